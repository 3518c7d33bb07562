# SPDX-License-Identifier: Apache-2.0
"""/proc/stat read once a tick and shared by its users.

The collector reads it at the start of each tick (:meth:`ProcStatReader.read`) for the node's CPU
times; the tick's other users take that reading (:attr:`ProcStatReader.latest`) instead of reading the
file again: the steal probe (its steal column per CPU) and the burst actuator's loop (the node's busy
share), which the agent hands the same reader. The file is parsed by the kernel-file table's one
/proc/stat parser (:data:`probes.cgroupfiles.PROC_STAT`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from probes.cgroupfiles import PROC_STAT, USER_HZ, CpuTimes
from probes.host import HostPaths


@dataclass(frozen=True, slots=True)
class ProcStatReading:
    """One read of /proc/stat: all CPUs and each CPU, in ns, and when it was read."""

    monotonic_s: float
    node: CpuTimes | None  # the "cpu" line; None when the file has none
    per_cpu: dict[int, CpuTimes]

    def node_ticks(self) -> tuple[int, int, int]:
        """(busy ticks, total ticks, CPU count) in USER_HZ ticks, as koordlet reads them; guest time is
        already in user/nice. No "cpu" line: (0, 0, CPUs)."""
        if self.node is None:
            return 0, 0, len(self.per_cpu)
        tick_ns = 1_000_000_000 // USER_HZ
        return self.node.busy_ns // tick_ns, self.node.total_ns // tick_ns, len(self.per_cpu)


class ProcStatReader:
    """Reads /proc/stat under ``paths``; :attr:`latest` is the last reading, for the tick's other users."""

    def __init__(self, paths: HostPaths | None = None) -> None:
        self.paths = paths or HostPaths()
        self.path = PROC_STAT.at(self.paths)
        self.latest: ProcStatReading | None = None

    def read(self) -> ProcStatReading | None:
        """Read the file now (None when it is missing) and keep the reading as :attr:`latest`."""
        found = PROC_STAT.read_or_none(self.paths)
        if found is None:
            self.latest = None
            return None
        node, per_cpu = found
        self.latest = ProcStatReading(time.monotonic(), node, per_cpu)
        return self.latest

    def node_ticks(self, *, read_now: bool) -> tuple[int, int, int]:
        """:meth:`ProcStatReading.node_ticks` of a reading made now (``read_now``: a reader of one's own)
        or of :attr:`latest` (the collector's reader: this tick's reading); FileNotFoundError without one."""
        reading = self.read() if read_now else self.latest
        if reading is None:
            raise FileNotFoundError(f"{self.path} is missing")
        return reading.node_ticks()
