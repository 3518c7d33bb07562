# SPDX-License-Identifier: Apache-2.0
"""reclaim: the victim stalls in reclaim in its own allocations, or global reclaim's kswapd runs on its
CPUs. Global reclaim is blamed on the pods holding and growing memory: the planner evicts the top BE one
(evict_enabled), else caps its memory; reclaim at the victim's own limit is advice only."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from detector.causes.base import (
    CULPRIT_MIN_SCORE,
    MAX_CULPRITS,
    ROOT_CGROUP,
    CauseContext,
    CauseSpec,
    Verdict,
)
from detector.causes.neighbor_cpu import NEIGHBOR_SHARE  # kernel threads (kswapd) ran for this share of its wait
from detector.causes.plan import Note, NoteKey, PlanContext, PlanStep, Submit
from detector.decisions import ActionKind, Decision, EvictAmount, MemorySuppressAmount
from detector.model import Culprit, Evidence, Incident
from detector.signals import NodeSignals, WorkloadSignals

NAME = "reclaim"  # its member of the Cause enum, which the registry builds (detector/causes/__init__.py)
KSWAPD_ACTIVE_PAGES_PER_S = 2560.0  # kswapd scanned or reclaimed 10 MiB/s or more: the node is in global reclaim
GROWTH_WINDOW_S = 60.0  # the pods' memory growth is measured over this window

# Findings (Incident.findings, refreshed every tick): the node reclaims, not only the victim's memcg.
KSWAPD = "reclaim.kswapd"  # kswapd ran on the victim's CPUs while the node reclaimed in the background
DIRECT = "reclaim.direct"  # the victim stalled in direct (global) reclaim this tick
GLOBAL = frozenset({KSWAPD, DIRECT})


def rule(ctx: CauseContext) -> Verdict | None:
    """It stalls in reclaim in its own allocations, or global reclaim's kswapd runs on its CPUs.

    kswapd is a kernel thread (the root cgroup): while the node reclaims in the background, the
    victim's wait behind "the node's own processes" is kswapd's, and the pods that grew caused it.
    """
    row = ctx.row
    if ctx.breached & {"reclaim_stall_ms_per_s", "psi_memory_some"} and row.reclaim_stall_ms_per_s > 0:
        confidence = min(1.0, row.reclaim_stall_ms_per_s / (2 * ctx.slo.reclaim_stall_ms_per_s))
        return Verdict(NAME, confidence, culprits(ctx, None), share=share(ctx))
    node_share = ctx.node_share
    if not (ctx.runq_breach and kswapd_at_work(ctx.signals) and node_share >= NEIGHBOR_SHARE):
        return None
    return Verdict(NAME, min(1.0, node_share), culprits(ctx, True), [
        Evidence("kswapd_pages_per_s", round(ctx.signals.kswapd_pages_per_s, 1), row.interval_s,
                 threshold=KSWAPD_ACTIVE_PAGES_PER_S, note="the node reclaims in the background (global reclaim)"),
        Evidence("kswapd_scanned_pages_per_s", round(ctx.signals.kswapd_scanned_pages_per_s, 1), row.interval_s,
                 threshold=KSWAPD_ACTIVE_PAGES_PER_S, note="kswapd's scanning, which comes before what it reclaims"),
        Evidence("who_ran_instead_node_share", round(node_share, 4), ctx.window_s, threshold=NEIGHBOR_SHARE,
                 note="kernel threads (root cgroup: kswapd) ran on its CPUs while it waited"),
    ], findings=(KSWAPD,), share=share(ctx))


def culprits(ctx: CauseContext, global_reclaim: bool | None) -> list[Culprit]:
    """Global reclaim: the pods by the memory they hold plus what they grew over the last minute (in
    bytes, so a small pod's small growth does not outrank the pod that fills the node); memcg reclaim
    is the pod's own. ``global_reclaim`` None: global when the victim stalled in direct (not memcg)
    reclaim.

    Growth alone misses the usual grower: once the node is full, kswapd takes its pages as fast as
    it charges new ones, so its usage is flat by the time reclaim hurts anyone (and memory.stat of
    an active pod is read every few ticks, so its first reading may already be on that plateau)."""
    if global_reclaim is None:
        global_reclaim = ctx.row.reclaim_by_kind_ms_per_s.get("direct", 0.0) > 0
    if not global_reclaim:
        return []
    history = ctx.history
    growth: dict[str, float] = {}
    held: dict[str, float] = {}
    for ck in ctx.signals.workloads:
        if ck == ctx.key:
            continue
        w = history.recent(ck, "memory_bytes", GROWTH_WINDOW_S)
        if len(w) == 0:
            continue
        held[ck] = max(float(w[-1]), 0.0)
        if len(w) >= 2 and w[-1] > w[0]:
            growth[ck] = float(w[-1] - w[0])
    weight = {ck: held[ck] + growth.get(ck, 0.0) for ck in held}
    total = sum(weight.values())
    found = []
    for ck in held:
        part = weight[ck] / total if total > 0 else 0.0
        found.append(Culprit(history.target(ck), round(part, 4), attribution=round(part, 4),
                             cpu_cores=history.last(ck, "cpu_cores"),
                             note=f"grew {growth.get(ck, 0.0) / 2**20:.0f} MiB in the last minute, "
                                  f"holds {held[ck] / 2**20:.0f} MiB"))
    kept = [c for c in found if c.target.cgroup != ROOT_CGROUP and c.score > CULPRIT_MIN_SCORE]
    kept.sort(key=lambda c: (-c.score, c.target.cgroup))
    return kept[:MAX_CULPRITS]


def kswapd_at_work(signals: NodeSignals) -> bool:
    """kswapd reclaims for the node: it scanned or reclaimed KSWAPD_ACTIVE_PAGES_PER_S or more this tick.
    Its scanning is the CPU time the victim waits behind, and comes first: woken, kswapd scans (and ages
    the active list) before it frees a page, so the tick it starts may count scans and no reclaimed page,
    and a tick of reclaimed pages alone would name the cause one tick after the wait behind it."""
    return max(signals.kswapd_pages_per_s, signals.kswapd_scanned_pages_per_s) >= KSWAPD_ACTIVE_PAGES_PER_S


def busy(ctx: CauseContext) -> bool:
    """kswapd reclaims for the node (CauseSpec.kernel_work_busy): on the victim's CPUs it is kernel work."""
    return kswapd_at_work(ctx.signals)


def share(ctx: CauseContext) -> float:
    """Its part of the victim's delay: the stall in its own allocations against the stall and the
    runqueue wait together (both time it wanted to make progress and did not), and, while kswapd
    reclaims for the node, the kernel work in its waits (kswapd is a root-cgroup thread: the node's
    share counts when larger, see CauseContext.kernel_work_share).
    The larger of the two; the run queue within its SLO, the stall is all that breached."""
    row = ctx.row
    if not ctx.runq_breach:
        return 1.0
    stall, wait = row.reclaim_stall_ms_per_s, row.runq_wait_ms_per_s
    parts = [stall / (stall + wait) if stall > 0 else 0.0]
    if kswapd_at_work(ctx.signals) and row.who_ran_instead_available:
        parts.append(ctx.kernel_work_share)
    return max(parts)


def context(row: WorkloadSignals) -> tuple[str, ...]:
    """Findings of every tick, whichever rule decided: the victim stalled in direct reclaim."""
    return (DIRECT,) if row.reclaim_stall_ms_per_s and "direct" in row.reclaim_by_kind_ms_per_s else ()


def global_reclaim(inc: Incident) -> bool:
    """The incident's latest findings say the node reclaims (kswapd on its CPUs, or its own direct reclaim)."""
    return not GLOBAL.isdisjoint(inc.findings)


EVICT = "reclaim.evict"  # the planner's step with evict_enabled
GLOBAL_NO_POD_YET = "reclaim.global_no_pod_yet"
MEMCG_OWN_LIMIT = "reclaim.memcg_own_limit"
GROWERS_NOT_BE = "reclaim.growers_not_be"
CAP_GROWER = "reclaim.cap_grower"


@dataclass(frozen=True)
class Step:
    """What the planner's memory step concluded: its code, the note for the incident, the decision (if
    any), and whether it is settled for the incident (``final``) or to be looked at again next tick."""

    code: str
    note: str | None
    decision: Decision | None = None
    final: bool = True


def memory_step(inc: Incident, evict_enabled: bool) -> Step:
    """Global reclaim with a BE pod that grew most: evict it when ``evict_enabled``, else cap its memory
    near its usage. The BE one, not the top culprit: a grower of the node's own (a system cgroup) may rank
    above it, and is never touched. Reclaim at the victim's own limit: advice only."""
    if not inc.culprits:
        if global_reclaim(inc):
            # The node reclaims, but no pod is named yet (memory.stat of a pod is read every few
            # ticks): not the victim's own limit. Wait for the engine to name one.
            return Step(GLOBAL_NO_POD_YET, SPEC.say(GLOBAL_NO_POD_YET), final=False)
        return Step(MEMCG_OWN_LIMIT, SPEC.say(MEMCG_OWN_LIMIT, victim=inc.victim.display))
    top = next((c for c in inc.culprits if (c.target.qos or "").upper() == "BE"), None)
    if top is None:
        return Step(GROWERS_NOT_BE, SPEC.say(GROWERS_NOT_BE, pods=", ".join(c.target.display for c in inc.culprits[:3])))
    if evict_enabled:
        return Step(EVICT, None, Decision(
            ActionKind.EVICT, top.target, EvictAmount(reason="interference"),
            SPEC.say(EVICT, culprit=top.target.display, victim=inc.victim.display),
            incident_id=inc.incident_id, victim=inc.victim, victim_signal=SPEC.verify_signal(inc), code=EVICT))
    return Step(CAP_GROWER, None, Decision(
        ActionKind.MEMORY_SUPPRESS, top.target, MemorySuppressAmount(),
        SPEC.say(CAP_GROWER, culprit=top.target.display, share=top.attribution, victim=inc.victim.display),
        incident_id=inc.incident_id, victim=inc.victim, victim_signal=SPEC.verify_signal(inc), code=CAP_GROWER))


MEMORY_STEP = "memory"  # the memory step, settled once per incident (Step.final)


def plan(ctx: PlanContext) -> Iterator[PlanStep]:
    """:func:`memory_step` on each tick until it is settled for the incident."""
    if ctx.done(MEMORY_STEP):
        return
    step = memory_step(ctx.incident, ctx.policy.evict_enabled)
    if step.final:
        ctx.mark(MEMORY_STEP)
    if step.note is not None:
        yield Note(NoteKey(step.code), step.note)
    if step.decision is not None:
        yield Submit(step.decision)


SPEC = CauseSpec(
    NAME, rule,
    title="memory reclaim",
    advice="the victim stalls in memory reclaim: raise its memory limit, or evict the BE pod growing its memory",
    plan=plan,
    context=context,
    kernel_work="kswapd, kcompactd, kdamond",
    kernel_work_busy=busy,
    # A cap or an eviction is judged on the stall it ends: the grower's memory, not the CPU, is what it
    # changes (a victim whose reclaim stopped after a cap has improved though it still waits on kernel work).
    verify_signals=("reclaim_stall_ms_per_s",),
    messages={
        EVICT: "{culprit} grew memory most while {victim} stalled in global reclaim",
        GLOBAL_NO_POD_YET: "global reclaim: no pod named yet",
        MEMCG_OWN_LIMIT: "{victim} reclaims at its own memory limit (memcg reclaim): no neighbour action; "
                         "advice: raise its memory limit",
        GROWERS_NOT_BE: "global reclaim; the pods that grew are not BE ({pods}): not touched",
        CAP_GROWER: "{culprit} grew most ({share:.0%} of the growth) while {victim} stalled in global reclaim: "
                    "cap its memory at its usage",
    },
)
