# SPDX-License-Identifier: Apache-2.0
"""`noisyneighbor agent`: the per-node daemon. Probes -> detector -> actuators, exported over HTTP.

One tick (``Agent.step``): the collector reads every probe and cgroup file into a NodeSnapshot, the
detector turns it into signals and incidents (decisions go to the actuator manager, which plans them
in dry-run or applies them through the journal), the exporter takes the snapshot, incidents and action
records, and incidents are posted as Kubernetes Events when in a cluster. ``run`` repeats that at the
interval; one failing tick is logged on one line and the loop goes on.

HTTP (one small threaded server on ``--listen``; port 0 picks a free port, see ``Agent.address``):
``/metrics`` (the Prometheus registry), ``/healthz`` (200 while the loop ticks, 503 once no tick has
completed for 3 intervals) and ``/readyz`` (200 once the first tick is done and at least one probe is
on; the JSON body lists each probe's state and reason, the pod source status and the actuator mode).

``stop`` is graceful and idempotent: the manager restores every file an actuator changed (journal),
probes are detached, the server stops. A policy that does not load raises before anything is started.

One module per job: :mod:`~noisyneighbor.agent.config` (command line and policy),
:mod:`~noisyneighbor.agent.loop` (:class:`Agent`: start-up wiring, the tick, health, stop),
:mod:`~noisyneighbor.agent.wiring` (labels, ``--act-only`` scope, optional Kubernetes parts),
:mod:`~noisyneighbor.agent.http_server` (the endpoints), :mod:`~noisyneighbor.agent.incident_log` and
:mod:`~noisyneighbor.agent.logs`. The names below are re-exported so ``from noisyneighbor.agent import X``
keeps working.
"""

from noisyneighbor.agent.config import (
    DEFAULT_LISTEN,
    STALE_INTERVALS,
    AgentConfig,
    AgentConfigError,
    parse_listen,
    policy_for,
)
from noisyneighbor.agent.incident_log import IncidentLog
from noisyneighbor.agent.logs import JsonLogFormatter
from noisyneighbor.agent.loop import Agent, TickStats
from noisyneighbor.agent.wiring import PodMetadataLabeler, ScopedActuator

__all__ = [
    "DEFAULT_LISTEN",
    "STALE_INTERVALS",
    "Agent",
    "AgentConfig",
    "AgentConfigError",
    "IncidentLog",
    "JsonLogFormatter",
    "PodMetadataLabeler",
    "ScopedActuator",
    "TickStats",
    "parse_listen",
    "policy_for",
]
