# SPDX-License-Identifier: Apache-2.0
"""Softirq delay and run time per CPU and vector, and stall events (decoder for bpf/softirq.bpf.c).

Softirq time is charged to the CPU it ran on, never to the task that happened to be `current`:
everything here is keyed by (cpu, vector). Stall events name the tasks that were current at the
raise and at the run, so the detector can join "which pods ran on the CPUs that stalled".
Ground truth: `/proc/softirqs` (``testkit.procfiles.read_proc_softirqs``) counts the same entries. Measured on
kernel 6.18 the BPF program sees 97-100 % of them (perf sees them all, no recursion misses are
recorded; the missing runs are TIMER, SCHED and RCU ones): `entries` is a floor, never above the kernel.
"""

from __future__ import annotations

import ctypes
import struct
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from probes.base import BpfProbe
from probes.cgroupfs import CgroupLayout
from probes.engine import AttachMode, Engine, LibbpfEngine, LoadedProbe, ProbeSpec, Tracepoint
from probes.hist import NN_HIST_SIZE, IntervalHistogram, LatencyHistogram, merge_intervals
from probes.host import HostPaths, possible_cpu_count
from probes.plugin import (
    MetricSpec,
    NodeFieldSpec,
    NodeSample,
    ProbePlugin,
    SignalExtractor,
    SignalSpec,
    SloSpec,
    TopColumn,
    TopInput,
    TopTable,
)
from probes.units import fmt_us

SPEC = ProbeSpec(
    name="softirq",
    object_file="softirq.bpf.o",
    tracepoints=(
        # Without softirq_raise the probe still counts entries and run time (no delay): degraded.
        Tracepoint("softirq_raise", "softirq_raise_btf", "softirq_raise_raw", required=False),
        Tracepoint("softirq_entry", "softirq_entry_btf", "softirq_entry_raw"),
        Tracepoint("softirq_exit", "softirq_exit_btf", "softirq_exit_raw"),
    ),
)
# enum in include/linux/interrupt.h, spelled as /proc/softirqs spells them
VECTORS = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU")
DEFAULT_STALL_THRESHOLD_NS = 10_000_000

_STATS = struct.Struct(f"<{NN_HIST_SIZE}s{NN_HIST_SIZE}sQ8x")  # struct softirq_stats
# The words of a CPU's vector that move with every update: `entries` (entry: it and the delay
# histogram) and the run-time histogram's count (exit). Neither moved: the slot is as last read.
_CHANGE_WORDS = [(2 * NN_HIST_SIZE) // 8, (NN_HIST_SIZE + NN_HIST_SIZE - 16) // 8]
# What this module decodes, per map: (key, value), checked against the object's BTF at load (engine).
MAP_LAYOUTS = {"stats": (4, _STATS), "drops": (4, 8)}


class _StallEvent(ctypes.Structure):  # struct softirq_stall_event
    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("delay_ns", ctypes.c_uint64),
        ("runtime_ns", ctypes.c_uint64),
        ("raise_cgroup_id", ctypes.c_uint64),
        ("entry_cgroup_id", ctypes.c_uint64),
        ("cpu", ctypes.c_uint32),
        ("vec", ctypes.c_uint32),
        ("raise_pid", ctypes.c_uint32),
        ("raise_tgid", ctypes.c_uint32),
        ("entry_pid", ctypes.c_uint32),
        ("entry_tgid", ctypes.c_uint32),
        ("in_ksoftirqd", ctypes.c_uint8),
        ("raise_seen", ctypes.c_uint8),
        ("_pad", ctypes.c_uint8 * 6),
        ("raise_comm", ctypes.c_char * 16),
        ("entry_comm", ctypes.c_char * 16),
    ]


def vector_name(vec: int) -> str:
    return VECTORS[vec] if 0 <= vec < len(VECTORS) else f"VEC{vec}"


@dataclass(frozen=True)
class SoftirqStall:
    """One softirq run whose raise → entry delay or run time reached the stall threshold.

    `raise_*`: the task that was current on `cpu` when the vector was first raised (what was running
    while it waited, or the one that raised it). `entry_*`: the task in whose context it ran — a
    ksoftirqd thread (`in_ksoftirqd`), or whatever task it interrupted / that re-enabled bottom halves.
    """

    ts_ns: int
    cpu: int
    vector: str
    delay_ns: int  # 0 when the raise was not seen (raise_seen False)
    runtime_ns: int
    in_ksoftirqd: bool
    raise_seen: bool
    raise_pid: int
    raise_tgid: int
    raise_comm: str
    raise_cgroup_id: int
    entry_pid: int
    entry_tgid: int
    entry_comm: str
    entry_cgroup_id: int

    @classmethod
    def decode(cls, raw: bytes) -> SoftirqStall:
        e = _StallEvent.from_buffer_copy(raw[: ctypes.sizeof(_StallEvent)])
        return cls(
            ts_ns=e.ts_ns, cpu=e.cpu, vector=vector_name(e.vec), delay_ns=e.delay_ns, runtime_ns=e.runtime_ns,
            in_ksoftirqd=bool(e.in_ksoftirqd), raise_seen=bool(e.raise_seen),
            raise_pid=e.raise_pid, raise_tgid=e.raise_tgid, raise_comm=e.raise_comm.decode(errors="replace"),
            raise_cgroup_id=e.raise_cgroup_id,
            entry_pid=e.entry_pid, entry_tgid=e.entry_tgid, entry_comm=e.entry_comm.decode(errors="replace"),
            entry_cgroup_id=e.entry_cgroup_id,
        )


@dataclass(frozen=True)
class SoftirqStats:
    """One CPU x vector, cumulative since load."""

    delay: LatencyHistogram  # raise → entry, for the entries whose raise was seen
    runtime: LatencyHistogram  # entry → exit
    entries: int  # all entries (what /proc/softirqs counts)

    @classmethod
    def decode(cls, raw: bytes) -> SoftirqStats:
        delay, runtime, entries = _STATS.unpack_from(raw)
        return cls(LatencyHistogram.decode(delay), LatencyHistogram.decode(runtime), entries)


@dataclass(frozen=True)
class SoftirqSnapshot:
    """Cumulative counters since load; subtract two snapshots (see :func:`summarize`) for an interval."""

    monotonic_s: float
    stats: dict[tuple[int, str], SoftirqStats]  # (cpu, vector name) -> stats
    drops: dict[str, int]

    def entries(self) -> dict[tuple[int, str], int]:
        return {k: s.entries for k, s in self.stats.items()}


class SoftirqProbe(BpfProbe["SoftirqStall"]):
    bytes_read: int = 0  # stats looked at or copied out in place since load (no syscall copies them)
    bytes_scanned: int = 0  # the part of it that was counters looked at in place (nothing copied)

    def __init__(
        self,
        engine: Engine | None = None,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        stall_threshold_ns: int = DEFAULT_STALL_THRESHOLD_NS,
        attach_mode: AttachMode = "auto",
        stall_ring_bytes: int = 256 * 1024,
    ) -> None:
        self.v1_cpu = self._key_by("cpu", paths, layout)
        self.stall_threshold_ns = stall_threshold_ns
        engine = engine or LibbpfEngine(self.paths)
        self.cpus = possible_cpu_count(self.paths)
        self.probe: LoadedProbe = engine.open_probe(
            SPEC,
            rodata={"v1_cpu_cgroup": self.v1_cpu, "stall_threshold_ns": stall_threshold_ns},
            attach_mode=attach_mode,
            map_sizes={"stalls": stall_ring_bytes, "stats": self.cpus * len(VECTORS)},
            layouts=MAP_LAYOUTS,
        )
        if stall_threshold_ns:
            self._watch_events("stalls", SoftirqStall.decode)
        mapped = self.probe.map_mmap("stats") if hasattr(self.probe, "map_mmap") else None
        words = _STATS.size // 8
        self._mapped = None if mapped is None else (
            np.frombuffer(mapped, dtype="<u8")[: self.cpus * len(VECTORS) * words].reshape(-1, words))
        self._seen = np.zeros((0, len(_CHANGE_WORDS)), dtype="<u8")  # change words at the last read
        self._stats: dict[tuple[int, str], SoftirqStats] = {}  # every CPU x vector, as last decoded

    def snapshot(self) -> SoftirqSnapshot:
        """Per (cpu, vector) for every possible CPU and every vector, plus drop counters.

        Only the CPU x vector slots whose counters moved since the last read are copied out and
        decoded (read in place where the array is mapped); the others are the same SoftirqStats
        object again, so a tick's work follows the CPUs that were busy, not the node's size."""
        now = time.monotonic()
        if self._mapped is not None:
            rows = self._mapped
        else:
            blob = self.probe.map_array_values("stats")
            rows = np.frombuffer(blob, dtype="<u8").reshape(-1, _STATS.size // 8)
        seen = rows[:, _CHANGE_WORDS]
        if len(self._seen) != len(seen):
            moved: list[int] = list(range(len(seen)))
        else:
            moved = np.flatnonzero((seen != self._seen).any(axis=1)).tolist()
        for slot in moved:
            raw = rows[slot].tobytes()
            cpu, vec = divmod(slot, len(VECTORS))
            self._stats[(cpu, VECTORS[vec])] = SoftirqStats.decode(raw)
            # What was decoded, not what was looked at: the CPU may have counted a run in between,
            # and the next read must compare against the copy it holds.
            seen[slot] = np.frombuffer(raw, dtype="<u8")[_CHANGE_WORDS]
        self._seen = seen  # fancy indexing copied them
        if self._mapped is not None:
            self.bytes_read += seen.nbytes + len(moved) * _STATS.size
            self.bytes_scanned += seen.nbytes
        return SoftirqSnapshot(now, dict(self._stats), self.read_drops())

    def poll_stalls(self, timeout_ms: int = 0) -> list[SoftirqStall]:
        """Stall events since the last call (waits up to timeout_ms for the first one)."""
        return self._poll_events(timeout_ms)



@dataclass(frozen=True, slots=True)
class SoftirqDelta:
    """One CPU x vector over an interval."""

    entries: int  # may be < 0 if the map was reset: readers clamp
    delay: IntervalHistogram
    runtime: IntervalHistogram


@dataclass(frozen=True)
class SoftirqInterval:
    """Two snapshots' difference (the plugin's ``delta``): the CPU x vector pairs that moved (the probe
    hands the same SoftirqStats object again for one that did not), in the snapshot's order, so its
    cost follows the CPUs that were busy, not the node's size. Raw counts: readers divide by their
    interval."""

    interval_s: float  # 0 when there is no earlier snapshot
    stats: dict[tuple[int, str], SoftirqDelta]


def delta(prev: SoftirqSnapshot | None, cur: SoftirqSnapshot) -> SoftirqInterval:
    """The interval prev → cur (prev None: since load)."""
    stats: dict[tuple[int, str], SoftirqDelta] = {}
    for (cpu, vector), s in cur.stats.items():
        before = prev.stats.get((cpu, vector)) if prev else None
        if before is s:
            continue  # not a count moved on that CPU and vector
        stats[(cpu, vector)] = SoftirqDelta(
            s.entries - (before.entries if before else 0),
            s.delay.delta(before.delay if before else None),
            s.runtime.delta(before.runtime if before else None),
        )
    return SoftirqInterval(cur.monotonic_s - prev.monotonic_s if prev else 0.0, stats)


def summarize(prev: SoftirqSnapshot | None, cur: SoftirqSnapshot, include_idle: bool = False) -> list[dict]:
    """JSON-able rows per CPU x vector for the interval prev → cur (prev None: since load): :func:`rows`
    of :func:`delta`."""
    return rows(delta(prev, cur), include_idle)


def rows(interval: SoftirqInterval, include_idle: bool = False) -> list[dict]:
    """JSON-able rows per CPU x vector of one interval.

    `runtime_s_per_s` is the share of the CPU the vector took (softirq seconds per wall second);
    delay columns cover entries whose raise was seen (`delay_samples`). Rows with no entries in the
    interval are left out unless `include_idle` (which keeps those whose counters moved without an
    entry; the interval has no row for a pair where nothing moved). Sorted by CPU, then vector number.
    """
    out = []
    for (cpu, vector), d in sorted(interval.stats.items(), key=lambda kv: (kv[0][0], VECTORS.index(kv[0][1]))):
        delay, runtime = d.delay, d.runtime
        if not include_idle and d.entries <= 0 and not runtime.count:
            continue
        out.append({
            "cpu": cpu,
            "vector": vector,
            "entries": max(d.entries, 0),
            "delay_samples": delay.count,
            "delay_p50_us": round(delay.quantile_ns(0.5) / 1e3, 3),
            "delay_p99_us": round(delay.quantile_ns(0.99) / 1e3, 3),
            "delay_max_us": round(delay.max_ns / 1e3, 3),
            "runtime_p99_us": round(runtime.quantile_ns(0.99) / 1e3, 3),
            "runtime_max_us": round(runtime.max_ns / 1e3, 3),
            "runtime_s": runtime.sum_ns / 1e9,
            "runtime_s_per_s": runtime.sum_ns / 1e9 / interval.interval_s if interval.interval_s > 0 else 0.0,
        })
    return out


# -- the plugin: metrics, top view, detector signals ------------------------------------------------

SOFTIRQ_DELAY = "noisyneighbor_softirq_delay_seconds"
SOFTIRQ_RUNTIME = "noisyneighbor_softirq_runtime_seconds"
SOFTIRQ_ENTRIES = "noisyneighbor_softirq_entries_total"
WORST_STALLS = 5  # stall events kept per `top` interval (the count covers all of them)


def node_series(snap: SoftirqSnapshot) -> Iterator[NodeSample]:
    for (cpu, vector), stats in snap.stats.items():
        labels = (str(cpu), vector)
        yield SOFTIRQ_DELAY, labels, stats.delay
        yield SOFTIRQ_RUNTIME, labels, stats.runtime
        yield SOFTIRQ_ENTRIES, labels, float(stats.entries)


def top_rows(view: TopInput) -> list[dict[str, Any]]:
    """Per CPU and vector with entries in the interval, most CPU time first."""
    out = rows(view.interval)
    for r in out:
        r["entries_per_s"] = r["entries"] / view.dt
        r["runtime_ms_per_s"] = r["runtime_s_per_s"] * 1e3
    out.sort(key=lambda r: (r["runtime_ms_per_s"], r["delay_p99_us"], r["entries"]), reverse=True)
    return out


def top_stalls(probe: SoftirqProbe, paths: HostPaths) -> Callable[[TopInput, Callable[[int], str]], dict[str, Any]]:
    """The stall events of each `top` interval: how many, and the worst, with the tasks' cgroups named."""
    probe.poll_stalls(0)  # what happened before the baseline is not this interval's

    def extras(view: TopInput, name_of: Callable[[int], str]) -> dict[str, Any]:
        stalls = probe.poll_stalls(0)
        worst = sorted(stalls, key=lambda s: max(s.delay_ns, s.runtime_ns), reverse=True)[:WORST_STALLS]
        return {
            "stalls": len(stalls),
            "stall_threshold_ms": getattr(probe, "stall_threshold_ns", 0) / 1e6,
            "worst_stalls": [{**asdict(s), "raise_cgroup": name_of(s.raise_cgroup_id),
                              "entry_cgroup": name_of(s.entry_cgroup_id)} for s in worst],
        }

    return extras


def top_footer(section: dict[str, Any]) -> str:
    footer = f"stall events (≥{section['stall_threshold_ms']:g}ms delay or run): {section['stalls']}"
    if section["worst_stalls"]:
        s = section["worst_stalls"][0]
        where = f"ksoftirqd ({s['entry_comm']})" if s["in_ksoftirqd"] else f"{s['entry_comm']} in {s['entry_cgroup']}"
        footer += (
            f" — worst: {s['vector']} cpu{s['cpu']} delay {fmt_us(s['delay_ns'] / 1e3) if s['raise_seen'] else '?'}"
            f" run {fmt_us(s['runtime_ns'] / 1e3)}, raised under {s['raise_comm'] or '-'} in {s['raise_cgroup']},"
            f" ran in {where}"
        )
    return footer


TOP_TABLE = TopTable(
    title="softirq per CPU and vector",
    columns=(
        TopColumn("CPU", "cpu", left=False),
        TopColumn("VECTOR", "vector"),
        TopColumn("ENTRIES/s", "entries_per_s", "rate"),
        TopColumn("DELAY P99", "delay_p99_us", "us", when="delay_samples"),
        TopColumn("DELAY MAX", "delay_max_us", "us", when="delay_samples"),
        TopColumn("RUN P99", "runtime_p99_us", "us"),
        TopColumn("RUN MAX", "runtime_max_us", "us"),
        TopColumn("RUN/s", "runtime_ms_per_s", text=lambda r: f"{r['runtime_ms_per_s']:.2f}ms", sorted_by=True),
    ),
    rows=top_rows,
    nothing="no softirq ran",
    hotkey="s",
    name_title=None,  # a row is a CPU's, not a cgroup's
    extras=top_stalls,
    footer=top_footer,
)


def node_signals(interval: SoftirqInterval, dt: float) -> dict[str, Any]:
    """Softirq run time (ms/s) and the raise -> entry delay p99 of each CPU: charged to CPUs, never to
    ``current``; a workload's exposure is read through where it ran (:func:`exposure`)."""
    sirq_ms: dict[int, float] = defaultdict(float)
    sirq_delay: dict[int, float] = {}
    per_cpu_delay: dict[int, list[IntervalHistogram]] = defaultdict(list)
    for (cpu, _vec), d in interval.stats.items():
        sirq_ms[cpu] += d.runtime.sum_ns / 1e6 / dt
        per_cpu_delay[cpu].append(d.delay)
    for cpu, delays in per_cpu_delay.items():
        sirq_delay[cpu] = merge_intervals(delays).quantile_ns(0.99)
    return {"softirq_ms_per_s_by_cpu": dict(sirq_ms), "softirq_delay_p99_ns_by_cpu": sirq_delay}


def exposure(weights: dict[int, float], node: dict[str, Any]) -> dict[str, Any]:
    """A workload's softirq: each CPU's run time weighted by its share of the workload's CPU time, and
    the worst delay p99 among the CPUs it spent more than 5 % of its time on."""
    sirq_ms, sirq_delay = node["softirq_ms_per_s_by_cpu"], node["softirq_delay_p99_ns_by_cpu"]
    return {
        "softirq_ms_per_s": sum(w * sirq_ms.get(cpu, 0.0) for cpu, w in weights.items()),
        "softirq_delay_p99_ns": max((sirq_delay.get(cpu, 0.0) for cpu, w in weights.items() if w > 0.05), default=0.0),
    }


DELAY_MIN_MS_PER_S = 10.0  # softirq time on its CPUs below which a late softirq is not a breach


def delay_to_check(row: Any) -> float | None:
    """The victim's softirq delay p99 its SLO checks this tick (its WorkloadSignals row), None: not
    checked. A late softirq matters when there is softirq work to be late: a quiet CPU's occasional timer
    softirq deferred to ksoftirqd has a long raise->entry delay and steals nothing."""
    if row.softirq_delay_p99_ns and row.cpu_cores and row.cpu_cores > 0.05 \
            and row.softirq_ms_per_s >= DELAY_MIN_MS_PER_S:
        return row.softirq_delay_p99_ns
    return None


PLUGIN = ProbePlugin(
    name="softirq", specs=(SPEC,), factory=SoftirqProbe, delta=delta,
    victim_plots=("softirq_ms_per_s",),
    signals=("softirq_ms_per_s", "softirq_delay_p99_ns"),
    signal_extractor=SignalExtractor(
        stage="cpus", fields=("softirq_ms_per_s", "softirq_delay_p99_ns"),
        node_fields=("softirq_ms_per_s_by_cpu", "softirq_delay_p99_ns_by_cpu"), node=node_signals,
        exposure=exposure,
        signal_specs=(
            SignalSpec("softirq_ms_per_s", "Softirq time on its CPUs", "ms/s", noise_floor=1.0, stored="always",
                       baseline=True, context_note=lambda row: f"on CPUs {sorted(row.cpu_weights)}",
                       slo=SloSpec("softirq_ms_per_s", 100.0, check_order=40, range=(0, 1000), divides=True,
                                   doc="softirq run time on its CPUs (a tenth of a CPU) before it is a breach")),
            SignalSpec("softirq_delay_p99_ns", "Softirq delay p99", "ms", 1e-6, noise_floor=5_000.0, stored="never",
                       slo=SloSpec("softirq_delay_p99_ms", 2.0, check_order=50, to_raw=1e6, gate=delay_to_check,
                                   doc=f"checked with at least {DELAY_MIN_MS_PER_S:g} ms/s of softirq on its CPUs")),
        ),
        node_specs=(NodeFieldSpec("softirq_ms_per_s_by_cpu"), NodeFieldSpec("softirq_delay_p99_ns_by_cpu"))),
    metrics=(SOFTIRQ_DELAY, SOFTIRQ_RUNTIME, SOFTIRQ_ENTRIES),
    metric_specs=(
        MetricSpec(SOFTIRQ_DELAY, "histogram", "Softirq raise to handler entry, per vector (and CPU with "
                   "--per-cpu-series).", ("cpu", "vector"), per_cgroup=False, per_cpu=True),
        MetricSpec(SOFTIRQ_RUNTIME, "histogram", "Softirq handler run time, per vector (and CPU with --per-cpu-series).",
                   ("cpu", "vector"), per_cgroup=False, per_cpu=True),
        MetricSpec(SOFTIRQ_ENTRIES, "counter", "Softirq handler runs (what /proc/softirqs counts), per vector (and CPU "
                   "with --per-cpu-series).", ("cpu", "vector"), per_cgroup=False, per_cpu=True),
    ),
    node_series=node_series,
    top_view="softirq",
    top_table=TOP_TABLE,
)
