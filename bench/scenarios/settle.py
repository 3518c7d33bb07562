# SPDX-License-Identifier: Apache-2.0
"""Wait, after a pass that freed most of the node's memory, until the hypervisor has taken it back.

On a VM whose virtio balloon does free page reporting (this machine: Firecracker, ``virtio0`` device 5,
feature bit 5), the guest reports freed 2 MiB blocks to the host, which discards them; the host's work
for each report takes the vCPUs from the guest (``/proc/stat`` steal). The global-reclaim scenarios free
their ~20 GiB heap at the end of a pass (and global-reclaim-evict mid-pass, at its eviction); the guest
then reported 1.3-1.8 GiB every ~2.5 s for ~35 s, and the next pass's victim (cpu-neighbor-shared in
``make bench``'s order) had requests of 10-40 ms in bursts every 2.5 s, each with 20-40 ms of steal on
its CPU and no wait in its run queue (2026-11-28 17:31 UTC: bench/debug/README.md, "page reporting").

The running total of what was reported is ``/sys/module/page_reporting/parameters/reported_kib`` on this
platform's kernel; it is settled once it moved less than ``QUIET_KIB`` over ``QUIET_S``. Mainline kernels
have no such counter: where a balloon reports free pages, the wait is mainline's own estimate of a full
report of an idle system's free lists (mm/page_reporting.c: "about 30 seconds"), with a margin. On bare
metal, or a VM without reporting, nothing is waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPORTED_KIB = Path("/sys/module/page_reporting/parameters/reported_kib")
VIRTIO_DEVICES = Path("/sys/bus/virtio/devices")
BALLOON_DEVICE_ID = 0x0005  # virtio device id of a memory balloon
REPORTING_FEATURE_BIT = 5  # VIRTIO_BALLOON_F_REPORTING
QUIET_S = 5.0  # reporting passes come every ~2.5 s while there is much to report: two missed in a row
QUIET_KIB = 64 << 10  # the tail passes report a few MiB each: not a steal the victims see
TIMEOUT_S = 90.0  # ~20 GiB took ~35 s here
MAINLINE_REPORT_S = 40.0
POLL_S = 0.5


@dataclass(frozen=True)
class Settled:
    waited_s: float
    reported_mib: float | None  # reported while waiting (None: no counter to read)
    how: str  # "counter" | "fixed" | "none" | "timeout"


def balloon_reports_free_pages(devices: Path = VIRTIO_DEVICES) -> bool:
    """A virtio balloon with free page reporting is bound (``features`` is a bit string, bit 0 first)."""
    try:
        entries = list(devices.iterdir())
    except OSError:
        return False
    for dev in entries:
        try:
            device = int((dev / "device").read_text().strip(), 16)
            features = (dev / "features").read_text().strip()
        except (OSError, ValueError):
            continue
        if device == BALLOON_DEVICE_ID and len(features) > REPORTING_FEATURE_BIT \
                and features[REPORTING_FEATURE_BIT] == "1":
            return True
    return False


def read_reported_kib(path: Path = REPORTED_KIB) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class ReportingQuiet:
    """Whether free page reporting has settled, from samples of the running total: settled at the first
    sample ``QUIET_S`` or more after the first whose total moved less than ``QUIET_KIB`` over the last
    ``QUIET_S`` (reports come every ~2.5 s while there is much to report: two missed in a row)."""

    def __init__(self, start: float, total: int) -> None:
        self.start = start
        self.first = total
        self.history = [(start, total)]

    def observe(self, now: float, total: int) -> bool:
        self.history.append((now, total))
        if now - self.start < QUIET_S:
            return False
        then = [v for t, v in self.history if t <= now - QUIET_S][-1]
        return total - then < QUIET_KIB

    @property
    def reported_mib(self) -> float:
        return (self.history[-1][1] - self.first) / 1024


def wait_for_free_page_reporting(timeout_s: float = TIMEOUT_S, reported: Callable[[], int | None] = read_reported_kib,
                                 reporting: Callable[[], bool] = balloon_reports_free_pages,
                                 clock: Callable[[], float] = time.monotonic,
                                 sleep: Callable[[float], None] = time.sleep) -> Settled:
    """Until the free page reporting of freed memory has settled, at most ``timeout_s``."""
    if not reporting():
        return Settled(0.0, None, "none")
    start = clock()
    first = reported()
    if first is None:
        sleep(MAINLINE_REPORT_S)
        return Settled(round(clock() - start, 1), None, "fixed")
    quiet = ReportingQuiet(start, first)
    while True:
        sleep(POLL_S)
        now, total = clock(), reported()
        if total is None:  # the counter went away: nothing more to learn from it
            return Settled(round(now - start, 1), quiet.reported_mib, "counter")
        if quiet.observe(now, total):
            return Settled(round(now - start, 1), quiet.reported_mib, "counter")
        if now - start >= timeout_s:
            return Settled(round(now - start, 1), quiet.reported_mib, "timeout")
