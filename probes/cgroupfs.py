# SPDX-License-Identifier: Apache-2.0
"""Cgroup hierarchies on this host, v1, v2 and hybrid, behind one small abstraction.

Discovery looks at the cgroup root only (no mountinfo), so a temp dir laid out like
`/sys/fs/cgroup` is a complete fake host:
- pure v2: the root itself holds `cgroup.controllers`;
- v1 / hybrid: one directory per v1 hierarchy (`cpu`, `memory`, `cpu,cpuacct`, ...) and, on hybrid
  hosts, `unified/` holding the v2 tree (usually with no controllers, but with PSI files).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from probes.cgroupfiles import CGROUP_CONTROLLERS, PID_CGROUP
from probes.host import HostPaths

V1_CONTROLLERS = frozenset(
    {"cpu", "cpuacct", "cpuset", "memory", "blkio", "io", "pids", "devices", "freezer", "net_cls",
     "net_prio", "perf_event", "hugetlb", "rdma", "misc"}
)


@dataclass(frozen=True)
class Hierarchy:
    version: int  # 1 or 2
    mount: Path  # the hierarchy's root directory on the host
    controllers: frozenset[str]

    # The mount as text ending in one "/": a cgroup's directory is ``prefix + relative_dir(path)``, one
    # concatenation (the per-tick readers make file names from it; pathlib costs more than the read).
    prefix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        mount = str(self.mount)
        object.__setattr__(self, "prefix", mount if mount.endswith("/") else f"{mount}/")

    def path_of(self, cgroup_path: str) -> Path:
        """Host directory of a cgroup given by its path relative to this hierarchy (`/a/b`)."""
        return Path(self.dir_of(cgroup_path))

    def dir_of(self, cgroup_path: str) -> str:
        """:meth:`path_of` as text ending in "/" (the mount's for the root): add a file's name to it."""
        return self.prefix + relative_dir(cgroup_path)


def relative_dir(cgroup_path: str) -> str:
    """A cgroup's directory below its hierarchy's mount, as text to follow :attr:`Hierarchy.prefix`: ""
    for the root, else "a/b/"."""
    rel = cgroup_path.strip("/")
    return f"{rel}/" if rel else ""


@dataclass(frozen=True)
class CgroupLayout:
    """The hierarchies of one host. `v1` maps each v1 controller to its hierarchy."""

    v2: Hierarchy | None
    v1: dict[str, Hierarchy] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        if self.v1 and self.v2:
            return "hybrid"
        return "v1" if self.v1 else "v2"

    def hierarchy_for(self, controller: str) -> Hierarchy | None:
        """The hierarchy where `controller` is active: v1 if mounted there, else v2 if enabled."""
        if controller in self.v1:
            return self.v1[controller]
        if self.v2 is not None and (controller in self.v2.controllers or not self.v1):
            return self.v2
        return None

    @property
    def cpu(self) -> Hierarchy | None:
        """Where pods' CPU cgroups live; runqueue attribution keys by this hierarchy's ids."""
        return self.hierarchy_for("cpu") or self.v2

    def hierarchies(self) -> list[Hierarchy]:
        seen: dict[Path, Hierarchy] = {}
        for h in [*self.v1.values(), *([self.v2] if self.v2 else [])]:
            seen.setdefault(h.mount, h)
        return list(seen.values())


def _v2_controllers(mount: Path) -> frozenset[str]:
    try:
        return CGROUP_CONTROLLERS.read(mount, 2)
    except OSError:
        return frozenset()


def discover(paths: HostPaths | None = None) -> CgroupLayout:
    paths = paths or HostPaths()
    root = paths.cgroup_root
    if (root / CGROUP_CONTROLLERS.name(2)).exists():
        return CgroupLayout(v2=Hierarchy(2, root, _v2_controllers(root)))
    v1: dict[str, Hierarchy] = {}
    v2 = None
    if not root.is_dir():
        raise FileNotFoundError(f"cgroup root {root} does not exist")
    for entry in sorted(root.iterdir()):
        if not entry.is_dir():
            continue
        if entry.name == "unified" and (entry / CGROUP_CONTROLLERS.name(2)).exists():
            v2 = Hierarchy(2, entry, _v2_controllers(entry))
            continue
        names = frozenset(entry.name.split(","))
        if entry.is_symlink() or not names & V1_CONTROLLERS:
            continue  # `cpu` -> `cpu,cpuacct` links: the real directory is listed too
        hierarchy = Hierarchy(1, entry, names & V1_CONTROLLERS)
        for c in hierarchy.controllers:
            v1[c] = hierarchy
    return CgroupLayout(v2=v2, v1=v1)


def self_cgroups(paths: HostPaths | None = None, pid: int | str = "self") -> dict[str, str]:
    """The cgroup path of a process per controller (`cpu`, `memory`, ...) and `""` for v2."""
    paths = paths or HostPaths()
    return PID_CGROUP.read(paths, pid=pid)
