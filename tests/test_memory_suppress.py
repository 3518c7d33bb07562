# SPDX-License-Identifier: Apache-2.0
"""Issue 19, reclaim: BE memory suppress on a real memory cgroup, refusals, and the planner's choice per kind."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from actuators.base import ActionState, Refused
from actuators.cgroupfile import CgroupFiles
from actuators.journal import Journal
from actuators.manager import ActuatorManager
from actuators.memory import MemorySuppressActuator
from actuators.mitigate import MitigationPlanner
from detector.decisions import ActionKind, Cause, Decision, LoggingSink, MemorySuppressAmount, Target
from detector.model import Culprit, Incident
from detector.policy import ActuatorPolicy
from probes.cgroupfiles import CPU_MAX, MEMORY_HIGH, MEMORY_USAGE
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
    original = files.read_raw(MEMORY_HIGH, rel).strip()
    proc = subprocess.Popen([sys.executable, "-c", FILL, str(tmp_path / "fill"), "64"], preexec_fn=be.preexec)
    journal = Journal(tmp_path / "j")
    manager = ActuatorManager([MemorySuppressActuator(files, journal)], journal, ActuatorPolicy(dry_run=False),
                              registry=CollectorRegistry())
    try:
        import time
        deadline = time.monotonic() + 20
        while int(files.read_raw(MEMORY_USAGE, rel)) < 48 << 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        usage = int(files.read_raw(MEMORY_USAGE, rel))
        manager.submit(_decision(rel))
        rec = manager.records[-1]
        assert rec.state == ActionState.APPLIED, rec.detail
        limit = int(files.read_raw(MEMORY_HIGH, rel))
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
    assert files.read_raw(MEMORY_HIGH, rel).strip() == original and not journal.owned()


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


def _fake_node(tmp_path: Path, free_mib: int, file_mib: int, usage_mib: int = 4096) -> CgroupFiles:
    """A v2 host in a temp dir: the node's zone counters (high watermarks 100 MiB, 24 GiB managed) and
    one BE pod with ``usage_mib`` used, ``file_mib`` of it page cache, no memory.high."""
    pages = lambda mib: mib * 1024 * 1024 // 4096  # noqa: E731
    paths = HostPaths.under(tmp_path)
    paths.proc.mkdir(parents=True)
    (paths.proc / "vmstat").write_text(f"nr_free_pages {pages(free_mib)}\nnr_inactive_file 1000\nnr_active_file 1000\n")
    (paths.proc / "zoneinfo").write_text(
        f"Node 0, zone   Normal\n  pages free     1\n        min      {pages(60)}\n        low      {pages(80)}\n"
        f"        high     {pages(100)}\n        spanned  1\n        present  {pages(24576)}\n"
        f"        managed  {pages(24576)}\n")
    pod = paths.cgroup_root / "kubepods.slice/batch"
    pod.mkdir(parents=True)
    (paths.cgroup_root / "cgroup.controllers").write_text("cpu memory\n")
    (pod / "memory.current").write_text(f"{usage_mib << 20}\n")
    (pod / "memory.high").write_text("max\n")
    half = (file_mib << 20) // 2
    (pod / "memory.stat").write_text(f"anon {(usage_mib - file_mib) << 20}\nfile {file_mib << 20}\n"
                                     f"active_file {half}\ninactive_file {half}\n")
    return CgroupFiles(paths)


@pytest.mark.skipif(os.sysconf("SC_PAGE_SIZE") != 4096, reason="the fake zone counters are in 4 KiB pages")
def test_the_cap_gives_the_node_back_its_free_memory_from_the_pods_page_cache(tmp_path: Path) -> None:
    # Free 150 MiB against a target of 100 MiB (high watermark) + 256 MiB margin (1 % of 24 GiB is
    # less): the cap is 206 MiB under usage, all of it page cache.
    files = _fake_node(tmp_path / "a", free_mib=150, file_mib=1024)
    plan = MemorySuppressActuator(files, Journal(tmp_path / "ja")).plan(_decision("kubepods.slice/batch"))
    (write,) = plan.writes
    assert write.path.endswith("kubepods.slice/batch/memory.high") and write.old == "max"
    assert int(write.new) == (4096 - 206) << 20, plan.summary
    assert plan.details["give_back_bytes"] == 206 << 20 and "gives back 206 MiB" in plan.summary
    # Only the page cache can go (no swap): 100 MiB of it at most 90 %.
    files = _fake_node(tmp_path / "b", free_mib=150, file_mib=100)
    plan = MemorySuppressActuator(files, Journal(tmp_path / "jb")).plan(_decision("kubepods.slice/batch"))
    assert int(plan.writes[0].new) == (4096 - 90) << 20, plan.summary
    # A node clear of its watermarks: the cap is the usage, nothing given back.
    files = _fake_node(tmp_path / "c", free_mib=2048, file_mib=1024)
    plan = MemorySuppressActuator(files, Journal(tmp_path / "jc")).plan(_decision("kubepods.slice/batch"))
    assert int(plan.writes[0].new) == 4096 << 20 and plan.details["give_back_bytes"] == 0
    # Asked not to: the cap is the usage even on a full node.
    d = _decision("kubepods.slice/batch")
    d = dataclasses.replace(d, amount=dataclasses.replace(d.amount, give_back_to_node=False))
    files = _fake_node(tmp_path / "d", free_mib=150, file_mib=1024)
    assert int(MemorySuppressActuator(files, Journal(tmp_path / "jd")).plan(d).writes[0].new) == 4096 << 20


@pytest.mark.parametrize("cpu_own", ["/", "/user.slice/session-1.scope"])
def test_the_sandbox_layout_finds_a_test_pods_memory_cgroup_by_its_cpu_path(tmp_path: Path, cpu_own: str) -> None:
    # Test pods nest under this process's own cgroup in each hierarchy, and those differ on a v1 host
    # (cpu:/ but memory:/process_api/<id> on the machine this was written on). The detector names a
    # pod by its cpu path; memory suppress must write in the pod's memory cgroup, not at that path in
    # the memory hierarchy (where it does not exist, or is another cgroup).
    from testkit.sandbox import sandbox_layout

    paths = HostPaths.under(tmp_path)
    (paths.proc / "self").mkdir(parents=True)
    (paths.proc / "self/cgroup").write_text(f"4:memory:/process_api/abc\n2:cpu,cpuacct:{cpu_own}\n0::/\n")
    for h in ("memory", "cpu,cpuacct"):
        (paths.cgroup_root / h).mkdir(parents=True)
    pod = "nn-test-1/kubepods.slice/batch"
    files = CgroupFiles(paths, sandbox_layout(paths))
    cpu_path = f"{cpu_own.rstrip('/')}/{pod}"
    assert files.dir(MEMORY_HIGH, cpu_path) == paths.cgroup_root / "memory/process_api/abc" / pod
    assert files.dir(CPU_MAX, cpu_path) == paths.cgroup_root / "cpu,cpuacct" / cpu_path.lstrip("/")
    plain = CgroupFiles(paths, discover(paths))
    assert plain.dir(MEMORY_HIGH, cpu_path) == paths.cgroup_root / "memory" / cpu_path.lstrip("/")


@pytest.mark.root
def test_the_sandbox_layout_reaches_a_real_owned_memory_cgroup(make_cgroup) -> None:
    from testkit.sandbox import sandbox_layout

    cg = make_cgroup("pod", ("cpu", "memory"))
    layout = discover(HostPaths())
    cpu_path = "/" + str(cg.path("cpu").relative_to(layout.hierarchy_for("cpu").mount))
    files = CgroupFiles(HostPaths(), sandbox_layout())
    assert files.path(MEMORY_HIGH, cpu_path).exists()
    assert files.dir(MEMORY_HIGH, cpu_path) == cg.path("memory")


def test_planner_waits_for_a_culprit_of_global_reclaim_instead_of_calling_it_the_victims_limit() -> None:
    # The node reclaims (kswapd on the victim's CPUs) and the engine has named nobody yet: this is not
    # memcg reclaim at the victim's own limit, so no "raise its memory limit" and no giving up; once a
    # BE pod is named, it is capped.
    from detector.causes import reclaim
    from detector.model import Evidence

    sink = LoggingSink()
    planner = MitigationPlanner(sink, lambda: [], policy=ActuatorPolicy(dry_run=False))
    inc = _reclaim_incident([])
    inc.evidence = [Evidence("kswapd_pages_per_s", 51200.0, 1.0)]
    inc.findings = [reclaim.KSWAPD]  # what the engine's reclaim rule found (the planner reads codes, not notes)
    planner(inc, "opened")
    assert sink.decisions == [] and not any("own memory limit" in e.note for e in inc.evidence)
    assert any("no pod named yet" in e.note for e in inc.evidence)
    be = Target("/batch", qos="BE", pod="batch")
    inc.culprits = [Culprit(be, 0.9, attribution=0.9)]
    planner(inc, "updated")
    assert [d.kind for d in sink.decisions] == [ActionKind.MEMORY_SUPPRESS] and sink.decisions[0].target == be
    # direct reclaim of its own (not memcg) says the same
    inc2 = _reclaim_incident([])
    inc2.incident_id = "inc-2"
    inc2.evidence = [Evidence("reclaim_stall_ms_per_s", 12.0, 1.0, note="direct 12.0")]
    inc2.findings = [reclaim.DIRECT]
    planner(inc2, "opened")
    assert len(sink.decisions) == 1 and not any("own memory limit" in e.note for e in inc2.evidence)
