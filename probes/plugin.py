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
    labels: tuple[str, ...] = ()  # its own labels (after node, and the cgroup's when per_cgroup)
    per_cgroup: bool = True  # False: a node metric, filled from ``node_series``


@dataclass(frozen=True, slots=True)
class TopColumn:
    """One column of a plugin's ``top`` table, as data: ``probes/`` knows nothing of rendering, the view
    (noisyneighbor/views.py) formats the row's ``key`` by ``unit``."""

    title: str
    key: str  # the row's key holding the value
    unit: str = "text"  # "text", "count", "rate" (per s), "bytes", "ms", "us", "pct"
    sorted_by: bool = False  # the rows come sorted by it, highest first (the view marks it ▼)


@dataclass(frozen=True)
class TopTable:
    """A plugin's ``top`` view declared as one table, so a new probe gets a view without a section class
    or a renderer of its own. ``rows`` turns the plugin's ``delta(prev, cur)`` into JSON-able rows, each
    naming its cgroup by ``cgroup`` (a path in the probe's hierarchy, named by the path's pod and
    container) or ``cgroup_id`` (resolved like the BPF probes' rows), sorted as they should show."""

    title: str  # after the view's name in its heading, e.g. "GPU memory per cgroup"
    columns: tuple[TopColumn, ...]
    rows: Callable[[Any], list[dict[str, Any]]]
    nothing: str  # what did not happen when there is no row ("no process on a GPU")
    hotkey: str | None = None  # the live view's key for it


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
    # The interval between two snapshots (prev None: since load), in the probe's own terms: the one
    # interval layer, read by `top` (its rows) and by the agent's detector (detector/signals.py). Holds
    # only what moved, so its cost follows the active cgroups.
    delta: Callable[[Any, Any], Any] | None = None
    # Entries in its per-cgroup kernel map (the bpf_map_entries gauge). None: nothing per cgroup.
    map_entries: Callable[[Any], int] | None = None
    signals: tuple[str, ...] = ()  # detector.catalog signal names computed from it
    metrics: tuple[str, ...] = ()  # exporter metric names filled from it (besides the per-probe health ones)
    # Metrics it defines itself, and their values: (metric name, cgroup path, value) from one snapshot,
    # the path relative to its hierarchy root as in NodeSnapshot.cgroup_cpu. The exporter labels them.
    metric_specs: tuple[MetricSpec, ...] = ()
    cgroup_series: Callable[[Any], Iterable[tuple[str, str, float]]] | None = None
    # Its node metrics (MetricSpec per_cgroup=False): (metric name, label values, value) per snapshot.
    node_series: Callable[[Any], Iterable[tuple[str, tuple[str, ...], float]]] | None = None
    flavours: tuple[str, ...] = ()  # its own attach modes beyond the engine's (auto, tp_btf, raw_tp)
    top_view: str | None = None  # its view in `noisyneighbor top` (--view)
    # That view as a declared table (rows from ``delta``); None: a hand-written section in
    # noisyneighbor/sections.py and renderer in noisyneighbor/views.py (the first four probes).
    top_table: TopTable | None = None
    top_options: Mapping[str, Any] = field(default_factory=dict)  # options `top` opens it with

    def open(self, **kwargs: Any) -> Any:
        return self.factory(**kwargs)
