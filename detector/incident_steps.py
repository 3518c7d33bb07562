# SPDX-License-Identifier: Apache-2.0
"""An incident's steps for the actuators (split out of ``detector/incidents.py``, issue 42).

Decisions (suppress the top BE culprit, and with it the other BE culprits that ran while the victim
waited; burst a self-throttled LS victim; evict a BE culprit of global reclaim) go to the DecisionSink
when the incident opens or its cause or top culprit changes, each with the victim's signal over its
breach as what its verification compares with. The actuators apply their own limits, cooldowns and
verification.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace

from detector import causes
from detector.decisions import ActionKind, Decision, DecisionSink, SuppressAmount
from detector.incident_culprits import CulpritFinder
from detector.incident_diagnosis import VictimState
from detector.model import Culprit, CulpritCost, Incident
from detector.policy import Policy
from detector.signals import NodeSignals, WorkloadSignals
from detector.workloads import key_of

# The victim signals the actuators verify an action with (Decision.victim_signal; lower is better):
# every cause's (CauseSpec.verify_signals).
VERIFY_SIGNALS = tuple(dict.fromkeys(name for s in causes.CAUSES for name in s.verify_signals))


def decide(inc: Incident, state: VictimState, policy: Policy, sink: DecisionSink, finder: CulpritFinder,
           online_cpus: tuple[int, ...]) -> None:
    """The cause's step, when what it decides on changed: the top culprit, whether it is within its
    request, or the BE culprits that ran while the victim waited above their requests (a hog that
    starts on the victim's CPU after the step, or goes past its request, is moved the tick it is
    seen, not once the top changes). An incident submits a step on a pod once: what follows a step
    that did not help is the planner's ladder, not the same step again."""
    # The top culprit that may be acted on: the node's own processes are named, never moved.
    top = next((c for c in inc.culprits if not finder.is_node(c)), None)
    movable = frozenset(c.target.cgroup for c in inc.culprits
                        if c.target.qos == "BE" and c.above_request is not False and c.who_ran_instead_share > 0)
    key = (inc.cause, top.target.cgroup if top else None, top is not None and top.above_request is False, movable)
    if key == state.decided:
        return
    state.decided = key
    spec = causes.spec(inc.cause)
    step = None if spec.act is None else spec.act(
        inc, top, causes.ActContext(policy, lambda culprit: suppress_amount(culprit, state, policy, online_cpus),
                                    spec.verify_signal(inc)))
    done = set(inc.actions)
    decisions = [d for d in (step if isinstance(step, list) else [step] if step is not None else [])
                 if f"{d.kind}:{d.target.display}" not in done]
    for d in decisions:
        inc.actions.append(f"{d.kind}:{d.target.display}")
        sink.submit(inc.for_verification(since_culprit(d, state)))
    moved = [d.target for d in decisions if d.kind == ActionKind.SUPPRESS]
    if len(moved) > 1:
        inc.moved_together = moved


def since_culprit(d: Decision, state: VictimState) -> Decision:
    """``d`` verified against the victim's signal over the breach ticks its target ran instead of it
    (the incident's breach level when it ran on none of them, or the decision watches another)."""
    ticks = [v for v, ran in zip(state.breach_signals, state.breach_ran, strict=False)
             if key_of(d.target) in ran]
    before = medians(ticks).get(d.victim_signal) if ticks and d.victim_before is None else None
    return d if before is None else replace(d, victim_before=before)


def moved_together_cost(key: str, inc: Incident, finder: CulpritFinder) -> CulpritCost | None:
    """The victim without all the culprits the incident's step moved together (None: fewer than two)."""
    if len(inc.moved_together) < 2:
        return None
    return finder.counterfactual.cost_of_set(key, [key_of(t) for t in inc.moved_together])


def suppress_amount(culprit: Culprit, state: VictimState, policy: Policy,
                    online_cpus: tuple[int, ...]) -> SuppressAmount:
    """cpuset policy: the culprit keeps every CPU but the victim's (isolation is what brings a p99
    back: a cfs quota only shortens the culprit's bursts, during which the victim waits as before).
    Where that would leave fewer CPUs than the floor, or the policy is cfsQuota: half its CPU use."""
    rt = policy.resource_threshold
    if rt.cpu_suppress_policy == "cpuset" and online_cpus and state.cpus:
        others = tuple(c for c in online_cpus if c not in state.cpus)
        if others and len(others) >= max(1, rt.cpu_suppress_min_cpus):
            return SuppressAmount(policy="cpuset", cpus=others)
    return SuppressAmount(policy="cfs_quota", cpu_cores=max(0.1, round((culprit.cpu_cores or 1.0) * 0.5, 2)))


def verify_values(row: WorkloadSignals) -> dict[str, float]:
    """The row's VERIFY_SIGNALS (a run-queue p99 only where it waited; the time throttled only where it
    has a value: a cgroup without CFS bandwidth has none)."""
    return {name: float(value) for name in VERIFY_SIGNALS
            if (name != "runq_p99_ns" or row.runq_count) and (value := getattr(row, name)) is not None}


def medians(ticks: Iterable[dict[str, float]]) -> dict[str, float]:
    """Each signal's median over the ticks that have it."""
    values: dict[str, list[float]] = defaultdict(list)
    for tick in ticks:
        for k, v in tick.items():
            values[k].append(v)
    return {k: statistics.median(v) for k, v in values.items()}


def signals_for_verify(signals: NodeSignals, victims: dict[str, VictimState], clear_windows: int,
                       verify_intervals: int) -> dict[str, float]:
    """The verify signals of the victims an action may be being verified for, keyed as
    DecisionSink.observe expects: by the victim's cgroup (``Decision.victim``), not by its workload
    key (a pod's is "pod:<uid>"). Those are the victims in a breach or an incident, on the tick it
    closed and ``verify_intervals`` ticks after (a verification runs that long after its action, which
    came while the incident was open); the others have nothing being verified, so per-tick work
    follows the incidents, not the pod count (each decision carries its own baseline). A stall of 0
    is a value: a victim whose reclaim stopped after a cap must be seen to have improved."""
    # clean ticks in a row: clear_windows of them close the incident, then the verification's
    horizon = clear_windows + max(1, verify_intervals)
    out = {}
    for key, row in signals.workloads.items():
        state = victims.get(key)
        if state is None or (state.incident is None and state.clear_ticks > horizon):
            continue
        cgroup = row.workload.target.cgroup
        for name, value in verify_values(row).items():
            out[f"{cgroup}:{name}"] = value
    return out
