# SPDX-License-Identifier: Apache-2.0
"""Every metric the agent exports, by constant name: the exporter's own and each probe plugin's (which
its module defines with the plugin). dashboards/generate.py reads them here."""

from __future__ import annotations

from noisyneighbor.exporter import *  # noqa: F403  (the exporter's metric names, OVERFLOW_CGROUP, METRICS)
from noisyneighbor.exporter import METRICS, OVERFLOW_CGROUP  # noqa: F401  (not in the star: read by name)
from probes.reclaim import NODE_RECLAIM_LATENCY, NODE_RECLAIM_PAGES, RECLAIM_LATENCY, RECLAIM_PAGES  # noqa: F401
from probes.runqlat import CPU_RUNQ_LATENCY, RUNQ_LATENCY  # noqa: F401
from probes.softirq import SOFTIRQ_DELAY, SOFTIRQ_ENTRIES, SOFTIRQ_RUNTIME  # noqa: F401
from probes.steal import CPU_STEAL  # noqa: F401
from probes.tcpconnect import (  # noqa: F401
    CONNECT_ERRORS,
    CONNECT_FAILURES,
    CONNECT_LATENCY,
    CONNECT_SUCCESSES,
    CONNECT_SYN_RETRANSMITS,
)
