# SPDX-License-Identifier: Apache-2.0
"""One tick of everything the probes know: the single object the detector, exporter and CLI read.

Every field is *cumulative* (counters since the probe loaded, or since boot for /proc files), so
consumers diff two snapshots for an interval and the exporter can publish counters and histograms
as they are. Per-cgroup file readings are keyed by cgroup path (relative to its hierarchy root);
BPF readings are keyed by cgroup id, which ``detector.cgroups.CgroupResolver`` turns into paths.
Each registered probe's snapshot is in ``plugins`` under the probe's name (``snap.probe(name)``); a probe
that is off or failed has none there and says why in ``probe_status``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from probes.cgroupfiles import USER_HZ, CpuTimes, parse_proc_stat  # noqa: F401  (/proc/stat: one parser)
from probes.cpuacct import CgroupCpuStat
from probes.engine import ProbeStatus
from probes.libbpf import ProgramStats
from probes.listenq import ListenReport
from probes.memstat import MemStat, NodeVmstat
from probes.psi import NodePsi, PsiReading
from probes.registry import PLUGINS


@dataclass(frozen=True)
class NodeSnapshot:
    monotonic_s: float
    wall_s: float
    # files
    node_cpu: CpuTimes | None = None
    node_cpu_per_cpu: dict[int, CpuTimes] = field(default_factory=dict)
    node_psi: NodePsi | None = None
    node_vmstat: NodeVmstat | None = None
    cgroup_cpu: dict[str, CgroupCpuStat] = field(default_factory=dict)  # cpu-hierarchy path ->
    cgroup_mem: dict[str, MemStat] = field(default_factory=dict)  # memory-hierarchy path ->
    cgroup_psi: dict[str, dict[str, PsiReading]] = field(default_factory=dict)  # v2 path -> resource ->
    # When each cgroup's PSI was read (monotonic s): cgroups not read every tick need their own interval.
    # Absent: read at ``monotonic_s``.
    cgroup_psi_read_s: dict[str, float] = field(default_factory=dict)
    cgroup_cpus: dict[str, tuple[int, ...]] = field(default_factory=dict)  # cpuset-hierarchy path -> effective CPUs
    # v1 cpuacct.usage_percpu (ns per CPU): where a cgroup actually ran, for joining per-CPU softirq
    # time to it. v2 has no per-CPU usage: consumers fall back to the effective cpuset.
    cgroup_cpu_percpu: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # The cgroups whose readings above were taken this tick; the others carry their last readings
    # (idle: nothing moved). None: every reading is new (a collector that reads everything each tick).
    changed_paths: frozenset[str] | None = None
    # The readings of the node readers the agent opened for probes that are not loaded
    # (ProbePlugin.node_reader), by the probe's name; exported by the probe's node_series.
    node_readings: dict[str, Any] = field(default_factory=dict)
    # The last read of the pods' listen queues (probes.listenq.ListenWatch: read on connect trouble or every
    # 30 s, so it may be older than this tick; see its monotonic_s). None: never read.
    listen: ListenReport | None = None
    # Every registered probe's snapshot (probes.registry) by the probe's name; absent while it is off or its
    # snapshot failed this tick. Read through probe(name).
    plugins: dict[str, Any] = field(default_factory=dict)
    # the agent's own health
    probe_status: dict[str, ProbeStatus] = field(default_factory=dict)
    bpf_programs: list[ProgramStats] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one-line problems met while collecting this tick

    def probe(self, name: str) -> Any:
        """A registered probe's snapshot by its name, None while it is off."""
        return self.plugins.get(name)

    def probe_snapshots(self) -> dict[str, Any]:
        """Every registered probe's snapshot by name (None while it is off), in registry order."""
        return {p.name: self.probe(p.name) for p in PLUGINS}
