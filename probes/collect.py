"""The per-tick collector: every probe and kernel file read once into a :class:`NodeSnapshot`.

It knows nothing of pods: the caller says which cgroup paths to read files for (``cgroup_paths``),
usually the pods' and containers' cgroups plus anything the BPF maps saw. A probe that cannot load
is reported ``off`` with its one-line reason and the rest carry on (degraded, never dead).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from probes.cgroupfs import CgroupLayout, discover
from probes.cpuacct import read_cgroup_cpu
from probes.engine import ProbeError, ProbeStatus
from probes.host import HostPaths, read_text_or_none
from probes.memstat import read_memstat, read_node_vmstat
from probes.psi import read_cgroup_psi, read_node_psi
from probes.reclaim import ReclaimProbe
from probes.runqlat import RunqLatProbe
from probes.snapshot import NodeSnapshot, parse_proc_stat
from probes.softirq import SoftirqProbe
from probes.tcpconnect import TcpConnectProbe

log = logging.getLogger(__name__)

BPF_PROBES = ("runqlat", "softirq", "reclaim", "tcpconnect")
# A cgroup whose CPU usage did not move since the last tick keeps its CPU, memory, cpuset and
# per-CPU readings for up to this long: on a node of mostly idle pods the per-tick cost is one small
# read per cgroup instead of six. Memory can change without the cgroup running (reclaim by others),
# hence the bound. PSI is always read: a task blocked on IO or memory stalls without using CPU, and
# its counters are turned into rates over the tick, which a stale reading would distort.
IDLE_REFRESH_S = 5.0


@dataclass
class _CgroupReading:
    usage_text: str | None  # the change detector: cpuacct.usage (v1) or cpu.stat (v2) as read
    read_at: float
    cpu: Any = None
    mem: Any = None
    cpus: tuple[int, ...] | None = None
    percpu: tuple[int, ...] | None = None


def cgroup_activity(probe: str, snap: Any) -> dict[int, int]:
    """Cumulative activity per cgroup id in one probe's snapshot: a number that grows while the
    cgroup is active, so a cgroup whose number stands still is idle (used to forget removed cgroups
    from the kernel maps). Probes with no per-cgroup map give {}."""
    out: dict[int, int] = {}
    if snap is None:
        return out
    if probe == "runqlat":
        return {cg: hist.count for cg, hist in snap.per_cgroup.items()}
    if probe == "reclaim":
        for (cgroup_id, _kind), stats in snap.per_cgroup.items():
            out[cgroup_id] = out.get(cgroup_id, 0) + stats.count
    elif probe == "tcpconnect":
        for (cgroup_id, _netns), stats in snap.per_key.items():
            out[cgroup_id] = out.get(cgroup_id, 0) + stats.connects + stats.syn_retransmits
    return out


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11); empty or malformed parts are skipped."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            continue
    return tuple(cpus)


class NodeCollector:
    """Opens the chosen BPF probes and reads everything into one NodeSnapshot per ``collect()``."""

    def __init__(
        self,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        probes: Iterable[str] = BPF_PROBES,
        cgroup_paths: Callable[[], Iterable[str]] | None = None,
        probe_options: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.paths = paths or HostPaths()
        self.layout = layout or discover(self.paths)
        self.wanted = tuple(probes)
        unknown = set(self.wanted) - set(BPF_PROBES)
        if unknown:
            raise ValueError(f"unknown probe(s) {', '.join(sorted(unknown))}; known: {', '.join(BPF_PROBES)}")
        self.cgroup_paths = cgroup_paths or (lambda: ())
        self.options = probe_options or {}
        self.probes: dict[str, Any] = {}
        self.status: dict[str, ProbeStatus] = {}
        self._readings: dict[str, _CgroupReading] = {}
        self.idle_refresh_s = IDLE_REFRESH_S

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> NodeCollector:
        factories = {
            "runqlat": RunqLatProbe,
            "softirq": SoftirqProbe,
            "reclaim": ReclaimProbe,
            "tcpconnect": TcpConnectProbe,
        }
        for name in self.wanted:
            try:
                probe = factories[name](paths=self.paths, layout=self.layout, **self.options.get(name, {}))
            except ProbeError as e:
                reason = str(e).removeprefix(f"{name}: ")
                self.status[name] = ProbeStatus(name, "off", reason=reason)
                log.warning("probe %s off: %s", name, reason)
                continue
            self.probes[name] = probe
            self.status[name] = probe.status
        return self

    def close(self) -> None:
        for probe in self.probes.values():
            probe.close()
        self.probes.clear()

    def __enter__(self) -> NodeCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one tick ---------------------------------------------------------------------------------
    def collect(self) -> NodeSnapshot:
        errors: list[str] = []
        snaps: dict[str, Any] = {}
        for name, probe in self.probes.items():
            try:
                snaps[name] = probe.snapshot()
            except OSError as e:  # a map read failing must not end the tick
                errors.append(f"{name}: snapshot failed: {e}")
        bpf_programs = []
        for probe in self.probes.values():
            try:
                bpf_programs.extend(probe.probe.program_stats())
            except OSError as e:
                errors.append(f"program stats: {e}")

        stat_text = read_text_or_none(self.paths.proc / "stat")
        node_cpu, per_cpu = parse_proc_stat(stat_text) if stat_text else (None, {})
        paths = sorted(set(self.cgroup_paths()))
        cgroup_cpu, cgroup_mem, cgroup_psi, cgroup_cpus, cgroup_percpu = {}, {}, {}, {}, {}
        now = time.monotonic()
        readings: dict[str, _CgroupReading] = {}
        for path in paths:
            r = self._read_cgroup(path, now, errors)
            readings[path] = r
            if self.layout.v2 is not None:
                psi = read_cgroup_psi(self.layout.v2.path_of(path))
                if psi:
                    cgroup_psi[path] = psi
            # Each reader returns None for a cgroup removed mid-read: it simply drops out this tick.
            if r.cpu is not None:
                cgroup_cpu[path] = r.cpu
            if r.mem is not None:
                cgroup_mem[path] = r.mem
            if r.cpus is not None:
                cgroup_cpus[path] = r.cpus
            if r.percpu is not None:
                cgroup_percpu[path] = r.percpu
        self._readings = readings  # cgroups no longer listed are forgotten
        return NodeSnapshot(
            monotonic_s=time.monotonic(),
            wall_s=time.time(),
            runq=snaps.get("runqlat"),
            softirq=snaps.get("softirq"),
            reclaim=snaps.get("reclaim"),
            tcp=snaps.get("tcpconnect"),
            node_cpu=node_cpu,
            node_cpu_per_cpu=per_cpu,
            node_psi=read_node_psi(self.paths),
            node_vmstat=read_node_vmstat(self.paths),
            cgroup_cpu=cgroup_cpu,
            cgroup_mem=cgroup_mem,
            cgroup_psi=cgroup_psi,
            cgroup_cpus=cgroup_cpus,
            cgroup_cpu_percpu=cgroup_percpu,
            probe_status=dict(self.status),
            bpf_programs=bpf_programs,
            errors=errors,
        )

    def _usage_text(self, path: str) -> str | None:
        cpuacct = self.layout.v1.get("cpuacct")
        if cpuacct is not None:
            return read_text_or_none(cpuacct.path_of(path) / "cpuacct.usage")
        cpu = self.layout.hierarchy_for("cpu")
        if cpu is not None and cpu.version == 2:
            return read_text_or_none(cpu.path_of(path) / "cpu.stat")
        return None

    def _read_cgroup(self, path: str, now: float, errors: list[str]) -> _CgroupReading:
        usage = self._usage_text(path)
        cached = self._readings.get(path)
        if (usage is not None and cached is not None and cached.usage_text == usage
                and now - cached.read_at < self.idle_refresh_s):
            return cached
        r = _CgroupReading(usage, now)
        r.cpu = read_cgroup_cpu(self.layout, path)
        r.mem = read_memstat(self.layout, path)
        cpuset = self.layout.hierarchy_for("cpuset")
        if cpuset is not None:
            name = "cpuset.effective_cpus" if cpuset.version == 1 else "cpuset.cpus.effective"
            text = read_text_or_none(cpuset.path_of(path) / name)
            if text is not None:
                r.cpus = parse_cpu_list(text)
        cpuacct = self.layout.v1.get("cpuacct")
        if cpuacct is not None:
            text = read_text_or_none(cpuacct.path_of(path) / "cpuacct.usage_percpu")
            if text is not None:
                try:
                    r.percpu = tuple(int(x) for x in text.split())
                except ValueError:
                    errors.append(f"{path}: malformed cpuacct.usage_percpu")
        return r
