# SPDX-License-Identifier: Apache-2.0
"""Hypervisor steal per CPU, as a probe plugin: the time each vCPU was runnable but the hypervisor ran
something else (``/proc/stat``'s 8th column, ``steal``).

On a cloud VM the host takes CPU time from the guest; inside the guest it looks like the task that was
"running" made no progress, and a task waiting behind it waits longer. The rq clock the runqueue probe
measures waits with includes stolen time, so a victim on stolen CPUs shows runqueue latency with no
pod on the node to blame. The detector joins this plugin's per-CPU steal to the CPUs a victim ran on
(``steal_ms_per_s``, weighted like softirq time) and names the cause ``hypervisor_steal``.

No BPF: the kernel already counts steal per CPU (paravirt steal clock, KVM/Xen/Hyper-V). Bare metal reads
0 everywhere; a kernel without the column (before 2.6.11) reads 0.

Series: ``noisyneighbor_cpu_steal_seconds_total``: none on bare metal (CPUs with no steal have no
series); on a VM one series, the vCPUs summed, and one per vCPU with ``--per-cpu-series`` (the series
budget's rule for every per-CPU family: 64 more at 64 vCPUs only when asked). The detector reads the
per-CPU figure from the probe either way.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from probes.cgroupfiles import CpuTimes
from probes.engine import ProbeError, ProbeStatus
from probes.host import HostPaths
from probes.plugin import MetricSpec, NodeFieldSpec, ProbePlugin, SignalExtractor, SignalSpec
from probes.procstat import ProcStatReader

NAME = "steal"
CPU_STEAL = "noisyneighbor_cpu_steal_seconds_total"


@dataclass(frozen=True)
class StealSnapshot:
    """Cumulative per CPU since boot: steal and all time (both ns, from USER_HZ ticks)."""

    monotonic_s: float
    steal_ns: dict[int, int]
    total_ns: dict[int, int]  # every column up to steal: the CPU's accounted time


@dataclass(frozen=True)
class StealInterval:
    interval_s: float
    steal_ns: dict[int, int]  # per CPU over the interval (only CPUs whose steal moved)
    total_ns: dict[int, int]  # per CPU accounted time over the interval (every CPU)

    def share(self, cpu: int) -> float:
        """The CPU's time the hypervisor took, 0..1, of what the CPU accounted over the interval."""
        total = self.total_ns.get(cpu, 0)
        return min(self.steal_ns.get(cpu, 0) / total, 1.0) if total > 0 else 0.0

    def ms_per_s(self) -> dict[int, float]:
        """Stolen ms per second of wall time, per CPU whose steal moved."""
        if self.interval_s <= 0:
            return {}
        return {cpu: ns / 1e6 / self.interval_s for cpu, ns in self.steal_ns.items() if ns}


def steal_of(per_cpu: dict[int, CpuTimes]) -> tuple[dict[int, int], dict[int, int]]:
    """(steal ns, accounted ns) per CPU from /proc/stat's per-CPU lines (the one /proc/stat parser's).

    A line short of the steal column (kernels before 2.6.11) reads as no steal; junk lines are left out.
    """
    steal = {cpu: t.steal_ns for cpu, t in per_cpu.items()}
    total = {cpu: t.busy_ns + t.idle_ns + t.iowait_ns for cpu, t in per_cpu.items()}
    return steal, total


class StealProbe:
    """Reads /proc/stat's steal column per CPU; what the collector asks of any probe."""

    hierarchy = None  # per CPU, not per cgroup

    def __init__(self, paths: HostPaths | None = None, layout: Any = None, attach_mode: str = "auto",
                 proc_stat: ProcStatReader | None = None) -> None:
        # Given the collector's reader, a snapshot takes the reading the collector made at the start of
        # the tick (/proc/stat once a tick); alone (tests, a caller without a collector), it reads itself.
        self._shared = proc_stat is not None
        self.proc_stat = proc_stat or ProcStatReader(paths)
        self.path = self.proc_stat.path
        reading = self.proc_stat.read()
        if reading is None:
            raise ProbeError(f"{NAME}: {self.path} is missing")
        if not reading.per_cpu:
            raise ProbeError(f"{NAME}: {self.path} has no per-CPU lines")
        self.status = ProbeStatus(NAME, "on")
        self.status.attach_mode = "/proc/stat"  # "steal: on (/proc/stat)", as the BPF probes say their flavour

    def snapshot(self) -> StealSnapshot:
        reading = self.proc_stat.latest if self._shared else self.proc_stat.read()
        if reading is None:
            return StealSnapshot(time.monotonic(), {}, {})
        steal, total = steal_of(reading.per_cpu)
        return StealSnapshot(reading.monotonic_s, steal, total)

    def close(self) -> None:
        pass

    def __enter__(self) -> StealProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def delta(prev: StealSnapshot | None, cur: StealSnapshot) -> StealInterval:
    """The interval prev -> cur (prev None: since boot). A CPU that went offline and back keeps counting."""
    if prev is None:
        return StealInterval(0.0, {c: v for c, v in cur.steal_ns.items() if v}, dict(cur.total_ns))
    steal = {}
    for cpu, ns in cur.steal_ns.items():
        d = ns - prev.steal_ns.get(cpu, ns)
        if d > 0:
            steal[cpu] = d
    total = {cpu: max(ns - prev.total_ns.get(cpu, ns), 0) for cpu, ns in cur.total_ns.items()}
    return StealInterval(cur.monotonic_s - prev.monotonic_s, steal, total)


def node_signals(interval: StealInterval, dt: float) -> dict[str, Any]:
    """Stolen ms per second per CPU (NodeSignals.steal_ms_per_s_by_cpu): charged to CPUs, read by a
    workload through where it ran (:func:`exposure`). The shape of issue 27's SignalExtractor (node)."""
    return {"steal_ms_per_s_by_cpu": interval.ms_per_s()}


def exposure(weights: dict[int, float], node: dict[str, Any]) -> dict[str, Any]:
    """A workload's steal: each CPU's stolen ms/s weighted by its share of the workload's CPU time
    (WorkloadSignals.steal_ms_per_s; issue 27's SignalExtractor exposure)."""
    stolen = node.get("steal_ms_per_s_by_cpu") or {}
    return {"steal_ms_per_s": sum(w * stolen.get(cpu, 0.0) for cpu, w in weights.items()) if stolen else 0.0}


def node_series(snap: StealSnapshot) -> Iterator[tuple[str, tuple[str, ...], float]]:
    """Per CPU whose steal is not 0 (bare metal: no series)."""
    for cpu, ns in snap.steal_ns.items():
        if ns:
            yield CPU_STEAL, (str(cpu),), ns / 1e9


PLUGIN = ProbePlugin(
    name=NAME, specs=(), factory=StealProbe, reads_proc_stat=True, delta=delta,
    signals=("steal_ms_per_s",),
    signal_extractor=SignalExtractor(
        stage="cpus", fields=("steal_ms_per_s",), node_fields=("steal_ms_per_s_by_cpu",),
        node=node_signals, exposure=exposure,
        # Stored every tick (0 where it ran on no stolen CPU): the hypervisor_steal cause's evidence.
        signal_specs=(SignalSpec("steal_ms_per_s", "Hypervisor steal on its CPUs", "ms/s", noise_floor=1.0,
                                 stored="always", summed_over_window=True),),
        node_specs=(NodeFieldSpec("steal_ms_per_s_by_cpu"),)),
    metrics=(CPU_STEAL,),
    metric_specs=(MetricSpec(CPU_STEAL, "counter", "Time the hypervisor ran something else while this vCPU was "
                             "runnable (/proc/stat steal), summed over CPUs (per CPU with --per-cpu-series); CPUs with no "
                             "steal have no series.", labels=("cpu",), per_cgroup=False, per_cpu=True),),
    node_series=node_series,
)
