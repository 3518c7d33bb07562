"""Issue 19's bench side: the mitigate pass acts only on its own pods, and a pod steadily above its limit is
reported as 'no neighbour action', not as a failed recovery."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from actuators.base import Plan, Refused
from bench.scenarios.metrics import ActionRecordLite, IncidentRecord, PassResult, Truth, score
from bench.scenarios.runner import own_scope
from detector.decisions import ActionKind, Decision, SuppressAmount, Target
from noisyneighbor.agent import ScopedActuator


@dataclass
class _Pod:
    path: str
    qos_class: str


def test_own_scope_covers_our_pods_and_their_be_level_only() -> None:
    ctx = SimpleNamespace(pods={
        "web": _Pod("/nn-test-1/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podA.slice", "LS"),
        "batch": _Pod("/nn-test-1/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podB.slice", "BE"),
    })
    globs = own_scope(ctx)

    class Inner:
        kind = ActionKind.SUPPRESS

        def plan(self, decision: Decision) -> Plan:
            return Plan(decision, "ok")

    act = ScopedActuator(Inner(), globs)

    def plan(cgroup: str) -> str:
        try:
            return act.plan(Decision(ActionKind.SUPPRESS, Target(cgroup, qos="BE"), SuppressAmount("cpuset", cpus=(0,)),
                                     "x")).summary
        except Refused as e:
            return str(e)

    assert plan("/nn-test-1/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podB.slice") == "ok"
    assert plan("/nn-test-1/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podB.slice/ctr") == "ok"
    assert plan("/nn-test-1/kubepods.slice/kubepods-besteffort.slice") == "ok"  # koordlet mode's BE tier
    # another test suite's pod on the same machine (what the unscoped bench once suppressed)
    assert "outside" in plan("/nn-test-999/other-kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podZ.slice")
    assert "outside" in plan("/nn-test-1/kubepods.slice")


def _steady_pass(note: str) -> PassResult:
    samples = [(-5 + i * 0.01, 2.0) for i in range(500)] + [(i * 0.01, 45.0) for i in range(1500)]
    return PassResult("self-throttle-steady", "mitigate", 5, 15,
                      incidents=[IncidentRecord("web", "self_throttling", (), started_s=2.0)],
                      actions=[ActionRecordLite(2.0, "burst", "web", "applied", "quota x1.2")],
                      samples=samples, note=note)


def test_steadily_above_its_limit_is_no_neighbour_action_not_a_failed_recovery() -> None:
    truth = Truth("web", ("self_throttling",), None)
    said = score(truth, _steady_pass("burst cannot help: steadily above its limit, no neighbour action"))
    assert said.recovered is None and "no neighbour action" in said.note
    unsaid = score(truth, _steady_pass(""))
    assert unsaid.recovered is False
