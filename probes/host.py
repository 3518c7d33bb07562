"""Where the host's pseudo-filesystems are.

Every host path the project reads or writes goes through :class:`HostPaths`, so tests (and an agent
running in a container with the host mounted elsewhere) can point it at a temp dir.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

# Errors that mean "the file or the object behind it went away while we looked": a cgroup removed
# mid-read gives ENOENT or ENODEV, a task that exited gives ESRCH.
VANISHED_ERRNOS = frozenset({errno.ENOENT, errno.ENODEV, errno.ESRCH, errno.ENOTDIR})


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


def read_text_or_none(path: str | os.PathLike[str]) -> str | None:
    """Read a small pseudo-file; None when it vanished (cgroup removed, task exited)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as e:
        if e.errno in VANISHED_ERRNOS:
            return None
        raise


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
