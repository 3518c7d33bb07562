# SPDX-License-Identifier: Apache-2.0
"""Workloads: the units the detector reasons about (a pod, or in standalone mode a cgroup).

The BPF maps are keyed by the *leaf* cgroup a task is in (a container), the cgroup files by any
path; the detector aggregates both to the workload that contains them: a pod-level cgroup when the
path is inside a kubepods tree, else the configured standalone cgroups (globs), else the cgroup
itself (host services, kernel threads in the root cgroup). A workload's class says whether it can
be a victim (SYSTEM/LSE/LSR/LS) and whether it may be acted on (BE).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from detector.cgroups import CgroupIdentity, CgroupResolver, parse_cgroup_path
from detector.decisions import Target
from probes.cgroupfs import Hierarchy

LATENCY_SENSITIVE = frozenset({"SYSTEM", "LSE", "LSR", "LS"})


class PodLike(Protocol):
    uid: str
    namespace: str
    name: str
    qos_class: str  # SYSTEM | LSE | LSR | LS | BE


def k8s_qos_to_class(qos: str | None) -> str | None:
    """Kubernetes QoS (from the cgroup path) -> koordinator class: Guaranteed/Burstable -> LS, BestEffort -> BE."""
    if qos is None:
        return None
    return "BE" if qos == "besteffort" else "LS"


@dataclass(frozen=True, slots=True)
class Workload:
    key: str  # "pod:<uid>" for pods (joins hierarchies), else the workload's cgroup path "/a/b"
    target: Target

    @property
    def qos(self) -> str | None:
        return self.target.qos

    @property
    def latency_sensitive(self) -> bool:
        return self.target.qos in LATENCY_SENSITIVE


def key_of(target: Target) -> str:
    """The workload key of a Target (the store's entity name): pods by UID, everything else by path."""
    return f"pod:{target.pod_uid}" if target.pod_uid else target.cgroup


def _norm(path: str) -> str:
    return "/" + path.strip("/") if path.strip("/") else "/"


class WorkloadIndex:
    """cgroup path -> Workload, from pod metadata (optional) and standalone globs.

    ``pods`` returns the node's pods (last good list; may be empty): a new list when they changed (a pod
    source hands out the same one until then, which ``refresh`` takes as unchanged at once). Standalone globs are matched
    against cgroup paths (fnmatch, e.g. ``/nn-test-*/ls-*``) and name workloads when there are no
    pods. Lookups are cached per path and the cache is dropped when the pod list changes.
    """

    def __init__(
        self,
        pods: Callable[[], Iterable[PodLike]] | None = None,
        ls_globs: Iterable[str] = (),
        be_globs: Iterable[str] = (),
    ) -> None:
        self._pods_fn = pods or (lambda: ())
        self.ls_globs = tuple(ls_globs)
        self.be_globs = tuple(be_globs)
        self._pods: dict[str, PodLike] = {}
        self._listed: object = None  # the list object the pods came in (a source's, kept while unchanged)
        self._pods_sig: tuple = ()
        self.pods_version = 0  # bumped whenever the pod list (uids, classes, names) changes
        self._cache: dict[tuple[str, bool], Workload] = {}
        self._pod_workloads: dict[str, Workload] = {}  # "pod:<uid>" -> workload with its cpu-hierarchy target
        # Per path, dropped with the lookup cache: whether it is its workload's root, and (the pod UID, the
        # pod record the answer came from, the container's name and limit): a pod record replaced (a new
        # object per change) makes its containers' answers stale.
        self._roots: dict[str, bool] = {}
        self._containers: dict[str, tuple[str, PodLike | None, tuple[str, float | None] | None]] = {}

    def refresh(self) -> None:
        listed = self._pods_fn()
        if listed is self._listed:
            return  # the very list of last time: a source hands out the same one until its pods change
        self._listed = listed if isinstance(listed, list) else None
        pods = {p.uid: p for p in listed}
        sig = tuple(sorted((uid, p.qos_class, p.name, p.namespace) for uid, p in pods.items()))
        self._pods = pods
        if sig != self._pods_sig:
            self._pods_sig = sig
            self.pods_version += 1
            self._clear_caches()
            self._pod_workloads.clear()

    def _clear_caches(self) -> None:
        self._cache.clear()
        self._roots.clear()
        self._containers.clear()

    def workload_of(self, path: str, primary: bool = True) -> Workload:
        """The workload containing ``path``. ``primary``: the path is in the cpu hierarchy (the one
        actuators write), so its pod path becomes the pod's Target.cgroup; paths from other
        hierarchies (memory ids of reclaim) join the same pod by UID even where their prefixes differ."""
        path = _norm(path)
        hit = self._cache.get((path, primary))
        if hit is None:
            hit = self._cache[(path, primary)] = self._classify(path, primary)
            if len(self._cache) > 65536:  # paths of removed cgroups must not accumulate forever
                self._clear_caches()
        if hit.key.startswith("pod:"):  # the pod's target may have been refined since (primary path seen)
            return self._pod_workloads.get(hit.key, hit)
        return hit

    def cpu_request_of(self, key: str) -> float | None:
        """A pod workload's CPU request in cores (cpu plus koordinator batch-cpu; 0 for a pod that
        requests none), None when unknown: not a pod, or no pod spec (standalone entities)."""
        if not key.startswith("pod:"):
            return None
        pod = self._pods.get(key[4:])
        if pod is None or not getattr(pod, "containers", ()):
            return None
        request = getattr(pod, "cpu_request_cores", None)
        return None if request is None else float(request)

    @property
    def pods(self) -> Iterable[PodLike]:
        """The pods of the last refresh."""
        return self._pods.values()

    @property
    def records(self) -> Mapping[str, PodLike]:
        """Pod UID -> its record, as of the last refresh: the same mapping object until the pod list
        changes (a reader keeps what it derived from the records while it is)."""
        return self._pods

    def pod_of(self, key: str) -> PodLike | None:
        """A pod workload's metadata ("pod:<uid>"), None when not a pod or not known."""
        return self._pods.get(key[4:]) if key.startswith("pod:") else None

    def container_of(self, path: str) -> tuple[str, float | None] | None:
        """(container name, its CPU limit in cores) for a container cgroup path, from the pod's spec;
        the short container id when the metadata does not name it; None when not a container or when
        it is the pod's sandbox (pause) container."""
        hit = self._containers.get(path)
        if hit is not None and self._pods.get(hit[0]) is hit[1]:
            return hit[2]
        ident = parse_cgroup_path(_norm(path))
        uid = ident.pod_uid or ""
        named = self._container_of(ident)
        if len(self._containers) > 65536:  # paths of removed cgroups must not accumulate forever
            self._containers.clear()
        self._containers[path] = (uid, self._pods.get(uid), named)
        return named

    def _container_of(self, ident: CgroupIdentity) -> tuple[str, float | None] | None:
        if ident.kind != "container" or ident.pod_uid is None or ident.container_id is None:
            return None
        pod = self._pods.get(ident.pod_uid)
        find = getattr(pod, "container", None)
        c = find(ident.container_id) if find is not None else None
        if c is None:
            ids = [getattr(x, "container_id", None) for x in getattr(pod, "containers", ())]
            if ids and all(ids):
                # The kubelet lists the id of every app container and never the sandbox's: a container
                # cgroup of this pod with another id is its pause container, none of its app containers.
                return None
            return ident.container_id[:12], None
        return c.name, c.cpu_limit_cores

    def is_workload_root(self, path: str) -> bool:
        """Is ``path`` the workload's own cgroup (whose files already sum its children), in any hierarchy?"""
        root = self._roots.get(path)
        if root is None:
            norm = _norm(path)
            ident = parse_cgroup_path(norm)
            root = ident.kind == "pod" if ident.pod_uid is not None else self.workload_of(norm).key == norm
            if len(self._roots) > 65536:
                self._roots.clear()
            self._roots[path] = root
        return root

    def _classify(self, path: str, primary: bool) -> Workload:
        ident = parse_cgroup_path(path)
        if ident.pod_uid is not None:
            parts = path.strip("/").split("/")
            # The pod-level cgroup: the first component (from the kubepods one) that names the pod.
            uid_forms = (ident.pod_uid, ident.pod_uid.replace("-", "_"))
            pod_path = path
            for i, part in enumerate(parts):
                if part.startswith(("pod", "kubepods-")) and any(u in part for u in uid_forms):
                    pod_path = "/" + "/".join(parts[: i + 1])
                    break
            key = f"pod:{ident.pod_uid}"
            known = self._pod_workloads.get(key)
            if known is not None and (not primary or known.target.cgroup == pod_path):
                return known
            pod = self._pods.get(ident.pod_uid)
            if pod is not None:
                target = Target(pod_path, pod.uid, pod.namespace, pod.name, pod.qos_class)
            else:  # a pod the metadata does not (yet) know: the path still gives its k8s QoS
                target = Target(pod_path, ident.pod_uid, None, None, k8s_qos_to_class(ident.qos))
            w = Workload(key, target)
            if primary or known is None:
                self._pod_workloads[key] = w
            return w
        for globs, qos in ((self.ls_globs, "LS"), (self.be_globs, "BE")):
            for pattern in globs:
                match = self._glob_prefix(path, pattern)
                if match is not None:
                    return Workload(match, Target(match, qos=qos))
        return Workload(path, Target(path))

    @staticmethod
    def _glob_prefix(path: str, pattern: str) -> str | None:
        """The shortest ancestor-or-self of ``path`` matching ``pattern`` (so a workload's children join it)."""
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:i])
            if fnmatch.fnmatchcase(prefix, pattern):
                return prefix
        return None


class IdMapper:
    """BPF cgroup id (per hierarchy) -> workload, through the resolver; unknown ids map to None."""

    def __init__(self, resolver: CgroupResolver, index: WorkloadIndex) -> None:
        self.resolver, self.index = resolver, index

    def path_of(self, cgroup_id: int, hierarchy: Hierarchy | None) -> str | None:
        if cgroup_id == 0:
            return None
        info = self.resolver.resolve(cgroup_id, hierarchy)
        return None if info is None else info.path

    def workload_of(self, cgroup_id: int, hierarchy: Hierarchy | None, primary: bool = True) -> Workload | None:
        path = self.path_of(cgroup_id, hierarchy)
        return None if path is None else self.index.workload_of(path, primary)
