# SPDX-License-Identifier: Apache-2.0
"""A cause's plan as data and callables: what the generic planner (actuators/mitigate.py) gives a plan
(:class:`PlanContext`) and what a plan gives back (:class:`Note`, :class:`Submit`).

The direction stays probes -> detector -> actuators: a plan reads the host only through the callables
of :class:`PlanHost` (the actuators side implements them: a pod's traffic, its tasks' scheduling, the
online CPUs) and returns :class:`~detector.decisions.Decision` objects, the one contract the actuators
take. A plan is a generator: the planner submits each step as it is yielded, so what the sink says of
it (a refusal, at once) is known to the plan's next line, as when the plans were the planner's methods.

Two kinds of plan (``CauseSpec``): ``plan`` runs on each tick of an open incident of its cause;
``ladder`` is a factory of a stateful :class:`Ladder` that runs on every open incident whatever its
cause and hears every action's result (:class:`StepResult`): neighbor_cpu's quota -> cpuset -> evict
ladder belongs to the (victim, culprit) pair, not to one incident or cause.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple, Protocol

from detector.decisions import Decision, PodTraffic, Target
from detector.model import Culprit, Incident

if TYPE_CHECKING:
    from detector.policy import ActuatorPolicy


class NoteKey(NamedTuple):
    """What a note is about: its outcome code and the things it names (a culprit's cgroup, a step). A
    later note with the same key replaces it; the same key and words again change nothing."""

    code: str
    subject: tuple[str, ...] = ()


@dataclass(frozen=True)
class Note:
    key: NoteKey
    text: str


@dataclass(frozen=True)
class Submit:
    """A decision for the sink (limits, journal, verify/revert), in the incident's name."""

    decision: Decision


PlanStep = Note | Submit


class StepKey(NamedTuple):
    """A step taken once per incident (``PlanContext.done``/``mark``): the incident and the step's name."""

    incident_id: str
    step: str


@dataclass(frozen=True)
class RtTasks:
    """Pods with real-time tasks allowed on the victim's CPUs, by their RT tasks' CPU seconds, largest first."""

    victim_cpus: frozenset[int]
    ranked: tuple[tuple[float, Target], ...]


class PlanHost(Protocol):
    """What a plan may read of the host, through the actuators side (no plan reads a kernel file)."""

    def sample_traffic(self, targets: Iterable[Target]) -> list[PodTraffic] | None:
        """Each pod's own-netns packets/s since the last sample; None: no traffic sampler wired."""

    def rt_tasks(self, inc: Incident, candidates: list[Target], fresh: bool) -> RtTasks | None:
        """The RT ranking (read again only when ``fresh`` or the last read is old); None: no host view."""

    def victim_cpus(self, inc: Incident) -> list[int]:
        """The CPUs the victim's busy tasks run on."""

    def online_cpus(self) -> list[int]:
        """The node's online CPUs."""

    def request_of(self, target: Target) -> float | None:
        """A target's CPU request in cores (None: unknown)."""


class StepOutcome(StrEnum):
    """An action's result as a plan sees it (the actuators' ActionRecord, translated by the planner)."""

    APPLIED = "applied"
    VERIFIED = "verified"
    DID_NOT_HELP = "did_not_help"  # reverted: the victim did not improve
    WAIT = "wait"  # refused by a limit that passes (retry_in_s)
    JUDGED = "judged"  # refused: the same step did not help this victim lately, or is in place already
    REFUSED = "refused"  # refused for good, or failed
    OTHER = "other"  # reverted for another reason, and every state a plan does not act on


@dataclass(frozen=True)
class StepResult:
    decision: Decision
    outcome: StepOutcome
    retry_in_s: float = 1.0
    # A judged step's verdict in numbers (the manager's ``improvement_percent``: how much of the victim's
    # signal it took away); None: not judged, or judged without one.
    improvement_percent: float | None = None


@dataclass
class PlanContext:
    """What the planner knows for one incident on one tick."""

    incident: Incident
    what: str  # "opened", "updated" or "closed"
    now: float
    policy: ActuatorPolicy
    verify_signal: str  # what the cause's actions are verified on (CauseSpec.verify_signal)
    candidates: Callable[[], Iterable[Target]]
    host: PlanHost
    done_steps: set[StepKey] = field(default_factory=set)  # the planner's: steps taken once per incident
    # The planner's too, forgotten with done_steps when the incident closes: what a step found that later
    # ticks need without doing the step again (softirq's traffic source, sampled once, stays its culprit).
    found: dict[StepKey, Culprit] = field(default_factory=dict)

    def done(self, step: str) -> bool:
        return StepKey(self.incident.incident_id, step) in self.done_steps

    def mark(self, step: str) -> None:
        self.done_steps.add(StepKey(self.incident.incident_id, step))

    def keep(self, step: str, culprit: Culprit) -> None:
        self.found[StepKey(self.incident.incident_id, step)] = culprit

    def kept(self, step: str) -> Culprit | None:
        return self.found.get(StepKey(self.incident.incident_id, step))


Plan = Callable[[PlanContext], Iterator[PlanStep]]


class Ladder(Protocol):
    """A stateful plan across incidents (``CauseSpec.ladder``): runs on every open incident, hears
    every action's result, and is told when an incident closes."""

    def plan(self, ctx: PlanContext) -> Iterator[PlanStep]: ...

    def on_result(self, result: StepResult, now: float) -> None: ...

    def on_closed(self, inc: Incident, now: float) -> None: ...

    def forget_old(self, now: float) -> None: ...


def rank_first(inc: Incident, target: Target, share: float, kernel_work: str = "") -> Culprit:
    """Put ``target`` first in the incident's culprits, keeping what the engine knew of it. With
    ``kernel_work`` (the cause's, e.g. "ksoftirqd") a culprit the engine had no cost for is costed
    by the victim's waits without that work (Incident.kernel_work_cost): a sender whose packets
    ksoftirqd processes never runs on the victim's CPU, its kernel work does. Returns that culprit."""
    if inc.culprits and inc.culprits[0].target.cgroup == target.cgroup:
        return inc.culprits[0]
    old = next((c for c in inc.culprits if c.target.cgroup == target.cgroup), None)
    rest = [c for c in inc.culprits if c.target.cgroup != target.cgroup]
    score = round(max([1.0, *(c.score for c in rest)]), 4)
    first = (replace(old, target=target, score=score, attribution=round(share, 4)) if old is not None
             else Culprit(target, score, attribution=round(share, 4)))
    cost = inc.kernel_work_cost
    if kernel_work and cost is not None and first.runq_p99_without_ns is None:
        first = replace(first, victim_runq_p99_ns=round(cost.p99_ns), runq_p99_without_ns=round(cost.p99_without_ns),
                        victim_wait_ms_per_s=round(cost.wait_ms_per_s, 3),
                        wait_ms_per_s_without=round(cost.wait_ms_per_s_without, 3), without_kernel_work=kernel_work)
    inc.culprits = [first, *rest]
    return first
