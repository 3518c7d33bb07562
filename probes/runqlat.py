"""Runqueue latency per cgroup and per CPU (decoder for bpf/runqlat.bpf.c)."""

from __future__ import annotations

import ctypes
import struct
import time
from dataclasses import dataclass
from typing import Literal

from probes.base import BpfProbe
from probes.cgroupfs import CgroupLayout
from probes.engine import (
    AttachMode,
    Engine,
    LibbpfEngine,
    LoadedProbe,
    ProbeError,
    ProbeSpec,
    Tracepoint,
    missing_btf_features,
)
from probes.hist import LatencyHistogram
from probes.host import HostPaths

SPEC = ProbeSpec(
    name="runqlat",
    object_file="runqlat.bpf.o",
    tracepoints=(
        Tracepoint("sched_wakeup", "runqlat_wakeup_btf", "runqlat_wakeup_raw"),
        Tracepoint("sched_wakeup_new", "runqlat_wakeup_new_btf", "runqlat_wakeup_new_raw"),
        Tracepoint("sched_switch", "runqlat_switch_btf", "runqlat_switch_raw"),
    ),
)
# Cheapest flavour: one sched_switch program over the kernel's own enqueue stamps (see the BPF file).
SCHED_INFO_SPEC = ProbeSpec(
    name="runqlat",
    object_file="runqlat.bpf.o",
    tracepoints=(Tracepoint("sched_switch", "runqlat_switch_schedinfo", "runqlat_switch_raw"),),
    btf_needs=(("member", "task_struct.sched_info"), ("member", "cfs_rq.rq"), ("member", "rq.clock")),
)
Flavour = Literal["auto", "sched_info", "tp_btf", "raw_tp"]


class _RunqEvent(ctypes.Structure):
    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("wait_ns", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("prev_cgroup_id", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("tgid", ctypes.c_uint32),
        ("prev_pid", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("comm", ctypes.c_char * 16),
        ("prev_comm", ctypes.c_char * 16),
    ]


@dataclass(frozen=True)
class RunqOutlier:
    """One wait above the outlier threshold, with the task that ran right before the victim."""

    ts_ns: int
    wait_ns: int
    cgroup_id: int
    pid: int
    tgid: int
    comm: str
    cpu: int
    prev_cgroup_id: int
    prev_pid: int
    prev_comm: str

    @classmethod
    def decode(cls, raw: bytes) -> RunqOutlier:
        e = _RunqEvent.from_buffer_copy(raw[: ctypes.sizeof(_RunqEvent)])
        return cls(
            e.ts_ns, e.wait_ns, e.cgroup_id, e.pid, e.tgid, e.comm.decode(errors="replace"), e.cpu,
            e.prev_cgroup_id, e.prev_pid, e.prev_comm.decode(errors="replace"),
        )


@dataclass(frozen=True)
class RunqSnapshot:
    """Cumulative counters since load; subtract two snapshots for an interval."""

    monotonic_s: float
    per_cgroup: dict[int, LatencyHistogram]
    per_cpu: list[LatencyHistogram]
    drops: dict[str, int]


class RunqLatProbe(BpfProbe[RunqOutlier]):
    def __init__(
        self,
        engine: Engine | None = None,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        outlier_threshold_ns: int = 0,
        attach_mode: Flavour = "auto",
        outlier_ring_bytes: int = 256 * 1024,
        max_cgroups: int = 16384,
    ) -> None:
        self.v1_cpu = self._key_by("cpu", paths, layout)
        engine = engine or LibbpfEngine(self.paths)
        options = {
            "rodata": {"v1_cpu_cgroup": self.v1_cpu, "outlier_threshold_ns": outlier_threshold_ns},
            "map_sizes": {"outliers": outlier_ring_bytes, "cgroup_runq": max_cgroups},
        }
        self.probe: LoadedProbe
        sched_info_error = None
        if attach_mode in ("auto", "sched_info"):
            missing = missing_btf_features(SCHED_INFO_SPEC) if isinstance(engine, LibbpfEngine) else ["libbpf engine"]
            if not missing:
                try:
                    self.probe = engine.open_probe(SCHED_INFO_SPEC, attach_mode="tp_btf", **options)
                    self.probe.status.attach_mode = "sched_info"
                except ProbeError as e:
                    sched_info_error = str(e)
            else:
                sched_info_error = f"runqlat: sched_info flavour unavailable: no {', '.join(missing)}"
            if sched_info_error and attach_mode == "sched_info":
                raise ProbeError(sched_info_error)
        if attach_mode != "sched_info" and (attach_mode != "auto" or sched_info_error):
            fallback: AttachMode = "auto" if attach_mode == "auto" else attach_mode
            self.probe = engine.open_probe(SPEC, attach_mode=fallback, **options)
        if outlier_threshold_ns:
            self._watch_events("outliers", RunqOutlier.decode)

    def snapshot(self) -> RunqSnapshot:
        per_cgroup = {
            struct.unpack("<Q", key)[0]: LatencyHistogram.decode_percpu(values)  # type: ignore[arg-type]
            for key, values in self.probe.map_items("cgroup_runq")
        }
        cpu_values = self.probe.map_lookup("cpu_runq", b"\0\0\0\0") or []
        per_cpu = [LatencyHistogram.decode(v) for v in cpu_values]  # type: ignore[union-attr]
        drops = self.read_drops()
        return RunqSnapshot(time.monotonic(), per_cgroup, per_cpu, drops)

    def forget(self, cgroup_ids: list[int]) -> int:
        """Drop removed cgroups from the kernel map so pod churn cannot fill it. Returns how many."""
        return sum(self.probe.map_delete("cgroup_runq", struct.pack("<Q", cg)) for cg in cgroup_ids)

    def poll_outliers(self, timeout_ms: int = 0) -> list[RunqOutlier]:
        return self._poll_events(timeout_ms)

