# SPDX-License-Identifier: Apache-2.0
"""Why a victim suffers: one declaration per cause, tried in order; the first rule that holds names it.

A cause is one module here with its :data:`SPEC` (:class:`~detector.causes.base.CauseSpec`): its rule
(``rule(ctx) -> Verdict | None``: reads the victim's signals through :class:`CauseContext` and, when it
holds, returns the cause, a confidence, the ranked culprits, the evidence it used and its findings), its
words (the HTML heading, the advice, the no-culprit sentence), the engine's step (``act``), the
planner's step (``mitigation``), the victim signals their actions are verified on
(``verify_signals``) and the outcome codes of both with their wording (``messages``).
``noisyneighbor diagnose`` and its HTML report, the incident engine and ``actuators/mitigate.py`` read
the declarations; nothing keys on a message's wording.

The order protects neighbours from false blame: what the victim does to itself (its own CPU limit,
its own threads) is ruled on before anyone else is blamed. Adding a cause: a :class:`Cause` member
(detector/decisions.py), its module here, one line in :data:`CAUSES`, one test.
"""

from __future__ import annotations

from detector.causes import (
    hypervisor_steal,
    neighbor_cpu,
    network_connect,
    psi_unknown,
    reclaim,
    self_contention,
    self_throttling,
    softirq,
)
from detector.causes.base import (
    ROOT_CGROUP,
    ActContext,
    CauseContext,
    CauseSpec,
    Mitigation,
    Rule,
    Verdict,
)
from detector.causes.neighbor_cpu import NEIGHBOR_SHARE
from detector.causes.reclaim import KSWAPD_ACTIVE_PAGES_PER_S
from detector.causes.self_contention import SELF_CONTENTION_SHARE
from detector.causes.self_throttling import FOREIGN_MINORITY, SELF_THROTTLE_RATIO, SELF_THROTTLE_SHARE
from detector.decisions import Cause

# Evaluated in this order; the first verdict wins. psi_unknown always holds (the fallback).
CAUSES: tuple[CauseSpec, ...] = (
    self_throttling.SPEC,
    reclaim.SPEC,
    softirq.SPEC,
    self_contention.SPEC,
    hypervisor_steal.SPEC,  # before neighbor_cpu: stolen time must not be blamed on a pod
    neighbor_cpu.SPEC,
    network_connect.SPEC,
    psi_unknown.SPEC,
)
BY_CAUSE: dict[Cause, CauseSpec] = {s.cause: s for s in CAUSES}
RULES: tuple[Rule, ...] = tuple(s.rule for s in CAUSES)


def spec(cause: Cause | str) -> CauseSpec:
    """A cause's declaration; KeyError names a cause nobody declared."""
    return BY_CAUSE[Cause(cause)]


def decide(ctx: CauseContext, rules: tuple[Rule, ...] = RULES) -> Verdict:
    for rule in rules:
        verdict = rule(ctx)
        if verdict is not None:
            return verdict
    return psi_unknown.rule(ctx)


def check_causes(specs: tuple[CauseSpec, ...] = CAUSES) -> None:
    """Every Cause is declared exactly once, and the fallback (a rule that always holds) is last."""
    causes = [s.cause for s in specs]
    missing = set(Cause) - set(causes)
    if missing or len(causes) != len(set(causes)):
        raise RuntimeError(f"causes: every Cause declared once (missing {sorted(missing)}, declared {causes})")
    if specs[-1].cause != Cause.PSI_UNKNOWN:
        raise RuntimeError("causes: the fallback psi_unknown must be tried last")


check_causes()

__all__ = [
    "BY_CAUSE",
    "CAUSES",
    "FOREIGN_MINORITY",
    "KSWAPD_ACTIVE_PAGES_PER_S",
    "NEIGHBOR_SHARE",
    "ROOT_CGROUP",
    "RULES",
    "SELF_CONTENTION_SHARE",
    "SELF_THROTTLE_RATIO",
    "SELF_THROTTLE_SHARE",
    "ActContext",
    "CauseContext",
    "CauseSpec",
    "Mitigation",
    "Rule",
    "Verdict",
    "decide",
    "spec",
]
