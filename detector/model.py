# SPDX-License-Identifier: Apache-2.0
"""The detector's output records: incidents with victim, cause, ranked culprits and evidence.

These are plain data so the CLI report, the exporter, Kubernetes Events and the incident log all
read the same thing; the logic that fills them lives in ``detector/incidents.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from detector.decisions import Decision, Target

if TYPE_CHECKING:
    from detector.causes import Cause


@dataclass(frozen=True, slots=True)
class Evidence:
    """One number behind a conclusion, with the window it was measured over."""

    signal: str  # e.g. "runq_p99_ns", "who_ran_instead_share", "throttled_ratio"
    value: float
    window_s: float
    threshold: float | None = None  # the SLO or k-sigma bound it was compared with
    baseline: float | None = None
    note: str = ""
    container: str = ""  # the container it is about (self causes: the one waited behind or at its limit)


@dataclass(frozen=True, slots=True)
class CulpritCost:
    """The victim over the culprit window (detector/counterfactual.py), with and without one culprit (or
    without the kernel work in its waits)."""

    p99_ns: float
    p99_without_ns: float
    wait_ms_per_s: float
    wait_ms_per_s_without: float

    @property
    def added_ns(self) -> float:
        return max(self.p99_ns - self.p99_without_ns, 0.0)


@dataclass(frozen=True, slots=True)
class TaskShare:
    """One of the node's own processes (outside any pod) and its share of their CPU time (detector/node_tasks.py)."""

    pid: int
    comm: str
    cpu_share: float  # of the node's processes' CPU time over the last tick


@dataclass(frozen=True, slots=True)
class Culprit:
    target: Target
    score: float  # 0..1, combined; culprits are sorted by it, highest first
    who_ran_instead_share: float = 0.0  # share of the victim's wait during which this cgroup ran on the CPU
    correlation: float = 0.0  # CPI2-style: suspect CPU use vs victim latency over the window
    attribution: float = 0.0  # reclaim/softirq attribution share where the cause has one
    cpu_cores: float = 0.0  # its CPU use over the window
    cpu_request_cores: float | None = None  # its CPU request (pods; None: unknown, e.g. standalone)
    above_request: bool | None = None  # uses more CPU than it requested (None: request unknown)
    note: str = ""  # e.g. "busy within its request"
    # The counterfactual (detector/counterfactual.py): the victim's runqueue p99 and wait per second over
    # the culprit window, and the same with this culprit's share of each wait taken out (None: not known).
    victim_runq_p99_ns: float | None = None
    runq_p99_without_ns: float | None = None
    victim_wait_ms_per_s: float | None = None
    wait_ms_per_s_without: float | None = None
    # Those two also without the kernel work it caused, named ("softirq work", "kswapd, kcompactd, kdamond": the cause's
    # CauseSpec.kernel_work), those kernel threads' part of the victim's waits; "": its own share only.
    without_kernel_work: str = ""
    # The node (its processes outside any pod) as a culprit: its top commands and their share of its CPU time.
    tasks: tuple[TaskShare, ...] = ()


# What an on_incident hook is told with the incident (detector/incidents.py): "opened", "updated" (a breach
# tick of an open incident), CLEAN (a tick of an open incident without a breach: one of its clear windows,
# so a ladder whose step was undone goes on while the incident lives) and "closed". Logs keep TRANSITIONS.
CLEAN = "clean"
TRANSITIONS = ("opened", "closed")


@dataclass
class Incident:
    incident_id: str
    victim: Target
    cause: Cause
    started_at: float
    confidence: float  # 0..1
    signal: str  # the signal that broke its SLO
    culprits: list[Culprit] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    ended_at: float | None = None
    updated_at: float = 0.0
    actions: list[str] = field(default_factory=list)  # action ids taken for it
    # Structured codes of what the cause rules found in the latest tick (detector/causes, e.g.
    # "reclaim.direct"): what the planner keys on, never the evidence's wording.
    findings: list[str] = field(default_factory=list)
    # A cause that declares kernel work (CauseSpec.kernel_work): the victim without that work in its
    # waits, whoever caused it, refreshed every tick; what the planner costs a culprit with when it names
    # one the detector could not (the sender whose packets ksoftirqd processes). None: no such cause.
    kernel_work_cost: CulpritCost | None = None
    # The victim's verify signals over its breach (detector.incidents.VERIFY_SIGNALS: the median of each
    # over the breach ticks, at most the culprit window), refreshed every breach tick: what an action
    # taken for this incident is verified against (Decision.victim_before).
    breach_signals: dict[str, float] = field(default_factory=dict)
    # The culprits its step moved together (two BE hogs suppressed at once), and the victim over the
    # culprit window without all of them (detector/counterfactual.py), refreshed every tick; empty / None
    # where it moved one or none (each culprit's own cost says that one).
    moved_together: list[Target] = field(default_factory=list)
    moved_together_cost: CulpritCost | None = None
    # The CPUs the victim ran on lately (more than 5 % of its time), refreshed every tick: what the
    # neighbour ladder's cpuset step keeps its culprit off.
    victim_cpus: list[int] = field(default_factory=list)
    # A cause that changed while the victim kept breaching closes the incident and opens the next one for
    # the new cause (detector/incidents.py, CAUSE_CHANGE_TICKS): the two are linked both ways, and the
    # closed one's "closed" evidence says what the cause became.
    follows: str | None = None  # the incident this one took over from (its cause changed)
    superseded_by: str | None = None  # the incident that took over from this one

    @property
    def moved_together_names(self) -> str:
        """The pods its step moved together, as one name for the reports ('batch and batch-small')."""
        return " and ".join(t.display for t in self.moved_together)

    def for_verification(self, decision: Decision) -> Decision:
        """``decision`` with the victim's signal over this breach as its verification baseline, where it
        watches this incident's victim and no baseline was set."""
        if decision.victim_before is not None or decision.victim != self.victim or not decision.victim_signal:
            return decision
        before = self.breach_signals.get(decision.victim_signal)
        return decision if before is None else replace(decision, victim_before=before)

    @property
    def open(self) -> bool:
        return self.ended_at is None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cause"] = str(self.cause)
        d["victim"]["display"] = self.victim.display
        for c, obj in zip(d["culprits"], self.culprits, strict=True):
            c["target"]["display"] = obj.target.display
        return d
