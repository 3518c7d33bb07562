# SPDX-License-Identifier: Apache-2.0
"""Hard IRQ handler time per CPU and IRQ line (decoder for bpf/hardirq.bpf.c).

Why it matters: a device interrupt's handler runs on whichever CPU the interrupt lands on, taking that
time from the task that was running there. Kernels without CONFIG_IRQ_TIME_ACCOUNTING (this project's
dev VM among them) charge it to that task, as if the task had used the CPU; with it, the time shows
only node-wide (/proc/stat ``irq``). Either way nothing per pod shows that a pod's CPUs are busy with a
NIC's or a disk's interrupts (a neighbour's IO lands its completions there). Like softirq time it is
charged to CPUs, never to ``current``: everything here is keyed by (cpu, irq), and the detector reads
a workload's share through where it ran (``hardirq_ms_per_s``, weighted like softirq and steal).

What it covers: the handlers ``irq:irq_handler_entry`` / ``irq_handler_exit`` trace, i.e. device IRQ
lines (the numbered lines of /proc/interrupts). The local timer, IPIs and other architecture vectors
(LOC, RES, CAL, ... in /proc/interrupts) are not; a threaded handler's thread is a task the
scheduler accounts (only its primary handler is here). A shared line runs every action's handler
per interrupt: ``entries`` counts handler runs, which is /proc/interrupts' count on a line with one
action. IRQ names are the ``irqaction`` name of the first handler the BPF side saw on the line since
load (stored once per line, off the per-run path): no /proc file is read at run time.

Ground truth: /proc/interrupts counts the same interrupts per CPU (tests/test_hardirq.py). Measured on
kernel 6.18 the BPF programs run for 94-100 % of them per window (perf sees them all, no recursion
misses are recorded; the softirq and runqlat probes' programs show the same, cause not found):
``entries`` and the run time are a floor, never above the kernel.
"""

from __future__ import annotations

import struct
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from probes.base import BpfProbe
from probes.engine import AttachMode, Engine, LibbpfEngine, LoadedProbe, ProbeSpec, Tracepoint
from probes.hist import NN_HIST_SIZE, IntervalHistogram, LatencyHistogram
from probes.host import HostPaths
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

NAME = "hardirq"
SPEC = ProbeSpec(
    name=NAME,
    object_file="hardirq.bpf.o",
    tracepoints=(
        Tracepoint("irq_handler_entry", "hardirq_entry_btf", "hardirq_entry_raw"),
        Tracepoint("irq_handler_exit", "hardirq_exit_btf", "hardirq_exit_raw"),
    ),
)

_STATS = struct.Struct(f"<{NN_HIST_SIZE}sQ")  # struct hardirq_stats
_KEY = struct.Struct("<II")  # struct hardirq_key: irq, cpu
NAME_LEN = 32  # NN_IRQ_NAME_LEN
MAX_PAIRS = 2048  # NN_HARDIRQ_PAIRS: (cpu, line) pairs kept; past it, new pairs are counted as drops
# What this module decodes, per map: (key, value), checked against the object's BTF at load (engine).
MAP_LAYOUTS = {"stats": (_KEY, _STATS), "names": (4, NAME_LEN), "running": (4, 16), "drops": (4, 8)}


@dataclass(frozen=True)
class HardirqStats:
    """One CPU x IRQ line, cumulative since load."""

    runtime: LatencyHistogram  # irq_handler_entry -> irq_handler_exit
    entries: int  # handler runs (one per action of the line)

    @classmethod
    def decode(cls, raw: bytes) -> HardirqStats:
        runtime, entries = _STATS.unpack_from(raw)
        return cls(LatencyHistogram.decode(runtime), entries)


@dataclass(frozen=True)
class HardirqSnapshot:
    """Cumulative counters since load: (cpu, irq) pairs on which a handler ever ran, the lines' names,
    the drop counters. Subtract two with :func:`delta`."""

    monotonic_s: float
    stats: dict[tuple[int, int], HardirqStats]  # (cpu, irq) -> stats
    names: dict[int, str]  # irq -> the name its handler registered ("" when the kernel gave none)
    drops: dict[str, int]


class HardirqProbe(BpfProbe[None]):
    hierarchy = None  # per CPU and IRQ line, not per cgroup

    def __init__(
        self,
        engine: Engine | None = None,
        paths: HostPaths | None = None,
        layout: Any = None,
        attach_mode: AttachMode = "auto",
        max_pairs: int = MAX_PAIRS,
    ) -> None:
        self.paths = paths or HostPaths()
        engine = engine or LibbpfEngine(self.paths)
        self.probe: LoadedProbe = engine.open_probe(SPEC, attach_mode=attach_mode, map_sizes={"stats": max_pairs},
                                                    layouts=MAP_LAYOUTS)
        # Last read per (cpu, irq) pair: its bytes and its decoded stats. A value that did not move is
        # the same object again.
        self._decoded: dict[tuple[int, int], tuple[bytes, HardirqStats]] = {}
        self._names: dict[int, str] = {}

    def snapshot(self) -> HardirqSnapshot:
        """Per (cpu, irq) with a handler run since load. Costs follow what moved: a pair whose value is
        byte for byte the last read's is not decoded again; names are read once per line."""
        now = time.monotonic()
        stats: dict[tuple[int, int], HardirqStats] = {}
        for key, raw in self.probe.map_items("stats"):
            irq, cpu = _KEY.unpack(key)
            pair = (cpu, irq)
            last = self._decoded.get(pair)
            if last is None or last[0] != raw:
                last = self._decoded[pair] = (raw, HardirqStats.decode(raw))  # type: ignore[arg-type]
            stats[pair] = last[1]
            if irq not in self._names:
                self._read_name(irq)
        return HardirqSnapshot(now, stats, self._names, self.read_drops())

    def _read_name(self, irq: int) -> None:
        raw = self.probe.map_lookup("names", irq.to_bytes(4, "little"))
        if raw is None:
            return  # its first run is storing it right now: read at the next snapshot
        # Copy on write: a snapshot already handed out keeps the names it had.
        self._names = {**self._names, irq: bytes(raw).split(b"\0", 1)[0].decode(errors="replace")}  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class HardirqDelta:
    """One CPU x IRQ line over an interval."""

    entries: int  # may be < 0 if the map was reset: readers clamp
    runtime: IntervalHistogram


@dataclass(frozen=True)
class HardirqInterval:
    """Two snapshots' difference (the plugin's ``delta``): only the (cpu, irq) pairs that moved (the
    probe hands the same HardirqStats object again for one that did not), so its cost follows the
    interrupts that happened, not the node's CPUs x lines. Raw counts: readers divide by the interval."""

    interval_s: float  # 0 when there is no earlier snapshot
    stats: dict[tuple[int, int], HardirqDelta]
    names: dict[int, str]


def delta(prev: HardirqSnapshot | None, cur: HardirqSnapshot) -> HardirqInterval:
    """The interval prev -> cur (prev None: since load)."""
    stats: dict[tuple[int, int], HardirqDelta] = {}
    for key, s in cur.stats.items():
        before = prev.stats.get(key) if prev else None
        if before is s:
            continue  # not a count moved on that CPU and line
        stats[key] = HardirqDelta(s.entries - (before.entries if before else 0),
                                  s.runtime.delta(before.runtime if before else None))
    return HardirqInterval(cur.monotonic_s - prev.monotonic_s if prev else 0.0, stats, cur.names)


# -- the plugin: metrics, top view, detector signals ------------------------------------------------

HARDIRQ_RUNTIME = "noisyneighbor_hardirq_runtime_seconds"
HARDIRQ_ENTRIES = "noisyneighbor_hardirq_entries_total"
# The detector's names for what this probe feeds (declared below, so detector/ needs no edit).
SIGNAL = SignalSpec("hardirq_ms_per_s", "Hard IRQ handler time on its CPUs", "ms/s", noise_floor=1.0,
                    slo=SloSpec("hardirq_ms_per_s", 100.0, check_order=60, range=(0, 1000),
                                doc="device interrupt handler time on its CPUs (a tenth of a CPU) before it is a breach"))
BY_CPU = NodeFieldSpec("hardirq_ms_per_s_by_cpu")
# Per CPU, each IRQ line's handler ms per second and its name: which line and device an interrupt storm
# on a victim's CPUs comes from (detector/causes/hardirq.py names it).
LINES_BY_CPU = NodeFieldSpec("hardirq_lines_by_cpu")


@dataclass(frozen=True, slots=True)
class IrqLineLoad:
    """One IRQ line's handler time on one CPU over an interval."""

    irq: int
    name: str  # its handler's name, as /proc/interrupts ends the line ("" when the kernel gave none)
    ms_per_s: float
    runs_per_s: float


def node_series(snap: HardirqSnapshot) -> Iterator[NodeSample]:
    """Per CPU and line; the exporter sums both away unless --per-cpu-series (MetricSpec.per_cpu_labels):
    multi-queue devices have a line per CPU, so the lines grow with the node like the CPUs do."""
    for (cpu, irq), s in snap.stats.items():
        labels = (str(cpu), str(irq))
        yield HARDIRQ_RUNTIME, labels, s.runtime
        yield HARDIRQ_ENTRIES, labels, float(s.entries)


def rows(interval: HardirqInterval, dt: float) -> list[dict[str, Any]]:
    """JSON-able rows per CPU x IRQ line with handler runs in the interval, most handler time first."""
    out = []
    for (cpu, irq), d in interval.stats.items():
        if d.entries <= 0 and not d.runtime.count:
            continue
        out.append({
            "cpu": cpu,
            "irq": irq,
            "name": interval.names.get(irq) or "-",
            "entries": max(d.entries, 0),
            "entries_per_s": max(d.entries, 0) / dt if dt > 0 else 0.0,
            "runtime_mean_us": round(d.runtime.mean_ns / 1e3, 3),
            "runtime_p99_us": round(d.runtime.quantile_ns(0.99) / 1e3, 3),
            "runtime_max_us": round(d.runtime.max_ns / 1e3, 3),
            "runtime_ms_per_s": d.runtime.sum_ns / 1e6 / dt if dt > 0 else 0.0,
        })
    out.sort(key=lambda r: (r["runtime_ms_per_s"], r["entries"]), reverse=True)
    return out


def top_rows(view: TopInput) -> list[dict[str, Any]]:
    return rows(view.interval, view.dt)


def top_footer(section: dict[str, Any]) -> str:
    by_cpu: dict[int, float] = defaultdict(float)
    for r in section["rows"]:
        by_cpu[r["cpu"]] += r["runtime_ms_per_s"]
    busiest = max(by_cpu.items(), key=lambda kv: kv[1], default=None)
    most = f", most on cpu{busiest[0]}: {busiest[1]:.2f}ms/s" if busiest else ""
    return (f"hard IRQ handler time {sum(by_cpu.values()):.2f}ms/s over all CPUs{most} "
            "(device lines; timer and IPIs not included)")


TOP_TABLE = TopTable(
    title="hard IRQ handlers per CPU and line",
    columns=(
        TopColumn("CPU", "cpu", left=False),
        TopColumn("IRQ", "irq", left=False),
        TopColumn("NAME", "name", flex=True),
        TopColumn("RUNS/s", "entries_per_s", "rate"),
        TopColumn("RUN AVG", "runtime_mean_us", "us"),
        TopColumn("RUN P99", "runtime_p99_us", "us"),
        TopColumn("RUN MAX", "runtime_max_us", "us"),
        TopColumn("RUN/s", "runtime_ms_per_s", text=lambda r: f"{r['runtime_ms_per_s']:.2f}ms", sorted_by=True),
    ),
    rows=top_rows,
    nothing="no IRQ handler ran",
    hotkey="h",
    name_title=None,  # a row is a CPU's and a line's, not a cgroup's
    footer=top_footer,
)


def node_signals(interval: HardirqInterval, dt: float) -> dict[str, Any]:
    """Hard IRQ handler ms per second of each CPU (NodeSignals.hardirq_ms_per_s_by_cpu), and of each
    line on it (NodeSignals.hardirq_lines_by_cpu: cpu -> [IrqLineLoad], most time first)."""
    by_cpu: dict[int, float] = defaultdict(float)
    lines: dict[int, list[IrqLineLoad]] = defaultdict(list)
    for (cpu, irq), d in interval.stats.items():
        ms = d.runtime.sum_ns / 1e6 / dt
        by_cpu[cpu] += ms
        if ms > 0 or d.entries > 0:
            lines[cpu].append(IrqLineLoad(irq, interval.names.get(irq, ""), ms, max(d.entries, 0) / dt))
    for loads in lines.values():
        loads.sort(key=lambda x: -x.ms_per_s)
    return {BY_CPU.name: dict(by_cpu), LINES_BY_CPU.name: dict(lines)}


def exposure(weights: dict[int, float], node: dict[str, Any]) -> dict[str, Any]:
    """A workload's hard IRQ time: each CPU's, weighted by its share of the workload's CPU time."""
    by_cpu = node.get(BY_CPU.name) or {}
    return {SIGNAL.name: sum(w * by_cpu.get(cpu, 0.0) for cpu, w in weights.items()) if by_cpu else 0.0}


PLUGIN = ProbePlugin(
    name=NAME, specs=(SPEC,), factory=HardirqProbe, delta=delta,
    # ~0.3 µs a device interrupt over empty programs on the same tracepoints (kernel-counted, tp_btf, dev VM):
    # cheap, but on by default it would change the default probe set (`top --view all`, /readyz). Asked for
    # with --probes …,hardirq.
    default=False,
    signals=(SIGNAL.name,),
    signal_extractor=SignalExtractor(stage="cpus", fields=(SIGNAL.name,), node_fields=(BY_CPU.name, LINES_BY_CPU.name),
                                     node=node_signals, exposure=exposure, signal_specs=(SIGNAL,),
                                     node_specs=(BY_CPU, LINES_BY_CPU)),
    metrics=(HARDIRQ_RUNTIME, HARDIRQ_ENTRIES),
    metric_specs=(
        MetricSpec(HARDIRQ_RUNTIME, "histogram", "Hard IRQ handler run time, summed over CPUs and IRQ lines (per "
                   "CPU and line with --per-cpu-series).", ("cpu", "irq"), per_cgroup=False, per_cpu=True,
                   per_cpu_labels=("cpu", "irq")),
        MetricSpec(HARDIRQ_ENTRIES, "counter", "Hard IRQ handler runs (what /proc/interrupts counts on a line with one "
                   "handler), summed over CPUs and IRQ lines (per CPU and line with --per-cpu-series).", ("cpu", "irq"),
                   per_cgroup=False, per_cpu=True, per_cpu_labels=("cpu", "irq")),
    ),
    node_series=node_series,
    top_view=NAME,
    top_table=TOP_TABLE,
)
