# SPDX-License-Identifier: Apache-2.0
"""Cgroup files behind resource names, the same for cgroup v1, v2 and hybrid hosts.

Actuators never spell a cgroup file name: they ask :class:`CgroupFiles` for a *resource* of a
cgroup and get the right file in the right hierarchy (found through
:class:`probes.cgroupfs.CgroupLayout`), in the right format:

=============  ======================================  ==============================
resource       v1 (hierarchy / file)                   v2 file
=============  ======================================  ==============================
CPU_QUOTA      cpu / ``cpu.cfs_quota_us`` (+period)    ``cpu.max`` ("max 100000")
CPU_BURST      cpu / ``cpu.cfs_burst_us``              ``cpu.max.burst``
CPU_SHARES     cpu / ``cpu.shares``                    ``cpu.weight`` (kernel conversion)
CPUSET_CPUS    cpuset / ``cpuset.cpus``                ``cpuset.cpus``
CPUSET_MEMS    cpuset / ``cpuset.mems``                ``cpuset.mems``
CPUSET_EFF..   cpuset / ``cpuset.effective_cpus``      ``cpuset.cpus.effective`` (read only)
TASKS          cpu / ``tasks``                         ``cgroup.threads``
PROCS          cpu / ``cgroup.procs``                  ``cgroup.procs``
=============  ======================================  ==============================

API (all cgroup paths are relative to the hierarchy root, e.g. ``kubepods.slice/kubepods-besteffort.slice``):

- ``files = CgroupFiles(HostPaths.under(tmp))`` (default: the real host).
- Typed reads: ``read_cpu_max(cg) -> CpuMax``, ``read_burst_us``, ``read_shares`` (v1 units, v2 weight
  converted), ``read_cpus`` (a sorted tuple; a v2 ``cpuset.cpus`` is empty until set: the parent's CPUs,
  which ``read_effective_cpus`` gives), ``read_tasks``, ``read_procs``.
- Planned writes (nothing is written, :class:`actuators.base.FileWrite` with old and new raw values,
  ready for :meth:`actuators.journal.Journal.apply`): ``quota_writes(cg, quota_us)``,
  ``burst_write(cg, burst_us)``, ``shares_write(cg, shares)``.
- Raw access: ``path(resource, cg)``, ``read_raw``, ``write_raw``; module functions
  :func:`read_file` / :func:`write_file` work on absolute paths (the journal uses them).
- ``descendants(resource, cg)``: the cgroup and every cgroup below it, top-down.
- ``kubepods_driver()`` -> "systemd" | "cgroupfs" | None and ``qos_cgroup("besteffort")`` ->
  ``kubepods.slice/kubepods-besteffort.slice`` or ``kubepods/besteffort``, detected by which root exists.

The files the probes read too (``cpu.max`` / CFS quota and period, ``cpuset.cpus``) are declared once
in :mod:`probes.cgroupfiles` with their parsers; a malformed value is the parser's one-line message
behind the file's path, the same words a probe's reason gives for it.

Errors are one line: :class:`CgroupVanished` when the cgroup is gone, :class:`ResourceUnavailable`
when the host has no such file (no controller, kernel without CFS burst), :class:`CgroupWriteError`
when the kernel refuses a value (EINVAL, ERANGE, EBUSY), all subclasses of :class:`CgroupFileError`.
"""

from __future__ import annotations

import errno
import os
from enum import StrEnum
from pathlib import Path

from actuators.base import FileWrite
from probes.cgroupfiles import (
    CGROUP_PROCS,
    CGROUP_THREADS,
    CPU_BURST,
    CPU_MAX,
    CPU_WEIGHT,
    CPUSET_CPUS,
    CPUSET_EFFECTIVE_CPUS,
    CPUSET_MEMS,
    MEMORY_HIGH,
    MEMORY_USAGE,
    CgroupFile,
    CgroupFileParseError,
    CpuMax,
    parse_cpu_list,
)
from probes.cgroupfs import CgroupLayout, Hierarchy, discover
from probes.host import VANISHED_ERRNOS, HostPaths


class CgroupFileError(Exception):
    """A cgroup file could not be read or written; ``str(exc)`` is one line."""


class CgroupVanished(CgroupFileError):
    """The cgroup (directory) is gone: removed while we planned or wrote."""


class ResourceUnavailable(CgroupFileError):
    """This host has no such file for the cgroup (controller not mounted/enabled, old kernel)."""


class CgroupWriteError(CgroupFileError):
    """The kernel refused the value (EINVAL, ERANGE, EBUSY, ...); ``errno`` says which."""

    def __init__(self, message: str, errno_: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno_


class Resource(StrEnum):
    CPU_QUOTA = "cpu_quota"
    CPU_PERIOD = "cpu_period"
    CPU_BURST = "cpu_burst"
    CPU_SHARES = "cpu_shares"
    CPUSET_CPUS = "cpuset_cpus"
    CPUSET_MEMS = "cpuset_mems"
    CPUSET_EFFECTIVE_CPUS = "cpuset_effective_cpus"  # read only: what the cpuset really allows
    TASKS = "tasks"
    PROCS = "procs"
    MEMORY_LIMIT = "memory_limit"  # v1 hard limit; v2 memory.high (throttle + reclaim, no OOM kill)
    MEMORY_USAGE = "memory_usage"


# resource -> its declaration in probes.cgroupfiles (the one table of kernel files: names and parser),
# and which of its v1 names it is (CFS quota and period are two v1 files, one v2 file).
_DECLARED: dict[Resource, tuple[CgroupFile, int]] = {
    Resource.CPU_QUOTA: (CPU_MAX, 0),
    Resource.CPU_PERIOD: (CPU_MAX, 1),
    Resource.CPU_BURST: (CPU_BURST, 0),
    Resource.CPU_SHARES: (CPU_WEIGHT, 0),
    Resource.CPUSET_CPUS: (CPUSET_CPUS, 0),
    Resource.CPUSET_MEMS: (CPUSET_MEMS, 0),
    Resource.CPUSET_EFFECTIVE_CPUS: (CPUSET_EFFECTIVE_CPUS, 0),
    Resource.TASKS: (CGROUP_THREADS, 0),
    Resource.PROCS: (CGROUP_PROCS, 0),
    Resource.MEMORY_LIMIT: (MEMORY_HIGH, 0),
    Resource.MEMORY_USAGE: (MEMORY_USAGE, 0),
}
# resource -> (controller, v1 file, v2 file)
_FILES: dict[Resource, tuple[str, str, str]] = {
    r: (f.controller, f.v1_names[i], f.name(2)) for r, (f, i) in _DECLARED.items()
}


# -- kernel conversions -------------------------------------------------------------------------

# kernel/sched/core.c: cpu.weight is the v1 share weight scaled so that the default 1024 <-> 100,
# rounded to nearest (DIV_ROUND_CLOSEST), weight clamped to [1, 10000], shares to [2, 262144].
def shares_to_weight(shares: int) -> int:
    return min(10_000, max(1, (shares * 100 + 512) // 1024))


def weight_to_shares(weight: int) -> int:
    return min(262_144, max(2, (weight * 1024 + 50) // 100))


def same_value(a: str | None, b: str | None) -> bool:
    """Two raw cgroup values mean the same thing ("0,1" == "0-1", whitespace ignored)."""
    if a is None or b is None:
        return a is b
    a, b = a.strip(), b.strip()
    if a == b:
        return True
    if " " not in a and " " not in b and "\n" not in a + b:
        try:
            return parse_cpu_list(a) == parse_cpu_list(b)
        except ValueError:
            return False
    return False


# -- raw file access ----------------------------------------------------------------------------


def read_file(path: str | os.PathLike[str]) -> str:
    """One cgroup/resctrl file, whole; one-line errors (CgroupVanished when its directory is gone)."""
    p = Path(path)
    try:
        with open(p, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as e:
        raise _classify(e, p, "read") from None


def write_file(path: str | os.PathLike[str], value: str) -> None:
    """Write ``value`` with a single write() (cgroup files take one value per write); never creates files.

    An empty v2 ``cpuset.cpus``/``cpuset.mems`` means "the parent's", and the journal restores it so; but
    a kernel before the v1/v2 split of cpuset's validate_change (6.1 among them) refuses to empty the
    list of a cgroup with tasks (ENOSPC). What the empty list stood for, the parent's effective list, is
    written then: the same CPUs now (it no longer follows later changes of the parent's)."""
    try:
        _write_once(path, value)
    except CgroupWriteError as e:
        p = Path(path)
        inherited = p.parent.parent / f"{p.name}.effective"
        if e.errno != errno.ENOSPC or value.strip() or p.name not in ("cpuset.cpus", "cpuset.mems") \
                or not inherited.exists():
            raise
        _write_once(path, read_file(inherited).strip())


def _write_once(path: str | os.PathLike[str], value: str) -> None:
    p = Path(path)
    # An empty value goes as a newline, as `echo > file` writes it: a write of zero bytes never reaches
    # the kernel's handler (it returns 0 and the file keeps its value: a "restored" empty cpuset was not).
    data = value.encode() if value else b"\n"
    try:
        # O_TRUNC as a shell `echo >` does: kernfs ignores it, and a temp-dir fake host needs it.
        fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    except OSError as e:
        raise _classify(e, p, "write", value) from None
    try:
        os.write(fd, data)
    except OSError as e:
        raise _classify(e, p, "write", value) from None
    finally:
        os.close(fd)


def _classify(e: OSError, p: Path, verb: str, value: str | None = None) -> CgroupFileError:
    what = f"{verb} {value.strip()!r} to {p}" if value is not None else f"{verb} {p}"
    reason = e.strerror or str(e)
    if e.errno in VANISHED_ERRNOS:
        if not p.parent.is_dir():
            return CgroupVanished(f"cgroup {p.parent} is gone ({what}: {reason})")
        return ResourceUnavailable(f"{p} does not exist on this host ({what}: {reason})")
    if e.errno in (errno.EACCES, errno.EPERM):
        return CgroupWriteError(f"{what}: permission denied", e.errno)
    return CgroupWriteError(f"{what}: {reason}", e.errno)


# -- the abstraction ----------------------------------------------------------------------------


class CgroupFiles:
    """Resource-named cgroup files of one host (real or a temp dir laid out like one)."""

    def __init__(self, paths: HostPaths | None = None, layout: CgroupLayout | None = None) -> None:
        self.paths = paths or HostPaths()
        self.layout = layout or discover(self.paths)

    # -- locating -----------------------------------------------------------------------------
    def hierarchy(self, resource: Resource) -> Hierarchy:
        controller = _FILES[resource][0]
        h = self.layout.hierarchy_for(controller)
        if h is None:
            raise ResourceUnavailable(f"no cgroup hierarchy has the {controller} controller on this host")
        return h

    def version(self, resource: Resource) -> int:
        return self.hierarchy(resource).version

    def dir(self, resource: Resource, cgroup: str) -> Path:
        return self.hierarchy(resource).path_of(cgroup)

    def path(self, resource: Resource, cgroup: str) -> Path:
        h = self.hierarchy(resource)
        _, v1_name, v2_name = _FILES[resource]
        return h.path_of(cgroup) / (v1_name if h.version == 1 else v2_name)

    def exists(self, resource: Resource, cgroup: str) -> bool:
        try:
            return self.path(resource, cgroup).exists()
        except ResourceUnavailable:
            return False

    def read_raw(self, resource: Resource, cgroup: str) -> str:
        return read_file(self.path(resource, cgroup))

    def write_raw(self, resource: Resource, cgroup: str, value: str) -> None:
        write_file(self.path(resource, cgroup), value)

    def descendants(self, resource: Resource, cgroup: str) -> list[str]:
        """The cgroup and all cgroups below it in the resource's hierarchy, parents before children."""
        top = self.dir(resource, cgroup)
        if not top.is_dir():
            raise CgroupVanished(f"cgroup {top} is gone")
        found = [cgroup.strip("/")]
        for dirpath, dirnames, _ in os.walk(top):
            dirnames.sort()
            rel = Path(dirpath).relative_to(self.hierarchy(resource).mount)
            found.extend(str(rel / d) for d in dirnames)
        # os.walk is top-down; sort by depth keeps parents first even across siblings
        return sorted(dict.fromkeys(found), key=lambda c: (c.count("/"), c))

    # -- typed reads --------------------------------------------------------------------------
    def read_cpu_max(self, cgroup: str) -> CpuMax:
        version = self.version(Resource.CPU_QUOTA)
        resources = (Resource.CPU_QUOTA,) if version == 2 else (Resource.CPU_QUOTA, Resource.CPU_PERIOD)
        texts = [self.read_raw(r, cgroup) for r in resources]
        try:
            return CPU_MAX.parse(version, *texts)
        except CgroupFileParseError as e:
            raise CgroupFileError(f"{self.path(Resource.CPU_QUOTA, cgroup)}: {e}") from None

    def read_burst_us(self, cgroup: str) -> int:
        return self._read_int(Resource.CPU_BURST, cgroup)

    def read_shares(self, cgroup: str) -> int:
        value = self._read_int(Resource.CPU_SHARES, cgroup)
        return weight_to_shares(value) if self.version(Resource.CPU_SHARES) == 2 else value

    def read_cpus(self, cgroup: str) -> tuple[int, ...]:
        return self._read_list(Resource.CPUSET_CPUS, cgroup)

    def read_effective_cpus(self, cgroup: str) -> tuple[int, ...]:
        return self._read_list(Resource.CPUSET_EFFECTIVE_CPUS, cgroup)

    def read_tasks(self, cgroup: str) -> list[int]:
        return list(self._read(Resource.TASKS, cgroup))

    def read_procs(self, cgroup: str) -> list[int]:
        return list(self._read(Resource.PROCS, cgroup))

    def _read_int(self, resource: Resource, cgroup: str) -> int:
        return self._read(resource, cgroup)

    def _read(self, resource: Resource, cgroup: str):
        """One file through its declared parser; a malformed value is the parser's line behind the path."""
        declared, _ = _DECLARED[resource]
        text = self.read_raw(resource, cgroup)
        try:
            return declared.parse(self.version(resource), text)
        except CgroupFileParseError as e:
            raise CgroupFileError(f"{self.path(resource, cgroup)}: {e}") from None

    def _read_list(self, resource: Resource, cgroup: str) -> tuple[int, ...]:
        text = self.read_raw(resource, cgroup)
        try:
            return parse_cpu_list(text)  # cpuset.cpus and cpuset.mems share the kernel's list format
        except CgroupFileParseError as e:
            raise CgroupFileError(f"{self.path(resource, cgroup)}: {e}") from None

    # -- planned writes (nothing written here) -------------------------------------------------
    def quota_writes(self, cgroup: str, quota_us: int | None, period_us: int | None = None) -> list[FileWrite]:
        """Set the CFS quota (None = unlimited); the period is kept unless given."""
        if quota_us is not None and quota_us < 1000:
            raise CgroupFileError(f"cfs quota {quota_us} us is below the kernel minimum of 1000 us")
        current = self.read_cpu_max(cgroup)
        period = period_us or current.period_us
        if self.version(Resource.CPU_QUOTA) == 2:
            path = self.path(Resource.CPU_QUOTA, cgroup)
            new = f"{'max' if quota_us is None else quota_us} {period}"
            return [FileWrite(str(path), read_file(path).strip(), new)]
        writes = []
        if period != current.period_us:
            p = self.path(Resource.CPU_PERIOD, cgroup)
            writes.append(FileWrite(str(p), str(current.period_us), str(period)))
        q = self.path(Resource.CPU_QUOTA, cgroup)
        old_quota = "-1" if current.quota_us is None else str(current.quota_us)
        writes.append(FileWrite(str(q), old_quota, "-1" if quota_us is None else str(quota_us)))
        return writes

    def burst_write(self, cgroup: str, burst_us: int) -> FileWrite:
        if burst_us < 0:
            raise CgroupFileError(f"cfs burst must be >= 0, got {burst_us}")
        path = self.path(Resource.CPU_BURST, cgroup)
        return FileWrite(str(path), read_file(path).strip(), str(burst_us))

    def shares_write(self, cgroup: str, shares: int) -> FileWrite:
        path = self.path(Resource.CPU_SHARES, cgroup)
        value = shares_to_weight(shares) if self.version(Resource.CPU_SHARES) == 2 else max(2, shares)
        return FileWrite(str(path), read_file(path).strip(), str(value))

    # -- kubepods ------------------------------------------------------------------------------
    def kubepods_driver(self) -> str | None:
        """"systemd" when ``kubepods.slice`` exists in the cpu hierarchy, "cgroupfs" for ``kubepods``."""
        h = self.hierarchy(Resource.CPU_QUOTA)
        if (h.mount / "kubepods.slice").is_dir():
            return "systemd"
        if (h.mount / "kubepods").is_dir():
            return "cgroupfs"
        return None

    def qos_cgroup(self, qos: str, driver: str | None = None) -> str:
        """The kubepods QoS cgroup path: "besteffort", "burstable" or "guaranteed" (= the kubepods root)."""
        qos = qos.lower()
        if qos not in ("besteffort", "burstable", "guaranteed"):
            raise ValueError(f"unknown Kubernetes QoS class {qos!r} (besteffort, burstable, guaranteed)")
        driver = driver or self.kubepods_driver()
        if driver is None:
            raise ResourceUnavailable("no kubepods cgroup (kubepods.slice or kubepods) on this host")
        if driver == "systemd":
            return "kubepods.slice" if qos == "guaranteed" else f"kubepods.slice/kubepods-{qos}.slice"
        return "kubepods" if qos == "guaranteed" else f"kubepods/{qos}"
