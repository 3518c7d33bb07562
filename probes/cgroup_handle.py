# SPDX-License-Identifier: Apache-2.0
"""A cgroup's path from its id in one system call, not a walk of the hierarchy.

The BPF side keys cgroups by their kernfs node id, which is also what cgroupfs puts in a file handle
(FILEID_KERNFS: the 64-bit id), so ``open_by_handle_at(2)`` on the hierarchy's mount opens the cgroup's
directory, and its ``/proc/self/fd`` link is its path: how bpftool and systemd go from an id to a
cgroup. It needs CAP_DAC_READ_SEARCH (the agent runs as root) and a kernel whose cgroupfs exports
handles (every kernel this runs on); where it cannot be used, callers walk the hierarchy as before.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

FILEID_KERNFS = 0xFE  # include/linux/exportfs.h


class _KernfsHandle(ctypes.Structure):
    """struct file_handle with the 8 bytes of a kernfs handle."""

    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int), ("f_handle", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_open_by_handle_at = getattr(_libc, "open_by_handle_at", None)


@dataclass(frozen=True)
class HandleLookup:
    """What a lookup by handle said: the cgroup's path in the hierarchy (`/a/b`), that no cgroup has the
    id any more (gone), or that handles cannot be used here (unsupported: walk instead)."""

    state: Literal["found", "gone", "unsupported"]
    path: str | None = None


GONE = HandleLookup("gone")
UNSUPPORTED = HandleLookup("unsupported")


CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC = 0x27E0EB, 0x63677270  # include/uapi/linux/magic.h


def is_cgroupfs(mount: Path) -> bool:
    """Whether `mount` is a cgroup filesystem (statfs f_type): another filesystem's handles are not
    kernfs ids (tests build hierarchies of plain directories)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first word
    if _libc.statfs(os.fsencode(mount), buf) != 0:
        return False
    return ctypes.c_long.from_buffer(buf).value in (CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC)


def path_by_id(mount: Path, cgroup_id: int) -> HandleLookup:
    """The path, relative to the hierarchy mounted at `mount` (a cgroup filesystem: is_cgroupfs), of the
    cgroup with this kernfs id."""
    if _open_by_handle_at is None or cgroup_id <= 0 or cgroup_id >= 1 << 64:
        return UNSUPPORTED if _open_by_handle_at is None else GONE
    try:
        mount_fd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return UNSUPPORTED
    try:
        handle = _KernfsHandle(8, FILEID_KERNFS, cgroup_id)
        fd = _open_by_handle_at(mount_fd, ctypes.byref(handle), os.O_RDONLY | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            # ESTALE: no node has the id (removed); ENOENT: removed while being opened.
            return GONE if err in (errno.ESTALE, errno.ENOENT) else UNSUPPORTED
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
    except OSError:
        return UNSUPPORTED
    finally:
        os.close(mount_fd)
    if link.endswith(" (deleted)"):
        return GONE
    root = os.path.realpath(mount)
    if link == root:
        return HandleLookup("found", "/")
    if link.startswith(root.rstrip("/") + "/"):
        return HandleLookup("found", link[len(root.rstrip("/")):])
    return UNSUPPORTED  # outside the mount as we see it (another namespace's view): walk
