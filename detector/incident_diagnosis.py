# SPDX-License-Identifier: Apache-2.0
"""A victim's windows, its breaches and the diagnosis of its wait, for the incident engine (split out of
``detector/incidents.py``, issue 42).

- Breach: a signal crosses its absolute SLO, or is k sigma above its own baseline while also at least
  half way to the SLO (so a quiet pod with a tight baseline does not page anyone over 200 µs); connect
  trouble is judged over a window of ticks.
- Diagnosis: the cause rules (``detector.causes``), ranked by the share of the wait each explains, in an
  order that protects neighbours from false blame; the evidence is the breaches, the victim's context
  and what the deciding rule used.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from detector import causes
from detector.baseline import Baselines
from detector.catalog import SLO_SIGNALS, signal
from detector.counterfactual import with_kernel_work
from detector.decisions import Cause
from detector.incident_culprits import CulpritFinder
from detector.model import Culprit, CulpritCost, Evidence, Incident
from detector.policy import SloThresholds
from detector.signals import CONTEXT_SIGNALS, IDLE, UNKNOWN, WINDOW_SIGNALS, NodeSignals, WorkloadSignals
from detector.workloads import key_of

CULPRIT_WINDOW_TICKS = 10  # who-ran-instead shares are summed over this many recent ticks
# A culprit that ran instead of the victim earlier in the window and in none of its last GONE_AFTER_TICKS
# ticks (moved off its CPUs, stopped, gone) no longer carries those waits into the cause shares of an open
# incident (:func:`diagnose`, ``current``): the cause follows what explains the wait now. softirq-starve:
# the BE pod moved off the victim's CPU kept the incident neighbor_cpu for ~10 s while its pre-move waits
# aged out of the window, and softirq's traffic cap came after the bench's scoring window (issue 41).
# Three ticks: a neighbour that pauses between bursts keeps its case through pauses of 2 ticks whatever
# the other cause (a surer one takes over the tick it is decided, IncidentEngine._update), and through 4
# when the other must be decided CAUSE_CHANGE_TICKS (3) ticks in a row: a burst every 2.5 s (the period
# of cpu-neighbor-shared's 10-30 ms bursts) leaves at most 2 ticks of 1 s between bursts. The cause changes
# 3 to 5 ticks after the culprit's last run.
GONE_AFTER_TICKS = 3
# Connect failures and SYN retransmits are judged over the connect SLO's window of recent ticks.
CONNECT_WINDOW_TICKS = signal("connect_p99_ns").window_ticks
# The SLOs judged over a window of recent ticks (Slo.window_ticks: the worst of their readings).
WINDOWED_SLOS = tuple(s for s in SLO_SIGNALS if s.window_ticks)


class Recent(list):
    """A victim's last ``maxlen`` values of one kind, oldest first: a list that drops its oldest past
    ``maxlen``, as a deque with a maxlen does. A deque holds a block of 64 slots whatever its maxlen (760
    bytes empty); a VictimState held a dozen, 1.6 MiB of the agent's 300-pod RSS (gc census)."""

    __slots__ = ("maxlen",)

    def __init__(self, maxlen: int) -> None:
        super().__init__()
        self.maxlen = maxlen

    def append(self, value: object) -> None:
        super().append(value)
        if len(self) > self.maxlen:
            del self[0]

    def extend(self, values: Iterable[object]) -> None:
        super().extend(values)
        if len(self) > self.maxlen:
            del self[: len(self) - self.maxlen]


def _recent() -> Recent:
    return Recent(CULPRIT_WINDOW_TICKS)


@dataclass
class VictimState:
    order: int = 0  # its place among the engine's victims (they are walked in the order they came)
    breach_ticks: int = 0
    clear_ticks: int = 0
    incident: Incident | None = None
    recent_ran_instead: Recent = field(default_factory=_recent)
    recent_wait_ns: Recent = field(default_factory=_recent)
    recent_own_wait_ns: Recent = field(default_factory=_recent)
    recent_own_by_container: Recent = field(default_factory=_recent)
    # ns per tick of the plugins' signals summed over the window (SignalSpec.summed_over_window), by name
    recent_window_ns: dict[str, Recent] = field(
        default_factory=lambda: {name: Recent(CULPRIT_WINDOW_TICKS) for name in WINDOW_SIGNALS})
    # ns of its waits the node's kernel work ran in (softirq work, kernel threads: the node pair's cf_node_ns)
    recent_kernel_work_ns: Recent = field(default_factory=_recent)
    # The verify signals of its breach ticks (the current breach, or the open incident's): what the
    # incident's actions are verified against (Incident.breach_signals).
    breach_signals: Recent = field(default_factory=_recent)
    # Who ran instead of it on each of those breach ticks (workload keys): a step on a culprit is verified
    # against the breach ticks the culprit ran on, not ticks before it came (cpu-neighbor-shared after a
    # breach behind another pod: a cpuset judged against 4 ticks before the hog, "-20 %", was undone).
    breach_ran: Recent = field(default_factory=_recent)
    # (cause, top culprit, within its request, BE culprits that may be moved) the last decisions were made for
    decided: tuple | None = None
    # Another cause than the open incident's, and the breach ticks in a row it was decided on.
    other_cause: tuple[Cause, int] | None = None
    incident_ticks: int = 0  # breach ticks of the open incident since it opened
    cpus: tuple[int, ...] = ()  # CPUs the victim ran on lately (weight > 5 %), for a cpuset suppress
    # (failed connects, SYN retransmits) per recent tick: connect trouble is sparse (a client blocked 1-3 s
    # in a SYN retry makes one event every few ticks), so it is judged over a window.
    recent_connect: Recent = field(default_factory=lambda: Recent(CONNECT_WINDOW_TICKS))
    # The readings of the SLOs judged over a window (WINDOWED_SLOS), by signal, per recent tick.
    recent_slo: dict[str, Recent] = field(
        default_factory=lambda: {s.name: Recent(s.window_ticks) for s in WINDOWED_SLOS})

    def add_tick(self, row: WorkloadSignals, node_key: str) -> None:
        """The row's wait, who ran instead and kernel work into the recent windows."""
        self.recent_ran_instead.append(dict(row.ran_instead_ns))
        self.recent_wait_ns.append(row.runq_wait_ms_per_s * 1e6 * row.interval_s)
        self.recent_own_wait_ns.append(row.own_wait_ns)
        self.recent_own_by_container.append(row.own_wait_by_container)
        for name, recent in self.recent_window_ns.items():
            recent.append(getattr(row, name) * 1e6 * row.interval_s)
        self.recent_kernel_work_ns.append(row.cf_node_ns.get(node_key, 0.0))
        dt = row.interval_s
        self.recent_connect.append((row.connect_failures_per_s * dt, row.syn_retransmits_per_s * dt))
        for sig in WINDOWED_SLOS:
            self.recent_slo[sig.name].append(sig.tick_value(row) or 0.0)

    def gone_culprits(self, key: str) -> set[str]:
        """Who ran instead of it (``key``: the victim) earlier in the window and in none of its last
        GONE_AFTER_TICKS ticks: moved off its CPUs, stopped or gone."""
        ticks = self.recent_ran_instead
        if len(ticks) <= GONE_AFTER_TICKS:
            return set()
        latest = {k for tick in ticks[-GONE_AFTER_TICKS:] for k, ns in tick.items() if ns > 0}
        earlier = {k for tick in ticks[:-GONE_AFTER_TICKS] for k, ns in tick.items() if ns > 0}
        return earlier - latest - {IDLE, UNKNOWN, key}


@dataclass(frozen=True)
class Breach:
    signal: str
    value: float
    threshold: float
    baseline: float | None = None
    rule: str = "slo"  # "slo" | "k_sigma"


def breaches(key: str, row: WorkloadSignals, state: VictimState, slo: SloThresholds, baselines: Baselines) -> list[Breach]:
    """The signals of ``row`` that breach this tick (SLO or k sigma), and a broken connect path."""
    out: list[Breach] = []
    for sig in SLO_SIGNALS:  # catalog order; each SLO's gate says whether this tick's reading counts
        value = sig.breach_value(row, state.recent_slo.get(sig.name, ()))
        threshold = sig.threshold(slo)
        if value is None or math.isnan(value) or threshold is None:
            continue
        if value > threshold:
            out.append(Breach(sig.name, value, threshold, _baseline_value(key, sig.name, slo, baselines)))
            continue
        if not sig.k_sigma or value < threshold / 2:
            continue
        score = baselines.score(key, sig.name, value)
        if score is not None and score > slo.k_sigma:
            out.append(Breach(sig.name, value, threshold, _baseline_value(key, sig.name, slo, baselines),
                              rule="k_sigma"))
    window = state.recent_connect
    failed = sum(f for f, _ in window)
    retransmits = sum(r for _, r in window)
    # SYNs dropped (each retransmit is a second or more added to a connect) and connects given up,
    # or SYNs dropped again and again: the connect path is broken.
    if retransmits >= 2 or (retransmits >= 1 and failed >= 1):
        out.append(Breach("syn_retransmits_per_s", retransmits / (len(window) * row.interval_s), 0.0,
                          rule=f"{failed:.0f} failed, {retransmits:.0f} SYN retransmits in {len(window)} ticks"))
    return out


def _baseline_value(key: str, signal: str, slo: SloThresholds, baselines: Baselines) -> float | None:
    b = baselines.get(key, signal)
    return None if b is None or b.n < slo.min_baseline_samples else b.ewma


def diagnose(key: str, row: WorkloadSignals, state: VictimState, found: list[Breach], signals: NodeSignals,
             slo: SloThresholds, finder: CulpritFinder,
             current: bool = False) -> tuple[Cause, float, list[Culprit], list[Evidence], list[str]]:
    """The cause rules (``detector.causes``), ranked by the share of the wait each explains; the
    evidence is the breaches, the victim's context (wait, throttling, the plugins' context signals) and what the
    deciding rule used; the findings are the deciding rule's and every cause's context codes of this
    tick.

    ``current`` (an open incident's re-evaluation, and its successor's diagnosis): the waits of culprits
    gone for GONE_AFTER_TICKS leave the causes' shares (:func:`recent_ran_instead`); the culprits are still
    ranked over the whole window, so whom the incident names (and acts on) is as before. A fresh
    incident's first cause is decided over the whole window."""
    dt = row.interval_s
    ran, total_wait, kernel_work = recent_ran_instead(state)
    gone = state.gone_culprits(key) if current else set()
    # The rules' culprit ranking: over the split they pass, or, while gone culprits are out of that split,
    # over the whole window (WholeWindowCulprits).
    cpu_culprits: Callable[[str, dict[str, float], float], list[Culprit]] = finder.cpu_culprits
    gone_evidence: list[Evidence] = []
    if gone:
        cpu_culprits = WholeWindowCulprits(finder, {k: v for k, v in ran.items() if k not in (IDLE, UNKNOWN, key)},
                                           total_wait)
        gone_evidence.append(_gone_evidence(finder, gone, ran, total_wait, dt * len(state.recent_wait_ns)))
        ran, total_wait, kernel_work = recent_ran_instead(state, gone)
    foreign = {k: v for k, v in ran.items() if k not in (IDLE, UNKNOWN, key)}
    ctx = causes.CauseContext(
        key=key, row=row, signals=signals, slo=slo, breached={b.signal for b in found},
        foreign=foreign, own_wait_ns=sum(state.recent_own_wait_ns), total_wait_ns=total_wait,
        own_by_container=summed(state.recent_own_by_container),
        window_ns={name: sum(recent) for name, recent in state.recent_window_ns.items()},
        window_s=dt * len(state.recent_wait_ns), cpu_culprits=cpu_culprits,
        correlation_culprits=finder.correlation_culprits, kernel_work_judges=causes.KERNEL_WORK_JUDGES,
        history=finder,
        culprit_hooks=finder.culprit_hooks, node_key=finder.node_key,
        kernel_work_ns=kernel_work, idle_wait_ns=ran.get(IDLE, 0.0),
    )
    verdict = causes.decide(ctx)
    culprits = verdict.culprits
    kernel_work = causes.spec(verdict.cause).kernel_work
    if kernel_work:
        culprits = with_kernel_work(culprits, lambda c: finder.counterfactual.cost(key, key_of(c.target), True),
                                    kernel_work)
    evidence = [
        Evidence(b.signal, b.value, dt, threshold=b.threshold, baseline=b.baseline, note=b.rule) for b in found
    ]
    context = [Evidence("runq_wait_ms_per_s", row.runq_wait_ms_per_s, dt)]
    if row.throttled_ms_per_s is not None:
        quota = "no quota" if row.quota_cores is None else f"quota {row.quota_cores:.2f} cores"
        context.append(Evidence("throttled_ms_per_s", row.throttled_ms_per_s, dt,
                                note=f"throttled ratio {row.throttled_ratio or 0:.2f}, {quota}"))
    if row.who_ran_instead_available:
        context.append(Evidence("who_ran_instead_foreign_share", ctx.foreign_share, ctx.window_s))
    for spec in CONTEXT_SIGNALS:  # the probe plugins' (SignalSpec.context_note)
        if value := getattr(row, spec.name):
            context.append(Evidence(spec.name, value, dt, note=spec.context_note(row)))  # type: ignore[misc]
    used = {e.signal for e in verdict.evidence}
    evidence += [e for e in context if e.signal not in used] + list(verdict.evidence) + gone_evidence
    findings = [*verdict.findings, *(f for spec in causes.CAUSES if spec.context for f in spec.context(row))]
    return verdict.cause, verdict.confidence, culprits, evidence, findings


def kernel_work_cost(key: str, cause: Cause, finder: CulpritFinder) -> CulpritCost | None:
    """The victim without the kernel work its cause declares (None: it declares none)."""
    return finder.counterfactual.kernel_work_cost(key) if causes.spec(cause).kernel_work else None


def recent_ran_instead(state: VictimState, gone: Collection[str] = frozenset(),
                       ) -> tuple[dict[str, float], float, float]:
    """Who ran instead of the victim over its recent ticks (workload key -> ns), its total wait and the kernel
    work in it (ns). With ``gone`` (culprits gone since, :meth:`VictimState.gone_culprits`), the waits behind
    them are taken out of each tick: those are history, not what it waits behind now. The kernel work of a
    tick then shrinks with its wait (the probe does not say on top of whose slices it ran; an even spread is
    the guess), so softirq's share is not inflated by the work that ran on top of the gone culprit's slices."""
    ran: dict[str, float] = defaultdict(float)
    total = kernel = 0.0
    for tick, wait, work in zip(state.recent_ran_instead, state.recent_wait_ns, state.recent_kernel_work_ns,
                                strict=True):
        left = wait
        for k, v in tick.items():
            if k in gone:
                left -= v
            else:
                ran[k] += v
        if gone:
            left = max(0.0, left)
            work = work * left / wait if wait > 0 else work
        total += left
        kernel += work
    return ran, total, kernel


@dataclass(frozen=True)
class WholeWindowCulprits:
    """The culprit ranking over the victim's whole window (``CauseContext.cpu_culprits`` while culprits gone
    since are left out of the causes' shares): it ranks ``foreign`` over ``total_wait``, the whole window's,
    and does not read the split a rule passes, which has the gone culprits' waits taken out. So a gone
    culprit stays named: it is whom the victim waited behind, and what the incident's steps and ladder act
    on."""

    finder: CulpritFinder
    foreign: dict[str, float]  # the whole window's who-ran-instead, workload key -> ns (idle, unknown, the victim out)
    total_wait: float  # the whole window's wait (ns)

    def __call__(self, key: str, _split_foreign: dict[str, float], _split_total_wait: float) -> list[Culprit]:
        return self.finder.cpu_culprits(key, self.foreign, self.total_wait)


def _gone_evidence(finder: CulpritFinder, gone: set[str], ran: dict[str, float], total_wait: float,
                   window_s: float) -> Evidence:
    """Which culprits' waits the shares leave out, and their share of the window's wait."""
    gone_ns = sum(ran.get(k, 0.0) for k in gone)
    names = ", ".join(sorted(finder.target(k).display for k in gone))
    return Evidence("gone_culprit_wait_share", round(gone_ns / total_wait, 4) if total_wait > 0 else 0.0, window_s,
                    note=f"{names}: ran instead of it earlier and in none of its last {GONE_AFTER_TICKS} ticks; "
                         "left out of the causes' shares")


def summed(ticks: Iterable[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for tick in ticks:
        for k, v in tick.items():
            out[k] += v
    return dict(out)
