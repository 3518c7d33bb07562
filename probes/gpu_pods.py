# SPDX-License-Identifier: Apache-2.0
"""GPU use per cgroup as a probe plugin: which pods and containers hold GPU memory, on which GPUs.

:mod:`probes.gpu` reads NVML: per device its utilisation and memory, and per process its GPU memory
and cgroups. The devices were exported; the processes' cgroups were read and dropped. This plugin
sums them per cgroup (the process's cgroup in the cpu hierarchy, or its v2 cgroup: the paths
``NodeSnapshot.cgroup_cpu`` is keyed by), and the exporter publishes them with the pod's labels.

A node without NVML or without a GPU is the normal case: the probe does not load and its status says
``off`` with the reason ``no GPU (...)``; a driver failure later turns it off the same way, with the
last readings gone rather than frozen. Not loaded unless asked for (``--probes ...,gpu``): the
default probe set, and /readyz's list of it, stay the BPF probes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from probes.engine import ProbeError, ProbeStatus
from probes.gpu import GpuCollector, GpuDevice, GpuProcess, GpuStatus
from probes.host import HostPaths
from probes.plugin import CgroupSample, MetricSpec, NodeSample, ProbePlugin, TopColumn, TopInput, TopTable

NAME = "gpu"
CGROUP_GPU_MEMORY = "noisyneighbor_cgroup_gpu_memory_used_bytes"
CGROUP_GPU_PROCESSES = "noisyneighbor_cgroup_gpu_processes"
# The node's devices: exported from the plugin's reading while it is loaded, else from its node reader's.
GPU_UTILIZATION = "noisyneighbor_gpu_utilization_ratio"
GPU_MEMORY_USED = "noisyneighbor_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "noisyneighbor_gpu_memory_total_bytes"
DEVICE_LABELS = ("gpu", "uuid", "model")


@dataclass(frozen=True, slots=True)
class GpuCgroupUse:
    memory_bytes: int  # GPU memory its processes hold, over every GPU (a process NVML gives no figure for: 0)
    processes: int  # its processes on a GPU (one running on two GPUs counts twice)
    devices: tuple[int, ...]  # the GPU indexes they run on, sorted


@dataclass(frozen=True)
class GpuPodsSnapshot:
    monotonic_s: float
    per_cgroup: dict[str, GpuCgroupUse]  # cgroup path -> its use now (gauges, not counters)
    # GPU processes with no cgroup to charge (exited between NVML's list and the /proc read).
    drops: dict[str, int] = field(default_factory=dict)
    # The devices as NVML reported them this tick (the node's GPU metrics, node_series): from the probe
    # while it is loaded, else from its node reader (GpuDeviceReader), so NVML is read once a tick.
    devices: list[GpuDevice] = field(default_factory=list)


def cgroup_of(process: GpuProcess) -> str | None:
    """The cgroup a GPU process is charged to: its cpu-controller cgroup on v1, its v2 cgroup otherwise."""
    return process.cgroups.get("cpu") or process.cgroups.get("") or None


def per_cgroup_use(devices: list[GpuDevice]) -> tuple[dict[str, GpuCgroupUse], int]:
    """(use per cgroup path, processes with no cgroup) from one NVML reading."""
    memory: dict[str, int] = {}
    processes: dict[str, int] = {}
    on: dict[str, set[int]] = {}
    unattributed = 0
    for device in devices:
        for process in device.processes:
            path = cgroup_of(process)
            if path is None:
                unattributed += 1
                continue
            memory[path] = memory.get(path, 0) + (process.used_memory_bytes or 0)
            processes[path] = processes.get(path, 0) + 1
            on.setdefault(path, set()).add(device.index)
    use = {path: GpuCgroupUse(memory[path], processes[path], tuple(sorted(on[path]))) for path in memory}
    return use, unattributed


class GpuPodsProbe:
    """The plugin's probe: what the collector asks of any probe (status, snapshot, close)."""

    hierarchy = None  # keyed by path, not by cgroup id: no BPF map to resolve

    def __init__(self, paths: HostPaths | None = None, layout: Any = None, attach_mode: str = "auto",
                 nvml_loader: Callable[[], ModuleType] | None = None) -> None:
        self.gpu = GpuCollector(paths) if nvml_loader is None else GpuCollector(paths, nvml_loader)
        if self.gpu.status.state != "on":
            reason = self.gpu.status.reason.removeprefix("not present: ")
            self.gpu.close()
            raise ProbeError(f"{NAME}: no GPU ({reason})")
        self.status = ProbeStatus(NAME, "on", self.gpu.status.reason)

    def snapshot(self) -> GpuPodsSnapshot:
        devices = self.gpu.collect()
        if self.gpu.status.state != "on":  # NVML failed: off with its reason, no stale use left behind
            self.status.state, self.status.reason = "off", self.gpu.status.reason
        use, unattributed = per_cgroup_use(devices)
        return GpuPodsSnapshot(time.monotonic(), use, {"process_exited": unattributed} if unattributed else {}, devices)

    def close(self) -> None:
        self.gpu.close()

    def __enter__(self) -> GpuPodsProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GpuDeviceReader:
    """The node's GPU devices while the probe is not loaded (``ProbePlugin.node_reader``): the agent opens
    it so the device metrics are exported on every GPU node, whether or not the per-pod probe runs. Its
    ``status`` is /healthz's ``gpu``; a node without NVML leaves it off, and it reads nothing then."""

    def __init__(self, paths: HostPaths | None = None, nvml_loader: Callable[[], ModuleType] | None = None) -> None:
        self.gpu = GpuCollector(paths) if nvml_loader is None else GpuCollector(paths, nvml_loader)

    @property
    def status(self) -> GpuStatus:
        return self.gpu.status

    def snapshot(self) -> GpuPodsSnapshot | None:
        """This tick's devices (no per-cgroup use: the probe's), None while NVML is off."""
        if self.gpu.status.state != "on":
            return None
        return GpuPodsSnapshot(time.monotonic(), {}, devices=self.gpu.collect())

    def close(self) -> None:
        self.gpu.close()


def delta(prev: GpuPodsSnapshot | None, cur: GpuPodsSnapshot) -> dict[str, GpuCgroupUse]:
    """The interval's use per cgroup: what it held at the end of it (GPU memory is a level, not a count)."""
    return dict(cur.per_cgroup)


def cgroup_series(snap: GpuPodsSnapshot) -> Iterator[CgroupSample]:
    for path, use in snap.per_cgroup.items():
        yield CGROUP_GPU_MEMORY, path, (), float(use.memory_bytes)
        yield CGROUP_GPU_PROCESSES, path, (), float(use.processes)


def device_series(snap: GpuPodsSnapshot) -> Iterator[NodeSample]:
    """The node's GPU devices: busy share, memory in use and size, each only where NVML gave it."""
    for device in snap.devices:
        labels = (str(device.index), device.uuid, device.name)
        if device.utilization_gpu_percent is not None:
            yield GPU_UTILIZATION, labels, device.utilization_gpu_percent / 100.0
        if device.memory_used_bytes is not None:
            yield GPU_MEMORY_USED, labels, float(device.memory_used_bytes)
        if device.memory_total_bytes is not None:
            yield GPU_MEMORY_TOTAL, labels, float(device.memory_total_bytes)


def top_rows(view: TopInput) -> list[dict[str, Any]]:
    """The ``top`` rows of one interval (its ``delta``): a cgroup per row, most GPU memory first."""
    interval: dict[str, GpuCgroupUse] = view.interval
    rows = [{"cgroup": path, "memory_bytes": use.memory_bytes, "processes": use.processes,
             "devices": ",".join(map(str, use.devices))} for path, use in interval.items()]
    rows.sort(key=lambda r: (-r["memory_bytes"], -r["processes"], r["cgroup"]))
    return rows


TOP_TABLE = TopTable(
    title="GPU memory per cgroup",
    columns=(
        TopColumn("GPU MEMORY", "memory_bytes", "bytes", sorted_by=True),
        TopColumn("PROCESSES", "processes", "count"),
        TopColumn("GPUS", "devices"),
    ),
    rows=top_rows,
    nothing="no process holds GPU memory",
    hotkey="g",
)


PLUGIN = ProbePlugin(
    name=NAME, default=False, specs=(), factory=GpuPodsProbe, delta=delta,
    metrics=(CGROUP_GPU_MEMORY, CGROUP_GPU_PROCESSES, GPU_UTILIZATION, GPU_MEMORY_USED, GPU_MEMORY_TOTAL),
    metric_specs=(
        MetricSpec(CGROUP_GPU_MEMORY, "gauge", "GPU memory held by the cgroup's processes, over every GPU (NVML)."),
        MetricSpec(CGROUP_GPU_PROCESSES, "gauge", "The cgroup's processes running on a GPU (NVML; per GPU)."),
        MetricSpec(GPU_UTILIZATION, "gauge", "GPU busy share (NVML utilization.gpu / 100).", DEVICE_LABELS,
                   per_cgroup=False),
        MetricSpec(GPU_MEMORY_USED, "gauge", "GPU memory in use.", DEVICE_LABELS, per_cgroup=False),
        MetricSpec(GPU_MEMORY_TOTAL, "gauge", "GPU memory size.", DEVICE_LABELS, per_cgroup=False),
    ),
    cgroup_series=cgroup_series,
    node_series=device_series,
    node_reader=GpuDeviceReader,
    top_view="gpu",
    top_table=TOP_TABLE,
)
