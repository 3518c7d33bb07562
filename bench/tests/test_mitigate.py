# SPDX-License-Identifier: Apache-2.0
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


def _steady_pass(above_own_limit: bool, note: str = "") -> PassResult:
    samples = [(-5 + i * 0.01, 2.0) for i in range(500)] + [(i * 0.01, 45.0) for i in range(1500)]
    return PassResult("self-throttle-steady", "mitigate", 5, 15,
                      incidents=[IncidentRecord("web", "self_throttling", (), started_s=2.0)],
                      actions=[ActionRecordLite(2.0, "burst", "web", "applied", "quota x1.2")],
                      samples=samples, note=note, above_own_limit=above_own_limit)


def test_steadily_above_its_limit_is_no_neighbour_action_not_a_failed_recovery() -> None:
    """By the burst loop's verdict (PassResult.above_own_limit), never by the note's words."""
    truth = Truth("web", ("self_throttling",), None)
    said = score(truth, _steady_pass(True))
    assert said.recovered is None
    reworded = score(truth, _steady_pass(False, "burst cannot help: steadily above its limit, no neighbour action"))
    assert reworded.recovered is False


def test_an_accepted_eviction_kills_the_pods_processes_and_only_its(tmp_path) -> None:
    """--evict: the agent's EvictActuator POSTs the Eviction to the pass's apiserver; after the grace period
    the 'kubelet' kills every process of the pod's cgroups (containers' too) and deletes the pod."""
    import subprocess
    import time

    from actuators.evict import EvictActuator
    from bench.scenarios.kubelet import GRACE_S, PassKube
    from bench.scenarios.runner import _pods_of
    from detector.decisions import EvictAmount
    from detector.policy import ActuatorPolicy

    def pod(name: str, uid: str, qos: str, *procs: subprocess.Popen) -> SimpleNamespace:
        # A stand-in for the pod's cgroup directories: its own cgroup.procs and a container's below it.
        d = tmp_path / name
        (d / "main").mkdir(parents=True)
        (d / "cgroup.procs").write_text("".join(f"{p.pid}\n" for p in procs[:1]))
        (d / "main" / "cgroup.procs").write_text("".join(f"{p.pid}\n" for p in procs[1:]))
        return SimpleNamespace(uid=uid, qos_class=qos, cgroup=SimpleNamespace(dirs={"cpu": d}))

    batch = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    web = subprocess.Popen(["sleep", "60"])
    kube = PassKube({"batch": pod("batch", "uid-b", "BE", *batch), "web": pod("web", "uid-w", "LS", web)}).start()
    api = kube.api_client()
    try:
        evictor = EvictActuator(api, _pods_of(kube), policy=ActuatorPolicy(evict_enabled=True))
        decision = Decision(ActionKind.EVICT, Target("/x/batch", pod_uid="uid-b", pod="default/batch", qos="BE"),
                            EvictAmount(reason="interference"), "grew most")
        evictor.apply(evictor.plan(decision))
        assert [(ns, name, code) for ns, name, _, code in kube.evictions] == [("default", "batch", 201)]
        for p in batch:
            assert p.wait(timeout=GRACE_S + 10) == -9
        deadline = time.monotonic() + 10
        while kube.get_pod("default", "batch") is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kube.get_pod("default", "batch") is None and kube.killed == {"batch": 2}
        assert web.poll() is None and kube.get_pod("default", "web") is not None
    finally:
        api.close()
        kube.stop()
        for p in [*batch, web]:
            p.kill()
            p.wait()


def test_eviction_is_on_only_in_the_mitigate_mode_of_an_evicting_pass() -> None:
    from bench.scenarios.catalog import by_name
    from bench.scenarios.runner import bench_policy

    assert not bench_policy("mitigate").actuators.evict_enabled  # the project default, as in the agent
    assert bench_policy("mitigate", None, True).actuators.evict_enabled
    assert not bench_policy("detect", None, True).actuators.evict_enabled
    [capped, evicted] = by_name(["global-reclaim", "global-reclaim-evict"])
    assert not capped.evict and evicted.evict and evicted.modes == ("mitigate",)
    assert (evicted.setup, evicted.inject, evicted.truth) == (capped.setup, capped.inject, capped.truth)
