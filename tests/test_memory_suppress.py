"""Issue 19, reclaim: BE memory suppress on a real memory cgroup, refusals, and the planner's choice per kind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from actuators.base import ActionState, Refused
from actuators.cgroupfile import CgroupFiles, Resource
from actuators.journal import Journal
from actuators.manager import ActuatorManager
from actuators.memory import MemorySuppressActuator
from actuators.mitigate import MitigationPlanner
from detector.decisions import ActionKind, Cause, Decision, LoggingSink, MemorySuppressAmount, Target
from detector.model import Culprit, Incident
from detector.policy import ActuatorPolicy
from probes.cgroupfs import discover
from probes.host import HostPaths

FILL = """
import sys, time
with open(sys.argv[1], "wb") as f:
    for _ in range(int(sys.argv[2])):
        f.write(b"x" * (1 << 20))
    f.flush()
time.sleep(60)
"""


def _decision(cgroup: str, qos: str | None = "BE") -> Decision:
    return Decision(ActionKind.MEMORY_SUPPRESS, Target(cgroup, qos=qos, pod="batch"),
                    MemorySuppressAmount(floor_bytes=16 << 20), "grew most during global reclaim", incident_id="inc-1")


@pytest.mark.root
def test_be_memory_capped_at_usage_and_restored(make_cgroup, tmp_path: Path) -> None:
    be = make_cgroup("kubepods.slice/kubepods-besteffort.slice/batch", ("memory",))
    layout = discover(HostPaths())
    rel = str(be.path("memory").relative_to(layout.hierarchy_for("memory").mount))
    files = CgroupFiles(HostPaths(), layout)
    original = files.read_raw(Resource.MEMORY_LIMIT, rel).strip()
    proc = subprocess.Popen([sys.executable, "-c", FILL, str(tmp_path / "fill"), "64"], preexec_fn=be.preexec)
    journal = Journal(tmp_path / "j")
    manager = ActuatorManager([MemorySuppressActuator(files, journal)], journal, ActuatorPolicy(dry_run=False),
                              registry=CollectorRegistry())
    try:
        import time
        deadline = time.monotonic() + 20
        while int(files.read_raw(Resource.MEMORY_USAGE, rel)) < 48 << 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        usage = int(files.read_raw(Resource.MEMORY_USAGE, rel))
        manager.submit(_decision(rel))
        rec = manager.records[-1]
        assert rec.state == ActionState.APPLIED, rec.detail
        limit = int(files.read_raw(Resource.MEMORY_LIMIT, rel))
        print(rec.plan.summary)
        assert usage * 0.8 <= limit <= usage * 1.1
        for qos in ("LS", "LSR", "SYSTEM", None):  # never a non-BE pod
            manager.submit(_decision(rel, qos))
            assert manager.records[-1].state == ActionState.REFUSED
        with pytest.raises(Refused):  # the actuator refuses on its own too
            MemorySuppressActuator(files, journal).plan(_decision(rel, "LS"))
    finally:
        proc.kill()
        proc.wait()
        manager.close()
    assert files.read_raw(Resource.MEMORY_LIMIT, rel).strip() == original and not journal.owned()


def _reclaim_incident(culprits: list[Culprit]) -> Incident:
    inc = Incident("inc-1", Target("/web", qos="LS", pod="web"), Cause.RECLAIM, 0.0, 0.8, "reclaim_stall_ms_per_s")
    inc.culprits = culprits
    return inc


def test_planner_global_reclaim_caps_the_be_grower_memcg_reclaim_is_advice() -> None:
    sink = LoggingSink()
    planner = MitigationPlanner(sink, lambda: [], policy=ActuatorPolicy(dry_run=False))
    be = Target("/batch", qos="BE", pod="batch")
    inc = _reclaim_incident([Culprit(be, 0.9, attribution=0.9)])
    planner(inc, "opened")
    planner(inc, "updated")
    assert [d.kind for d in sink.decisions] == [ActionKind.MEMORY_SUPPRESS] and sink.decisions[0].target == be
    own = _reclaim_incident([])  # memcg reclaim at its own limit: the engine names no culprit
    own.incident_id = "inc-2"
    planner(own, "opened")
    assert len(sink.decisions) == 1
    assert any("no neighbour action" in e.note and "raise its memory limit" in e.note for e in own.evidence)
    ls_grower = _reclaim_incident([Culprit(Target("/api", qos="LS"), 0.9)])
    ls_grower.incident_id = "inc-3"
    planner(ls_grower, "opened")
    assert len(sink.decisions) == 1 and any("not touched" in e.note for e in ls_grower.evidence)
