# SPDX-License-Identifier: Apache-2.0
"""network_connect: the connect path (SYN drops, retransmits, full accept queues of the servers)."""

from __future__ import annotations

from detector.causes.base import CauseContext, CauseSpec, Verdict
from detector.model import Evidence

NAME = "network_connect"  # its member of the Cause enum, which the registry builds (detector/causes/__init__.py)


def rule(ctx: CauseContext) -> Verdict | None:
    if not ctx.breached & {"connect_p99_ns", "syn_retransmits_per_s"}:
        return None
    row, dt = ctx.row, ctx.row.interval_s
    servers, more = ctx.connect_servers(ctx.key)
    return Verdict(NAME, 0.7, servers, [
        Evidence("connect_failures_per_s", row.connect_failures_per_s, dt),
        Evidence("syn_retransmits_per_s", row.syn_retransmits_per_s, dt),
        *more,
    ], share=0.0 if ctx.runq_breach else 1.0)  # the connect path explains none of a runqueue wait


SPEC = CauseSpec(
    NAME, rule,
    title="the TCP connect path",
    advice="connects stall (SYN drops/retransmits): check the server's accept backlog and ListenOverflows",
)
