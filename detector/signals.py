# SPDX-License-Identifier: Apache-2.0
"""Per-workload signals for one interval: two cumulative NodeSnapshots in, one row per workload out.

Everything the incident engine reasons with lands here, in one row type, with the units in the field
names. What a probe's interval means is its plugin's ``signal_extractor`` (probes/plugin.py, declared in
the probe's module): functions over the plugin's ``delta(prev, cur)`` (the layer ``top`` reads too,
holding only what moved) that return values by field name. This module names no probe: it joins them.
It hands an extractor a ``workload_key(cgroup id)`` that resolves ids in the plugin's hierarchy
(``ProbePlugin.id_controller``) to workload keys, makes the rows in the order the extractor met them,
and reads the cgroup files itself (CPU accounting, memory, PSI: keyed by path).

Data still flows one way: probes/ never imports detector/; the detector imports each plugin's
declaration (probes.registry) and calls it. Per-CPU values (charged to CPUs, never to ``current``)
reach a workload through its CPU weights: the share of its own CPU time spent on each CPU (v1
``cpuacct.usage_percpu``; on v2 its effective cpuset, uniformly), made here, read by the extractor's
``exposure``.

The row types declare what the detector reads itself (the cgroup files); every probe declares its own
fields with its plugin (``SignalExtractor.signal_specs`` for catalog signals, ``row_specs`` for other
row fields, ``node_specs``): every row and node has them, at their declared default until an extractor
sets them (so a cause or ``diagnose`` reading one never meets an AttributeError while the probe is
off), and the store keeps the signals as each declares (``SignalSpec.stored``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from detector.containers import POD_ITSELF, MayUse, containers_by_pod, may_use
from detector.workloads import IdMapper, Workload
from probes.cgroupfs import CgroupLayout
from probes.memstat import NodeVmstat
from probes.plugin import IDLE, UNKNOWN, NodeFieldSpec, RowFieldSpec, SignalSpec  # noqa: F401  (IDLE, UNKNOWN: re-exported for detector/incidents.py)
from probes.psi import psi_rate
from probes.registry import BY_NAME, PLUGINS
from probes.snapshot import NodeSnapshot

# Catalog signals the detector derives from a plugin's fields (detector/incidents.py), by what they
# are computed from: a plugin that names one (ProbePlugin.signals) must produce those fields.
DERIVED_FROM: dict[str, tuple[str, ...]] = {
    "runq_wait_share": ("runq_wait_ms_per_s",),
    "who_ran_instead_foreign_share": ("ran_instead_ns",),
    "who_ran_instead_own_share": ("own_wait_ns",),
}



@dataclass(frozen=True, slots=True)
class ContainerCpu:
    """One container cgroup of a pod over the interval: its CPU use and its own CFS bandwidth."""

    name: str  # the container's name in the pod spec (its short id when the metadata has none)
    path: str
    cpu_cores: float
    quota_cores: float | None  # None: no limit on this container
    throttled_ratio: float  # Δnr_throttled / Δnr_periods (0 without periods)
    throttled_ms_per_s: float
    limit_cores: float | None = None  # the spec's limit, when the pod source gave one


@dataclass
class WorkloadSignals:
    workload: Workload
    interval_s: float
    # (the probe plugins' fields are declared by the plugins: SignalExtractor.signal_specs / row_specs)
    # its own wait split by the container it waited behind: name (detector.containers.POD_ITSELF for the
    # pod cgroup) -> ns, named here from a plugin's split by cgroup id (own_wait_by_cgroup)
    own_wait_by_container: dict[str, float] = field(default_factory=dict)
    # CPU accounting
    cpu_cores: float | None = None
    quota_cores: float | None = None
    throttled_ratio: float | None = None  # Δnr_throttled / Δnr_periods
    throttled_ms_per_s: float | None = None
    containers: dict[str, ContainerCpu] = field(default_factory=dict)  # container cgroup path -> its CPU
    cpus_allowed: int | None = None  # CPUs in its effective cpuset, when read
    may_use: MayUse | None = None  # pods: its containers' cpuset union and quota sum (detector/containers.py)
    cpu_weights: dict[int, float] = field(default_factory=dict)
    memory_usage_bytes: int | None = None
    memory_limit_bytes: int | None = None
    # PSI (percent of wall time, like avg10), when the cgroup has v2 pressure files
    psi_cpu_some: float | None = None
    psi_memory_some: float | None = None
    psi_io_some: float | None = None

    def __getattr__(self, name: str) -> Any:
        # Only reached when the row has no such attribute: a plugin-declared field no extractor set on
        # it (its probe is off, or nothing moved for this workload) reads as its declared default. A
        # signal's default is a number, read as is (those registered at import are class attributes,
        # set below, found before this is reached); another field's is made once and kept on the row,
        # so what a reader adds to it (a dict, say) stays.
        spec = PLUGIN_SIGNALS.get(name)
        if spec is not None:
            return spec.default
        row_field = PLUGIN_ROW_FIELDS.get(name)
        if row_field is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = row_field.default()
        setattr(self, name, value)
        return value

    @classmethod
    def of(cls, workload: Workload, interval_s: float, **values: Any) -> WorkloadSignals:
        """A row from field values, the plugin-declared signals among them (the dataclass's own
        constructor knows only its own fields)."""
        own = {k: v for k, v in values.items() if k in _ROW_OWN_FIELDS}
        row = cls(workload, interval_s, **own)
        for name, value in values.items():
            if name not in own:
                if name not in PLUGIN_SIGNALS and name not in PLUGIN_ROW_FIELDS:
                    raise TypeError(f"WorkloadSignals has no field {name!r}")
                setattr(row, name, value)
        return row

    def as_store_values(self) -> dict[str, float]:
        """The numeric signals the time-series store keeps (NaN for unknown): the row's own, then the
        plugin-declared ones as their ``stored`` says."""
        nan = math.nan

        def v(x: float | None) -> float:
            return nan if x is None else float(x)

        values = {"cpu_cores": v(self.cpu_cores), "throttled_ratio": v(self.throttled_ratio),
                  "psi_cpu_some": v(self.psi_cpu_some), "psi_memory_some": v(self.psi_memory_some)}
        # "set": only those an extractor set on this row, so a probe that is off (hardirq is not loaded
        # by default) adds no series per workload to the store; "always": the default elsewhere.
        own = self.__dict__
        for spec in PLUGIN_SIGNALS.values():
            stored = spec.stored
            if stored == "never":
                continue
            x = own.get(spec.name, _UNSET)
            if x is _UNSET:
                if stored != "always":
                    continue
                x = spec.default
            elif x is not None and not isinstance(x, int | float):
                continue
            if spec.stored_when is not None and not own.get(spec.stored_when):
                x = None  # a statistic of no events (its count unset or 0): unknown
            values[spec.name] = nan if x is None else float(x)
        return values


@dataclass
class NodeSignals:
    interval_s: float
    workloads: dict[str, WorkloadSignals]
    # (the probe plugins' node fields are declared by the plugins: SignalExtractor.node_specs)
    node_cpu_busy: float | None = None  # 0..ncpu cores busy
    node_psi: dict[str, float] = field(default_factory=dict)  # "cpu_some" -> percent
    online_cpus: tuple[int, ...] = ()
    # Every workload that exists, active or not (``workloads`` holds rows only for those whose inputs
    # moved this tick). None: ``workloads`` holds every one.
    present: frozenset[str] | None = None
    # Pages kswapd reclaimed per second (/proc/vmstat pgsteal_kswapd): global reclaim in the background,
    # whose CPU time is a kernel thread's (the root cgroup) on whichever CPU kswapd ran.
    kswapd_pages_per_s: float = 0.0
    # Pages kswapd scanned per second (pgscan_kswapd): its work, which comes before what it reclaims. Woken,
    # it scans first and reclaims later: in the VM lane's global-reclaim (2026-11-30 04:11 UTC) the tick the
    # victim first waited 41.8 ms/s behind the root cgroup had 4,680 pages/s scanned (no direct reclaim) and
    # 0 reclaimed (detector/causes/reclaim.py, kswapd_at_work).
    kswapd_scanned_pages_per_s: float = 0.0

    def __getattr__(self, name: str) -> Any:
        # A plugin-declared node field no extractor set (its probe off): made from its declared default
        # once, then kept on this node, so what a reader adds to it stays.
        spec = PLUGIN_NODE_FIELDS.get(name)
        if spec is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value = spec.default()
        setattr(self, name, value)
        return value

    @classmethod
    def of(cls, interval_s: float, workloads: dict[str, WorkloadSignals], **values: Any) -> NodeSignals:
        """A node from field values, the plugin-declared ones among them (the dataclass's own
        constructor knows only its own fields)."""
        own = {k: v for k, v in values.items() if k in _NODE_OWN_FIELDS}
        node = cls(interval_s, workloads, **own)
        for name, value in values.items():
            if name not in own:
                setattr(node, name, value)
        return node


def _plugin_fields() -> tuple[dict[str, SignalSpec], dict[str, RowFieldSpec], dict[str, NodeFieldSpec]]:
    """The fields the plugins declare for the rows (signals, other fields) and the node; one that a row
    type already has, or that two declarations name, is a mistake (a default would never be read),
    refused at import."""
    extractors = [p.signal_extractor for p in PLUGINS if p.signal_extractor is not None]
    signals = {s.name: s for e in extractors for s in e.signal_specs}
    row_fields = {s.name: s for e in extractors for s in e.row_specs}
    node = {s.name: s for e in extractors for s in e.node_specs}
    twice = sorted(signals.keys() & row_fields.keys())
    if twice:
        raise TypeError(f"probe plugins declare row field(s) as a signal and as a field: {', '.join(twice)}")
    for row_type, declared in ((WorkloadSignals, signals.keys() | row_fields.keys()), (NodeSignals, node.keys())):
        clash = sorted(declared & {f.name for f in dataclasses.fields(row_type)})
        if clash:
            raise TypeError(f"probe plugins declare {row_type.__name__} field(s) it has already: {', '.join(clash)}")
    return signals, row_fields, node


_UNSET = object()  # a row attribute no extractor set
# Plugin-declared fields by name (probes.registry, fixed at import like the registry itself).
PLUGIN_SIGNALS, PLUGIN_ROW_FIELDS, PLUGIN_NODE_FIELDS = _plugin_fields()
_NODE_OWN_FIELDS = frozenset(f.name for f in dataclasses.fields(NodeSignals))
_ROW_OWN_FIELDS = frozenset(f.name for f in dataclasses.fields(WorkloadSignals))
# A plugin signal's default (a number or None: nothing a reader could change in place) is a class attribute
# of the row, found by the ordinary lookup: ``__getattr__`` (an AttributeError raised and caught first) is
# reached only for the other plugin fields (and a signal registered later). The engine reads a dozen
# signals no extractor set on each victim's row every tick. An extractor's value is in the row's __dict__.
for _spec in PLUGIN_SIGNALS.values():
    setattr(WorkloadSignals, _spec.name, _spec.default)
# The plugin signals whose ns over a victim's recent ticks the causes read (SignalSpec.summed_over_window).
WINDOW_SIGNALS: tuple[str, ...] = tuple(spec.name for spec in PLUGIN_SIGNALS.values() if spec.summed_over_window)
# The plugin signals shown in every incident's context while non-zero (SignalSpec.context_note).
CONTEXT_SIGNALS: tuple[SignalSpec, ...] = tuple(spec for spec in PLUGIN_SIGNALS.values() if spec.context_note is not None)


def probe_delta(name: str, prev: NodeSnapshot, cur: NodeSnapshot) -> Any:
    """A probe's interval between two node snapshots through its plugin's ``delta`` (the layer ``top``
    reads too), None unless it has a snapshot in both."""
    before, now = prev.probe(name), cur.probe(name)
    if before is None or now is None:
        return None
    return BY_NAME[name].delta(before, now)


@dataclass(frozen=True)
class ProbeTick:
    """A tick's probe readings as the detector's step reads them: its last snapshot, this one, and each probe's
    interval (its plugin's ``delta``), computed the first time it is asked for and held for this tick only. The
    detector makes one per step (:meth:`detector.runtime.Detector.probe_tick`) and hands the same one to a
    reader fed before the step (a cause's culprit source, detector/causes/base.py) and to the build, so a
    probe's interval is computed once a tick."""

    prev: NodeSnapshot | None  # the detector's last snapshot (None before its first step)
    cur: NodeSnapshot
    _intervals: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def previous(self, name: str) -> Any:
        """The probe's reading in the last snapshot (None: none)."""
        return None if self.prev is None else self.prev.probe(name)

    def current(self, name: str) -> Any:
        return self.cur.probe(name)

    def interval(self, name: str) -> Any:
        """The probe's interval (its plugin's ``delta``), None unless it has a reading in both."""
        if self.prev is None:
            return None
        if name not in self._intervals:
            self._intervals[name] = probe_delta(name, self.prev, self.cur)
        return self._intervals[name]


class _Tick:
    """One build's rows: a workload's row is made the first time anything about it moved."""

    def __init__(self, dt: float) -> None:
        self.dt = dt
        self.rows: dict[str, WorkloadSignals] = {}
        self.node: dict[str, Any] = {}  # NodeSignals fields the plugins' extractors set

    def row(self, w: Workload) -> WorkloadSignals:
        r = self.rows.get(w.key)
        if r is None:
            r = self.rows[w.key] = WorkloadSignals(w, self.dt)
        return r


class SignalBuilder:
    """Joins two snapshots to workloads: each probe plugin's ``signal_extractor`` (probes/plugin.py) over
    its interval, and the cgroup files (CPU accounting, memory, PSI) read here, in a fixed order
    (``SIGNAL_STAGES``): which rows exist when a stage runs is part of what it computes."""

    def __init__(self, layout: CgroupLayout, ids: IdMapper) -> None:
        self.layout = layout
        self.ids = ids
        self.cpu_h = layout.hierarchy_for("cpu")
        self.mem_h = layout.hierarchy_for("memory")
        self.hierarchies = {p.id_controller: layout.hierarchy_for(p.id_controller) for p in PLUGINS}
        self.extractors = tuple((p, p.signal_extractor) for p in PLUGINS if p.signal_extractor is not None)
        # (the listed paths, the pod list version, their workload keys and those of unlisted rows since)
        self._present_of: tuple[object, int, frozenset[str]] | None = None
        self._containers_of: tuple[object, dict[str, list[str]]] | None = None  # (listed paths, pod uid -> containers)
        self._listed_now: Iterable[str] = ()

    def build(self, prev: NodeSnapshot, cur: NodeSnapshot, extra_paths: Iterable[str] = (),
              probes: ProbeTick | None = None) -> NodeSignals:
        """The signals of the interval ``prev`` -> ``cur``. ``probes``: the tick's probe intervals as the
        detector's step has them (:class:`ProbeTick` of ``prev`` and ``cur``, or of a snapshot holding the
        same probe readings), some perhaps computed already by a reader fed before the step."""
        if probes is None:
            probes = ProbeTick(prev, cur)
        tick = _Tick(max(cur.monotonic_s - prev.monotonic_s, 1e-6))
        # Which cgroups' file readings are new this tick. A collector that follows activity names them
        # (idle cgroups keep their last readings, and get no row: nothing happened to them); without
        # that, every reading is new and every listed workload gets a row, as before.
        changed = cur.changed_paths
        incremental = changed is not None
        # Workload keys of every listed cgroup. Asked first: it names each pod by its cpu-hierarchy
        # path, so a row a memory path (reclaim, memory.stat) opens below gets the pod's real target.
        listed_keys = self._present(extra_paths) if incremental else frozenset()
        if changed is None:
            for path in extra_paths:
                tick.row(self.ids.index.workload_of(path))
            changed = cur.cgroup_cpu.keys() | cur.cgroup_mem.keys() | cur.cgroup_psi.keys()
        intervals = {p.name: probes.interval(p.name) for p, _ in self.extractors}
        self._listed_now = extra_paths  # the containers of each pod (what it may use) are among them
        self._stage("tasks", intervals, tick)
        self._own_wait_by_container(tick)
        self._cpu_files(prev, cur, changed, incremental, tick)
        self._cpu_exposure(prev, cur, intervals, tick)
        self._stage("memory", intervals, tick)
        self._memory_files(prev, cur, changed, incremental, tick)
        self._stage("network", intervals, tick)
        self._psi_files(prev, cur, changed, tick)
        for plugin, extractor in self.extractors:  # node-wide facts: rows with nothing this tick have them too
            interval = intervals[plugin.name]
            if extractor.every_row is not None and interval is not None:
                for name, value in extractor.every_row(interval).items():
                    for r in tick.rows.values():
                        setattr(r, name, value)
        return NodeSignals.of(tick.dt, tick.rows, node_cpu_busy=_busy_cores(prev, cur, tick.dt),
                              node_psi=_node_psi(prev, cur, tick.dt), online_cpus=tuple(sorted(cur.node_cpu_per_cpu)),
                              present=self._present_with(tick, listed_keys) if incremental else None,
                              kswapd_pages_per_s=_vmstat_rate(prev, cur, tick.dt, lambda v: v.pgsteal_kswapd),
                              kswapd_scanned_pages_per_s=_vmstat_rate(prev, cur, tick.dt, lambda v: v.pgscan_kswapd),
                              **tick.node)

    def _stage(self, stage: str, intervals: dict[str, Any], tick: _Tick) -> None:
        """The extractors of one stage: their node values, and their values per workload on its row."""
        for plugin, extractor in self.extractors:
            interval = intervals[plugin.name]
            if extractor.stage != stage or interval is None:
                continue
            if extractor.node is not None:
                tick.node.update(extractor.node(interval, tick.dt))
            if extractor.workloads is None:
                continue
            hierarchy, primary = self.hierarchies[plugin.id_controller], plugin.id_controller == "cpu"
            seen: dict[str, Workload] = {}

            def workload_key(cgroup_id: int) -> str | None:
                w = self.ids.workload_of(cgroup_id, hierarchy, primary=primary)  # noqa: B023 (called right here)
                if w is None:
                    return None
                seen.setdefault(w.key, w)  # noqa: B023
                return w.key

            for key, values in extractor.workloads(interval, tick.dt, workload_key).items():
                r = tick.row(seen[key])
                for name, value in values.items():
                    setattr(r, name, value)

    def _cpu_files(self, prev: NodeSnapshot, cur: NodeSnapshot, changed: Iterable[str], incremental: bool,
                   tick: _Tick) -> None:
        """CPU use and CFS throttling of each workload's own cgroup, then of its containers."""
        dt = tick.dt
        for path in changed:
            c, p = cur.cgroup_cpu.get(path), prev.cgroup_cpu.get(path)
            if c is None or p is None or not self.ids.index.is_workload_root(path):
                continue  # only the workload's own cgroup: it already sums its children
            w = self.ids.index.workload_of(path)
            if incremental and w.key not in tick.rows and c.usage_ns == p.usage_ns and c.nr_periods == p.nr_periods:
                continue  # read again (its turn on the wheel) but it did not run: no row, no fake zeros
            r = tick.row(w)
            r.cpu_cores = max(c.usage_ns - p.usage_ns, 0) / 1e9 / dt
            r.quota_cores = c.quota_cores
            periods = c.nr_periods - p.nr_periods
            r.throttled_ratio = (c.nr_throttled - p.nr_throttled) / periods if periods > 0 else 0.0
            r.throttled_ms_per_s = max(c.throttled_ns - p.throttled_ns, 0) / 1e6 / dt
            cpus = cur.cgroup_cpus.get(path)
            r.cpus_allowed = len(cpus) if cpus else None
            if w.target.pod_uid:
                r.may_use = may_use(self._pod_containers(self._listed_now).get(w.target.pod_uid, ()),
                                    cur.cgroup_cpus, cur.cgroup_cpu)
        # Containers of a pod: their own quota and throttling (a limit set on one container only shows
        # there, not on the pod). Read when they moved; attached to the pod's row.
        for path in changed:
            c, p = cur.cgroup_cpu.get(path), prev.cgroup_cpu.get(path)
            if c is None or p is None or (c.usage_ns == p.usage_ns and c.nr_periods == p.nr_periods):
                continue
            named = self.ids.index.container_of(path)
            if named is None:
                continue
            periods = c.nr_periods - p.nr_periods
            r = tick.row(self.ids.index.workload_of(path))
            r.containers[path] = ContainerCpu(
                named[0], path, max(c.usage_ns - p.usage_ns, 0) / 1e9 / dt, c.quota_cores,
                (c.nr_throttled - p.nr_throttled) / periods if periods > 0 else 0.0,
                max(c.throttled_ns - p.throttled_ns, 0) / 1e6 / dt, named[1])

    def _cpu_exposure(self, prev: NodeSnapshot, cur: NodeSnapshot, intervals: dict[str, Any], tick: _Tick) -> None:
        """Where each workload ran (its CPU weights), and the per-CPU values of the "cpus" stage's
        extractors read through them, for the rows made so far."""
        self._stage("cpus", intervals, tick)
        exposures = [e.exposure for p, e in self.extractors
                     if e.stage == "cpus" and e.exposure is not None and intervals[p.name] is not None]
        for r in tick.rows.values():
            weights = self._cpu_weights(prev, cur, r.workload.target.cgroup)
            r.cpu_weights = weights
            for exposure in exposures:
                for name, value in exposure(weights, tick.node).items():
                    setattr(r, name, value)

    def _memory_files(self, prev: NodeSnapshot, cur: NodeSnapshot, changed: Iterable[str], incremental: bool,
                      tick: _Tick) -> None:
        for path in changed:
            m = cur.cgroup_mem.get(path)
            if m is not None and self.ids.index.is_workload_root(path):
                w = self.ids.index.workload_of(path, primary=False)
                before = prev.cgroup_mem.get(path)
                if incremental and w.key not in tick.rows and (before is None or before.usage_bytes == m.usage_bytes):
                    continue  # first sight or no change: nothing happened to it (no row, no store entity)
                r = tick.row(w)
                r.memory_usage_bytes, r.memory_limit_bytes = m.usage_bytes, m.limit_bytes

    def _psi_files(self, prev: NodeSnapshot, cur: NodeSnapshot, changed: Iterable[str], tick: _Tick) -> None:
        for path in changed:
            readings = cur.cgroup_psi.get(path)
            if readings is None or not self.ids.index.is_workload_root(path):
                continue
            before = prev.cgroup_psi.get(path, {})
            if before is readings:
                continue  # not read again since the last tick
            # Its own interval: a cgroup whose PSI is not read every tick has stalls from several ticks.
            psi_dt = cur.cgroup_psi_read_s.get(path, cur.monotonic_s) - prev.cgroup_psi_read_s.get(path, prev.monotonic_s)
            if psi_dt <= 0:
                continue
            r = tick.row(self.ids.index.workload_of(path))
            for resource, reading in readings.items():
                if resource not in before:
                    continue
                rate = psi_rate(before[resource], reading, psi_dt)
                if resource == "cpu":
                    r.psi_cpu_some = None if rate.some is None else rate.some * 100
                elif resource == "memory":
                    r.psi_memory_some = None if rate.some is None else rate.some * 100
                elif resource == "io":
                    r.psi_io_some = None if rate.some is None else rate.some * 100

    def _present_with(self, tick: _Tick, listed_keys: frozenset[str]) -> frozenset[str]:
        new = [k for k in tick.rows if k not in listed_keys]
        if new:  # a workload with a row that is not listed (the root, a service): present too
            listed_keys = listed_keys | frozenset(new)
            self._present_of = (self._present_of[0], self._present_of[1], listed_keys)  # type: ignore[index]
        return listed_keys

    def _present(self, listed: Iterable[str]) -> frozenset[str]:
        """Workload keys of the listed (cpu-hierarchy) cgroups and of every workload with a row since
        the list was made; the same object until either changes, so consumers can tell by identity.
        Made again when the list or the pod metadata changes (which drops the index's pod targets)."""
        version = self.ids.index.pods_version
        if self._present_of is None or self._present_of[0] is not listed or self._present_of[1] != version:
            self._present_of = (listed, version, frozenset(self.ids.index.workload_of(p).key for p in listed))
        return self._present_of[2]

    # -- helpers --------------------------------------------------------------------------------
    def _own_wait_by_container(self, tick: _Tick) -> None:
        """The runqlat plugin splits a workload's own wait by the cgroup it waited behind; named here (the
        probes know no containers): its container's name, or POD_ITSELF for the pod cgroup."""
        for r in tick.rows.values():
            if r.own_wait_by_cgroup:
                named: dict[str, float] = {}
                for cgroup_id, ns in r.own_wait_by_cgroup.items():
                    name = self._container_name(cgroup_id)
                    named[name] = named.get(name, 0.0) + ns
                r.own_wait_by_container = named

    def _pod_containers(self, listed: Iterable[str]) -> dict[str, list[str]]:
        """Pod UID -> its listed container paths; made again only when the listed paths change."""
        if self._containers_of is None or self._containers_of[0] is not listed:
            self._containers_of = (listed, containers_by_pod(listed))
        return self._containers_of[1]

    def _container_name(self, cgroup_id: int) -> str:
        path = self.ids.path_of(cgroup_id, self.cpu_h)
        named = self.ids.index.container_of(path) if path is not None else None
        return named[0] if named is not None else POD_ITSELF

    def _cpu_weights(self, prev: NodeSnapshot, cur: NodeSnapshot, key: str) -> dict[int, float]:
        c, p = cur.cgroup_cpu_percpu.get(key), prev.cgroup_cpu_percpu.get(key)
        if c is not None and p is not None and len(c) == len(p):
            deltas = [max(a - b, 0) for a, b in zip(c, p, strict=True)]
            total = sum(deltas)
            if total > 0:
                return {cpu: d / total for cpu, d in enumerate(deltas) if d}
        cpus = cur.cgroup_cpus.get(key)
        if cpus:
            return {cpu: 1 / len(cpus) for cpu in cpus}
        ncpu = len(cur.node_cpu_per_cpu) or 1
        return {cpu: 1 / ncpu for cpu in (cur.node_cpu_per_cpu or {0: None})}


def _node_psi(prev: NodeSnapshot, cur: NodeSnapshot, dt: float) -> dict[str, float]:
    node_psi: dict[str, float] = {}
    if cur.node_psi is not None and prev.node_psi is not None:
        for resource in ("cpu", "memory", "io", "irq"):
            a, b = prev.node_psi.get(resource), cur.node_psi.get(resource)
            if a is None or b is None:
                continue
            rate = psi_rate(a, b, dt)
            if rate.some is not None:
                node_psi[f"{resource}_some"] = rate.some * 100
            if rate.full is not None:
                node_psi[f"{resource}_full"] = rate.full * 100
    return node_psi


def _busy_cores(prev: NodeSnapshot, cur: NodeSnapshot, dt: float) -> float | None:
    if cur.node_cpu is None or prev.node_cpu is None:
        return None
    return max(cur.node_cpu.busy_ns - prev.node_cpu.busy_ns, 0) / 1e9 / dt


def _vmstat_rate(prev: NodeSnapshot, cur: NodeSnapshot, dt: float, counter: Callable[[NodeVmstat], int | None]) -> float:
    """Per second over the tick of one of the node's /proc/vmstat counters; 0 when either read lacks it."""
    if cur.node_vmstat is None or prev.node_vmstat is None:
        return 0.0
    a, b = counter(prev.node_vmstat), counter(cur.node_vmstat)
    return max(b - a, 0) / dt if a is not None and b is not None else 0.0
