"""The probe plugin interface: what a probe declares so the collector, exporter, ``top``, the agent and
the benches can use it without naming it (the list of plugins is probes/registry.py).

See docs/architecture.md for the flow and a walk-through of adding a probe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from probes.engine import AttachMode, ProbeSpec

ENGINE_ATTACH_MODES: tuple[str, ...] = get_args(AttachMode)  # what every probe accepts


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A per-cgroup metric a plugin adds to /metrics, filled from its ``cgroup_series``. (The first
    probes' metrics are defined and filled by the exporter itself; ``ProbePlugin.metrics`` names them.)"""

    name: str  # noisyneighbor_..., _total for a counter
    type: str  # "gauge" | "counter"
    help: str


@dataclass(frozen=True)
class ProbePlugin:
    """One probe as the rest of the code sees it."""

    name: str  # the probe's name: ProbeSpec.name, ProbeStatus.name, the `probe` metric label, --probes
    default: bool = field(default=True, kw_only=True)  # loaded when --probes is not given
    # The NodeSnapshot attribute that carries its snapshot (None while it is off); None: a probe added
    # later, whose snapshot is in NodeSnapshot.plugins[name] (read either through snap.probe(name)).
    snapshot_field: str | None
    specs: tuple[ProbeSpec, ...]  # its BPF object and programs with their attach flavours, cheapest first
    factory: Callable[..., Any]  # factory(paths=, layout=, attach_mode=, **options) -> the loaded probe
    # Cumulative activity per cgroup id in one snapshot (grows while the cgroup is active): which cgroups
    # to read this tick, which removed cgroups to forget from the kernel map. None: no per-cgroup map.
    activity: Callable[[Any], dict[int, int]] | None = None
    activity_is_reclaim: bool = False  # its activity means memory reclaim (the watch reads memory.stat then)
    # The interval between two snapshots (prev None: since load), in the probe's own terms.
    delta: Callable[[Any, Any], Any] | None = None
    # Entries in its per-cgroup kernel map (the bpf_map_entries gauge). None: nothing per cgroup.
    map_entries: Callable[[Any], int] | None = None
    signals: tuple[str, ...] = ()  # detector.catalog signal names computed from it
    metrics: tuple[str, ...] = ()  # exporter metric names filled from it (besides the per-probe health ones)
    # Metrics it defines itself, and their values: (metric name, cgroup path, value) from one snapshot,
    # the path relative to its hierarchy root as in NodeSnapshot.cgroup_cpu. The exporter labels them.
    metric_specs: tuple[MetricSpec, ...] = ()
    cgroup_series: Callable[[Any], Iterable[tuple[str, str, float]]] | None = None
    flavours: tuple[str, ...] = ()  # its own attach modes beyond the engine's (auto, tp_btf, raw_tp)
    top_view: str | None = None  # its view in `noisyneighbor top` (--view)
    top_options: Mapping[str, Any] = field(default_factory=dict)  # options `top` opens it with

    def open(self, **kwargs: Any) -> Any:
        return self.factory(**kwargs)
