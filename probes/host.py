# SPDX-License-Identifier: Apache-2.0
"""Where the host's pseudo-filesystems are.

Every host path the project reads or writes goes through :class:`HostPaths`, so tests (and an agent
running in a container with the host mounted elsewhere) can point it at a temp dir.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from probes.cgroupfiles import SYS_CPU_POSSIBLE


@dataclass(frozen=True)
class HostPaths:
    cgroup_root: Path = Path("/sys/fs/cgroup")
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")

    @classmethod
    def under(cls, root: str | os.PathLike[str]) -> HostPaths:
        """All host paths below one root, e.g. `/host` in a container or a temp dir in tests."""
        root = Path(root)
        return cls(cgroup_root=root / "sys/fs/cgroup", proc=root / "proc", sys=root / "sys")

    @property
    def btf_vmlinux(self) -> Path:
        return self.sys / "kernel/btf/vmlinux"

    @property
    def tracefs(self) -> Path:
        return self.sys / "kernel/tracing"


def read_small(path: str) -> str | None:
    """A small pseudo-file by a prebuilt string path, for the per-tick readers: one open, one read
    (pathlib's path objects and text wrappers cost more than the read itself there). None when it
    is absent, vanished or unreadable: the callers count all of those as "not there now"."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:  # kernfs hands a file out whole when the buffer is larger
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


ReadText = Callable[[str], str | None]  # read_small, or HotFiles.read


def _open_files_allowed() -> int:
    """The process's soft limit on open descriptors (RLIMIT_NOFILE)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class HotFiles:
    """Pseudo-files re-read every tick, kept open and re-read with ``pread(fd, 0)``: kernfs makes the
    text anew at offset 0, and an open + close per read costs more than the read. Bounded (least
    recently used closed first): an open cgroup file pins its cgroup in the kernel after removal,
    so owners must also :meth:`close` the files of a cgroup they stop watching.

    The bound must hold the files read every tick: past it, the least recently used is closed just
    before it is read again, and every read pays an open and a close (6 µs against 1 µs for a
    pread here, 900 files a tick at 300 busy pods). Owners raise it with what they read
    (:meth:`fit`); each open file keeps a page of kernel memory (its seq_file buffer)."""

    def __init__(self, max_open: int = 256) -> None:
        self.max_open = max_open
        self._limit = _open_files_allowed() // 2  # the rest of the descriptors stay for everything else
        self._fds: dict[str, int] = {}  # insertion order = least recently used first

    def read(self, path: str) -> str | None:
        fd = self._fds.pop(path, None)
        for attempt in (0, 1):
            if fd is None:
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    return None
            try:
                data = os.pread(fd, 65536, 0)
            except OSError:  # ENODEV: the cgroup was removed (perhaps made again under the same name)
                os.close(fd)
                fd = None
                if attempt:
                    return None
                continue
            if len(data) == 65536:  # too large to keep: read it whole the ordinary way
                os.close(fd)
                return read_small(path)
            self._fds[path] = fd
            if len(self._fds) > self.max_open:
                os.close(self._fds.pop(next(iter(self._fds))))
            return data.decode("utf-8", "replace")
        return None

    def fit(self, files: int) -> None:
        """Keep room for `files` open (at least 256, at most half the process's descriptors). Room
        grows at once and shrinks by 1 % a tick: the files read per tick swing from tick to tick, and
        closing what is read again a tick later is the cost this class avoids."""
        self.max_open = max(256, min(max(files, self.max_open * 99 // 100), self._limit))
        while len(self._fds) > self.max_open:
            os.close(self._fds.pop(next(iter(self._fds))))

    def close(self, paths: Iterable[str] | None = None) -> None:
        """Close these files (all when None)."""
        for path in list(self._fds) if paths is None else paths:
            fd = self._fds.pop(path, None)
            if fd is not None:
                os.close(fd)

    def __len__(self) -> int:
        return len(self._fds)


def possible_cpu_count(paths: HostPaths) -> int:
    """The possible CPUs (what the kernel sizes per-CPU maps by): /sys/devices/system/cpu/possible."""
    try:
        return len(SYS_CPU_POSSIBLE.read(paths)) or 1
    except (OSError, ValueError):
        return os.cpu_count() or 1
