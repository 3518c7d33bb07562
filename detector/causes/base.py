# SPDX-License-Identifier: Apache-2.0
"""What every cause declaration is made of: the context its rule reads, the verdict it returns, and the
declaration itself (:class:`CauseSpec`): rule, words, the engine's step, the planner's plan and the outcome codes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from detector.causes.plan import Ladder, Plan
from detector.decisions import Decision, SuppressAmount, Target
from detector.model import Culprit, Evidence, Incident
from detector.signals import NodeSignals, ProbeTick, WorkloadSignals

if TYPE_CHECKING:
    from detector.policy import Policy, SloThresholds

ROOT_CGROUP = "/"  # the workload key of the node's processes outside any pod
VICTIM_SIGNAL = "runq_p99_ns"  # what verify/revert watches for a CPU action
CULPRIT_MIN_SCORE = 0.0  # a culprit must score above this (a zero score blames nobody)
MAX_CULPRITS = 5  # an incident names at most this many


class WorkloadHistory(Protocol):
    """What a cause's own culprit ranking may read beyond this tick's rows (the engine's CulpritFinder,
    over its time-series store): a workload's recent values of a signal, its last value, its Target."""

    def recent(self, key: str, signal: str, seconds: float) -> Sequence[float]:
        """The workload's present values of ``signal`` over the last ``seconds``, oldest first."""
        ...

    def last(self, key: str, signal: str) -> float:
        """Its last value of ``signal`` in the last few seconds (0.0 when none was measured)."""
        ...

    def target(self, key: str) -> Target:
        """The workload as last seen (its cgroup, pod and QoS), for naming it as a culprit."""
        ...


class NoHistory:
    """No store behind the rules (a rule checked on one made-up row): nothing recent, every workload
    named by its key alone."""

    def recent(self, key: str, signal: str, seconds: float) -> Sequence[float]:
        return ()

    def last(self, key: str, signal: str) -> float:
        return 0.0

    def target(self, key: str) -> Target:
        return Target(key)


NO_HISTORY = NoHistory()
# A cause's culprit hook: the victim's workload key -> the culprits it names and the evidence for them.
CulpritHook = Callable[[str], tuple[list[Culprit], list[Evidence]]]


class CulpritSource(Protocol):
    """A cause's own culprit finder over a node reading the incident engine does not hold, which the agent
    takes beside the probes (CauseSpec.culprit_source): the agent's reader of that reading builds the
    source, feeds it every tick's probe intervals (the detector's, before its step) and every reading it
    takes, takes one now when the source asks, and hooks :meth:`culprits_for` in as the cause's culprits
    (CauseContext.culprit_hooks, by the cause's NAME)."""

    def observe(self, tick: ProbeTick) -> bool:
        """The tick's probe readings and intervals in; True when they ask for the reading to be taken now."""
        ...

    def observe_report(self, report: Any) -> None:
        """The reading its reader took (of the type CulpritSourceSpec.reads names)."""
        ...

    def culprits_for(self, victim_key: str) -> tuple[list[Culprit], list[Evidence]]:
        """The culprits the victim waits on, and the evidence (a CulpritHook; never raises)."""
        ...


@dataclass(frozen=True)
class SourceWiring:
    """What a culprit source's factory gets from the agent: names for what its reading holds, and the SLOs."""

    workload_of_id: Callable[[int], str | None]  # a cgroup id (the cpu hierarchy's, as runqlat's) -> workload key
    target_of_path: Callable[[str], Target]  # a workload's cgroup path -> its Target
    slo: SloThresholds


@dataclass(frozen=True)
class CulpritSourceSpec:
    """A cause's culprit source: the reading it joins, by the type of its reader's report (the agent's reader
    of that type builds it), and its factory."""

    reads: type
    build: Callable[[SourceWiring], CulpritSource]


@dataclass
class CauseContext:
    """What every rule may read: the victim's row, the breaches, the windowed who-ran-instead split,
    the engine's culprit rankers (they need the store, the targets and the pods' requests), the
    workloads' history for a cause that ranks its culprits itself, and the causes' kernel-work
    judgements (the registry's :data:`~detector.causes.KERNEL_WORK_JUDGES`)."""

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
    # Whether the node does a cause's kernel work on the victim's CPUs beyond the usual this tick, one per
    # cause that declares it (CauseSpec.kernel_work_busy): any of them makes kernel_work_share take the
    # node's whole share of the wait. The registry's tuple; base.py names no cause.
    kernel_work_judges: tuple[KernelWorkJudge, ...]
    # The workloads' recent values, for a cause that ranks its culprits from them (CulpritFinder).
    history: WorkloadHistory = NO_HISTORY
    # A cause's own culprit finder over what the engine does not hold, by the cause's NAME, wired from
    # outside (CauseSpec.culprit_source, which the agent builds): :meth:`hooked_culprits`. base.py names
    # no cause.
    culprit_hooks: Mapping[str, CulpritHook] = field(default_factory=dict)
    # own_wait_ns by the container it waited behind (window): name -> ns (detector/containers.py)
    own_by_container: dict[str, float] = field(default_factory=dict)
    # ns over the window of the plugins' signals summed over it (SignalSpec.summed_over_window), by name
    window_ns: Mapping[str, float] = field(default_factory=dict)
    node_key: str = ROOT_CGROUP  # the workload key of the node's own processes (IncidentEngine.node_key)
    # ns of its wait (window) the node's kernel work ran in: softirq work on top of whatever task was on the
    # CPU, and the kernel threads' slices (ksoftirqd, kswapd, kcompactd, kdamond): the node's own pair's
    # cf_node_ns (bpf/runqlat.bpf.c, move_counterfactual_softirq), in the waits of 128 us and more.
    kernel_work_ns: float = 0.0
    # ns of its wait (window) its CPU ran the idle task: a runnable task waits beside an idle CPU only while
    # its group is throttled (CFS bandwidth), so with throttling in the tick this is throttled wait.
    idle_wait_ns: float = 0.0

    def hooked_culprits(self, cause: str) -> tuple[list[Culprit], list[Evidence]]:
        """The culprits and evidence of ``cause``'s hook for the victim; none when nothing is hooked in."""
        hook = self.culprit_hooks.get(cause)
        return hook(self.key) if hook is not None else ([], [])

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
    def node_kernel_work(self) -> bool:
        """The node does kernel work on the victim's CPUs beyond the usual: a cause that declares a
        judgement of it says so (softirq time there past its SLO, kswapd reclaiming for the node)."""
        return any(judge(self) for judge in self.kernel_work_judges)

    @property
    def kernel_work_share(self) -> float:
        """Share of its wait the node's kernel work ran in (softirq work on top of tasks, kernel threads).
        The probe counts it in the waits of 128 us and more only; while the node does kernel work beyond
        the usual (:attr:`node_kernel_work`), the node's whole share of the wait (ksoftirqd and kswapd are
        root-cgroup threads) is taken when larger: under a NET_RX flood on the victim's CPU, ksoftirqd ran
        62 of its 131 ms of wait, in many short waits, where the count had 36 (tests/test_cause_ranking_kernel.py).
        A node daemon busy on its CPUs at that time is counted as that kernel work."""
        if self.total_wait_ns <= 0:
            return 0.0
        work = self.kernel_work_ns
        if self.node_kernel_work:
            work = max(work, self.foreign.get(self.node_key, 0.0))
        return min(1.0, work / self.total_wait_ns)

    @property
    def foreign_tasks_share(self) -> float:
        """Share of its wait other cgroups' tasks ran in, their own time only: the kernel work in those
        waits (:attr:`kernel_work_share`: softirq work on top of their slices, the kernel threads' slices,
        both counted under the task or the root cgroup) taken out. The probe does not say on top of whose
        slice the softirq work ran, so the part on top of the victim's own or the idle task is taken out
        too: this share errs low by at most that part."""
        if self.total_wait_ns <= 0:
            return 0.0
        return max(0.0, self.foreign_share - self.kernel_work_share)

    @property
    def throttle_share(self) -> float:
        """Throttled time over its runqueue wait (or the throttled ratio when it barely waited). The
        throttled time is the group's, once per CPU, while each of its runnable tasks waits all of it: two
        tasks on a throttled CPU wait twice the throttled time. So while it is throttled, the wait beside
        an idle CPU (:attr:`idle_wait_ns`) stands for it when larger: a pod with a bursty side job at its
        quota waited 234 of 293 ms/s beside an idle CPU with 126 ms/s throttled (0.43 of the wait), and
        read "no known cause" on most ticks (bench self-throttle-bursty, 2026-11-29)."""
        row = self.row
        if row.throttled_ms_per_s is not None and row.runq_wait_ms_per_s > 0.5:
            share = row.throttled_ms_per_s / row.runq_wait_ms_per_s
            if row.throttled_ms_per_s > 0 and self.total_wait_ns > 0:
                share = max(share, self.idle_wait_ns / self.total_wait_ns)
            return min(1.0, share)
        if row.throttled_ratio is not None and row.throttled_ratio >= 0.5:
            return row.throttled_ratio
        return 0.0


@dataclass(frozen=True)
class Verdict:
    cause: str  # the cause module's NAME; detector.causes.decide returns it as its Cause member
    confidence: float
    culprits: list[Culprit] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)  # what the rule used, beyond the breaches
    findings: tuple[str, ...] = ()  # structured codes of what the rule found (Incident.findings)
    # The part of the victim's wait this cause explains (0..1), from the wait's split: the ranking's key
    # (detector.causes.decide). Each rule gives its own; see the module docstring for the convention.
    share: float = 0.0


Rule = Callable[[CauseContext], Verdict | None]
KernelWorkJudge = Callable[[CauseContext], bool]


@dataclass(frozen=True)
class ActContext:
    """What a cause's engine step may read besides the incident: the policy and the engine's suppress
    amount for a culprit (cpuset off the victim's CPUs, or a cfs quota)."""

    policy: Policy
    suppress_amount: Callable[[Culprit], SuppressAmount]
    victim_signal: str = VICTIM_SIGNAL  # what its decisions are verified on (CauseSpec.verify_signal)


# The engine's step for an incident of a cause (its top culprit, or None): a decision, several, or none.
Act = Callable[[Incident, Culprit | None, ActContext], Decision | list[Decision] | None]


@dataclass(frozen=True)
class CauseSpec:
    """One cause, declared once: how it is recognised, how it reads to a human, what is done about it."""

    cause: str  # its NAME: the registry makes it a member of the Cause enum
    rule: Rule
    title: str  # the HTML report's heading: "<victim> suffers from <title>"
    advice: str  # what would help, for diagnose's text and HTML
    # Not a neighbour's doing: the sentence the HTML gives instead of culprits (the text says "none
    # (not a neighbour's doing)"); None: a neighbour may be at fault ("none attributed" when none is).
    blameless: str | None = None
    act: Act | None = None  # the engine's step when an incident opens or its top culprit changes
    # The planner's steps beyond the engine's (detector/causes/plan.py): ``plan`` on each tick of an open
    # incident of this cause; ``ladder``, a factory of a stateful plan that runs on every open incident and
    # hears every action's result (neighbor_cpu's quota -> cpuset -> evict, per victim and culprit).
    plan: Plan | None = None
    ladder: Callable[[], Ladder] | None = None
    # Outcome code -> the once-per-incident step (PlanContext.mark) a refusal of it lets the plan take again.
    retry_when_refused: Mapping[str, str] = field(default_factory=dict)
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
    # Whether the node does that kernel work on the victim's CPUs beyond the usual this tick (softirq time
    # there past its SLO; kswapd reclaiming for the node): then the node's whole share of the victim's wait
    # is kernel work (CauseContext.kernel_work_share, every cause's share reads it). None: no judgement.
    kernel_work_busy: KernelWorkJudge | None = None
    # Its evidence comes from outside the node and comes and goes (steal): an incident opened with this
    # cause takes a later tick's cause that names pods, whatever the first confidence (its rule comes
    # before theirs, so on that tick it no longer explains the wait; the pods are what can be acted on).
    yields_to_pods: bool = False
    # Its own culprit finder over a node reading beside the probes, which the agent takes on this cause's
    # trouble and hooks in by the cause's NAME (CulpritSource). None: it reads none.
    culprit_source: CulpritSourceSpec | None = None
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
