# SPDX-License-Identifier: Apache-2.0
"""Why a victim suffers: one declaration per cause; of the rules that hold, the one that explains the
largest share of the victim's wait names it.

A cause is one module here with its :data:`SPEC` (:class:`~detector.causes.base.CauseSpec`): its rule
(``rule(ctx) -> Verdict | None``: reads the victim's signals through :class:`CauseContext` and, when it
holds, returns the cause, a confidence, the ranked culprits, the evidence it used, its findings and
its ``share``: the part of the victim's wait it explains), its words (the HTML heading, the advice,
the no-culprit sentence), the engine's step (``act``), the planner's (``plan``, and ``ladder`` across incidents), the victim
signals their actions are verified on (``verify_signals``) and the outcome codes of both with their
wording (``messages``). ``noisyneighbor diagnose`` and its HTML report, the incident engine and
``actuators/mitigate.py`` read the declarations; nothing keys on a message's wording.

The ranking (:func:`decide`, issue 41). The run-queue probe splits each wait of the victim: who ran
instead (its own tasks, each other cgroup, the node's processes), and the kernel work inside it
(softirq work on top of whichever task held the CPU, ksoftirqd, kswapd and the other kernel threads).
Each rule's thresholds say whether its cause is there at all; its ``share`` says how much of the wait
it explains, from that split:

- neighbor_cpu: other cgroups' tasks' own time (the kernel work on top of their slices taken out),
  outside the time the victim sat throttled at its own limit;
- self_contention: the wait behind its own tasks; self_throttling: the time throttled over the wait
  (or the throttled ratio, throttled in most periods while others ran for a minority of its wait);
- softirq: the kernel work in its waits; reclaim: the stall in its own allocations against the stall
  and the wait together, or while kswapd reclaims, the kernel work (or the node's share) in its waits;
- hypervisor_steal: steal on its CPUs over the wait; network_connect: none of a runqueue wait.

So a neighbour that ran 95 % of the wait is the cause though softirq time on the CPU passes its SLO,
and softirq or reclaim wins only where its work is the larger part of the wait. A cause breached on
another signal than the run queue (softirq time or delay, the reclaim stall, the connect path) while
the run queue is within its SLO takes share 1: it is all that breached. Ties, to the last digit, go to
the declaration order, which protects neighbours from false blame: what the victim does to itself (its
own CPU limit, its own threads) is ruled on before anyone else is blamed, steal before the pods. Without
the probe's split (``who_ran_instead_available`` false: no run-queue probe) there are no shares and the
first rule that holds, in that order, names the cause, as before. psi_unknown (share 0) always holds.

Adding a cause: its module here (its NAME, rule and share, words, codes and plan), one line in
:data:`CAUSES` (its place in the ranking) and one at the end of :data:`ADDED` (the :class:`Cause` enum is
built from it), one test.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from detector.causes import (
    hardirq,
    hypervisor_steal,
    neighbor_cpu,
    psi_unknown,
    reclaim,
    self_contention,
    self_throttling,
    softirq,
    tcpconnect,
)
from detector.causes.base import (
    ROOT_CGROUP,
    ActContext,
    CauseContext,
    CauseSpec,
    KernelWorkJudge,
    Rule,
    Verdict,
)
from detector.causes.neighbor_cpu import NEIGHBOR_SHARE
from detector.causes.reclaim import KSWAPD_ACTIVE_PAGES_PER_S
from detector.causes.self_contention import SELF_CONTENTION_SHARE
from detector.causes.self_throttling import FOREIGN_MINORITY, SELF_THROTTLE_RATIO, SELF_THROTTLE_SHARE
from detector.model import Evidence

# Ranked by share (ties and no split: this order). psi_unknown always holds (the fallback).
CAUSES: tuple[CauseSpec, ...] = (
    self_throttling.SPEC,
    reclaim.SPEC,
    softirq.SPEC,
    hardirq.SPEC,
    self_contention.SPEC,
    hypervisor_steal.SPEC,  # before neighbor_cpu: stolen time must not be blamed on a pod
    neighbor_cpu.SPEC,
    tcpconnect.SPEC,
    psi_unknown.SPEC,
)
# The order the causes were added in: the Cause enum's (what reports and tests iterate), a new one last.
ADDED: tuple[CauseSpec, ...] = (
    neighbor_cpu.SPEC,
    self_throttling.SPEC,
    hypervisor_steal.SPEC,
    self_contention.SPEC,
    softirq.SPEC,
    reclaim.SPEC,
    tcpconnect.SPEC,
    psi_unknown.SPEC,
    hardirq.SPEC,
)
# Why a victim suffers, one member per declared cause (its NAME; NEIGHBOR_CPU = "neighbor_cpu"): the
# detector names exactly one per incident. detector.decisions offers it too.
Cause = StrEnum("Cause", [(s.cause.upper(), s.cause) for s in ADDED])  # type: ignore[misc]
BY_CAUSE: dict[Cause, CauseSpec] = {Cause(s.cause): s for s in CAUSES}
RULES: tuple[Rule, ...] = tuple(s.rule for s in CAUSES)
# Whether the node does a cause's kernel work on the victim's CPUs beyond the usual: every CauseContext
# gets these (CauseContext.kernel_work_judges), so the context names no cause.
KERNEL_WORK_JUDGES: tuple[KernelWorkJudge, ...] = tuple(s.kernel_work_busy for s in CAUSES if s.kernel_work_busy)
# The causes with a culprit source of their own (CauseSpec.culprit_source): the agent's reader of each
# source's reading builds it and hooks it in by the cause's NAME, so the agent names no cause.
CULPRIT_SOURCES: tuple[CauseSpec, ...] = tuple(s for s in CAUSES if s.culprit_source is not None)


def spec(cause: Cause | str) -> CauseSpec:
    """A cause's declaration; KeyError names a cause nobody declared."""
    return BY_CAUSE[Cause(cause)]


def decide(ctx: CauseContext, rules: tuple[Rule, ...] = RULES) -> Verdict:
    """The verdict of the rule that holds with the largest share of the victim's wait (ties: the first
    in ``rules``); without the probe's split, the first rule that holds. The winner's evidence gets the
    ranking (``cause_wait_share``: its share, and every other holding cause's)."""
    held = [replace(v, cause=Cause(v.cause)) for v in (rule(ctx) for rule in rules) if v is not None]
    if not held:
        return replace(fallback := psi_unknown.rule(ctx), cause=Cause(fallback.cause))
    if not ctx.row.who_ran_instead_available:
        return held[0]
    best = max(held, key=lambda v: v.share)  # max() keeps the first of equals: the declaration order
    if len(held) == 1:
        return best
    ranking = ", ".join(f"{v.cause} {v.share:.0%}" for v in sorted(held, key=lambda v: -v.share))
    return replace(best, evidence=[*best.evidence, Evidence(
        "cause_wait_share", round(best.share, 4), ctx.window_s,
        note=f"share of its wait each cause that held explains: {ranking}")])


def check_causes(specs: tuple[CauseSpec, ...] = CAUSES) -> None:
    """Every Cause is declared exactly once, and the fallback (a rule that always holds) is last."""
    causes = [s.cause for s in specs]
    missing = set(Cause) - set(causes)
    if missing or len(causes) != len(set(causes)):
        raise RuntimeError(f"causes: every Cause declared once (missing {sorted(missing)}, declared {causes})")
    if specs[-1].cause != psi_unknown.NAME:
        raise RuntimeError("causes: the fallback psi_unknown must be tried last")


check_causes()
if sorted(s.cause for s in ADDED) != sorted(s.cause for s in CAUSES):
    raise RuntimeError("causes: ADDED and CAUSES hold the same declarations")

__all__ = [
    "ADDED",
    "BY_CAUSE",
    "CAUSES",
    "CULPRIT_SOURCES",
    "FOREIGN_MINORITY",
    "KERNEL_WORK_JUDGES",
    "KSWAPD_ACTIVE_PAGES_PER_S",
    "NEIGHBOR_SHARE",
    "ROOT_CGROUP",
    "RULES",
    "SELF_CONTENTION_SHARE",
    "SELF_THROTTLE_RATIO",
    "SELF_THROTTLE_SHARE",
    "ActContext",
    "Cause",
    "CauseContext",
    "CauseSpec",
    "Rule",
    "Verdict",
    "decide",
    "spec",
]
