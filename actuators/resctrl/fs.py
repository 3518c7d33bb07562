# SPDX-License-Identifier: Apache-2.0
"""The filesystem seam every resctrl read, write, mkdir and rmdir goes through (the kernel's, or a test's
fake that validates like the kernel and fills ``info/last_cmd_status``)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Protocol

from actuators.cgroupfile import (
    CgroupFileError,
    CgroupVanished,
    CgroupWriteError,
    ResourceUnavailable,
    read_file,
    write_file,
)
from probes.cgroupfiles import VANISHED_ERRNOS

# -- the filesystem seam ----------------------------------------------------------------------


class ResctrlFs(Protocol):
    """Every access to the resctrl filesystem. Errors are ``OSError`` with the kernel's errno."""

    def read(self, path: Path) -> str: ...

    def write(self, path: Path, data: str) -> None: ...

    def mkdir(self, path: Path) -> None: ...

    def rmdir(self, path: Path) -> None: ...


class KernelResctrlFs:
    """The real filesystem: one ``write(2)`` per call, because resctrl parses each write on its own."""

    def read(self, path: Path) -> str:
        return Path(path).read_text(encoding="utf-8", errors="replace")

    def write(self, path: Path, data: str) -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, data.encode())
        finally:
            os.close(fd)

    def mkdir(self, path: Path) -> None:
        os.mkdir(path)

    def rmdir(self, path: Path) -> None:
        os.rmdir(path)


class ResctrlFileIO:
    """``read``/``write`` callables for :class:`actuators.journal.Journal` that understand resctrl files.

    Paths under the resctrl root go through the :class:`ResctrlFs` (so a fake kernel validates them);
    a schemata value gets the trailing newline the kernel requires (the journal keeps values
    stripped); a refusal becomes a one-line :class:`CgroupWriteError` carrying ``last_cmd_status``.
    Other paths go to :func:`actuators.cgroupfile.read_file` / ``write_file``, so one agent journal
    built with these callables serves cgroup files and resctrl alike.
    """

    def __init__(self, root: Path, fs: ResctrlFs) -> None:
        self.root = Path(root)
        self.fs = fs

    def _ours(self, path: Path) -> bool:
        return path == self.root or self.root in path.parents

    def last_cmd_status(self) -> str:
        try:
            return _one_line(self.fs.read(self.root / "info/last_cmd_status"))
        except OSError:
            return "unknown"

    def read(self, path: str) -> str:
        p = Path(path)
        if not self._ours(p):
            return read_file(p)
        try:
            return self.fs.read(p)
        except OSError as e:
            raise self._classify(e, p, f"read {p}") from None

    def write(self, path: str, value: str) -> None:
        p = Path(path)
        if not self._ours(p):
            write_file(p, value)
            return
        data = value if value.endswith("\n") else value + "\n"
        try:
            self.fs.write(p, data)
        except OSError as e:
            raise self._classify(e, p, f"write {value.strip()!r} to {p}") from None

    def mkdir(self, path: Path) -> None:
        try:
            self.fs.mkdir(path)
        except OSError as e:
            raise self._classify(e, path, f"mkdir {path}") from None

    def _classify(self, e: OSError, path: Path, what: str) -> CgroupFileError:
        reason = e.strerror or str(e)
        if e.errno in VANISHED_ERRNOS and e.errno != errno.ESRCH:
            if not path.parent.is_dir():
                return CgroupVanished(f"resctrl group {path.parent} is gone ({what}: {reason})")
            return ResourceUnavailable(f"{path} does not exist ({what}: {reason})")
        return CgroupWriteError(f"resctrl {what}: {reason} (last_cmd_status: {self.last_cmd_status()})")


def _one_line(text: str) -> str:
    return " ".join(text.split())


