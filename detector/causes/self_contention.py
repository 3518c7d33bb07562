"""self_contention: the victim's own threads fill the CPUs it may use. Not a neighbour's fault."""

from __future__ import annotations

from detector.causes.base import CauseContext, CauseSpec, Verdict
from detector.causes.self_throttling import quota_text
from detector.decisions import Cause
from detector.model import Evidence

SELF_CONTENTION_SHARE = 0.5  # its own threads ran for at least this share of its wait


def rule(ctx: CauseContext) -> Verdict | None:
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
        note += f" (cpuset of {row.cpus_allowed} CPU{'s' if row.cpus_allowed > 1 else ''}, {quota_text(row.quota_cores)})"
    used = [
        Evidence("who_ran_instead_own_share", round(own, 4), ctx.window_s, threshold=SELF_CONTENTION_SHARE, note=note),
        Evidence("who_ran_instead_foreign_share", round(foreign, 4), ctx.window_s),
    ]
    return Verdict(Cause.SELF_CONTENTION, own, [], used)


SPEC = CauseSpec(
    Cause.SELF_CONTENTION, rule,
    title="its own threads outnumbering the CPUs it may use (self-contention)",
    advice="the victim's own threads outnumber the CPUs it may use (its cpuset or quota): give it more "
           "CPUs, or run fewer busy threads (size thread pools to its CPUs); no neighbour is at fault",
    blameless="the victim waits behind its own threads, not behind a neighbour.",
)
