# SPDX-License-Identifier: Apache-2.0
"""Hard IRQ probe: its handler runs per CPU and line against the kernel's own count (/proc/interrupts)
while real block IO raises the disk's interrupts; its decoder, interval, series, top rows and signals
from fake snapshots; the off path."""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from probes import hardirq
from probes.engine import LibbpfEngine, ProbeError
from probes.hardirq import HardirqDelta, HardirqInterval, HardirqProbe, HardirqSnapshot, HardirqStats
from probes.hist import HIST_SLOTS, IntervalHistogram, LatencyHistogram
from probes.host import HostPaths
from tests.ground_truth import missed_allowance

# The probe's BPF programs miss a share of the handler runs /proc/interrupts counts, as the softirq and
# runqlat probes' do (tests/ground_truth.py). Measured on this machine (kernel 6.18, 2 CPUs, tp_btf and
# raw_tp alike) over windows of 2000 O_DIRECT reads: perf's count of irq:irq_handler_entry equalled
# /proc/interrupts while the probe counted up to 120 of 2007 (6.0 %) fewer, in 5-15 % of the windows at
# one time and in 1-3 % at another (none under stress-ng --cpu 2), with no recursion miss recorded and
# the entry and exit programs each run that many fewer times (counters in the programs). Never more
# than the kernel. Cause not found. The tests allow this share on the low side only.
HANDLER_RUN_LOSS = 0.05

# ---- helpers ----------------------------------------------------------------------------------------


def read_proc_interrupts(path: Path = Path("/proc/interrupts")) -> tuple[dict[tuple[int, int], int], dict[int, str]]:
    """The kernel's interrupt counts per (cpu, numbered line), and each line's description after its
    counts (chip, hwirq, then its handlers' names, comma-separated when the line is shared). The
    architecture's own rows (LOC, RES, ...) are not numbered lines: left out, as the probe leaves them."""
    lines = path.read_text().splitlines()
    cpus = [int(c[3:]) for c in lines[0].split()]
    counts: dict[tuple[int, int], int] = {}
    descs: dict[int, str] = {}
    for line in lines[1:]:
        head, _, rest = line.partition(":")
        if not head.strip().isdigit():
            continue
        irq, fields = int(head), rest.split()
        for cpu, count in zip(cpus, fields[: len(cpus)], strict=True):
            counts[(cpu, irq)] = int(count)
        descs[irq] = " ".join(fields[len(cpus):])
    return counts, descs


def disk_io(directory: Path, blocks: int) -> None:
    """Block IO that completes through the disk's interrupt: written and fsynced, then read back with
    O_DIRECT (no page cache: every read is a request to the device)."""
    path = directory / "hardirq-io"
    block = 4096
    with open(path, "wb") as f:
        f.write(os.urandom(block) * blocks)
        f.flush()
        os.fsync(f.fileno())
    buf = mmap.mmap(-1, block)  # page aligned, as O_DIRECT wants
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        for i in range(blocks):
            assert os.preadv(fd, [buf], i * block) == block
    finally:
        os.close(fd)
        buf.close()
        path.unlink()


def _hist(values_ns: list[int]) -> LatencyHistogram:
    slots = [0] * HIST_SLOTS
    for v in values_ns:
        slots[min((v // 1000).bit_length(), HIST_SLOTS - 1)] += 1
    return LatencyHistogram(tuple(slots), sum(values_ns), len(values_ns), max(values_ns, default=0))


def _ihist(count: int, sum_ns: int) -> IntervalHistogram:
    return IntervalHistogram(tuple([0, count] + [0] * (HIST_SLOTS - 2)), sum_ns, count, None)


def active_interval() -> HardirqInterval:
    """An interval in which two CPUs ran handlers (tests/test_signal_plugins.py runs the extractor on it)."""
    return HardirqInterval(1.0, {(0, 36): HardirqDelta(100, _ihist(100, 3_000_000)),
                                 (1, 36): HardirqDelta(10, _ihist(10, 400_000)),
                                 (1, 41): HardirqDelta(5, _ihist(5, 100_000))}, {36: "virtio1-req.0", 41: "virtio3-rx"})


# ---- the kernel's own count ---------------------------------------------------------------------------


@pytest.mark.root
@pytest.mark.vm
@pytest.mark.parametrize("attach_mode", ["tp_btf", "raw_tp"])
def test_handler_runs_match_proc_interrupts_under_disk_io(attach_mode, disk_dir):
    """Reads were p1, truth1, p2 … p3, truth2, p4. On every line with one handler whose count moved, the
    kernel's count per CPU over [truth1, truth2] lies between the probe's over [p2, p3] and over [p1, p4],
    but for one interrupt in flight at a read (the kernel counts it before its handler runs, the probe
    when the handler returns; one at a time per CPU and line) and, on the low side only, the share of
    runs the probe's programs miss (HANDLER_RUN_LOSS). Each line's handlers ran for some time, and the
    probe names each line as /proc/interrupts does."""
    with HardirqProbe(attach_mode=attach_mode) as probe:
        assert probe.status.attach_mode == attach_mode
        p1 = probe.snapshot()
        t1, _ = read_proc_interrupts()
        p2 = probe.snapshot()
        disk_io(disk_dir, 2000)
        p3 = probe.snapshot()
        t2, descs = read_proc_interrupts()
        p4 = probe.snapshot()

    def entries(snap: HardirqSnapshot, key: tuple[int, int]) -> int:
        s = snap.stats.get(key)
        return s.entries if s else 0

    moved = {k for k in t2 if t2[k] != t1.get(k, 0)}
    single = {irq for irq, desc in descs.items() if "," not in desc}
    checked = sorted(k for k in moved if k[1] in single)
    bad, runtime_ns = [], {}
    for k in checked:
        truth = t2[k] - t1.get(k, 0)
        low, high = entries(p3, k) - entries(p2, k), entries(p4, k) - entries(p1, k)
        print(f"cpu{k[0]} irq {k[1]:4} {descs[k[1]][-30:]:30} truth {truth:6}  probe {low}..{high}")
        if not low - 1 <= truth <= high + 1 + missed_allowance(truth, HANDLER_RUN_LOSS):
            bad.append((k, low, truth, high))
        before, after = p2.stats.get(k), p3.stats.get(k)
        if after is not None:
            d = after.runtime.delta(before.runtime if before else None)
            assert abs(d.count - (after.entries - (before.entries if before else 0))) <= 1  # counted together
            runtime_ns[k[1]] = runtime_ns.get(k[1], 0) + d.sum_ns
    assert bad == []
    disk = max(checked, key=lambda k: t2[k] - t1.get(k, 0))
    assert t2[disk] - t1.get(disk, 0) >= 100, "too little interrupt activity: the test proves nothing"
    for irq in {k[1] for k in checked if t2[k] - t1.get(k, 0) >= 10}:
        assert runtime_ns.get(irq, 0) > 0, f"irq {irq} ran handlers but no run time was measured"
        assert descs[irq].split()[-1].startswith(p4.names[irq]) and p4.names[irq], (irq, descs[irq], p4.names[irq])
    assert p4.drops == dict.fromkeys(p4.drops, 0)


@pytest.mark.root
def test_layouts_match_the_object():
    with HardirqProbe() as probe:
        obj = probe.probe.obj  # type: ignore[attr-defined]
        assert obj.map("stats").value_size == hardirq._STATS.size == 35 * 8 + 8
        assert obj.map("names").value_size == hardirq.NAME_LEN
        # Keyed by (irq, cpu), one copy: memory follows the pairs that ran, not the possible CPUs.
        assert obj.map("stats").key_size == 8 and not obj.map("stats").percpu and not obj.map("names").percpu


# ---- off: one line, and the others carry on -----------------------------------------------------------


def test_a_kernel_without_the_irq_tracepoints_is_one_clear_line(tmp_path):
    """No BTF type and no tracefs event for irq_handler_entry/exit (a kernel built without them):
    refused before anything is loaded, in one line."""
    btf = Path("/sys/kernel/btf/vmlinux")
    if not btf.exists():
        pytest.skip("needs this kernel's BTF file to stand in for a --btf file")
    fake = HostPaths.under(tmp_path)
    (fake.tracefs / "events" / "sched" / "sched_switch").mkdir(parents=True)  # tracefs is there, irq's not
    with pytest.raises(ProbeError) as exc:
        HardirqProbe(engine=LibbpfEngine(paths=fake, btf_path=btf))
    msg = str(exc.value)
    assert msg == "hardirq: off: kernel lacks tracepoint(s) irq_handler_entry, irq_handler_exit"


def test_missing_object_is_one_clear_line(tmp_path):
    with pytest.raises(ProbeError) as exc:
        HardirqProbe(engine=LibbpfEngine(object_dir=tmp_path))
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("hardirq: off") and "make bpf" in msg


# ---- decoding, the interval, series, top rows (no kernel needed) -------------------------------------


def test_decode_mirrors_struct_hardirq_stats():
    hist = _hist([3000, 5000, 40_000])
    raw = struct.pack(f"<{HIST_SLOTS}Q3QQ", *hist.slots, hist.sum_ns, hist.count, hist.max_ns, 3)
    assert len(raw) == hardirq._STATS.size
    assert HardirqStats.decode(raw) == HardirqStats(hist, 3)


def _snapshots() -> tuple[HardirqSnapshot, HardirqSnapshot]:
    idle = HardirqStats(_hist([2000]), 1)
    prev = HardirqSnapshot(10.0, {(1, 36): HardirqStats(_hist([10_000] * 4), 4), (0, 41): idle}, {36: "virtio1-req.0"},
                           {})
    cur = HardirqSnapshot(12.0, {(1, 36): HardirqStats(_hist([10_000] * 4 + [20_000] * 100), 104), (0, 41): idle,
                                 (0, 36): HardirqStats(_hist([30_000] * 2), 2)}, {36: "virtio1-req.0", 41: "virtio3-rx"}, {})
    return prev, cur


def test_delta_holds_only_what_moved_and_rows_put_the_most_time_first():
    prev, cur = _snapshots()
    interval = hardirq.delta(prev, cur)
    assert interval.interval_s == 2.0
    assert set(interval.stats) == {(1, 36), (0, 36)}  # (0, 41) is the same object: nothing moved
    assert interval.stats[(1, 36)].entries == 100 and interval.stats[(1, 36)].runtime.sum_ns == 2_000_000
    assert hardirq.delta(None, cur).stats[(0, 41)].entries == 1  # since load
    rows = hardirq.rows(interval, interval.interval_s)
    assert [(r["cpu"], r["irq"], r["name"]) for r in rows] == [(1, 36, "virtio1-req.0"), (0, 36, "virtio1-req.0")]
    top = rows[0]
    assert top["entries_per_s"] == 50.0 and top["runtime_ms_per_s"] == pytest.approx(1.0)
    assert top["runtime_mean_us"] == 20.0 and top["runtime_max_us"] == pytest.approx(20.0)
    assert hardirq.top_footer({"rows": rows}).startswith("hard IRQ handler time 1.03ms/s over all CPUs, most on cpu1")
    import json

    json.dumps(rows)


def test_series_are_summed_over_cpus_and_lines_unless_asked():
    """Lines grow with the node (a multi-queue NIC or NVMe disk has one per CPU): at 64 CPUs with two such
    devices, one histogram and one counter by default, every CPU x line with --per-cpu-series."""
    from noisyneighbor.exporter import Exporter, render_text
    from probes.cgroupfs import discover
    from probes.snapshot import NodeSnapshot

    stats = {(cpu, 100 + cpu + 64 * dev): HardirqStats(_hist([5000] * 3), 3) for cpu in range(64) for dev in range(2)}
    snap = NodeSnapshot(monotonic_s=1.0, wall_s=1.0, plugins={"hardirq": HardirqSnapshot(1.0, stats, {}, {})})

    def scrape(**kw) -> dict:
        exporter = Exporter(CollectorRegistry(), node="n1", layout=discover(), **kw)
        exporter.update(snap)
        return {f.name: f.samples for f in text_string_to_metric_families(render_text(exporter).decode())
                if f.name in (hardirq.HARDIRQ_RUNTIME, hardirq.HARDIRQ_ENTRIES.removesuffix("_total"))}

    lean = scrape()
    runtime, entries = lean[hardirq.HARDIRQ_RUNTIME], lean[hardirq.HARDIRQ_ENTRIES.removesuffix("_total")]
    assert len(runtime) == 20 and len(entries) == 1  # 17 buckets, +Inf, _sum, _count
    assert entries[0].value == 3 * 128 and entries[0].labels == {"node": "n1"}
    full = scrape(per_cpu_series=True)
    per_line = full[hardirq.HARDIRQ_ENTRIES.removesuffix("_total")]
    assert len(per_line) == 128 and {s.labels["cpu"] for s in per_line} == {str(c) for c in range(64)}


# ---- what it means to the detector --------------------------------------------------------------------


def test_signals_per_cpu_and_through_where_a_workload_ran():
    extractor = hardirq.PLUGIN.signal_extractor
    node = extractor.node(active_interval(), 0.5)
    assert node["hardirq_ms_per_s_by_cpu"] == {0: 6.0, 1: 1.0}
    # and per line on each CPU, most time first, named as /proc/interrupts ends the line
    assert node["hardirq_lines_by_cpu"] == {
        0: [hardirq.IrqLineLoad(36, "virtio1-req.0", 6.0, 200.0)],
        1: [hardirq.IrqLineLoad(36, "virtio1-req.0", 0.8, 20.0), hardirq.IrqLineLoad(41, "virtio3-rx", 0.2, 10.0)]}
    assert extractor.exposure({0: 0.75, 1: 0.25}, node) == {"hardirq_ms_per_s": 0.75 * 6.0 + 0.25 * 1.0}
    assert extractor.exposure({0: 1.0}, {"hardirq_ms_per_s_by_cpu": {}}) == {"hardirq_ms_per_s": 0.0}


def test_the_detector_takes_the_signal_from_the_plugin_alone():
    """Declared in probes/hardirq.py only: catalogued, on every row (0 with the probe off), stored."""
    from detector.catalog import SIGNALS, human_value
    from detector.cgroups import CgroupResolver
    from detector.signals import SignalBuilder
    from detector.workloads import IdMapper, WorkloadIndex
    from probes.cgroupfs import discover
    from probes.cpuacct import CgroupCpuStat
    from probes.snapshot import NodeSnapshot

    assert SIGNALS["hardirq_ms_per_s"].label == "Hard IRQ handler time on its CPUs"
    assert human_value("hardirq_ms_per_s", 12.5) == "12.5 ms/s"
    layout = discover(HostPaths())
    builder = SignalBuilder(layout, IdMapper(CgroupResolver(HostPaths(), layout), WorkloadIndex(ls_globs=["/ls-*"])))

    def snap(t: float, usage_ns: int, irq: HardirqSnapshot | None) -> NodeSnapshot:
        return NodeSnapshot(monotonic_s=t, wall_s=t, plugins={} if irq is None else {"hardirq": irq},
                            cgroup_cpus={"/ls-web": (1,)},
                            cgroup_cpu={"/ls-web": CgroupCpuStat(2, usage_ns, None, None, 0, 0, 0, None, None, None, None)})

    prev, cur = _snapshots()
    signals = builder.build(snap(10.0, 0, prev), snap(12.0, 600_000_000, cur), extra_paths=["/ls-web"])
    row = signals.workloads["/ls-web"]
    assert signals.hardirq_ms_per_s_by_cpu == {1: pytest.approx(1.0), 0: pytest.approx(0.03)}
    assert row.hardirq_ms_per_s == pytest.approx(1.0)  # it ran on CPU 1 only
    assert row.as_store_values()["hardirq_ms_per_s"] == pytest.approx(1.0)

    off = builder.build(snap(10.0, 0, None), snap(12.0, 600_000_000, None), extra_paths=["/ls-web"])
    assert off.workloads["/ls-web"].hardirq_ms_per_s == 0.0 and off.hardirq_ms_per_s_by_cpu == {}


# ---- the hardirq cause on the probe's real output -----------------------------------------------------


@pytest.mark.root
def test_an_interrupt_storm_is_named_by_its_line_and_device_as_proc_interrupts_says(disk_dir):
    """The hardirq cause (detector/causes/hardirq.py) on what the probe really read: block IO raises the
    disk's interrupts, and the CPU /proc/interrupts counted most of them on is the victim's. The rule
    names the line with the most handler time there, one /proc/interrupts counted on that CPU, by the
    device /proc/interrupts ends the line with; the plan is one advice note (IRQ affinity) naming both.
    Neither /proc/stat's irq time (no CONFIG_IRQ_TIME_ACCOUNTING here: it stays 0) nor a storm past the
    default SLO (100 ms/s) can be had on this host on demand: the SLO is set under what the reads gave."""
    from dataclasses import replace

    from detector import causes
    from detector.causes import hardirq as cause
    from detector.causes.plan import Note, NoteKey, PlanContext
    from detector.decisions import Cause, Target
    from detector.model import Incident
    from detector.policy import ActuatorPolicy, SloThresholds
    from detector.signals import NodeSignals, WorkloadSignals
    from detector.workloads import Workload

    with HardirqProbe() as probe:
        p1 = probe.snapshot()
        t1, _ = read_proc_interrupts()
        disk_io(disk_dir, 2000)
        t2, descs = read_proc_interrupts()
        p2 = probe.snapshot()
    moved = {k: t2[k] - t1.get(k, 0) for k in t2 if t2[k] != t1.get(k, 0)}
    cpu, disk_irq = max(moved, key=lambda k: moved[k])
    assert moved[(cpu, disk_irq)] >= 100, "too little interrupt activity: the test proves nothing"
    interval = hardirq.delta(p1, p2)
    extractor = hardirq.PLUGIN.signal_extractor
    node = extractor.node(interval, interval.interval_s)
    victim = Target("/kubepods.slice/v", "v", "default", "web", "LS")
    row = WorkloadSignals(Workload("pod:v", victim), interval.interval_s)
    row.cpu_weights = {cpu: 1.0}
    row.hardirq_ms_per_s = extractor.exposure(row.cpu_weights, node)["hardirq_ms_per_s"]
    assert row.hardirq_ms_per_s > 0
    ctx = causes.CauseContext(
        key="pod:v", row=row, signals=NodeSignals.of(interval.interval_s, {"pod:v": row}, **node),
        slo=replace(SloThresholds(), hardirq_ms_per_s=row.hardirq_ms_per_s / 2), breached={"hardirq_ms_per_s"},
        foreign={}, own_wait_ns=0.0, total_wait_ns=0.0, window_s=interval.interval_s,
        cpu_culprits=lambda *a: [], correlation_culprits=lambda *a: [], kernel_work_judges=causes.KERNEL_WORK_JUDGES)
    verdict = causes.decide(ctx)
    assert verdict.cause == Cause.HARDIRQ and verdict.findings == (cause.STORM,)
    line = next(e for e in verdict.evidence if e.signal == cause.IRQ_LINE)
    irq = int(line.value)
    top = node["hardirq_lines_by_cpu"][cpu][0]
    assert irq == top.irq and line.note == top.name  # the line with the most handler time on its CPU ...
    assert moved.get((cpu, irq), 0) > 0  # ... which the kernel counted interrupts of there ...
    assert descs[irq].split()[-1].startswith(top.name) and top.name  # ... by the name /proc/interrupts gives it
    inc = Incident("inc-h", victim, verdict.cause, 0.0, verdict.confidence, "hardirq_ms_per_s",
                   evidence=list(verdict.evidence), victim_cpus=[cpu])
    plan = causes.spec(inc.cause).plan
    assert plan is not None
    steps = list(plan(PlanContext(inc, "opened", 0.0, ActuatorPolicy(), "hardirq_ms_per_s", lambda: [], None)))
    assert [s.key for s in steps] == [NoteKey(cause.AFFINITY, (str(irq),))]
    assert isinstance(steps[0], Note) and f"IRQ {irq} ({top.name})" in steps[0].text
    assert f"/proc/irq/{irq}/smp_affinity_list" in steps[0].text and f"CPUs {cpu}" in steps[0].text


def test_the_hardirq_rule_holds_past_its_slo_and_its_share_is_the_handler_time_over_the_wait():
    """The rule on a run-queue breach: held when the handler time on its CPUs is past the SLO (its share the
    handler time over the wait, at most 1), not held under it; the line with the most time where the
    victim ran is named (the interval of active_interval(): line 36 on CPU 0, 41 on CPU 1 only)."""
    from detector import causes
    from detector.causes import hardirq as cause
    from detector.decisions import Cause, Target
    from detector.policy import SloThresholds
    from detector.signals import NodeSignals, WorkloadSignals
    from detector.workloads import Workload

    node = hardirq.PLUGIN.signal_extractor.node(active_interval(), 1.0)  # CPU 0: 3 ms/s; CPU 1: 0.4 + 0.1

    def ctx(weights: dict[int, float], slo: float) -> causes.CauseContext:
        row = WorkloadSignals(Workload("pod:v", Target("/v")), 1.0)
        row.cpu_weights = weights
        row.hardirq_ms_per_s = hardirq.PLUGIN.signal_extractor.exposure(weights, node)["hardirq_ms_per_s"]
        row.runq_wait_ms_per_s = 2.0
        return causes.CauseContext(
            key="pod:v", row=row, signals=NodeSignals.of(1.0, {"pod:v": row}, **node),
            slo=SloThresholds(hardirq_ms_per_s=slo), breached={"runq_p99_ns"}, foreign={}, own_wait_ns=0.0,
            total_wait_ns=0.0, window_s=1.0, cpu_culprits=lambda *a: [], correlation_culprits=lambda *a: [],
            kernel_work_judges=causes.KERNEL_WORK_JUDGES)

    held = cause.rule(ctx({0: 1.0}, 1.0))
    assert held is not None and held.cause == Cause.HARDIRQ and held.share == 1.0  # 3 ms/s of handlers > 2 of wait
    assert next(e.value for e in held.evidence if e.signal == cause.IRQ_LINE) == 36
    held = cause.rule(ctx({1: 1.0}, 0.25))
    assert held is not None and held.share == pytest.approx(0.25)  # 0.5 ms/s over 2 ms/s of wait
    assert [(e.value, e.note) for e in held.evidence if e.signal == cause.IRQ_LINE] == [(36, "virtio1-req.0")]
    assert cause.rule(ctx({1: 1.0}, 100.0)) is None  # under its SLO
