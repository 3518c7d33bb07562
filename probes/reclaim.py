# SPDX-License-Identifier: Apache-2.0
"""Memory reclaim stalls per memory cgroup and for the node (decoder for bpf/reclaim.bpf.c).

Three kinds of reclaim, each a begin → end pair of vmscan tracepoints in the stalled task:
- ``memcg``: the task's memory cgroup hit its limit (v1 ``memory.limit_in_bytes``, v2 ``memory.max``
  or ``memory.high``) and the charge reclaims inside that cgroup. This is the "my pod is slow because
  it sits at its own limit" case. Whoever lowers a limit or writes ``memory.reclaim`` runs the same
  reclaim and is charged for it too (it is that writer that waits). So is khugepaged: it charges the
  huge page it collapses to the memcg of the process it collapses, and at that memcg's limit reclaims
  the pod's pages in its own context, keyed to its own cgroup (the root). No kernel up to 6.18 names
  the target memcg in the tracepoint; the stall events (comm ``khugepaged``) show those passes.
- ``direct``: the node ran short of free pages and an allocating task reclaims for the whole node:
  one pass per ``/proc/vmstat`` ``allocstall_*`` increment. This is the noisy-neighbour case: any
  pod may pay for another pod's page cache.
- ``softlimit`` (v1 only, required=False): a global reclaimer trims cgroups above their
  ``memory.soft_limit_in_bytes``. It runs *inside* a direct reclaim pass (or in kswapd, then keyed
  by kswapd's cgroup, the root), so its time and pages are also in the enclosing direct pass:
  never add the kinds up.

Keys are memory-cgroup ids: the v1 memory hierarchy's directory inode on v1/hybrid hosts (pods'
memory cgroups live there), the v2 cgroup id otherwise.

Pages are what the end tracepoint reports: LRU pages freed. For memcg reclaim that equals the
pages the kernel adds to the cgroup's ``pgsteal`` (v2 memory.stat) and to the node's
``pgsteal_anon + pgsteal_file``; global direct reclaim also counts slab pages freed by shrinkers.
"""

from __future__ import annotations

import ctypes
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from probes.base import BpfProbe
from probes.cgroupfs import CgroupLayout
from probes.engine import AttachMode, Engine, LibbpfEngine, LoadedProbe, ProbeSpec, Tracepoint
from probes.hist import NN_HIST_SIZE, IntervalHistogram, LatencyHistogram
from probes.host import HostPaths
from probes.memstat import read_node_vmstat
from probes.plugin import (
    CgroupSample,
    MetricSpec,
    NodeFieldSpec,
    NodeSample,
    ProbePlugin,
    RowFieldSpec,
    SignalExtractor,
    SignalSpec,
    SloSpec,
    TopColumn,
    TopInput,
    TopTable,
    WorkloadKey,
)
from probes.units import fmt_ms, fmt_rate, fmt_us

SPEC = ProbeSpec(
    name="reclaim",
    object_file="reclaim.bpf.o",
    tracepoints=(
        Tracepoint("mm_vmscan_direct_reclaim_begin", "reclaim_direct_begin_btf", "reclaim_direct_begin_raw"),
        Tracepoint("mm_vmscan_direct_reclaim_end", "reclaim_direct_end_btf", "reclaim_direct_end_raw"),
        Tracepoint("mm_vmscan_memcg_reclaim_begin", "reclaim_memcg_begin_btf", "reclaim_memcg_begin_raw"),
        Tracepoint("mm_vmscan_memcg_reclaim_end", "reclaim_memcg_end_btf", "reclaim_memcg_end_raw"),
        # Soft limits are a v1 feature; kernels built without it lose only this kind.
        Tracepoint(
            "mm_vmscan_memcg_softlimit_reclaim_begin", "reclaim_softlimit_begin_btf", "reclaim_softlimit_begin_raw",
            required=False,
        ),
        Tracepoint(
            "mm_vmscan_memcg_softlimit_reclaim_end", "reclaim_softlimit_end_btf", "reclaim_softlimit_end_raw",
            required=False,
        ),
    ),
)
KINDS = ("direct", "memcg", "softlimit")  # enum nn_reclaim_kind

_KEY = struct.Struct("<QII")  # struct reclaim_key
_STATS_TAIL = struct.Struct("<QQ")  # struct reclaim_stats after the nn_hist: nr_reclaimed, no_progress
STATS_SIZE = NN_HIST_SIZE + _STATS_TAIL.size
# What this module decodes, per map: (key, value), checked against the object's BTF at load (engine).
BEGIN_SIZE = 48  # struct reclaim_begin (the raw_tp flavour's pid hash; only its keys are read, by tests)
MAP_LAYOUTS = {"cgroup_reclaim": (_KEY, STATS_SIZE), "node_reclaim": (4, STATS_SIZE), "fallback_reclaim": (4, BEGIN_SIZE),
               "drops": (4, 8)}


class _ReclaimEvent(ctypes.Structure):
    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("duration_ns", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("nr_reclaimed", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("tgid", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
        ("order", ctypes.c_uint32),
        ("gfp_flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("comm", ctypes.c_char * 16),
    ]


def _kind_name(kind: int) -> str:
    return KINDS[kind] if 0 <= kind < len(KINDS) else f"kind{kind}"


@dataclass(frozen=True)
class ReclaimStats:
    """Cumulative reclaim passes of one key: latency.count passes, nr_reclaimed pages."""

    latency: LatencyHistogram
    nr_reclaimed: int
    no_progress: int  # passes that freed nothing

    @property
    def count(self) -> int:
        return self.latency.count

    @classmethod
    def empty(cls) -> ReclaimStats:
        return cls(LatencyHistogram.empty(), 0, 0)

    @classmethod
    def decode(cls, raw: bytes) -> ReclaimStats:
        pages, no_progress = _STATS_TAIL.unpack_from(raw, NN_HIST_SIZE)
        return cls(LatencyHistogram.decode(raw), pages, no_progress)



@dataclass(frozen=True)
class ReclaimStall:
    """One reclaim pass at or above the stall threshold."""

    ts_ns: int
    duration_ns: int
    cgroup_id: int
    kind: str
    nr_reclaimed: int
    pid: int
    tgid: int
    comm: str
    order: int  # allocation order that had to reclaim
    gfp_flags: int
    cpu: int

    @classmethod
    def decode(cls, raw: bytes) -> ReclaimStall:
        e = _ReclaimEvent.from_buffer_copy(raw[: ctypes.sizeof(_ReclaimEvent)])
        return cls(
            e.ts_ns, e.duration_ns, e.cgroup_id, _kind_name(e.kind), e.nr_reclaimed, e.pid, e.tgid,
            e.comm.decode(errors="replace"), e.order, e.gfp_flags, e.cpu,
        )


@dataclass(frozen=True)
class ReclaimSnapshot:
    """Cumulative counters since load; subtract two snapshots (summarize) for an interval."""

    monotonic_s: float
    per_cgroup: dict[tuple[int, str], ReclaimStats]  # (memcg id, kind)
    node: dict[str, ReclaimStats]  # kind -> whole node; "direct" matches allocstall_*
    drops: dict[str, int]

    @property
    def node_direct(self) -> ReclaimStats:
        return self.node.get("direct", ReclaimStats.empty())

    def cgroup(self, cgroup_id: int, kind: str = "memcg") -> ReclaimStats:
        return self.per_cgroup.get((cgroup_id, kind), ReclaimStats.empty())


@dataclass(frozen=True, slots=True)
class ReclaimDelta:
    """One key's reclaim passes over an interval (counts clamped at 0)."""

    latency: IntervalHistogram  # latency.count passes
    pages: int
    no_progress: int


def _delta_of(cur: ReclaimStats, prev: ReclaimStats | None) -> ReclaimDelta:
    return ReclaimDelta(cur.latency.delta(prev.latency if prev else None),
                        max(cur.nr_reclaimed - (prev.nr_reclaimed if prev else 0), 0),
                        max(cur.no_progress - (prev.no_progress if prev else 0), 0))


@dataclass(frozen=True)
class ReclaimInterval:
    """Two snapshots' difference (the plugin's ``delta``), read by ``top`` and the agent's detector.
    ``per_cgroup`` holds only the (memory cgroup id, kind) keys that reclaimed in it; ``node`` every kind
    the probe counts. Raw counts: readers divide by their own interval."""

    interval_s: float
    per_cgroup: dict[tuple[int, str], ReclaimDelta]
    node: dict[str, ReclaimDelta]

    @property
    def node_direct(self) -> ReclaimDelta:
        return self.node.get("direct") or _delta_of(ReclaimStats.empty(), None)


def delta(prev: ReclaimSnapshot | None, cur: ReclaimSnapshot) -> ReclaimInterval:
    """The interval prev → cur (prev None: since load)."""
    before = prev.per_cgroup if prev is not None else {}
    per_cgroup: dict[tuple[int, str], ReclaimDelta] = {}
    for key, stats in cur.per_cgroup.items():
        earlier = before.get(key)
        if earlier is not None and earlier.latency.count == stats.latency.count:
            continue  # no pass ended: nothing to subtract (the common case, checked without a delta)
        d = _delta_of(stats, earlier)
        if d.latency.count:
            per_cgroup[key] = d
    node_before = prev.node if prev is not None else {}
    node = {kind: _delta_of(stats, node_before.get(kind)) for kind, stats in cur.node.items()}
    return ReclaimInterval(cur.monotonic_s - prev.monotonic_s if prev is not None else 0.0, per_cgroup, node)


def _interval_row(d: ReclaimDelta, dt: float) -> dict | None:
    lat = d.latency
    if not lat.count:
        return None
    return {
        "count": lat.count,
        "count_per_s": lat.count / dt,
        "pages": d.pages,
        "pages_per_s": d.pages / dt,
        "no_progress": d.no_progress,
        "stall_ms_per_s": lat.sum_ns / 1e6 / dt,
        "mean_us": lat.mean_ns / 1e3,
        "p99_us": lat.quantile_ns(0.99) / 1e3,
        "max_us": lat.max_ns / 1e3,
        "max_exact": lat.exact_max_ns is not None,
    }


def summarize(prev: ReclaimSnapshot, cur: ReclaimSnapshot) -> list[dict]:
    """:func:`rows` of :func:`delta`."""
    return rows(delta(prev, cur))


def rows(interval: ReclaimInterval) -> list[dict]:
    """JSON-able rows, one per (cgroup id, kind) that reclaimed in the interval, most stalled first.

    Each row: cgroup_id, kind, interval_s, count, count_per_s, pages, pages_per_s, no_progress,
    stall_ms_per_s (time spent in reclaim per second of wall time, summed over the cgroup's tasks),
    mean_us, p99_us (within a factor of 2: log2 slots), max_us and max_exact.
    """
    dt = max(interval.interval_s, 1e-9)
    out = []
    for (cgroup_id, kind), d in interval.per_cgroup.items():
        row = _interval_row(d, dt)
        if row is not None:
            out.append({"cgroup_id": cgroup_id, "kind": kind, "interval_s": dt, **row})
    out.sort(key=lambda r: (-r["stall_ms_per_s"], r["cgroup_id"], r["kind"]))
    return out


def node_rows(interval: ReclaimInterval) -> dict[str, dict]:
    """Node totals per kind for the interval (same fields as rows); kinds with no pass are absent."""
    dt = max(interval.interval_s, 1e-9)
    out = {}
    for kind, d in interval.node.items():
        row = _interval_row(d, dt)
        if row is not None:
            out[kind] = {"interval_s": dt, **row}
    return out


class ReclaimProbe(BpfProbe["ReclaimStall"]):
    def __init__(
        self,
        engine: Engine | None = None,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        stall_threshold_ns: int = 10_000_000,
        attach_mode: AttachMode = "auto",
        stall_ring_bytes: int = 256 * 1024,
        max_keys: int = 1536,
    ) -> None:
        """stall_threshold_ns: passes at least this long go to poll_stalls() (0: none)."""
        self.v1_memory = self._key_by("memory", paths, layout)
        engine = engine or LibbpfEngine(self.paths)
        rodata: dict[str, int | bool] = {"v1_memory_cgroup": self.v1_memory, "stall_threshold_ns": stall_threshold_ns}
        sizes = {"stalls": stall_ring_bytes, "cgroup_reclaim": max_keys}
        probe: LoadedProbe | None = None
        if attach_mode in ("auto", "tp_btf"):
            # tp_btf keeps the begin state in task storage: the raw_tp flavour's pid hash gets one entry.
            probe = engine.open_probe(SPEC, rodata=rodata, attach_mode=attach_mode,
                                      map_sizes={**sizes, "fallback_reclaim": 1}, layouts=MAP_LAYOUTS)
            if probe.status.attach_mode != "tp_btf":
                probe.close()  # auto chose raw_tp on this kernel: load it with its full pid hash
                probe = None
        if probe is None:
            probe = engine.open_probe(SPEC, rodata=rodata, attach_mode="raw_tp", map_sizes=sizes, layouts=MAP_LAYOUTS)
        self.probe = probe
        if stall_threshold_ns:
            self._watch_events("stalls", ReclaimStall.decode)

    def snapshot(self) -> ReclaimSnapshot:
        per_cgroup = {}
        for key, value in self.probe.map_items("cgroup_reclaim"):  # one copy per key, every CPU adds to it
            cgroup_id, kind, _ = _KEY.unpack(key)
            per_cgroup[(cgroup_id, _kind_name(kind))] = ReclaimStats.decode(value)  # type: ignore[arg-type]
        node = {}
        for i, kind in enumerate(KINDS):
            value = self.probe.map_lookup("node_reclaim", i.to_bytes(4, "little"))
            node[kind] = ReclaimStats.decode(value) if value else ReclaimStats.empty()  # type: ignore[arg-type]
        drops = self.read_drops()
        return ReclaimSnapshot(time.monotonic(), per_cgroup, node, drops)

    summarize = staticmethod(summarize)

    def forget(self, cgroup_ids: list[int]) -> int:
        """Drop removed cgroups (all kinds) from the kernel map so pod churn cannot fill it."""
        return sum(
            self.probe.map_delete("cgroup_reclaim", _KEY.pack(cg, kind, 0))
            for cg in cgroup_ids
            for kind in range(len(KINDS))
        )

    def poll_stalls(self, timeout_ms: int = 0) -> list[ReclaimStall]:
        return self._poll_events(timeout_ms)



# -- the plugin: metrics, top view, detector signals ------------------------------------------------

RECLAIM_LATENCY = "noisyneighbor_reclaim_latency_seconds"
RECLAIM_PAGES = "noisyneighbor_reclaim_pages_total"
NODE_RECLAIM_LATENCY = "noisyneighbor_node_reclaim_latency_seconds"
NODE_RECLAIM_PAGES = "noisyneighbor_node_reclaim_pages_total"
NODE_ALLOCSTALLS = "noisyneighbor_node_allocstalls_total"


def activity(snap: ReclaimSnapshot) -> dict[int, int]:
    out: dict[int, int] = {}
    for (cgroup_id, _kind), stats in snap.per_cgroup.items():
        out[cgroup_id] = out.get(cgroup_id, 0) + stats.count
    return out


def cgroup_series(snap: ReclaimSnapshot) -> Iterator[CgroupSample]:
    for (cgroup_id, kind), stats in snap.per_cgroup.items():
        yield RECLAIM_LATENCY, cgroup_id, (kind,), stats.latency
        yield RECLAIM_PAGES, cgroup_id, (kind,), float(stats.nr_reclaimed)


def node_series(snap: ReclaimSnapshot) -> Iterator[NodeSample]:
    for kind, stats in snap.node.items():
        yield NODE_RECLAIM_LATENCY, (kind,), stats.latency
        yield NODE_RECLAIM_PAGES, (kind,), float(stats.nr_reclaimed)


def top_node(probe: ReclaimProbe, paths: HostPaths) -> Callable[[TopInput, Callable[[int], str]], dict[str, Any]]:
    """Each `top` interval's node totals per kind, and /proc/vmstat's direct reclaim passes beside them."""
    last = [read_node_vmstat(paths)]

    def extras(view: TopInput, name_of: Callable[[int], str]) -> dict[str, Any]:
        vmstat, before = read_node_vmstat(paths), last[0]
        allocstall = None
        if vmstat is not None and before is not None:
            allocstall = max(vmstat.allocstall_total - before.allocstall_total, 0)
        last[0] = vmstat
        return {"node": node_rows(view.interval), "allocstall": allocstall,
                "allocstall_per_s": None if allocstall is None else allocstall / view.dt}

    return extras


def top_footer(section: dict[str, Any]) -> str:
    direct = section["node"].get("direct")
    node = "node: direct reclaim " + (
        f"{direct['count']} passes, {fmt_rate(direct['pages_per_s'])} pages/s, {fmt_ms(direct['stall_ms_per_s'])}/s"
        f" stalled, max {fmt_us(direct['max_us'], direct['max_exact'])}"
        if direct else "none"
    )
    others = "".join(f", {kind} {row['count']} passes" for kind, row in section["node"].items() if kind != "direct")
    vmstat = "?" if section["allocstall"] is None else f"+{section['allocstall']}"
    return f"{node}{others}   /proc/vmstat allocstall: {vmstat}"


TOP_TABLE = TopTable(
    title="memory reclaim per memory cgroup",
    columns=(
        TopColumn("KIND", "kind"),
        TopColumn("COUNT/s", "count_per_s", "rate"),
        TopColumn("PAGES/s", "pages_per_s", "rate"),
        TopColumn("STALL/s", "stall_ms_per_s", "ms", sorted_by=True),
        TopColumn("P99", "p99_us", "us"),
        TopColumn("MAX", "max_us", "us", exact="max_exact"),
    ),
    rows=lambda view: rows(view.interval),
    nothing="no memory reclaim in any cgroup",
    hotkey="c",
    name_title="MEMORY CGROUP / POD",
    kind_key="cgroup_kind",  # "kind" is the reclaim kind here
    extras=top_node,
    footer=top_footer,
)


def workload_signals(interval: ReclaimInterval, dt: float, workload_key: WorkloadKey) -> dict[str, dict[str, Any]]:
    """Reclaim stalls in each workload's own allocations (memory hierarchy ids), by kind."""
    out: dict[str, dict[str, Any]] = {}
    for (cgid, kind), rd in interval.per_cgroup.items():  # only the (memcg id, kind) keys that reclaimed
        key = workload_key(cgid)
        if key is None:
            continue
        r = out.setdefault(key, {"reclaim_stall_ms_per_s": 0.0, "reclaim_by_kind_ms_per_s": {},
                                 "reclaim_pages_per_s": 0.0})
        ms = rd.latency.sum_ns / 1e6 / dt
        r["reclaim_stall_ms_per_s"] += ms
        r["reclaim_by_kind_ms_per_s"][kind] = r["reclaim_by_kind_ms_per_s"].get(kind, 0.0) + ms
        r["reclaim_pages_per_s"] += rd.pages / dt
    return out


def allocstall_series(node: Any) -> Iterator[NodeSample]:
    """Global direct reclaim passes by zone from the node's /proc/vmstat reading (NodeSnapshot.node_vmstat,
    read once a tick by the collector): what the kernel counts of direct reclaim, BPF or not."""
    vmstat = node.node_vmstat
    if vmstat is not None:
        for zone, passes in vmstat.allocstall.items():
            yield NODE_ALLOCSTALLS, (zone,), float(passes)


def by_kind_note(row: Any) -> str:
    """The victim's stall by kind, for its incident's context line: "direct 3.0, memcg 12.5"."""
    return ", ".join(f"{k} {v:.1f}" for k, v in sorted(row.reclaim_by_kind_ms_per_s.items()))


PLUGIN = ProbePlugin(
    name="reclaim", specs=(SPEC,), factory=ReclaimProbe,
    activity=activity, activity_moves_memory=True, delta=delta, map_entries=lambda s: len(s.per_cgroup),
    id_controller="memory",
    victim_plots=("reclaim_stall_ms_per_s",),
    signals=("reclaim_stall_ms_per_s",),
    signal_extractor=SignalExtractor(
        stage="memory", fields=("reclaim_stall_ms_per_s", "reclaim_by_kind_ms_per_s", "reclaim_pages_per_s"),
        node_fields=("node_direct_reclaim_ms_per_s",), workloads=workload_signals,
        node=lambda interval, dt: {"node_direct_reclaim_ms_per_s": interval.node_direct.latency.sum_ns / 1e6 / dt},
        # Its stall is stored every tick (a baseline is learned for it: a quiet tick is a 0, not a gap).
        signal_specs=(SignalSpec("reclaim_stall_ms_per_s", "Memory reclaim stall", "ms/s", noise_floor=0.5,
                                 stored="always", baseline=True, context_note=by_kind_note,
                                 slo=SloSpec("reclaim_stall_ms_per_s", 20.0, check_order=30, range=(0, 1000),
                                             divides=True)),),
        # The stall by kind (direct = global, memcg, softlimit) and the pages reclaimed, for the cause.
        row_specs=(RowFieldSpec("reclaim_by_kind_ms_per_s", dict), RowFieldSpec("reclaim_pages_per_s")),
        node_specs=(NodeFieldSpec("node_direct_reclaim_ms_per_s", default=float),)),
    metrics=(RECLAIM_LATENCY, RECLAIM_PAGES, NODE_RECLAIM_LATENCY, NODE_RECLAIM_PAGES, NODE_ALLOCSTALLS),
    metric_specs=(
        MetricSpec(RECLAIM_LATENCY, "histogram", "Reclaim passes the cgroup's tasks stalled in, by kind (direct, memcg, "
                   "softlimit; softlimit passes are also inside direct ones).", ("kind",)),
        MetricSpec(RECLAIM_PAGES, "counter", "Pages freed by the cgroup's reclaim passes, by kind.", ("kind",)),
        MetricSpec(NODE_RECLAIM_LATENCY, "histogram", "Reclaim passes on the node, by kind.", ("kind",), per_cgroup=False),
        MetricSpec(NODE_RECLAIM_PAGES, "counter", "Pages freed by reclaim passes on the node, by kind.", ("kind",),
                   per_cgroup=False),
        MetricSpec(NODE_ALLOCSTALLS, "counter", "Global direct reclaim passes (/proc/vmstat allocstall_*), by zone.",
                   ("zone",), per_cgroup=False),
    ),
    cgroup_series=cgroup_series,
    node_series=node_series,
    shared_node_series=allocstall_series,
    top_view="reclaim",
    top_table=TOP_TABLE,
    top_options={"stall_threshold_ns": 0},  # no stall ring buffer: top shows the histograms only
)
