# SPDX-License-Identifier: Apache-2.0
"""What /healthz and /readyz answer of an agent: liveness, readiness and why."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from noisyneighbor.agent.config import STALE_INTERVALS
from noisyneighbor.output import SCHEMA_VERSION
from probes.collect import DEGRADED_TEXT, degraded_code
from probes.engine import ProbeOffCode
from probes.registry import BY_NAME

if TYPE_CHECKING:
    from noisyneighbor.agent.loop import Agent


def agent_health(agent: Agent) -> dict[str, Any]:
    """Live while ticks keep coming; ready once a BPF probe runs (or the node can run none: no BTF)."""
    now = time.monotonic()
    stats = agent.stats
    last = stats.last_tick_monotonic
    age = None if last is None else now - last
    limit = STALE_INTERVALS * agent.interval_s + max(stats.last_tick_seconds, 0.0)
    # Before the first tick (start-up loads the BPF objects) the clock runs from the start instead.
    since = now - stats.started_monotonic if age is None else age
    live = since <= limit + (30.0 if age is None else 0.0)
    status = agent.collector.status if agent.collector is not None else {}
    probes = {name: {"state": st.state, "reason": st.reason, "code": st.code, "attach_mode": st.attach_mode}
              for name, st in status.items()}
    # Ready once a BPF probe runs (on, or degraded: a full table still measures the rest): steal (a /proc
    # file) alone detects nothing. A kernel without BTF can run none, whatever the agent does: Ready and
    # degraded (degraded_code; noisyneighbor_agent_degraded{code="no_btf"} and NoisyNeighborNodeWithoutBTF
    # name the node), so such a node never holds a DaemonSet rollout.
    any_on = any(st.state != "off" for name, st in status.items() if name not in BY_NAME or BY_NAME[name].specs)
    degraded = degraded_code(status)
    stopped = agent.stopped
    ready = stats.ticks >= 1 and not stopped and (any_on or degraded == ProbeOffCode.NO_BTF)
    pods = agent.pod_source.status if agent.pod_source is not None else None
    acts = agent.policy.actuators if agent.policy is not None else None
    manager = agent.manager
    return {
        "schema_version": SCHEMA_VERSION,
        "live": bool(live and not stopped),
        "ready": bool(ready),
        # For programs (the code) and for people (the text): never parse the text.
        "degraded_code": degraded,
        "degraded": DEGRADED_TEXT[degraded] if degraded is not None else None,
        "ticks": stats.ticks,
        "failed_ticks": stats.failures,
        "last_error": stats.last_error,
        "last_tick_age_seconds": None if age is None else round(age, 3),
        "interval_seconds": agent.interval_s,
        "probes": probes,
        "pod_source": None if pods is None else {"source": pods.source, "ok": pods.ok, "reason": pods.reason,
                                                  "pods": pods.pods},
        "actuators": None if acts is None or manager is None else {
            "mode": "dry-run" if acts.dry_run else "enforcing",
            "kinds": sorted(str(k) for k in manager.actuators),
            "active": len(manager.active_records()),
            "journal": str(manager.journal.directory),
        },
        "open_incidents": len(agent.detector.engine.open_incidents) if agent.detector is not None else 0,
        "listen_queues": None if agent.listen is None else agent.listen.health(),
    }
