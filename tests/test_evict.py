# SPDX-License-Identifier: Apache-2.0
"""Eviction actuator against FakeKube over real HTTP, with the kubernetes client pointed at it."""

from __future__ import annotations

import pytest

from actuators.base import ActionError, Refused
from actuators.evict import (
    EvictActuator,
    PodUsage,
)
from detector.decisions import ActionKind, Decision, EvictAmount, Target
from detector.model import Culprit, Incident
from detector.pods import pod_from_dict
from detector.policy import ActuatorPolicy
from testkit.fakekube import FakeKube, make_pod

GiB = 2**30


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kube():
    # Evicted pods stay terminating (deletionTimestamp set) for the whole test.
    with FakeKube(eviction_delete_delay=120.0) as k:
        k.clients = []
        yield k
        for api in k.clients:
            api.close()  # close pooled keep-alive connections cleanly before the server stops
        bad = [(r.method, r.path) for r in k.requests
               if not (r.method == "POST" and r.path.startswith("/api/v1/namespaces/") and r.path.endswith("/eviction"))]
        assert bad == [], f"something other than the eviction subresource was called: {bad}"


def be_pod(kube: FakeKube, name: str, *, cpu: str = "1", memory: str = "1Gi", qos: str = "BE", **kw) -> str:
    pod = kube.add_pod(make_pod(name, namespace="batch", qos_class=qos, requests={"cpu": cpu, "memory": memory}, **kw))
    return pod["metadata"]["uid"]


def evictor(kube: FakeKube, clock: FakeClock, usage=None, scores=None, per_minute: int = 10) -> EvictActuator:
    policy = ActuatorPolicy(dry_run=False, evict_enabled=True, evictions_per_minute=per_minute)
    api = kube.api_client()
    kube.clients.append(api)
    return EvictActuator(api, lambda: [pod_from_dict(p) for p in kube.pods()], usage, policy,
                         scores=(lambda d: scores) if scores is not None else None, clock=clock)


def decision(reason: str = "interference", cores: float = 0.0, memory: int = 0, target: Target | None = None) -> Decision:
    return Decision(ActionKind.EVICT, target or Target("kubepods.slice/kubepods-besteffort.slice", qos="BE"),
                    EvictAmount(reason, release_cpu_cores=cores, release_memory_bytes=memory), reason="test")


def evicted(kube: FakeKube) -> list[str]:
    return [name for _, name, _, code in kube.evictions if code == 201]


def test_victim_order_score_annotation_priority_usage(kube):
    clock = FakeClock()
    uids = {
        "c": be_pod(kube, "c", annotations={"koordinator.sh/eviction-priority": "1"}),
        "b": be_pod(kube, "b"),
        "a": be_pod(kube, "a"),
        "d": be_pod(kube, "d", priority=100),
        "f": be_pod(kube, "f", priority=-5),
        "g": be_pod(kube, "g", priority=-5),
        "ls": be_pod(kube, "ls", qos="LS"),
    }
    scores = {uids["c"]: 0.9, uids["b"]: 0.9, uids["a"]: 0.2, uids["ls"]: 1.0}
    usage = {uids["f"]: PodUsage(cpu_cores=0.1), uids["g"]: PodUsage(cpu_cores=2.0)}
    act = evictor(kube, clock, usage, scores)
    plan = act.plan(decision(cores=100.0))
    assert not plan.reversible
    assert [c.path for c in plan.calls] == [f"/api/v1/namespaces/batch/pods/{n}/eviction" for n in "cbagfd"]
    assert plan.calls[0].body["kind"] == "Eviction" and plan.calls[0].body["apiVersion"] == "policy/v1"
    act.apply(plan)
    assert evicted(kube) == list("cbagfd")  # never the LS pod, though its score is highest
    assert all(kube.get_pod("batch", n)["metadata"].get("deletionTimestamp") for n in "cbagfd")
    assert kube.requests[0].body["kind"] == "Eviction" and kube.requests[0].body["metadata"]["name"] == "c"


def test_interference_without_amount_evicts_the_top_culprit_only(kube):
    clock = FakeClock()
    a, b = be_pod(kube, "a"), be_pod(kube, "b")
    incident = Incident("i1", Target("victim"), cause="neighbor_cpu", started_at=0, confidence=1, signal="runq_p99_ns",
                        culprits=[Culprit(Target("x", pod_uid=b), 0.8), Culprit(Target("y", pod_uid=a), 0.3)])
    act = evictor(kube, clock, scores={c.target.pod_uid: c.score for c in incident.culprits})
    act.apply(act.plan(decision()))
    assert evicted(kube) == ["b"]


def test_named_pod_target_and_non_be_class_on_request(kube):
    clock = FakeClock()
    be_pod(kube, "be1")
    ls = be_pod(kube, "ls1", qos="LS")
    act = evictor(kube, clock)
    act.apply(act.plan(decision(target=Target("x", pod_uid=ls, qos="LS"))))
    assert evicted(kube) == ["ls1"]


def test_429_moves_to_next_victim_and_is_recorded(kube):
    clock = FakeClock()
    b, a = be_pod(kube, "b"), be_pod(kube, "a")
    kube.set_eviction_response("batch", "b", 429)
    usage = {b: PodUsage(cpu_cores=1.0), a: PodUsage(cpu_cores=1.0)}
    act = evictor(kube, clock, usage, {b: 0.9, a: 0.5})
    act.apply(act.plan(decision(cores=1.0)))
    assert [(n, code) for _, n, _, code in kube.evictions] == [("b", 429), ("a", 201)]
    outcomes = [(x.pod, x.outcome, x.code) for x in act.attempts]
    assert outcomes == [("batch/b", "pdb_blocked", 429), ("batch/a", "evicted", 201)]
    assert "disruption budget" in act.attempts[0].message
    # b stays skipped for a while after its 429; with nothing else left, the plan is refused
    clock.now += 25
    with pytest.raises(Refused, match="blocked by a PodDisruptionBudget"):
        act.plan(decision(cores=5.0))


def test_all_blocked_is_a_one_line_error(kube):
    clock = FakeClock()
    be_pod(kube, "only")
    kube.set_eviction_response("batch", "only", 429)
    act = evictor(kube, clock)
    with pytest.raises(ActionError) as exc:
        act.apply(act.plan(decision(cores=1.0)))
    assert "\n" not in str(exc.value) and "no pod evicted" in str(exc.value) and "429" in str(exc.value)


def test_rate_limit_per_node(kube):
    clock = FakeClock()
    for n in "abcd":
        be_pod(kube, n)
    act = evictor(kube, clock, per_minute=2)
    plan = act.plan(decision("cpu_satisfaction", cores=10.0))
    assert len(plan.calls) == 2  # the plan already respects the budget
    act.apply(plan)
    assert len(evicted(kube)) == 2
    clock.now += 30  # past the CPU cooldown, within the minute
    with pytest.raises(Refused, match="rate limit"):
        act.plan(decision("cpu_satisfaction", cores=10.0))
    clock.now += 31
    act.apply(act.plan(decision("cpu_satisfaction", cores=10.0)))
    assert len(evicted(kube)) == 4


def test_terminating_pods_count_against_the_target(kube):
    clock = FakeClock()
    for n in "abcd":
        be_pod(kube, n, cpu="1")
    act = evictor(kube, clock)
    act.apply(act.plan(decision("cpu_satisfaction", cores=1.5)))
    assert len(evicted(kube)) == 2  # 1 + 1 cores of requests >= 1.5
    clock.now += 21
    # the two are still terminating and release 2 cores: the same target needs nobody else
    with pytest.raises(Refused, match=r"2 terminating pod\(s\) already release 2.00 cores"):
        act.plan(decision("cpu_satisfaction", cores=1.5))
    plan = act.plan(decision("cpu_satisfaction", cores=2.5))
    assert len(plan.calls) == 1
    act.apply(plan)
    assert len(evicted(kube)) == 3


def test_cooldowns_with_a_fake_clock(kube):
    clock = FakeClock()
    for n in "abcdef":
        be_pod(kube, n)
    usage = {pod_from_dict(p).uid: PodUsage(cpu_cores=1, memory_bytes=GiB) for p in kube.pods()}
    act = evictor(kube, clock, usage)
    act.apply(act.plan(decision("memory_threshold", memory=GiB)))
    clock.now += 3.9
    with pytest.raises(Refused, match="memory_threshold cooldown"):
        act.plan(decision("memory_threshold", memory=10 * GiB))
    # another trigger is not blocked (the terminating pod's 1 core counts: one more pod is needed for 2)
    plan = act.plan(decision("cpu_satisfaction", cores=2.0))
    assert len(plan.calls) == 1
    act.apply(plan)
    clock.now += 0.2
    act.apply(act.plan(decision("memory_threshold", memory=5 * GiB)))  # 4.1 s after the first
    clock.now += 19.0
    with pytest.raises(Refused, match="cpu_satisfaction cooldown"):
        act.plan(decision("cpu_satisfaction", cores=100.0))
    clock.now += 1.0
    assert act.plan(decision("cpu_satisfaction", cores=100.0)).calls


def test_memory_order_lowest_priority_then_largest(kube):
    clock = FakeClock()
    u = {n: be_pod(kube, n, priority=p) for n, p in (("big", 10), ("small", 0), ("large", 0))}
    usage = {u["big"]: PodUsage(memory_bytes=8 * GiB), u["small"]: PodUsage(memory_bytes=GiB),
             u["large"]: PodUsage(memory_bytes=3 * GiB)}
    act = evictor(kube, clock, usage)
    act.apply(act.plan(decision("memory_threshold", memory=int(3.5 * GiB))))
    assert evicted(kube) == ["large", "small"]  # priority 0 first, larger first; 4 GiB >= 3.5 GiB


def test_404_and_pod_gone_before_apply(kube):
    clock = FakeClock()
    a, b, c = be_pod(kube, "a"), be_pod(kube, "b"), be_pod(kube, "c")
    kube.set_eviction_response("batch", "a", 404)
    act = evictor(kube, clock, scores={a: 0.9, b: 0.8, c: 0.1})
    plan = act.plan(decision("cpu_satisfaction", cores=1.0))
    assert [x.path.split("/")[-2] for x in plan.calls] == ["a"]
    kube.remove_pod("batch", "b")  # deleted by someone else between plan and apply: no request for it
    act.apply(plan)
    assert [(n, code) for _, n, _, code in kube.evictions] == [("a", 404), ("c", 201)]
    assert [(x.pod, x.outcome) for x in act.attempts] == [("batch/a", "gone"), ("batch/b", "gone"), ("batch/c", "evicted")]


def test_unreachable_apiserver_is_one_line_error(kube):
    clock = FakeClock()
    be_pod(kube, "a")
    act = evictor(kube, clock)
    plan = act.plan(decision(cores=1.0))
    pods = kube.pods()
    act.pods = lambda: [pod_from_dict(p) for p in pods]
    kube.go_down()
    with pytest.raises(ActionError) as exc:
        act.apply(plan)
    assert "\n" not in str(exc.value) and "no pod evicted" in str(exc.value)
    assert act.attempts[-1].outcome == "error"


def test_revert_only_records(kube):
    clock = FakeClock()
    be_pod(kube, "a")
    act = evictor(kube, clock)
    plan = act.plan(decision())
    act.apply(plan)
    act.revert(plan)
    assert act.attempts[-1].outcome == "not_reverted" and act.attempts[-1].pod == "batch/a"
    assert kube.get_pod("batch", "a")["metadata"]["deletionTimestamp"]


def test_plan_refusals(kube):
    clock = FakeClock()
    act = evictor(kube, clock)
    with pytest.raises(Refused, match="no BE pod"):
        act.plan(decision(cores=1.0))
    with pytest.raises(Refused, match="unknown reason"):
        act.plan(decision("whim"))
    with pytest.raises(Refused, match="bad release"):
        act.plan(decision("cpu_satisfaction", cores=-1.0))


def test_prepare_loads_the_client_before_the_first_eviction(kube):
    """Where eviction is enabled the agent loads the client at start: at the first eviction its modules
    would be read from disk while the node is short of memory (bench: 10 s late under global reclaim)."""
    ev = evictor(kube, FakeClock())
    assert "core" not in vars(ev)  # built lazily: a node that never evicts never pays for it
    ev.prepare()
    assert "core" in vars(ev)
    be_pod(kube, "a")
    ev.apply(ev.plan(decision()))
    assert evicted(kube) == ["a"]
