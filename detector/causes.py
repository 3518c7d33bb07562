"""Why a victim suffers: an ordered list of small rules, the first that holds names the cause.

Each rule is one function ``rule(ctx) -> Verdict | None``: it reads the victim's signals through
:class:`CauseContext`, and when it holds it returns the cause, a confidence, the ranked culprits and
the evidence it used (which the incident carries next to the breaches). The order protects
neighbours from false blame: what the victim does to itself (its own CPU limit, its own threads)
is ruled on before anyone else is blamed. Adding a cause is one rule in :data:`RULES` and one test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from detector.decisions import Cause
from detector.model import Culprit, Evidence
from detector.signals import NodeSignals, WorkloadSignals

if TYPE_CHECKING:
    from detector.policy import SloThresholds

SELF_THROTTLE_SHARE = 0.5  # throttled time explains at least this share of its runqueue wait, or
SELF_THROTTLE_RATIO = 0.9  # ... it was throttled in at least this share of its CFS periods
FOREIGN_MINORITY = 0.5  # ... and other cgroups ran for less than this share of its wait
SELF_CONTENTION_SHARE = 0.5  # its own threads ran for at least this share of its wait
ROOT_CGROUP = "/"  # the workload key of the node's processes outside any pod
NEIGHBOR_SHARE = 0.3  # foreign cgroups ran for at least this share of its wait
KSWAPD_ACTIVE_PAGES_PER_S = 2560.0  # kswapd reclaimed 10 MiB/s or more: the node is in global reclaim


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
    _memo: dict = field(default_factory=dict)

    @property
    def runq_breach(self) -> bool:
        return bool(self.breached & {"runq_p99_ns", "psi_cpu_some"})

    @property
    def foreign_share(self) -> float:
        return sum(self.foreign.values()) / self.total_wait_ns if self.total_wait_ns > 0 else 0.0

    @property
    def node_share(self) -> float:
        """Share of its wait behind the root cgroup: the node's own processes, kernel threads included."""
        return self.foreign.get(ROOT_CGROUP, 0.0) / self.total_wait_ns if self.total_wait_ns > 0 else 0.0

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


Rule = Callable[[CauseContext], Verdict | None]


def _quota(q: float | None) -> str:
    return "no quota" if q is None else f"quota {q:.2f} cores"


def self_throttling(ctx: CauseContext) -> Verdict | None:
    """It sits at its own CPU limit (the pod's, or one container's): throttled time explains most of
    its wait, or it is throttled in most periods and most of its wait is not behind other cgroups."""
    if not ctx.runq_breach:
        return None
    row, dt = ctx.row, ctx.row.interval_s
    not_foreign = ctx.foreign_share < FOREIGN_MINORITY
    ratio = row.throttled_ratio or 0.0
    pod_hit = ctx.throttle_share >= SELF_THROTTLE_SHARE or (ratio >= SELF_THROTTLE_RATIO and not_foreign)
    # A limit on one container only (the pod has none unless every container has one).
    limited = [c for c in row.containers.values() if c.quota_cores is not None]
    wait = row.runq_wait_ms_per_s
    hit = [c for c in limited
           if (c.throttled_ratio >= SELF_THROTTLE_RATIO and not_foreign)
           or (wait > 0.5 and c.throttled_ms_per_s / wait >= SELF_THROTTLE_SHARE)]
    if not pod_hit and not hit:
        return None
    used = [Evidence("who_ran_instead_foreign_share", round(ctx.foreign_share, 4), ctx.window_s,
                     threshold=FOREIGN_MINORITY, note="wait behind other cgroups (must be a minority)")]
    for c in sorted(hit, key=lambda c: -c.throttled_ratio):
        used.append(Evidence("container_throttled_ratio", round(c.throttled_ratio, 4), dt,
                             threshold=SELF_THROTTLE_RATIO,
                             note=f"container {c.name} at its own limit: {_quota(c.quota_cores)}, "
                                  f"{c.cpu_cores:.2f} cores used, throttled {c.throttled_ms_per_s:.0f} ms/s"))
    share = max([ctx.throttle_share, ratio if pod_hit else 0.0, *(c.throttled_ratio for c in hit)])
    return Verdict(Cause.SELF_THROTTLING, min(1.0, share), [], used)


def reclaim(ctx: CauseContext) -> Verdict | None:
    """It stalls in reclaim in its own allocations, or global reclaim's kswapd runs on its CPUs.

    kswapd is a kernel thread (the root cgroup): while the node reclaims in the background, the
    victim's wait behind "the node's own processes" is kswapd's, and the pods that grew caused it.
    """
    row = ctx.row
    if ctx.breached & {"reclaim_stall_ms_per_s", "psi_memory_some"} and row.reclaim_stall_ms_per_s > 0:
        confidence = min(1.0, row.reclaim_stall_ms_per_s / (2 * ctx.slo.reclaim_stall_ms_per_s))
        return Verdict(Cause.RECLAIM, confidence, ctx.reclaim_culprits(ctx.key, row, ctx.signals, None))
    kswapd = ctx.signals.kswapd_pages_per_s
    node_share = ctx.node_share
    if not (ctx.runq_breach and kswapd >= KSWAPD_ACTIVE_PAGES_PER_S and node_share >= NEIGHBOR_SHARE):
        return None
    return Verdict(Cause.RECLAIM, min(1.0, node_share), ctx.reclaim_culprits(ctx.key, row, ctx.signals, True), [
        Evidence("kswapd_pages_per_s", round(kswapd, 1), row.interval_s, threshold=KSWAPD_ACTIVE_PAGES_PER_S,
                 note="the node reclaims in the background (global reclaim)"),
        Evidence("who_ran_instead_node_share", round(node_share, 4), ctx.window_s, threshold=NEIGHBOR_SHARE,
                 note="kernel threads (root cgroup: kswapd) ran on its CPUs while it waited"),
    ])


def softirq(ctx: CauseContext) -> Verdict | None:
    limit = ctx.slo.softirq_ms_per_s
    row = ctx.row
    if not (ctx.breached & {"softirq_ms_per_s", "softirq_delay_p99_ns"}
            or (ctx.runq_breach and row.softirq_ms_per_s >= limit)):
        return None
    confidence = min(1.0, row.softirq_ms_per_s / (2 * limit))
    used = [Evidence("softirq_ms_per_s", row.softirq_ms_per_s, row.interval_s, threshold=limit,
                     note=f"on CPUs {sorted(row.cpu_weights)}")]
    return Verdict(Cause.SOFTIRQ, confidence, ctx.cpu_culprits(ctx.key, ctx.foreign, ctx.total_wait_ns), used)


def self_contention(ctx: CauseContext) -> Verdict | None:
    """Its own threads fill the CPUs it may use: most of its wait is behind its own tasks (who ran
    instead), more than behind anyone else; throttled or not."""
    row = ctx.row
    if not ctx.runq_breach or not row.who_ran_instead_available:
        return None
    own, foreign = ctx.own_share, ctx.foreign_share
    if own < SELF_CONTENTION_SHARE or own <= foreign:
        return None
    allowed = [n for n in (row.cpus_allowed, row.quota_cores) if n]
    capacity = min(allowed) if allowed else None
    note = f"{row.cpu_cores or 0:.2f} cores used" + (f" of {capacity:.2f} it may use" if capacity else "")
    if row.cpus_allowed:
        note += f" (cpuset of {row.cpus_allowed} CPU{'s' if row.cpus_allowed > 1 else ''}, {_quota(row.quota_cores)})"
    used = [
        Evidence("who_ran_instead_own_share", round(own, 4), ctx.window_s, threshold=SELF_CONTENTION_SHARE, note=note),
        Evidence("who_ran_instead_foreign_share", round(foreign, 4), ctx.window_s),
    ]
    return Verdict(Cause.SELF_CONTENTION, own, [], used)


def neighbor_cpu(ctx: CauseContext) -> Verdict | None:
    row = ctx.row
    if not ctx.runq_breach:
        return None
    if row.who_ran_instead_available:
        if ctx.foreign_share < NEIGHBOR_SHARE:
            return None
        culprits = ctx.cpu_culprits(ctx.key, ctx.foreign, ctx.total_wait_ns)
        confidence = ctx.foreign_share
        node_share = ctx.node_share
        if not culprits and node_share >= NEIGHBOR_SHARE:
            # The node's own processes (the root cgroup: system daemons, kernel threads) ran instead.
            # The cause is known; there is no pod to blame or act on, so no culprit.
            return Verdict(Cause.NEIGHBOR_CPU, min(1.0, confidence), [], [
                Evidence("who_ran_instead_foreign_share", round(ctx.foreign_share, 4), ctx.window_s,
                         threshold=NEIGHBOR_SHARE),
                Evidence("who_ran_instead_node_share", round(node_share, 4), ctx.window_s,
                         note="the node's own processes outside pods (root cgroup) ran on its CPUs")])
    else:
        culprits = ctx.correlation_culprits(ctx.key, ctx.signals)
        confidence = 0.5 * culprits[0].score if culprits else 0.0
    if not culprits:
        return None
    used = [Evidence("who_ran_instead_foreign_share", round(ctx.foreign_share, 4), ctx.window_s,
                     threshold=NEIGHBOR_SHARE)] if row.who_ran_instead_available else []
    return Verdict(Cause.NEIGHBOR_CPU, min(1.0, confidence), culprits, used)


def network_connect(ctx: CauseContext) -> Verdict | None:
    if not ctx.breached & {"connect_p99_ns", "syn_retransmits_per_s"}:
        return None
    row, dt = ctx.row, ctx.row.interval_s
    servers, more = ctx.connect_servers(ctx.key)
    return Verdict(Cause.NETWORK_CONNECT, 0.7, servers, [
        Evidence("connect_failures_per_s", row.connect_failures_per_s, dt),
        Evidence("syn_retransmits_per_s", row.syn_retransmits_per_s, dt),
        *more,
    ])


def psi_unknown(ctx: CauseContext) -> Verdict:
    return Verdict(Cause.PSI_UNKNOWN, 0.3)


# Evaluated in this order; the first verdict wins. psi_unknown always holds (the fallback).
RULES: tuple[Rule, ...] = (self_throttling, reclaim, softirq, self_contention, neighbor_cpu, network_connect,
                           psi_unknown)


def decide(ctx: CauseContext, rules: tuple[Rule, ...] = RULES) -> Verdict:
    for rule in rules:
        verdict = rule(ctx)
        if verdict is not None:
            return verdict
    return psi_unknown(ctx)
