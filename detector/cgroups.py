# SPDX-License-Identifier: Apache-2.0
"""Cgroup id <-> path resolution and Kubernetes pod attribution.

The BPF programs key everything by a cgroup *id*: the kernfs node id of the task's cgroup, in the
v2 hierarchy on v2 hosts and in the v1 ``cpu`` hierarchy on v1/hybrid hosts (see
``bpf/nn_common.h``). A kernfs node id is also the inode number of the cgroup's directory, so the
only way back from an id to something a human recognises is to walk the hierarchy and ``stat`` it.
This module does that walk, caches it, and turns each path into a :class:`CgroupIdentity` (pod UID,
container id, QoS class) so the detector can say "pod/5dbe5657/1a2b3c4d5e6f" instead of "4711".

Two facts shape the design:

- Ids are per hierarchy. Every hierarchy's root is id 1 and ids are small counters, so the same
  number names unrelated cgroups in ``cpu``, ``memory`` and ``unified``: an index is per hierarchy.
- kernfs allocates ids cyclically and never hands out a removed cgroup's id again (the high 32 bits
  are a generation), so a cached id -> path entry can go stale (cgroup removed) but never *wrong*
  (another cgroup under the same id). That is why a cache that is refreshed lazily is safe.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast

from probes.cgroup_handle import is_cgroupfs, path_by_id
from probes.cgroupfs import CgroupLayout, Hierarchy, discover
from probes.host import HostPaths

Kind = Literal["container", "pod", "qos", "kubepods", "system", "user", "docker", "other", "root"]
Runtime = Literal["containerd", "crio", "docker"]
QoS = Literal["guaranteed", "burstable", "besteffort"]

# Negative lookups are remembered until the next rescan; past this many distinct unknown ids they
# are not, so a stream of garbage ids cannot grow memory without bound (it only costs walks, which
# stay rate-limited).
_MAX_NEGATIVES = 65536


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """What a cgroup path says about its owner; derived from the path alone (no API server).

    ``pod_uid`` is the Kubernetes pod UID with dashes (systemd slice names carry it with
    underscores); static pods have a 32-hex config hash as UID and keep it as is. ``container_id``
    is the full 64-hex runtime id. ``display`` is short enough for a table column.
    """

    path: str
    kind: Kind
    pod_uid: str | None = None
    container_id: str | None = None
    runtime: Runtime | None = None
    qos: QoS | None = None
    display: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CgroupInfo(CgroupIdentity):
    """A cgroup on this host: its identity plus where it is and the id BPF reports for it."""

    id: int
    hierarchy_version: int
    mount: Path  # its hierarchy's mount point (shared by every cgroup of the hierarchy)

    @property
    def fs_path(self) -> Path:
        """Its directory on this host. Made when asked: a Path kept per cgroup and hierarchy was ~1 KiB
        each of the agent's memory (thousands at 1,000 pods) for a value almost never read."""
        return self.mount / self.path.lstrip("/")


# --------------------------------------------------------------------------------------------
# Path parsing (pure)
# --------------------------------------------------------------------------------------------

_HEX64 = r"[0-9a-f]{64}"
# The kubepods root: `kubepods` (cgroupfs driver), `kubepods.slice` (systemd driver) or a slice
# nested under a prefix, e.g. `kubelet-kubepods.slice` when the kubelet runs in `kubelet.slice`.
_KUBEPODS_RE = re.compile(r"^(?:kubepods|(?:.+-)?kubepods\.slice)$")
_QOS_CGROUPFS: dict[str, QoS] = {"besteffort": "besteffort", "burstable": "burstable"}
_QOS_SYSTEMD_RE = re.compile(r"(?:^|-)kubepods-(besteffort|burstable)\.slice$")
# Pod UIDs: `pod<uuid>` (cgroupfs) or `...-pod<uuid with underscores>.slice` (systemd).
_POD_CGROUPFS_RE = re.compile(r"^pod([0-9a-fA-F][0-9a-fA-F-]*)$")
_POD_SYSTEMD_RE = re.compile(r"(?:^|-)pod([0-9a-fA-F][0-9a-fA-F_]*)\.slice$")
# Container cgroups below a pod. Order matters: `crio-conmon-` before `crio-`.
_CONMON_RE = re.compile(rf"^crio-conmon-({_HEX64})(?:\.scope)?$")
_CONTAINER_RES: tuple[tuple[re.Pattern[str], Runtime | None], ...] = (
    (re.compile(rf"^cri-containerd-({_HEX64})(?:\.scope)?$"), "containerd"),
    (re.compile(rf"^crio-({_HEX64})(?:\.scope)?$"), "crio"),
    (re.compile(rf"^docker-({_HEX64})(?:\.scope)?$"), "docker"),
    # cgroupfs driver: the bare id. containerd and dockershim both do this, so no runtime.
    (re.compile(rf"^({_HEX64})$"), None),
)
_DOCKER_SCOPE_RE = re.compile(rf"^docker-({_HEX64})\.scope$")
_BARE_ID_RE = re.compile(rf"^{_HEX64}$")


def _normalize(path: str) -> tuple[str, list[str]]:
    parts = [p for p in path.strip().split("/") if p]
    return "/" + "/".join(parts), parts


def parse_cgroup_path(path: str) -> CgroupIdentity:
    """Classify a cgroup path (relative to its hierarchy) and pull out pod UID and container id.

    Works for the systemd and cgroupfs kubelet drivers, for containerd, CRI-O and docker, and for a
    kubepods tree nested under some prefix (kind, kubelet in its own slice): the first kubepods
    component wins, because from the host the outermost pod is the one this node's kubelet runs.
    """
    return _IDENTITIES.get(path)


class _IdentityCache:
    """Parsed paths, kept while their cgroups are there.

    Paths are parsed tick after tick (workloads, exporter) and nearly all are the same as last time;
    identities are immutable, so sharing them is safe. A fixed-size LRU of 4,096 kept the paths of
    removed pods until it was full: under pod churn the agent's memory grew by ~2 MiB of such entries
    (tracemalloc, bench/agent_footprint.py). Here every walk of the hierarchy starts a generation: the
    paths it finds, and any path used since, are carried over; a path unused for a whole generation
    (a removed cgroup) is dropped."""

    def __init__(self) -> None:
        self.current: dict[str, CgroupIdentity] = {}
        self.previous: dict[str, CgroupIdentity] = {}

    def get(self, path: str) -> CgroupIdentity:
        ident = self.current.get(path)
        if ident is None:
            ident = self.previous.get(path) or _parse(path)
            self.current[path] = ident
        return ident

    def new_generation(self) -> None:
        self.previous, self.current = self.current, {}


_IDENTITIES = _IdentityCache()


def _parse(path: str) -> CgroupIdentity:
    norm, parts = _normalize(path)
    if not parts:
        return CgroupIdentity(path="/", kind="root", display="/")
    for i, part in enumerate(parts):
        if _KUBEPODS_RE.match(part):
            return _parse_kubepods(norm, parts[i + 1 :])
    return _parse_non_k8s(norm, parts)


def _parse_kubepods(norm: str, rest: list[str]) -> CgroupIdentity:
    """`rest` is what follows the kubepods component: [qos], pod, container, sub-cgroups."""
    if not rest:
        return CgroupIdentity(path=norm, kind="kubepods", display="kubepods")
    qos: QoS | None = None
    head = rest[0]
    qos_match = _QOS_SYSTEMD_RE.search(head)
    if head in _QOS_CGROUPFS:
        qos = _QOS_CGROUPFS[head]
    elif qos_match:
        qos = cast(QoS, qos_match.group(1))
    if qos is not None:
        rest = rest[1:]
        if not rest:
            return CgroupIdentity(path=norm, kind="qos", qos=qos, display=f"kubepods/{qos}")

    pod_match = _POD_CGROUPFS_RE.match(rest[0]) or _POD_SYSTEMD_RE.search(rest[0])
    if pod_match is None:
        # Something under kubepods that kubelet did not name like a pod: keep the QoS we know.
        return CgroupIdentity(path=norm, kind="other", qos=qos, display=norm)
    qos = qos or "guaranteed"  # guaranteed pods sit directly under kubepods
    pod_uid = pod_match.group(1).replace("_", "-")
    pod_display = f"pod/{pod_uid[:8]}"
    rest = rest[1:]
    if not rest:
        return CgroupIdentity(path=norm, kind="pod", pod_uid=pod_uid, qos=qos, display=pod_display)

    head, below = rest[0], rest[1:]
    suffix = "".join(f"/{p}" for p in below)
    conmon = _CONMON_RE.match(head)
    if conmon:
        # CRI-O's per-container monitor: it belongs to the pod, but its CPU is not the container's.
        return CgroupIdentity(
            path=norm, kind="other", pod_uid=pod_uid, runtime="crio", qos=qos,
            display=f"{pod_display}/crio-conmon-{conmon.group(1)[:12]}{suffix}",
        )
    for pattern, runtime in _CONTAINER_RES:
        m = pattern.match(head)
        if m:
            cid = m.group(1)
            # Sub-cgroups a container makes for itself (systemd in a container, nested runtimes)
            # are still charged to that container.
            return CgroupIdentity(
                path=norm, kind="container", pod_uid=pod_uid, container_id=cid, runtime=runtime,
                qos=qos, display=f"{pod_display}/{cid[:12]}{suffix}",
            )
    return CgroupIdentity(
        path=norm, kind="other", pod_uid=pod_uid, qos=qos, display=f"{pod_display}/{head}{suffix}"
    )


def _parse_non_k8s(norm: str, parts: list[str]) -> CgroupIdentity:
    for part in parts:
        m = _DOCKER_SCOPE_RE.match(part)
        if m:  # systemd cgroup driver: /system.slice/docker-<id>.scope
            return CgroupIdentity(
                path=norm, kind="docker", container_id=m.group(1), runtime="docker", display=norm
            )
    if parts[0] == "docker" and len(parts) >= 2 and _BARE_ID_RE.match(parts[1]):
        # cgroupfs driver: /docker/<id>
        return CgroupIdentity(
            path=norm, kind="docker", container_id=parts[1], runtime="docker", display=norm
        )
    if parts[0] in ("system.slice", "init.scope"):
        return CgroupIdentity(path=norm, kind="system", display=norm)
    if parts[0] == "user.slice":
        return CgroupIdentity(path=norm, kind="user", display=norm)
    return CgroupIdentity(path=norm, kind="other", display=norm)


# --------------------------------------------------------------------------------------------
# Resolver
# --------------------------------------------------------------------------------------------


@dataclass
class _Index:
    """One hierarchy's id -> cgroup map as of one walk."""

    by_id: dict[int, CgroupInfo]
    by_path: dict[str, int]
    scanned_at: float
    # Ids that missed after this walk, while a rescan was not yet allowed. The next walk starts
    # after they were asked for, so whatever it does not find is dead and joins `negatives`.
    pending: set[int] = field(default_factory=set)
    negatives: set[int] = field(default_factory=set)


class CgroupResolver:
    """Maps the cgroup ids BPF reports back to paths and pod identities.

    The index is built by walking a hierarchy once and reused. An unknown id triggers a rescan (a
    new pod started since the last walk), but at most once per ``rescan_interval`` seconds per
    hierarchy, so a burst of unknown ids costs one walk, not one walk each. Ids asked for before a
    walk that the walk did not find are remembered as negative until the next rescan and return None
    without further walks: they belong to cgroups that were already gone (kernfs never reuses an id),
    and callers show the raw id.
    """

    def __init__(
        self,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        rescan_interval: float = 1.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = paths or HostPaths()
        self.layout = layout or discover(self.paths)
        self.rescan_interval = rescan_interval
        self._clock = clock
        self._indexes: dict[Path, _Index] = {}
        # Hierarchies where a lookup by handle (probes/cgroup_handle.py) can / cannot be used.
        self._handles: set[Path] = set()
        self._no_handles: set[Path] = set()
        self._lock = threading.RLock()  # the exporter and the event loop may share one resolver

    # -- public API -------------------------------------------------------------------------
    def resolve(self, cgroup_id: int, hierarchy: Hierarchy | None = None) -> CgroupInfo | None:
        """The cgroup with this id in `hierarchy` (default: the cpu hierarchy), or None."""
        h = self._hierarchy(hierarchy)
        if h is None:
            return None
        with self._lock:
            index = self._index(h)
            info = index.by_id.get(cgroup_id)
            if info is not None or cgroup_id in index.negatives:
                return info
            found = self._by_handle(h, index, cgroup_id)
            if found is not None or cgroup_id in index.negatives:
                return found
            if self._clock() - index.scanned_at < self.rescan_interval:
                # Too soon to walk again. Not negative yet: the cgroup may be newer than the walk,
                # and the next walk will tell.
                if len(index.pending) < _MAX_NEGATIVES:
                    index.pending.add(cgroup_id)
                return None
            index = self._rescan(h, index.pending | {cgroup_id})
            return index.by_id.get(cgroup_id)

    def id_of(self, path: str, hierarchy: Hierarchy | None = None) -> int | None:
        """The id of the cgroup at `path` (relative to the hierarchy), or None if there is none.

        Answered with one lstat rather than from the index, so it is never stale; the answer is
        also put into the index so that resolving the id right after needs no walk.
        """
        h = self._hierarchy(hierarchy)
        if h is None:
            return None
        norm, parts = _normalize(path)
        if any(p in (".", "..") for p in parts):
            return None  # never look outside the hierarchy
        # A string, not h.path_of's Path: this runs for every cgroup the dead-cgroup check looks at each
        # tick, and building a Path was most of its cost.
        fs_path = f"{os.fspath(h.mount).rstrip('/')}{norm}"
        try:
            st = os.lstat(fs_path)
        except OSError:
            st = None
        with self._lock:
            index = self._indexes.get(h.mount)
            if st is None or not stat.S_ISDIR(st.st_mode):
                if index is not None and (stale := index.by_path.pop(norm, None)) is not None:
                    index.by_id.pop(stale, None)
                return None
            if index is not None and (old := index.by_path.get(norm)) != st.st_ino:
                if old is not None:  # removed and recreated under the same name since the walk
                    index.by_id.pop(old, None)
                info = _make_info(norm, st.st_ino, h)
                index.by_id[info.id] = info
                index.by_path[norm] = info.id
                index.negatives.discard(info.id)
            return st.st_ino

    def invalidate(self) -> None:
        """Forget every index: the next lookup walks again, whatever the rescan interval."""
        with self._lock:
            self._indexes.clear()

    def all(self, hierarchy: Hierarchy | None = None, max_age: float | None = None) -> list[CgroupInfo]:
        """Every cgroup in the index of `hierarchy` (default: cpu), sorted by path.

        Lookups of unknown ids refresh the index, but a new cgroup with no task activity yet (a pod
        just created) produces no ids; with `max_age` an index older than that is walked again first.
        """
        h = self._hierarchy(hierarchy)
        if h is None:
            return []
        with self._lock:
            index = self._index(h)
            if max_age is not None and self._clock() - index.scanned_at >= max_age:
                index = self._rescan(h)
            return sorted(index.by_id.values(), key=lambda i: i.path)

    # -- internals --------------------------------------------------------------------------
    def _by_handle(self, h: Hierarchy, index: _Index, cgroup_id: int) -> CgroupInfo | None:
        """A cgroup newer than the last walk, looked up by its id in one system call (a pod that just
        started is then named in the tick it first runs, not after the next walk); a removed one joins
        the negatives. None also where handles cannot be used: the caller walks."""
        if h.mount in self._no_handles:
            return None
        if h.mount not in self._handles and not is_cgroupfs(h.mount):
            self._no_handles.add(h.mount)
            return None
        self._handles.add(h.mount)
        found = path_by_id(h.mount, cgroup_id)
        if found.state == "unsupported":
            self._no_handles.add(h.mount)
            return None
        if found.state == "gone" or found.path is None:
            if len(index.negatives) < _MAX_NEGATIVES:
                index.negatives.add(cgroup_id)
            return None
        if (old := index.by_path.get(found.path)) is not None:  # removed and recreated under the same name
            index.by_id.pop(old, None)
        info = _make_info(found.path, cgroup_id, h)
        index.by_id[cgroup_id] = info
        index.by_path[found.path] = cgroup_id
        return info

    def _hierarchy(self, hierarchy: Hierarchy | None) -> Hierarchy | None:
        return hierarchy if hierarchy is not None else self.layout.cpu

    def _index(self, h: Hierarchy) -> _Index:
        index = self._indexes.get(h.mount)
        return index if index is not None else self._rescan(h)

    def _rescan(self, h: Hierarchy, asked: set[int] | None = None) -> _Index:
        """Walk `h` again. `asked`: ids requested before this walk; those it misses are dead."""
        before = self._indexes.get(h.mount)
        _IDENTITIES.new_generation()  # the walk carries over the paths it finds
        by_id = self._walk(h, before.by_id if before is not None else {})
        index = _Index(
            by_id=by_id, by_path={i.path: i.id for i in by_id.values()}, scanned_at=self._clock()
        )
        if asked:
            dead = asked - by_id.keys()
            if len(dead) <= _MAX_NEGATIVES:
                index.negatives = dead
        self._indexes[h.mount] = index
        return index

    def _walk(self, h: Hierarchy, known: dict[int, CgroupInfo]) -> dict[int, CgroupInfo]:
        """Every cgroup directory under the hierarchy's mount, keyed by inode number.

        Iterative (no recursion limit), follows no symlinks, and skips whatever vanishes or cannot
        be read while it walks: cgroups come and go all the time on a busy node. A walk costs one
        readdir per cgroup: inode numbers come with the directory entries (kernfs reports the node
        id there), and a cgroup already ``known`` at the same path keeps its parsed info.
        """
        found: dict[int, CgroupInfo] = {}
        try:
            root = os.lstat(h.mount)
        except OSError:
            return found
        if not stat.S_ISDIR(root.st_mode):
            return found
        found[root.st_ino] = _make_info("/", root.st_ino, h)
        stack: list[tuple[str, str]] = [(os.fspath(h.mount), "")]
        while stack:
            fs_dir, rel = stack.pop()
            try:
                # Most entries are the cgroup's control files: dropped in one pass (cgroupfs gives each
                # entry's type with its name, so is_dir makes no system call).
                with os.scandir(fs_dir) as it:
                    subdirs = [entry for entry in it if entry.is_dir(follow_symlinks=False)]
            except OSError:
                continue  # removed (ENOENT/ENODEV), replaced by a file (ENOTDIR), or unreadable
            for entry in subdirs:
                try:
                    ino = entry.inode()
                except OSError:
                    continue
                child = f"{rel}/{entry.name}"
                info = known.get(ino)
                if info is not None and info.path == child:
                    found[ino] = info
                    parse_cgroup_path(child)  # still there: its parsed identity stays cached
                else:
                    found[ino] = _make_info(child, ino, h)
                stack.append((entry.path, child))
        return found


def _make_info(path: str, cgroup_id: int, h: Hierarchy) -> CgroupInfo:
    ident = parse_cgroup_path(path)
    return CgroupInfo(
        path=ident.path, kind=ident.kind, pod_uid=ident.pod_uid, container_id=ident.container_id,
        runtime=ident.runtime, qos=ident.qos, display=ident.display,
        id=cgroup_id, hierarchy_version=h.version, mount=h.mount,
    )
