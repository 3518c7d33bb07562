# SPDX-License-Identifier: Apache-2.0
"""The detector as one object: NodeSnapshots in, signals, incidents and decisions out.

``Detector.step(snapshot)`` is what the agent loop and ``noisyneighbor diagnose`` call once per
tick; ``Detector.cgroup_paths()`` tells the collector which cgroups' files to read next tick (every
workload seen in BPF maps plus every pod cgroup on the node), so nothing else needs to know pods.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from detector.batch import BatchAllocatable, measure_snapshot, meter_for
from detector.catalog import check_plugin_signals
from detector.cgroups import CgroupResolver
from detector.decisions import DecisionSink, Target
from detector.incidents import IncidentEngine
from detector.model import Incident
from detector.node_tasks import NodeTasks
from detector.policy import Policy
from detector.signals import NodeSignals, ProbeTick, SignalBuilder
from detector.store import DEFAULT_RETENTION_S, SignalStore
from detector.workloads import IdMapper, PodLike, WorkloadIndex
from probes.cgroupfs import CgroupLayout
from probes.host import HostPaths
from probes.registry import PLUGINS
from probes.snapshot import NodeSnapshot

# Pod cgroups are listed from the resolver's index at most this often (a walk of the hierarchy).
POD_LIST_INTERVAL_S = 5.0
# Without a change in the pod list, pod cgroups are listed again (a walk) this often while the listing
# lacks a cgroup the pod list names (a pod or container whose cgroup was not there yet at the last walk).
POD_LIST_MAX_AGE_S = 30.0
# ... and at least this often when every pod and container the pod list names was found: a walk costs in
# proportion to the node's cgroups (a fifth of the agent's CPU at 1,000 pods when it ran every 30 s), and
# what it could still find then is a cgroup nothing names and nothing ran in (a standalone workload
# becomes listed anyway when the probes see it active).
POD_LIST_FULL_WALK_S = 300.0
# A non-pod workload the probes saw stays listed this long after it was last active.
SEEN_WORKLOAD_TTL_S = 300.0


def store_for(interval_s: float, retention_s: float = DEFAULT_RETENTION_S) -> SignalStore:
    """The detector's store with room for the ticks of its interval (5 % early, as a late tick's successor
    is), not the store's default of ticks 0.8 s apart: its arrays are most of the agent's memory that grows
    with the pods, and a fifth of them stayed empty at 1 s."""
    ticks = math.ceil(retention_s / (0.95 * interval_s)) + 4 if interval_s > 0 else None
    return SignalStore(retention_s=retention_s, tick_capacity=ticks)


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
        check_plugin_signals(PLUGINS)  # the probes name the signals they feed; the catalog must know them
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
        self.engine = IncidentEngine(self.policy, sink=sink, on_incident=on_incident, clock=clock,
                                     cpu_request=self.index.cpu_request_of, store=store_for(self.policy.interval_seconds))
        cpu = self.layout.cpu
        # The node as a culprit: its top commands, from its cgroup's processes (detector/node_tasks.py).
        self.engine.node_tasks = NodeTasks(lambda key: None if cpu is None else cpu.path_of(key),
                                           self.paths.proc).top
        self.prev: NodeSnapshot | None = None
        self.last: NodeSignals | None = None
        self._pod_paths: list[str] = []
        self._container_paths: list[str] = []
        self._memory_pod_paths: list[str] = []
        self._pod_paths_at = -1e9
        self._walked_at = -1e9
        # Pod UIDs and container ids the last walk found cgroups for: does the listing hold every pod
        # and container the pod list names (then the max-age walk is skipped)?
        self._found_pod_uids: frozenset[str] = frozenset()
        self._found_container_ids: frozenset[str] = frozenset()
        # Workloads the probes saw that are not pods (a systemd service, say): listed while they
        # exist, so an idle one keeps its readings instead of being dropped and read anew.
        self._seen_paths: dict[str, float] = {}
        self._listed_pods_version = -1
        self._pod_set: frozenset[str] = frozenset()
        self._listed: frozenset[str] = frozenset()
        self._listed_cpu: frozenset[str] = frozenset()  # the same, less the memory-hierarchy-only pod paths
        self._psi_paths: frozenset[str] = frozenset()
        self.batch = meter_for(self.policy, self.paths)  # what the node can still give BE pods
        self.batch_allocatable: BatchAllocatable | None = None

    @property
    def sink(self) -> DecisionSink:
        return self.engine.sink

    def cgroup_paths(self) -> frozenset[str]:
        """Cgroups whose files the collector should watch: every pod cgroup and the workloads seen.

        The same object is returned until the pod list is refreshed or a new workload is seen, so
        the collector's per-tick listing work is one identity check.
        """
        now = time.monotonic()
        changed = False
        age = now - self._pod_paths_at
        # Walking the hierarchy costs in proportion to the cgroups on the node: done when the pod list
        # changed (a new pod's cgroups appear with it), and at a slow pace otherwise.
        pods_changed = self.index.pods_version != self._listed_pods_version
        walk = pods_changed and age >= POD_LIST_INTERVAL_S
        if not walk and age >= POD_LIST_MAX_AGE_S:
            walk = now - self._walked_at >= POD_LIST_FULL_WALK_S or not self._pod_list_found()
            self._pod_paths_at = now  # checked: the next check after another max age
        if walk:
            self._pod_paths_at = self._walked_at = now
            self._listed_pods_version = self.index.pods_version
            # Pods and their containers: a CPU limit lives on each container (the kubelet puts one on
            # the pod only when every container has one), so containers are listed too. The collector
            # reads a listed cgroup only when it is active or its turn on the slow wheel comes
            # (probes.cgroupwatch); the agent lists containers for the exporter anyway.
            infos = self.resolver.all(self.layout.hierarchy_for("cpu"), max_age=0.0)
            self._pod_paths = [info.path for info in infos if info.kind == "pod" or self._standalone(info.path)]
            self._container_paths = [info.path for info in infos if info.kind == "container"]
            self._found_pod_uids = frozenset(info.pod_uid for info in infos if info.kind == "pod" and info.pod_uid)
            self._found_container_ids = frozenset(
                info.container_id for info in infos if info.kind == "container" and info.container_id)
            # Where the memory hierarchy nests pods under another prefix (a sandbox; on a node the
            # paths agree), its pod paths are listed too: each path is read where it exists.
            memory = self.layout.hierarchy_for("memory")
            if memory is not None and memory != self.layout.hierarchy_for("cpu"):
                listed = set(self._pod_paths)
                self._memory_pod_paths = [
                    info.path for info in self.resolver.all(memory, max_age=0.0)
                    if info.kind == "pod" and info.path not in listed
                ]
            cpu = self.layout.hierarchy_for("cpu")
            self._seen_paths = {p: t for p, t in self._seen_paths.items()
                                if now - t < SEEN_WORKLOAD_TTL_S and self.resolver.id_of(p, cpu) is not None}
            self._pod_set = frozenset(self._pod_paths)
            self._psi_paths = frozenset(p for p in self._pod_paths if self.index.workload_of(p).latency_sensitive)
            changed = True
        if self.last is not None:
            for r in self.last.workloads.values():
                path = r.workload.target.cgroup
                if path == "/" or path in self._pod_set:
                    continue  # pods are listed (and unlisted) with the pod list
                if path not in self._listed:
                    changed = True
                self._seen_paths[path] = now
        if changed:
            self._listed_cpu = frozenset((*self._pod_paths, *self._container_paths, *self._seen_paths))
            self._listed = self._listed_cpu | frozenset(self._memory_pod_paths)
        return self._listed

    def _pod_list_found(self) -> bool:
        """Every pod of the pod list, and every container of theirs with an id, had its cgroup at the last
        walk. False also where the pods do not say their containers (a source without them)."""
        for pod in self.index.pods:
            containers = getattr(pod, "containers", None)
            if containers is None or pod.uid not in self._found_pod_uids:
                return False
            for container in containers:
                cid = getattr(container, "container_id", None)
                if cid and cid not in self._found_container_ids:
                    return False
        return True

    def pod_targets(self) -> list[Target]:
        """The node's pods as actuator targets (as of the last listing): candidates for the mitigation
        planner's traffic and RT attribution."""
        return [self.index.workload_of(path).target for path in self._pod_paths]

    def psi_paths(self) -> frozenset[str]:
        """Latency-sensitive workload roots: the collector reads their PSI every tick (victim signals)."""
        return self._psi_paths

    def _standalone(self, path: str) -> bool:
        w = self.index.workload_of(path)
        return w.key == path and w.target.qos is not None

    def probe_tick(self, snapshot: NodeSnapshot) -> ProbeTick:
        """``snapshot``'s probe readings against the last step's. Hand it to the next step (of this snapshot,
        or of a copy holding the same probe readings) with whatever read it before: each probe's interval is
        computed once, the first time it is asked for."""
        return ProbeTick(self.prev, snapshot)

    def step(self, snapshot: NodeSnapshot, probes: ProbeTick | None = None) -> Tick | None:
        """Feed one snapshot; the first one only sets the baseline (None). ``probes``: this tick's
        :meth:`probe_tick`, when a reader had it before the step."""
        if probes is not None and probes.prev is not self.prev:
            raise ValueError("probe_tick() of another step: its intervals start from another snapshot")
        self.index.refresh()
        prev, self.prev = self.prev, snapshot
        if prev is None:
            return None
        # The listed cgroups (pods and the non-pod workloads seen lately): every workload that exists.
        signals = self.builder.build(prev, snapshot, extra_paths=self._listed_cpu
                                     if snapshot.changed_paths is not None else self._pod_paths, probes=probes)
        self.last = signals
        changed = self.engine.step(signals, ts=snapshot.monotonic_s)
        self.engine.sink.observe(self.engine.signals_for_verify(signals), snapshot.monotonic_s)
        self.batch_allocatable = measure_snapshot(self.batch, snapshot, self.index, self._pod_paths, self.paths)
        return Tick(signals, changed)

    def close(self) -> None:
        self.engine.close()


def _slash(glob: str) -> str:
    return glob if glob.startswith("/") else "/" + glob
