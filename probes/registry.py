# SPDX-License-Identifier: Apache-2.0
"""The probe registry: every probe the agent and ``top`` run, one line each. Each probe declares itself
as a :class:`~probes.plugin.ProbePlugin` (the interface, in probes/plugin.py) at the end of its own
module (``PLUGIN``): its BPF object and programs with their attach flavours, how to open it, which
:class:`~probes.snapshot.NodeSnapshot` field carries its snapshot, what moved this tick (``activity``),
its ``delta(prev, cur)``, its metric families and series, its ``top`` table and its signal extractor.

The collector (``probes.collect``), the exporter, ``top`` (``noisyneighbor.sections``), the detector's
signal builder, the agent's and the CLI's probe lists and the benches loop over :data:`PLUGINS` instead
of naming probes. Adding a probe is its BPF C and header, its module, its test and one line here, with
its import (docs/architecture.md).

Signals and metrics are names (strings): ``probes/`` imports nothing from ``detector/`` or
``noisyneighbor/``; ``detector.catalog.check_plugin_signals``, tests/test_registry.py and
tests/test_signal_plugins.py check the names against the signal catalog, the exporter's metric
definitions and what the extractors produce.
"""

from __future__ import annotations

from probes import gpu_pods, hardirq, reclaim, runqlat, softirq, steal, tcpconnect
from probes.plugin import ENGINE_ATTACH_MODES, MetricSpec, ProbePlugin

__all__ = ["BY_NAME", "DEFAULT_NAMES", "ENGINE_ATTACH_MODES", "NAMES", "PLUGINS", "MetricSpec", "ProbePlugin", "plugin"]


# Order: collection order, the order of --probes' default and of `top`'s views.
PLUGINS: tuple[ProbePlugin, ...] = (
    runqlat.PLUGIN,
    softirq.PLUGIN,
    reclaim.PLUGIN,
    tcpconnect.PLUGIN,
    gpu_pods.PLUGIN,
    steal.PLUGIN,
    hardirq.PLUGIN,
)

BY_NAME: dict[str, ProbePlugin] = {p.name: p for p in PLUGINS}
NAMES: tuple[str, ...] = tuple(p.name for p in PLUGINS)  # every probe --probes may name
DEFAULT_NAMES: tuple[str, ...] = tuple(p.name for p in PLUGINS if p.default)  # loaded without --probes


def plugin(name: str) -> ProbePlugin:
    """The plugin called ``name``; ValueError (one line, the known names) for any other."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown probe {name!r}; known: {', '.join(NAMES)}") from None
