"""The detector as one object: NodeSnapshots in, signals, incidents and decisions out.

``Detector.step(snapshot)`` is what the agent loop and ``noisyneighbor diagnose`` call once per
tick; ``Detector.cgroup_paths()`` tells the collector which cgroups' files to read next tick (every
workload seen in BPF maps plus every pod cgroup on the node), so nothing else needs to know pods.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from detector.cgroups import CgroupResolver
from detector.decisions import DecisionSink
from detector.incidents import IncidentEngine
from detector.model import Incident
from detector.policy import Policy
from detector.signals import NodeSignals, SignalBuilder
from detector.workloads import IdMapper, PodLike, WorkloadIndex
from probes.cgroupfs import CgroupLayout
from probes.host import HostPaths
from probes.snapshot import NodeSnapshot

# Pod cgroups are listed from the resolver's index at most this often (a walk of the hierarchy).
POD_LIST_INTERVAL_S = 5.0


@dataclass
class Tick:
    signals: NodeSignals
    changed: list[Incident]


class Detector:
    def __init__(
        self,
        policy: Policy | None = None,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        resolver: CgroupResolver | None = None,
        pods: Callable[[], Iterable[PodLike]] | None = None,
        sink: DecisionSink | None = None,
        on_incident: Iterable[Callable[[Incident, str], None]] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy or Policy()
        self.paths = paths or HostPaths()
        self.resolver = resolver or CgroupResolver(self.paths, layout)
        self.layout = layout or self.resolver.layout
        self.index = WorkloadIndex(
            pods,
            ls_globs=[_slash(g) for g in self.policy.ls_cgroups],
            be_globs=[_slash(g) for g in self.policy.be_cgroups],
        )
        self.ids = IdMapper(self.resolver, self.index)
        self.builder = SignalBuilder(self.layout, self.ids)
        self.engine = IncidentEngine(self.policy, sink=sink, on_incident=on_incident, clock=clock)
        self.prev: NodeSnapshot | None = None
        self.last: NodeSignals | None = None
        self._pod_paths: list[str] = []
        self._memory_pod_paths: list[str] = []
        self._pod_paths_at = -1e9

    @property
    def sink(self) -> DecisionSink:
        return self.engine.sink

    def cgroup_paths(self) -> list[str]:
        """Cgroups whose files the collector should read: known workloads and every pod cgroup."""
        now = time.monotonic()
        if now - self._pod_paths_at >= POD_LIST_INTERVAL_S:
            self._pod_paths_at = now
            self._pod_paths = [
                info.path for info in self.resolver.all(self.layout.hierarchy_for("cpu"), max_age=POD_LIST_INTERVAL_S)
                if info.kind == "pod" or self._standalone(info.path)
            ]
            # Where the memory hierarchy nests pods under another prefix (a sandbox; on a node the
            # paths agree), its pod paths are listed too: each path is read where it exists.
            memory = self.layout.hierarchy_for("memory")
            if memory is not None and memory != self.layout.hierarchy_for("cpu"):
                listed = set(self._pod_paths)
                self._memory_pod_paths = [
                    info.path for info in self.resolver.all(memory, max_age=POD_LIST_INTERVAL_S)
                    if info.kind == "pod" and info.path not in listed
                ]
        keys = set(self._pod_paths) | set(self._memory_pod_paths)
        if self.last is not None:
            keys.update(r.workload.target.cgroup for r in self.last.workloads.values() if r.workload.target.cgroup != "/")
        return sorted(keys)

    def _standalone(self, path: str) -> bool:
        w = self.index.workload_of(path)
        return w.key == path and w.target.qos is not None

    def step(self, snapshot: NodeSnapshot) -> Tick | None:
        """Feed one snapshot; the first one only sets the baseline (None)."""
        self.index.refresh()
        prev, self.prev = self.prev, snapshot
        if prev is None:
            return None
        signals = self.builder.build(prev, snapshot, extra_paths=self._pod_paths)
        self.last = signals
        changed = self.engine.step(signals, ts=snapshot.monotonic_s)
        self.engine.sink.observe(self.engine.signals_for_verify(signals), snapshot.monotonic_s)
        return Tick(signals, changed)

    def close(self) -> None:
        self.engine.close()


def _slash(glob: str) -> str:
    return glob if glob.startswith("/") else "/" + glob
