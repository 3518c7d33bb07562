# SPDX-License-Identifier: Apache-2.0
"""self_contention: the victim's own threads fill the CPUs it may use. Not a neighbour's fault."""

from __future__ import annotations

from detector.causes.base import CauseContext, CauseSpec, Verdict
from detector.causes.self_throttling import quota_text
from detector.containers import largest_share
from detector.model import Evidence
from detector.signals import WorkloadSignals

NAME = "self_contention"  # its member of the Cause enum, which the registry builds (detector/causes/__init__.py)

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
    used = [
        Evidence("who_ran_instead_own_share", round(own, 4), ctx.window_s, threshold=SELF_CONTENTION_SHARE,
                 note=may_use_text(row)),
        Evidence("who_ran_instead_foreign_share", round(foreign, 4), ctx.window_s),
    ]
    # Which of its containers it waited behind (a busy sidecar, or the app's own threads).
    own_total = sum(ctx.own_by_container.values())
    for name, share in largest_share(ctx.own_by_container, own_total, CONTAINER_MIN_SHARE):
        used.append(Evidence("who_ran_instead_container_share", round(share, 4), ctx.window_s, container=name,
                             note=f"of its wait behind its own tasks: behind container {name}"))
    return Verdict(NAME, own, [], used, share=own)  # its part: the wait behind its own tasks


CONTAINER_MIN_SHARE = 0.2  # a container behind which it spent at least this share of its own wait is named


def may_use(row: WorkloadSignals) -> tuple[float | None, str]:
    """(cores it may use, how that reads). A pod may use the union of its containers' cpusets (the static
    CPU manager pins containers while the pod cgroup keeps every CPU) and the sum of their quotas when
    every container has one; a cpuset or quota on the pod cgroup itself bounds it too."""
    bounds: list[tuple[float, str]] = []
    m = row.may_use
    if m is not None and m.cpu_count:
        bounds.append((float(m.cpu_count), f"its containers' cpusets: {m.cpu_count} CPU{'s' if m.cpu_count > 1 else ''}"))
    if m is not None and m.quota_cores:
        bounds.append((m.quota_cores, f"its containers' quotas: {m.quota_cores:.2f} cores"))
    if row.cpus_allowed:
        bounds.append((float(row.cpus_allowed), f"cpuset of {row.cpus_allowed} CPU{'s' if row.cpus_allowed > 1 else ''}"))
    if row.quota_cores:
        bounds.append((row.quota_cores, quota_text(row.quota_cores)))
    if not bounds:
        return None, "no cpuset or quota read"
    capacity = min(b for b, _ in bounds)
    return capacity, ", ".join(text for b, text in bounds if b == capacity) + (
        "" if row.quota_cores or (m is not None and m.quota_cores) else ", no quota")


def may_use_text(row: WorkloadSignals) -> str:
    capacity, why = may_use(row)
    used = f"{row.cpu_cores or 0:.2f} cores used"
    return used + (f" of {capacity:.2f} it may use ({why})" if capacity else "")


SPEC = CauseSpec(
    NAME, rule,
    title="its own threads outnumbering the CPUs it may use (self-contention)",
    advice="the victim's own threads outnumber the CPUs it may use (its cpuset or quota): give it more "
           "CPUs, or run fewer busy threads (size thread pools to its CPUs); no neighbour is at fault",
    blameless="the victim waits behind its own threads, not behind a neighbour.",
)
