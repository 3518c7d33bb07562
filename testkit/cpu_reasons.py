# SPDX-License-Identifier: Apache-2.0
"""Why ``probes.cpuacct.read_cgroup_cpu`` gives None for a cgroup, in one line: what the tests assert a
probe skipped and why (the agent itself only skips). Files read through their rows of the kernel-file
table (``CgroupFile.raw``), the bad text judged by the rows' parsers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from probes.cgroupfiles import (
    CPU_MAX,
    CPU_STAT,
    CPUACCT_STAT,
    CPUACCT_USAGE,
    CgroupFile,
    CgroupFileParseError,
    parse_flat_keyed,
)
from probes.cgroupfs import CgroupLayout
from probes.cpuacct import locate_cpu_stat_dirs, read_cgroup_cpu


def cpu_stat_unavailable_reason(layout: CgroupLayout, cgroup_path: str) -> str | None:
    """One line on why read_cgroup_cpu() gives None for this cgroup; None if it reads fine now.

    Kept apart from the reader so the per-tick path stays a handful of reads.
    """
    dirs = locate_cpu_stat_dirs(layout, cgroup_path)
    if dirs is None:
        return "no cgroup hierarchy has the cpu or cpuacct controller"
    if dirs.cgroup_version == 1 and dirs.cpuacct_dir is None:
        return "no v1 cpuacct hierarchy: CPU usage is only accounted there"
    for d in (dirs.cpu_dir, dirs.cpuacct_dir):
        if d is not None and not d.is_dir():
            return f"cgroup {d} does not exist (removed?)"
    if dirs.cgroup_version == 2 and dirs.cpu_dir is not None:
        problem = _file_problem(
            CPU_STAT, dirs.cpu_dir, 2, lambda t: "usage_usec" in parse_flat_keyed(t), "no usage_usec line"
        ) or _parse_problem(CPU_MAX, dirs.cpu_dir, 2)
    elif dirs.cpuacct_dir is not None:
        problem = _file_problem(
            CPUACCT_USAGE, dirs.cpuacct_dir, 1, lambda t: CPUACCT_USAGE.parse_or_none(1, t) is not None, "not an integer"
        ) or _file_problem(CPUACCT_STAT, dirs.cpuacct_dir, 1, lambda _: True, "")
    else:
        problem = None
    if problem:
        return problem
    if read_cgroup_cpu(layout, cgroup_path) is None:
        return "files changed while being read (cgroup removed?)"
    return None


def _raw(file: CgroupFile[Any], cgroup_dir: Path, version: int) -> tuple[Path, str | None, str | None]:
    """(path, its text or None when absent, a one-line error when it cannot be read)."""
    path = file.path(cgroup_dir, version)
    try:
        return path, file.raw(cgroup_dir, version), None
    except OSError as e:
        return path, None, f"{path}: {e.strerror or e}"


def _file_problem(
    file: CgroupFile[Any], cgroup_dir: Path, version: int, valid: Callable[[str], bool], complaint: str,
    *, optional: bool = False,
) -> str | None:
    path, text, error = _raw(file, cgroup_dir, version)
    if error is not None:
        return error
    if text is None:
        return None if optional else f"{path} absent"
    if not valid(text):
        return f"{path}: {complaint} ({text.strip()[:40]!r})"
    return None


def _parse_problem(file: CgroupFile[Any], cgroup_dir: Path, version: int) -> str | None:
    """The parser's own one-line complaint about an optional file: what an actuator reading it says."""
    path, text, error = _raw(file, cgroup_dir, version)
    if error is not None or text is None:
        return error
    try:
        file.parse(version, text)
    except CgroupFileParseError as e:
        return f"{path}: {e}"
    return None
