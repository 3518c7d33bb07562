# SPDX-License-Identifier: Apache-2.0
"""The per-tick collector: every probe and kernel file read once into a :class:`NodeSnapshot`.

It knows nothing of pods: the caller says which cgroup paths to watch (``cgroup_paths``), usually the
pods' and containers' cgroups plus anything the BPF maps saw, and which of them need their PSI read
every tick (``psi_paths``: the latency-sensitive ones). Which watched cgroups' files are actually read
in a tick follows activity (:mod:`probes.cgroupwatch`): the probes' per-cgroup counts say who moved;
the snapshot carries every watched cgroup's last readings and ``changed_paths`` names those read now.
A probe that cannot load is reported ``off`` with its one-line reason and the rest carry on
(degraded, never dead).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from probes.cgroupfs import CgroupLayout, discover
from probes.cgroupwatch import CgroupWatch, changed_ids
from probes.engine import ProbeError, ProbeOffCode, ProbeStatus, ProgramStats
from probes.host import HostPaths
from probes.memstat import read_node_vmstat
from probes.procstat import ProcStatReader
from probes.psi import read_node_psi
from probes.registry import BY_NAME, DEFAULT_NAMES, NAMES, PLUGINS
from probes.snapshot import NodeSnapshot

log = logging.getLogger(__name__)

BPF_PROBES = DEFAULT_NAMES  # the registry's probes loaded by default, in collection order
PROGRAM_STATS_EVERY_TICKS = 5  # BPF programs' run counts (kernel.bpf_stats_enabled) are this stale at most


def cgroup_activity(probe: str, snap: Any) -> Mapping[int, int]:
    """Cumulative activity per cgroup id in one probe's snapshot: a number that grows while the
    cgroup is active, so a cgroup whose number stands still is idle (which cgroups to read this
    tick; which removed cgroups to forget from the kernel maps). Probes with no per-cgroup map give {}.
    Each plugin in probes.registry says how its snapshot counts."""
    if snap is None:
        return {}
    activity = BY_NAME[probe].activity
    return {} if activity is None else activity(snap)


def _changed_ids(probe: str, prev: Any, snap: Any, before: Mapping[int, int] | None,
                 now: Mapping[int, int]) -> list[int]:
    """Ids whose activity differs between the probe's last snapshot (`prev`, its activity `before`) and
    this one: among those its plugin says moved when it can (``activity_moved``), so an idle cgroup costs
    nothing; else by comparing every id. The same ids in the same order either way."""
    moved_of = BY_NAME[probe].activity_moved
    moved = moved_of(prev, snap) if moved_of is not None and before is not None and prev is not None else None
    return changed_ids(before, now, moved)


# What each degraded code says to people (the /readyz "degraded" text beside the code).
DEGRADED_TEXT: dict[ProbeOffCode, str] = {
    ProbeOffCode.NO_BTF: "kernel has no BTF: no probe can run (give the agent --btf FILE)",
}


def degraded_code(status: Mapping[str, ProbeStatus]) -> ProbeOffCode | None:
    """Why the node as a whole can measure nothing, whatever the agent does: NO_BTF when every BPF probe
    is off because the kernel has no BTF (steal, a /proc file, needs none and detects nothing alone).
    None otherwise: a probe off for another reason is that probe's problem (its own status and alert).
    Readiness, /readyz's degraded status and the noisyneighbor_agent_degraded metric all read this."""
    bpf = [st for name, st in status.items() if name not in BY_NAME or BY_NAME[name].specs]
    if bpf and all(st.state == "off" and st.code == ProbeOffCode.NO_BTF for st in bpf):
        return ProbeOffCode.NO_BTF
    return None


class NodeCollector:
    """Opens the chosen BPF probes and reads everything into one NodeSnapshot per ``collect()``."""

    def __init__(
        self,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        probes: Iterable[str] = BPF_PROBES,
        cgroup_paths: Callable[[], Iterable[str]] | None = None,
        probe_options: dict[str, dict[str, Any]] | None = None,
        psi_paths: Callable[[], Iterable[str]] | None = None,
        proc_stat: ProcStatReader | None = None,
    ) -> None:
        self.paths = paths or HostPaths()
        # /proc/stat, read once at the start of each tick; the probes that read it (and whoever else the
        # caller hands this reader, e.g. the burst actuator) take that reading
        self.proc_stat = proc_stat or ProcStatReader(self.paths)
        self.layout = layout or discover(self.paths)
        self.wanted = tuple(probes)
        unknown = set(self.wanted) - set(NAMES)
        if unknown:
            raise ValueError(f"unknown probe(s) {', '.join(sorted(unknown))}; known: {', '.join(NAMES)}")
        self.cgroup_paths = cgroup_paths or (lambda: ())
        self.psi_paths = psi_paths or (lambda: ())
        self.options = probe_options or {}
        self.probes: dict[str, Any] = {}
        self.status: dict[str, ProbeStatus] = {}
        self.watch = CgroupWatch(self.layout)
        self._activity: dict[str, Mapping[int, int]] = {}  # probe -> id -> count, as of the last tick
        self._activity_of: dict[str, Any] = {}  # probe -> the snapshot that activity is of
        # probe -> (activity the tick before, activity this tick, ids whose activity moved), for whoever
        # forgets removed cgroups
        self.activity_change: dict[str, tuple[Mapping[int, int], Mapping[int, int], list[int]]] = {}
        self._program_stats: list[ProgramStats] = []  # the kernel's run counts, as of the last refresh
        self._ticks = 0

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> NodeCollector:
        for name in self.wanted:
            plugin = BY_NAME[name]
            shared = {"proc_stat": self.proc_stat} if plugin.reads_proc_stat else {}
            try:
                probe = plugin.open(paths=self.paths, layout=self.layout, **shared, **self.options.get(name, {}))
            except ProbeError as e:
                reason = str(e).removeprefix(f"{name}: ")
                self.status[name] = ProbeStatus(name, "off", reason=reason, code=e.code)
                log.warning("probe %s off: %s", name, reason)
                continue
            self.probes[name] = probe
            self.status[name] = probe.status
        return self

    def close(self) -> None:
        for probe in self.probes.values():
            probe.close()
        self.probes.clear()
        self.watch.close()

    def __enter__(self) -> NodeCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one tick ---------------------------------------------------------------------------------
    def collect(self) -> NodeSnapshot:
        errors: list[str] = []
        snaps: dict[str, Any] = {}
        stat = self.proc_stat.read()  # before the probes: those that read /proc/stat take this reading
        for name, probe in self.probes.items():
            try:
                snaps[name] = probe.snapshot()
            except OSError as e:  # a map read failing must not end the tick
                errors.append(f"{name}: snapshot failed: {e}")
        # The kernel's run counts are read every few ticks: they feed only the exporter's counters
        # (scraped every 15 s), and one info syscall per program per tick was 4 % of an idle agent.
        if self._ticks % PROGRAM_STATS_EVERY_TICKS == 0:
            self._program_stats = []
            for probe in self.probes.values():
                loaded = getattr(probe, "probe", None)  # a plugin that is not a BPF probe has no programs
                if loaded is None:
                    continue
                try:
                    self._program_stats.extend(loaded.program_stats())
                except OSError as e:
                    errors.append(f"program stats: {e}")
        self._ticks += 1
        bpf_programs = self._program_stats

        watch = self.watch
        watch.set_listed(self.cgroup_paths())
        active, memory_moved = self._active_paths(snaps)
        changed = watch.tick(active, memory_moved, self.psi_paths(), errors)
        return NodeSnapshot(
            monotonic_s=time.monotonic(),
            wall_s=time.time(),
            plugins={plugin.name: snaps[plugin.name] for plugin in PLUGINS if plugin.name in snaps},
            node_cpu=stat.node if stat is not None else None,
            node_cpu_per_cpu=stat.per_cpu if stat is not None else {},
            node_psi=read_node_psi(self.paths),
            node_vmstat=read_node_vmstat(self.paths),
            # Copies (C-speed): the watch updates its dicts in place next tick.
            cgroup_cpu=dict(watch.cpu),
            cgroup_mem=dict(watch.mem),
            cgroup_psi=dict(watch.psi),
            cgroup_psi_read_s=dict(watch.psi_read_s),
            cgroup_cpus=dict(watch.cpus),
            cgroup_cpu_percpu=dict(watch.percpu),
            changed_paths=frozenset(changed),
            probe_status=dict(self.status),
            bpf_programs=bpf_programs,
            errors=errors,
        )

    def _active_paths(self, snaps: dict[str, Any]) -> tuple[list[str], list[str]]:
        """Listed cgroups a probe saw this tick (count moved since the last tick), and those a probe whose
        activity moves memory saw (``ProbePlugin.activity_moves_memory``)."""
        active: list[str] = []
        memory_moved: list[str] = []
        self.activity_change = {}  # this tick's only: a probe whose snapshot failed has none
        for name, snap in snaps.items():
            now = cgroup_activity(name, snap)
            if not now and name not in self._activity:
                continue
            hierarchy = getattr(self.probes.get(name), "hierarchy", None)
            out = memory_moved if BY_NAME[name].activity_moves_memory else active
            before = self._activity.get(name)
            changed = _changed_ids(name, self._activity_of.get(name), snap, before, now)
            for cgid in changed:
                path = self.watch.path_of_id(cgid, hierarchy)
                if path is not None:
                    out.append(path)
            if before is not None:
                self.activity_change[name] = (before, now, changed)
            self._activity[name], self._activity_of[name] = now, snap
        return active, memory_moved
