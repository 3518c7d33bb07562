# SPDX-License-Identifier: Apache-2.0
"""The cgroup files of :mod:`probes.cgroupfiles`, found in their hierarchy, for cgroup v1, v2 and hybrid hosts.

Actuators never spell a cgroup file name: they hand :class:`CgroupFiles` a declaration of the kernel-file
table (``CPU_MAX``, ``CPU_BURST``, ``CPUSET_CPUS``, ``CGROUP_PROCS``, ``MEMORY_HIGH``...) and a cgroup,
and get the declaration's file in the hierarchy of its controller (found through
:class:`probes.cgroupfs.CgroupLayout`), read through its one parser. The table has the v1 and v2 names.

API (all cgroup paths are relative to the hierarchy root, e.g. ``kubepods.slice/kubepods-besteffort.slice``):

- ``files = CgroupFiles(HostPaths.under(tmp))`` (default: the real host).
- Typed reads: ``read(file, cg)`` through the declaration's parser, and ``read_cpu_max(cg) -> CpuMax``,
  ``read_burst_us``, ``read_cpus`` (a sorted tuple; a v2 ``cpuset.cpus`` is empty until set: the parent's
  CPUs, which ``read_effective_cpus`` gives), ``read_procs``.
- Planned writes (nothing is written, :class:`actuators.base.FileWrite` with old and new raw values,
  ready for :meth:`actuators.journal.Journal.apply`): ``quota_writes(cg, quota_us)``,
  ``burst_write(cg, burst_us)``.
- Raw access: ``path(file, cg)``, ``paths_of(file, cg)`` (v1 CFS bandwidth is two files), ``read_raw``;
  module functions :func:`read_file` / :func:`write_file` work on absolute paths (the journal uses them).
- ``descendants(file, cg)``: the cgroup and every cgroup below it, top-down.

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
from pathlib import Path
from typing import Any

from actuators.base import FileWrite
from probes.cgroupfiles import (
    CGROUP_PROCS,
    CPU_BURST,
    CPU_MAX,
    CPUSET_CPUS,
    CPUSET_EFFECTIVE_CPUS,
    CPUSET_MEMS,
    VANISHED_ERRNOS,
    CgroupFile,
    CgroupFileParseError,
    CpuMax,
    parse_cpu_list,
)
from probes.cgroupfs import CgroupLayout, Hierarchy, discover
from probes.host import HostPaths


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
        if e.errno != errno.ENOSPC or value.strip() or p.name not in (CPUSET_CPUS.name(2), CPUSET_MEMS.name(2)) \
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
    """The declared cgroup files of one host (real or a temp dir laid out like one)."""

    def __init__(self, paths: HostPaths | None = None, layout: CgroupLayout | None = None) -> None:
        self.paths = paths or HostPaths()
        self.layout = layout or discover(self.paths)

    # -- locating -----------------------------------------------------------------------------
    def hierarchy(self, file: CgroupFile[Any]) -> Hierarchy:
        h = self.layout.hierarchy_for(file.controller)
        if h is None:
            raise ResourceUnavailable(f"no cgroup hierarchy has the {file.controller} controller on this host")
        return h

    def version(self, file: CgroupFile[Any]) -> int:
        return self.hierarchy(file).version

    def dir(self, file: CgroupFile[Any], cgroup: str) -> Path:
        return self.hierarchy(file).path_of(cgroup)

    def paths_of(self, file: CgroupFile[Any], cgroup: str) -> tuple[Path, ...]:
        """Every file the value is in (v1 CFS bandwidth: quota, then period)."""
        h = self.hierarchy(file)
        found = file.paths(h.path_of(cgroup), h.version)
        if not found:
            raise ResourceUnavailable(f"{file.v2_name or file.v1_names[0]} has no cgroup v{h.version} file")
        return found

    def path(self, file: CgroupFile[Any], cgroup: str) -> Path:
        return self.paths_of(file, cgroup)[0]

    def exists(self, file: CgroupFile[Any], cgroup: str) -> bool:
        try:
            return self.path(file, cgroup).exists()
        except ResourceUnavailable:
            return False

    def read_raw(self, file: CgroupFile[Any], cgroup: str) -> str:
        return read_file(self.path(file, cgroup))

    def descendants(self, file: CgroupFile[Any], cgroup: str) -> list[str]:
        """The cgroup and all cgroups below it in the file's hierarchy, parents before children."""
        top = self.dir(file, cgroup)
        if not top.is_dir():
            raise CgroupVanished(f"cgroup {top} is gone")
        found = [cgroup.strip("/")]
        for dirpath, dirnames, _ in os.walk(top):
            dirnames.sort()
            rel = Path(dirpath).relative_to(self.hierarchy(file).mount)
            found.extend(str(rel / d) for d in dirnames)
        # os.walk is top-down; sort by depth keeps parents first even across siblings
        return sorted(dict.fromkeys(found), key=lambda c: (c.count("/"), c))

    # -- typed reads --------------------------------------------------------------------------
    def read(self, file: CgroupFile[Any], cgroup: str) -> Any:
        """The file's value through its declared parser; a malformed value is the parser's line behind the path."""
        texts = [read_file(p) for p in self.paths_of(file, cgroup)]
        try:
            return file.parse(self.version(file), *texts)
        except CgroupFileParseError as e:
            raise CgroupFileError(f"{self.path(file, cgroup)}: {e}") from None

    def read_cpu_max(self, cgroup: str) -> CpuMax:
        return self.read(CPU_MAX, cgroup)

    def read_burst_us(self, cgroup: str) -> int:
        return self.read(CPU_BURST, cgroup)

    def read_cpus(self, cgroup: str) -> tuple[int, ...]:
        return self.read(CPUSET_CPUS, cgroup)

    def read_effective_cpus(self, cgroup: str) -> tuple[int, ...]:
        return self.read(CPUSET_EFFECTIVE_CPUS, cgroup)

    def read_procs(self, cgroup: str) -> list[int]:
        return list(self.read(CGROUP_PROCS, cgroup))

    # -- planned writes (nothing written here) -------------------------------------------------
    def quota_writes(self, cgroup: str, quota_us: int | None, period_us: int | None = None) -> list[FileWrite]:
        """Set the CFS quota (None = unlimited); the period is kept unless given."""
        if quota_us is not None and quota_us < 1000:
            raise CgroupFileError(f"cfs quota {quota_us} us is below the kernel minimum of 1000 us")
        current = self.read_cpu_max(cgroup)
        period = period_us or current.period_us
        if self.version(CPU_MAX) == 2:
            path = self.path(CPU_MAX, cgroup)
            new = f"{'max' if quota_us is None else quota_us} {period}"
            return [FileWrite(str(path), read_file(path).strip(), new)]
        writes = []
        q, p = self.paths_of(CPU_MAX, cgroup)  # v1: cpu.cfs_quota_us, cpu.cfs_period_us
        if period != current.period_us:
            writes.append(FileWrite(str(p), str(current.period_us), str(period)))
        old_quota = "-1" if current.quota_us is None else str(current.quota_us)
        writes.append(FileWrite(str(q), old_quota, "-1" if quota_us is None else str(quota_us)))
        return writes

    def burst_write(self, cgroup: str, burst_us: int) -> FileWrite:
        if burst_us < 0:
            raise CgroupFileError(f"cfs burst must be >= 0, got {burst_us}")
        path = self.path(CPU_BURST, cgroup)
        return FileWrite(str(path), read_file(path).strip(), str(burst_us))
