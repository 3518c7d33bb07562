# SPDX-License-Identifier: Apache-2.0
"""Cgroups we own: created for tests, benchmarks and scenarios, removed afterwards (testkit: bench and tests only,
not part of the shipped packages, nothing under noisyneighbor/, probes/, detector/ or actuators/ imports it).

The machine's own cgroups are never written to. Everything is created below a prefix directory
`nn-test-<pid>` nested under the cgroup this process already belongs to in each hierarchy (read from
`/proc/self/cgroup`), and removed on teardown, even on failure: tasks still inside are killed (they
are ours: only processes we started are ever moved in), then directories are removed bottom-up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from probes.cgroupfiles import parse_cpu_max
from probes.cgroupfs import CgroupLayout, Hierarchy, discover, self_cgroups
from probes.host import HostPaths

PREFIX = "nn-test"


class OwnedCgroup:
    """One cgroup per requested controller hierarchy (plus v2 when asked), all named `name`.

    `controllers` lists v1 controllers ("cpu", "memory", "cpuset", ...) or "unified" for the v2 tree.
    On a pure v2 host every controller maps to the single v2 hierarchy and is enabled in the
    parent's `cgroup.subtree_control` of the prefix directory (which we own).
    """

    def __init__(
        self,
        name: str,
        controllers: Iterable[str] = ("cpu",),
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        prefix: str | None = None,
    ) -> None:
        self.paths = paths or HostPaths()
        self.layout = layout or discover(self.paths)
        self.prefix = prefix or f"{PREFIX}-{os.getpid()}"
        self.name = name
        mine = self_cgroups(self.paths)
        self.dirs: dict[str, Path] = {}
        self._created: list[Path] = []
        for controller in controllers:
            hierarchy: Hierarchy | None
            if controller == "unified":
                hierarchy, own_path = self.layout.v2, mine.get("", "/")
            else:
                hierarchy = self.layout.hierarchy_for(controller)
                own_path = mine.get(controller, mine.get("", "/")) if hierarchy and hierarchy.version == 1 \
                    else mine.get("", "/")
            if hierarchy is None:
                raise RuntimeError(f"no cgroup hierarchy with controller {controller!r} on this host")
            self.dirs[controller] = hierarchy.path_of(own_path) / self.prefix / name

    # -- lifecycle ---------------------------------------------------------------------------
    def create(self) -> OwnedCgroup:
        try:
            for controller, d in self.dirs.items():
                # `name` may be nested ("kubepods.slice/…/pod.slice"): create every missing level
                # from the prefix directory down, and remember each one for removal.
                base = d
                while base.parent.name != self.prefix:
                    base = base.parent
                prefix_dir = base.parent
                for level in [prefix_dir, *reversed(d.relative_to(prefix_dir).parents[:-1]), d]:
                    level = prefix_dir / level if not level.is_absolute() else level
                    # v2: a controller's files exist only where every ancestor enables it, also on
                    # levels made earlier by another OwnedCgroup (a pod before its containers) or
                    # for another controller of this one.
                    if self._v2_root_of(level) is not None and controller != "unified":
                        self._enable_v2_controller(level.parent, controller, prefix_dir)
                    if level.exists():
                        continue
                    level.mkdir()
                    self._created.append(level)
                    if self._v2_root_of(level) is None:  # a v2 cpuset starts empty: its parent's CPUs
                        self._inherit_cpuset(level)
        except BaseException:
            self.remove()
            raise
        return self

    def _v2_root_of(self, d: Path) -> Path | None:
        v2 = self.layout.v2
        if v2 is not None and not self.layout.v1 and d.is_relative_to(v2.mount):
            return v2.mount
        return None

    def _enable_v2_controller(self, parent: Path, controller: str, prefix_dir: Path) -> None:
        # Only ever written on the prefix directory and below it: we created all of them.
        if not parent.is_relative_to(prefix_dir):
            return
        control = parent / "cgroup.subtree_control"
        with contextlib.suppress(OSError):
            if controller not in control.read_text().split():
                control.write_text(f"+{controller}")

    @staticmethod
    def _inherit_cpuset(d: Path) -> None:
        # v1 cpuset cgroups start with empty cpus/mems and refuse tasks until they are set (v2 ones
        # with an empty cpuset.cpus use their parent's effective set: nothing to copy there).
        cpus = d / "cpuset.cpus"
        if cpus.exists() and not cpus.read_text().strip():
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((d.parent / f).read_text().strip() or "0")

    def path(self, controller: str = "cpu") -> Path:
        return self.dirs[controller]

    def add_pid(self, pid: int) -> None:
        for d in self.dirs.values():
            (d / "cgroup.procs").write_text(str(pid))

    def preexec(self) -> None:
        """For subprocess.Popen(preexec_fn=...): the child joins the cgroup before it execs, on the CPUs it
        was started with. Linux 6.1 resets a task that joins a cgroup with cpuset to the cpuset's CPUs (6.2+
        keep the CPUs the task asked for): a child started off the victim's CPU ran there until it execed
        `taskset` (in the VM lane, tens of ms: the enforcing agent rightly moved the BE pod before the test did)."""
        cpus = os.sched_getaffinity(0)
        self.add_pid(os.getpid())
        allowed = os.sched_getaffinity(0)
        # Only narrowed to what the cgroup allows: a child pinned elsewhere than a cgroup's cpuset keeps the
        # kernel's choice (asking for CPUs outside the cpuset is EINVAL).
        if allowed != cpus and cpus & allowed:
            os.sched_setaffinity(0, cpus & allowed)

    def pids(self) -> set[int]:
        return cgroup_pids(self.dirs.values())

    def write(self, controller: str, filename: str, value: str) -> None:
        """Write a cgroup file, spelled as on v1 or v2: a v1 name where only its v2 file exists (a pure
        v2 host) is written as its v2 equivalent (see :func:`write_cgroup_file`)."""
        write_cgroup_file(self.dirs[controller], filename, value)

    def read(self, controller: str, filename: str) -> str:
        return (self.dirs[controller] / filename).read_text()

    def remove(self, timeout: float = 5.0) -> None:
        """Kill our tasks still inside, then rmdir bottom-up. Safe to call twice."""
        deadline = time.monotonic() + timeout
        while True:
            if not kill_processes(self.dirs.values()):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        for d in reversed(self._created):
            _rmdir_retry(d, deadline)
        self._created.clear()

    def __enter__(self) -> OwnedCgroup:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()


def cgroup_pids(dirs: Iterable[Path], below: bool = False) -> set[int]:
    """The processes in these cgroup directories (``below``: and in every cgroup under them)."""
    found: set[int] = set()
    for d in dirs:
        for procs in (d.rglob("cgroup.procs") if below else [d / "cgroup.procs"]):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in procs.read_text().split())
    return found


def kill_processes(dirs: Iterable[Path], below: bool = False) -> int:
    """SIGKILL (after SIGCONT: a stopped task dies too) every process of these cgroups of ours
    (``below``: and of the cgroups under them); how many were signalled."""
    n = 0
    for pid in cgroup_pids(dirs, below):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
            n += 1
    return n


def _v2_cpu_max(d: Path, quota: str | None = None, period: str | None = None) -> tuple[str, str]:
    current = parse_cpu_max((d / "cpu.max").read_text())
    q = quota if quota is not None else ("max" if current.quota_us is None else str(current.quota_us))
    return "cpu.max", f"{'max' if q.lstrip('-').isdigit() and int(q) < 0 else q} {period or current.period_us}"


# v1 file -> (v2 file, v2 text) in the same cgroup directory, for the files tests and benches set.
_V2_SPELLING: dict[str, Callable[[Path, str], tuple[str, str]]] = {
    # The kubelet's and runc's conversion: shares 2..262144 onto weight 1..10000.
    "cpu.shares": lambda d, v: ("cpu.weight", str(max(1, min(10000, 1 + (int(v) - 2) * 9999 // 262142)))),
    "cpu.cfs_quota_us": lambda d, v: _v2_cpu_max(d, quota=v),
    "cpu.cfs_period_us": lambda d, v: _v2_cpu_max(d, period=v),
    "memory.limit_in_bytes": lambda d, v: ("memory.max", "max" if int(v) < 0 else v),
}


def write_cgroup_file(d: Path, filename: str, value: str) -> None:
    """Write ``filename`` in cgroup directory ``d``. Tests and benches set files by their v1 name
    (cpu.shares, cpu.cfs_quota_us, memory.limit_in_bytes); where the directory has no such file but
    the v2 one (a pure cgroup v2 host), the v2 file gets the same setting: cpu.weight, cpu.max,
    memory.max."""
    to_v2 = _V2_SPELLING.get(filename)
    if to_v2 is not None and not (d / filename).exists():
        filename, value = to_v2(d, value)
    (d / filename).write_text(value)


def _rmdir_retry(d: Path, deadline: float) -> None:
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            # EBUSY: child cgroups or tasks still exiting; a non-empty prefix dir belongs to
            # another OwnedCgroup of this process and is removed with it.
            if time.monotonic() > deadline or any(p.is_dir() for p in d.iterdir()):
                return
            time.sleep(0.02)


@dataclass(frozen=True)
class _ReRooted(Hierarchy):
    """A hierarchy whose cgroups are named by their path in another one: ``strip`` (the other
    hierarchy's own cgroup) is cut from the front and the rest is looked up below ``mount``."""

    strip: str = "/"

    def path_of(self, cgroup_path: str) -> Path:
        rel = cgroup_path.strip("/")
        strip = self.strip.strip("/")
        if strip and (rel == strip or rel.startswith(strip + "/")):
            rel = rel[len(strip):].lstrip("/")
        return self.mount / rel


def sandbox_layout(paths: HostPaths | None = None, layout: CgroupLayout | None = None) -> CgroupLayout:
    """The host's layout with each v1 hierarchy re-rooted so that a test pod's cpu-hierarchy path
    names the same pod in every hierarchy.

    OwnedCgroup nests test pods under this process's own cgroup in each hierarchy, and on a v1 host
    those can differ (cpu:/ but memory:/process_api/<id> here). The detector names a pod by its cpu
    path, so an actuator writing memory.limit_in_bytes at that path in the memory hierarchy would miss
    the pod (or, worse, find another). On a Kubernetes node the kubelet's path is the same in every
    hierarchy and the agent uses the plain layout; the bench and tests that act on their own pods
    through another hierarchy use this one. v2 has one hierarchy: nothing to re-root.
    """
    paths = paths or HostPaths()
    layout = layout or discover(paths)
    mine = self_cgroups(paths)
    cpu_own = mine.get("cpu", mine.get("", "/"))
    v1: dict[str, Hierarchy] = {}
    for controller, h in layout.v1.items():
        own = mine.get(controller, "/")
        v1[controller] = h if own == cpu_own else \
            _ReRooted(h.version, h.path_of(own), h.controllers, strip=cpu_own)
    return CgroupLayout(v2=layout.v2, v1=v1)


def cleanup_prefix(paths: HostPaths | None = None, prefix: str | None = None) -> None:
    """Remove every cgroup below our prefix in every hierarchy (end of a test session)."""
    paths = paths or HostPaths()
    layout = discover(paths)
    prefix = prefix or f"{PREFIX}-{os.getpid()}"
    mine = self_cgroups(paths)
    for h in layout.hierarchies():
        own = mine.get(next(iter(h.controllers), ""), mine.get("", "/")) if h.version == 1 else mine.get("", "/")
        base = h.path_of(own) / prefix
        if not base.is_dir():
            continue
        for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            kill_processes([d])
            _rmdir_retry(d, time.monotonic() + 5)
        _rmdir_retry(base, time.monotonic() + 5)


# cpu.shares of this process's nn-test-<pid> directory while a test's pods interfere on purpose: 16
# times a nice-0 task's, so a CPU hog in a test pod gets ~16/17 of its CPU against one other task or
# cgroup at the root (other test runs, CI load), not half, and stays the main neighbour the test
# builds. Only ever written on that directory, which this process created.
SHIELD_SHARES = 16384


def shield(cg: OwnedCgroup, shares: int = SHIELD_SHARES) -> Callable[[], None]:
    """Give the nn-test-<pid> directory above `cg` `shares` of CPU weight (cpu.weight on v2);
    returns the function that puts the old value back (a no-op once the directory is gone)."""
    top = cg.path("cpu")
    while top.name != cg.prefix:
        top = top.parent
    path, value = top / "cpu.shares", str(shares)
    if not path.exists():
        path, value = top / "cpu.weight", str(max(1, min(10000, shares * 100 // 1024)))
    old = path.read_text().strip()
    path.write_text(value)

    def restore() -> None:
        with contextlib.suppress(OSError):  # removed with the last test cgroup below it
            path.write_text(old)

    return restore
