# SPDX-License-Identifier: Apache-2.0
"""The node's own processes (those of a cgroup outside any pod: the root cgroup's by default) ranked by the
CPU time they used between two reads: the commands an incident names when "the node" ran on the victim's
CPUs instead of it, so that a neighbour cause always says whom it blames.

Read from the cgroup's ``cgroup.procs`` and each process's ``/proc/<pid>/stat`` (utime + stime, its threads
summed), only while an incident blames the node: a cost in the node's processes for the ticks it does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from detector.model import TaskShare
from probes.cgroupfiles import CGROUP_PROCS, PID_STAT, CgroupFileParseError
from probes.host import HostPaths

MAX_PROCS = 4096  # a root cgroup with more processes is read for its first this many
TOP_TASKS = 3


class NodeTasks:
    """``top(key)``: the processes of the cgroup ``key`` (a workload key: a path in the cpu hierarchy) by
    their share of its processes' CPU time since the previous call for it; () on the first call."""

    def __init__(self, cgroup_dir: Callable[[str], Path | None], proc: Path = Path("/proc")) -> None:
        self.cgroup_dir = cgroup_dir
        self.paths = HostPaths(proc=proc)
        self._prev: dict[str, dict[int, float]] = {}  # key -> pid -> CPU seconds at the previous read

    def top(self, key: str, n: int = TOP_TASKS) -> tuple[TaskShare, ...]:
        d = self.cgroup_dir(key)
        if d is None:
            return ()
        try:
            # cgroup.procs: the same name and format on v1 and v2
            pids = CGROUP_PROCS.read(d, 2)[:MAX_PROCS]
        except (OSError, CgroupFileParseError):
            return ()
        now: dict[int, float] = {}
        comms: dict[int, str] = {}
        for pid in pids:
            try:
                stat = PID_STAT.read(self.paths, pid=pid)
            except (OSError, CgroupFileParseError):
                continue  # exited since the list was read
            now[pid], comms[pid] = stat.cpu_s, stat.comm
        prev = self._prev.get(key)
        self._prev[key] = now
        if prev is None:
            return ()
        used = {pid: now[pid] - prev.get(pid, now[pid]) for pid in now}
        total = sum(v for v in used.values() if v > 0)
        if total <= 0:
            return ()
        ranked = sorted((v, pid) for pid, v in used.items() if v > 0)[::-1][:n]
        return tuple(TaskShare(pid, comms[pid], round(v / total, 4)) for v, pid in ranked)

    def forget(self, key: str) -> None:
        self._prev.pop(key, None)
