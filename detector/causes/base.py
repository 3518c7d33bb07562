# SPDX-License-Identifier: Apache-2.0
"""What every cause declaration is made of: the context its rule reads, the verdict it returns, and the
declaration itself (:class:`CauseSpec`): rule, words, the engine's step and the planner's outcome codes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from detector.decisions import Cause, Decision, SuppressAmount
from detector.model import Culprit, Evidence, Incident
from detector.signals import NodeSignals, WorkloadSignals

if TYPE_CHECKING:
    from detector.policy import Policy, SloThresholds

ROOT_CGROUP = "/"  # the workload key of the node's processes outside any pod
VICTIM_SIGNAL = "runq_p99_ns"  # what verify/revert watches for a CPU action


@dataclass
class CauseContext:
    """What every rule may read: the victim's row, the breaches, the windowed who-ran-instead split,
    and the engine's culprit rankers (they need the store, the targets and the pods' requests)."""

    key: str
    row: WorkloadSignals
    signals: NodeSignals
    slo: SloThresholds
    breached: set[str]  # names of the signals that breached
    foreign: dict[str, float]  # culprit workload key -> ns of the victim's wait it ran for (window)
    own_wait_ns: float  # ns of the victim's wait behind its own tasks (window)
    total_wait_ns: float  # the victim's runqueue wait (window)
    window_s: float
    cpu_culprits: Callable[[str, dict[str, float], float], list[Culprit]]
    correlation_culprits: Callable[[str, NodeSignals], list[Culprit]]
    # (victim key, its row, the node, global reclaim or not; None: global when it stalled in direct reclaim)
    reclaim_culprits: Callable[[str, WorkloadSignals, NodeSignals, bool | None], list[Culprit]]
    # The servers with full accept queues the victim's connects went to, and the evidence of it.
    connect_servers: Callable[[str], tuple[list[Culprit], list[Evidence]]] = lambda key: ([], [])
    # own_wait_ns by the container it waited behind (window): name -> ns (detector/containers.py)
    own_by_container: dict[str, float] = field(default_factory=dict)
    steal_ns: float = 0.0  # hypervisor steal on the victim's CPUs, weighted like softirq time (window)
    node_key: str = ROOT_CGROUP  # the workload key of the node's own processes (IncidentEngine.node_key)

    @property
    def runq_breach(self) -> bool:
        return bool(self.breached & {"runq_p99_ns", "psi_cpu_some"})

    @property
    def foreign_share(self) -> float:
        return sum(self.foreign.values()) / self.total_wait_ns if self.total_wait_ns > 0 else 0.0

    @property
    def node_share(self) -> float:
        """Share of its wait behind the root cgroup: the node's own processes, kernel threads included."""
        return self.foreign.get(self.node_key, 0.0) / self.total_wait_ns if self.total_wait_ns > 0 else 0.0

    @property
    def own_share(self) -> float:
        return min(1.0, self.own_wait_ns / self.total_wait_ns) if self.total_wait_ns > 0 else 0.0

    @property
    def throttle_share(self) -> float:
        """Throttled time over its runqueue wait (or the throttled ratio when it barely waited)."""
        row = self.row
        if row.throttled_ms_per_s is not None and row.runq_wait_ms_per_s > 0.5:
            return min(1.0, row.throttled_ms_per_s / row.runq_wait_ms_per_s)
        if row.throttled_ratio is not None and row.throttled_ratio >= 0.5:
            return row.throttled_ratio
        return 0.0


@dataclass(frozen=True)
class Verdict:
    cause: Cause
    confidence: float
    culprits: list[Culprit] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)  # what the rule used, beyond the breaches
    findings: tuple[str, ...] = ()  # structured codes of what the rule found (Incident.findings)


Rule = Callable[[CauseContext], Verdict | None]


@dataclass(frozen=True)
class ActContext:
    """What a cause's engine step may read besides the incident: the policy and the engine's suppress
    amount for a culprit (cpuset off the victim's CPUs, or a cfs quota)."""

    policy: Policy
    suppress_amount: Callable[[Culprit], SuppressAmount]
    victim_signal: str = VICTIM_SIGNAL  # what its decisions are verified on (CauseSpec.verify_signal)


# The engine's step for an incident of a cause (its top culprit, or None): a decision, several, or none.
Act = Callable[[Incident, Culprit | None, ActContext], Decision | list[Decision] | None]


class Mitigation(StrEnum):
    """The planner's steps beyond the engine's decisions (actuators/mitigate.py runs them)."""

    TRAFFIC_AND_RT = "traffic_and_rt"  # rank pods by their own traffic and RT tasks on the victim's CPUs
    MEMORY_GROWER = "memory_grower"  # cap the BE pod that grew most in global reclaim


@dataclass(frozen=True)
class CauseSpec:
    """One cause, declared once: how it is recognised, how it reads to a human, what is done about it."""

    cause: Cause
    rule: Rule
    title: str  # the HTML report's heading: "<victim> suffers from <title>"
    advice: str  # what would help, for diagnose's text and HTML
    # Not a neighbour's doing: the sentence the HTML gives instead of culprits (the text says "none
    # (not a neighbour's doing)"); None: a neighbour may be at fault ("none attributed" when none is).
    blameless: str | None = None
    act: Act | None = None  # the engine's step when an incident opens or its top culprit changes
    mitigation: Mitigation | None = None  # the planner's extra step, when it has one
    # Findings of every tick from the victim's row, whichever rule decided (Incident.findings).
    context: Callable[[WorkloadSignals], tuple[str, ...]] | None = None
    # Outcome code -> its wording (str.format fields). Decisions carry the code (Decision.code) and
    # the planner keys on codes only: rewording a message changes no decision (tests/test_causes.py).
    messages: dict[str, str] = field(default_factory=dict)
    # The kernel work the node does for this cause on a culprit's behalf ("softirq work": what its
    # packets made, in ksoftirqd or on top of whatever task ran; "kswapd, kcompactd, kdamond": the
    # reclaim and compaction its growth forced, and DAMON's pageout of what it streamed through) and
    # stops when the culprit is moved away: the top BE culprit's counterfactual takes its part of each
    # wait out too (detector/counterfactual.py; the probe marks those threads' slices and times softirq
    # work, bpf/runqlat.h). "": none; a culprit's cost is its own share only.
    kernel_work: str = ""
    # Its evidence comes from outside the node and comes and goes (steal): an incident opened with this
    # cause takes a later tick's cause that names pods, whatever the first confidence (its rule comes
    # before theirs, so on that tick it no longer explains the wait; the pods are what can be acted on).
    yields_to_pods: bool = False
    # The victim's signals its actions are verified on (Decision.victim_signal; lower is better): the
    # one the incident breached on when it is among them, else the first (:meth:`verify_signal`).
    verify_signals: tuple[str, ...] = (VICTIM_SIGNAL,)

    def verify_signal(self, inc: Incident) -> str:
        """What an action for ``inc`` is verified on: the signal that broke its SLO when this cause
        verifies on it (a softirq incident that breached on softirq time is judged on softirq time, not
        on a run-queue p99 that never left its bulk), else the cause's first."""
        return inc.signal if inc.signal in self.verify_signals else self.verify_signals[0]

    def say(self, code: str, **fields: Any) -> str:
        return self.messages[code].format(**fields)
