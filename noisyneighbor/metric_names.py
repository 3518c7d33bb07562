# SPDX-License-Identifier: Apache-2.0
"""Every metric the agent exports, by constant name: the exporter's own and each probe plugin's (which
its module defines with the plugin). dashboards/generate.py reads them here.

A plugin's constants are taken from its module (the one its factory is defined in): every upper-case
module constant whose value is one of the plugin's metric names (``ProbePlugin.metric_specs``), so a
new probe's metrics are here without an edit in this file.
"""

from __future__ import annotations

import sys

from noisyneighbor.exporter import *  # noqa: F403  (the exporter's metric names, OVERFLOW_CGROUP, METRICS)
from noisyneighbor.exporter import METRICS, OVERFLOW_CGROUP  # noqa: F401  (not in the star: read by name)
from probes.registry import PLUGINS


def plugin_metric_constants() -> dict[str, str]:
    """Constant name -> metric name of every registered plugin's metrics, from the plugins' modules."""
    out: dict[str, str] = {}
    for plugin in PLUGINS:
        names = {spec.name for spec in plugin.metric_specs}
        module = sys.modules[plugin.factory.__module__]
        out.update({k: v for k, v in vars(module).items() if k.isupper() and isinstance(v, str) and v in names})
    return out


globals().update(plugin_metric_constants())
