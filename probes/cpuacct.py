# SPDX-License-Identifier: Apache-2.0
"""Per-cgroup CPU accounting: usage, user/system split, CFS bandwidth throttling and the quota.

Everything is normalised to nanoseconds (times) and microseconds (quota/period, as configured).

cgroup v1 (cpu and cpuacct may be separate hierarchies or one `cpu,cpuacct` directory):
- cpuacct.usage: ns; cpuacct.stat: `user`/`system` in USER_HZ ticks;
- cpu.stat: nr_periods, nr_throttled, throttled_time (ns), and nr_bursts, burst_time (ns) on
  kernels with CFS burst (5.14+);
- cpu.cfs_quota_us (-1 = unlimited), cpu.cfs_period_us.
cgroup v2:
- cpu.stat: usage_usec, user_usec, system_usec always; nr_periods, nr_throttled, throttled_usec,
  nr_bursts, burst_usec only where the cpu controller is enabled;
- cpu.max: "max 100000" or "50000 100000" (absent without the cpu controller, and at the root).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probes.cgroupfiles import (
    CPU_MAX,
    CPU_STAT,
    CPUACCT_STAT,
    CPUACCT_USAGE,
    CgroupFile,
    CgroupFileParseError,
    CpuMax,
    parse_flat_keyed,
)
from probes.cgroupfs import CgroupLayout
from probes.host import ReadText, read_small

NS_PER_US = 1_000
NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)  # one per watched cgroup: no per-instance dict
class CgroupCpuStat:
    cgroup_version: int  # 1 or 2: which files the numbers came from
    usage_ns: int
    user_ns: int | None  # v1: USER_HZ resolution (10 ms at 100 Hz)
    system_ns: int | None
    # No CFS bandwidth control in effect (no quota, or no cpu controller) means nothing can be
    # throttled, so these read 0 then rather than None.
    nr_periods: int
    nr_throttled: int
    throttled_ns: int
    nr_bursts: int | None  # None on kernels without CFS burst
    burst_ns: int | None
    quota_us: int | None  # None = unlimited (or no cpu controller)
    period_us: int | None  # None when there is no cpu controller to have one

    @property
    def quota_cores(self) -> float | None:
        """The quota as a number of CPUs (quota / period), None when unlimited."""
        if self.quota_us is None or not self.period_us:
            return None
        return self.quota_us / self.period_us


# -- parsing ------------------------------------------------------------------------------------




def _v1_limits(quota_text: str | None, period_text: str | None) -> CpuMax | None:
    """v1 CFS quota and period through CPU_MAX's parser; None when either is missing or malformed."""
    if quota_text is None or period_text is None:
        return None
    try:
        return CPU_MAX.parse_v1(quota_text, period_text)
    except CgroupFileParseError:
        return None


def _read(file: CgroupFile[Any], cgroup_dir: Path, version: int, part: int = 0) -> str | None:
    try:
        return file.raw(cgroup_dir, version, part)
    except OSError:
        return None  # unreadable counts as missing


def _read_counters(file: CgroupFile[dict[str, int]], cgroup_dir: Path, version: int) -> dict[str, int] | None:
    text = _read(file, cgroup_dir, version)
    return None if text is None else file.parse(version, text)


# -- readers ------------------------------------------------------------------------------------


def read_v2_cpu_stat(cgroup_dir: Path) -> CgroupCpuStat | None:
    """One v2 cgroup; None when it vanished or cpu.stat/cpu.max are unusable."""
    stat = _read_counters(CPU_STAT, cgroup_dir, 2)
    if stat is None or "usage_usec" not in stat:
        return None
    quota_us: int | None = None
    period_us: int | None = None
    cpu_max = _read(CPU_MAX, cgroup_dir, 2)
    if cpu_max is not None:
        parsed = CPU_MAX.parse_or_none(2, cpu_max)
        if parsed is None:
            return None  # guessing "unlimited" would hide a throttled cgroup
        quota_us, period_us = parsed.quota_us, parsed.period_us
    elif not cgroup_dir.is_dir():
        return None  # vanished between the two reads
    return _v2_stat(stat, quota_us, period_us)


def _v2_stat(stat: dict[str, int], quota_us: int | None, period_us: int | None) -> CgroupCpuStat:
    """A v2 cpu.stat (with usage_usec) and the cgroup's cpu.max as a CgroupCpuStat."""
    user, system = stat.get("user_usec"), stat.get("system_usec")
    bursts, burst = stat.get("nr_bursts"), stat.get("burst_usec")
    return CgroupCpuStat(
        cgroup_version=2,
        usage_ns=stat["usage_usec"] * NS_PER_US,
        user_ns=None if user is None else user * NS_PER_US,
        system_ns=None if system is None else system * NS_PER_US,
        nr_periods=stat.get("nr_periods", 0),
        nr_throttled=stat.get("nr_throttled", 0),
        throttled_ns=stat.get("throttled_usec", 0) * NS_PER_US,
        nr_bursts=bursts,
        burst_ns=None if burst is None else burst * NS_PER_US,
        quota_us=quota_us,
        period_us=period_us,
    )


def read_v1_cpu_stat(
    cpu_dir: Path | None, cpuacct_dir: Path | None, clock_ticks: int | None = None
) -> CgroupCpuStat | None:
    """One v1 cgroup from its cpu and cpuacct directories (the same one when co-mounted).

    None when it vanished or there is no cpuacct directory (usage lives only there).
    `clock_ticks` is USER_HZ, os.sysconf('SC_CLK_TCK') by default.
    """
    if cpuacct_dir is None:
        return None
    usage_text = _read(CPUACCT_USAGE, cpuacct_dir, 1)
    usage = None if usage_text is None else CPUACCT_USAGE.parse_or_none(1, usage_text)
    acct = _read_counters(CPUACCT_STAT, cpuacct_dir, 1)
    if usage is None or acct is None:
        return None
    ticks = clock_ticks or os.sysconf("SC_CLK_TCK")
    user, system = acct.get("user"), acct.get("system")
    stat: dict[str, int] = {}
    quota_us: int | None = None
    period_us: int | None = None
    if cpu_dir is not None:
        cpu_stat = _read_counters(CPU_STAT, cpu_dir, 1)
        limits = _v1_limits(_read(CPU_MAX, cpu_dir, 1, 0), _read(CPU_MAX, cpu_dir, 1, 1))  # quota, period
        if cpu_stat is None or limits is None:
            if not cpu_dir.is_dir():
                return None
            # The directory is there but the bandwidth files are not: CONFIG_CFS_BANDWIDTH=n.
        else:
            stat = cpu_stat
            quota_us, period_us = limits.quota_us, limits.period_us
    return _v1_stat(usage, user, system, ticks, stat, quota_us, period_us)


def _v1_stat(usage: int, user: int | None, system: int | None, ticks: int, stat: dict[str, int],
             quota_us: int | None, period_us: int | None) -> CgroupCpuStat:
    """v1 cpuacct numbers (user/system in USER_HZ ticks), cpu.stat and the limits as a CgroupCpuStat."""
    return CgroupCpuStat(
        cgroup_version=1,
        usage_ns=usage,
        user_ns=None if user is None else user * NS_PER_S // ticks,
        system_ns=None if system is None else system * NS_PER_S // ticks,
        nr_periods=stat.get("nr_periods", 0),
        nr_throttled=stat.get("nr_throttled", 0),
        throttled_ns=stat.get("throttled_time", 0),
        nr_bursts=stat.get("nr_bursts"),
        burst_ns=stat.get("burst_time"),
        quota_us=quota_us,
        period_us=period_us,
    )


@dataclass(frozen=True)
class CpuStatDirs:
    """Where one cgroup's CPU accounting files are."""

    cgroup_version: int
    cpu_dir: Path | None  # v1: cpu hierarchy (cpu.stat, quota); v2: the cgroup
    cpuacct_dir: Path | None  # v1 only


def locate_cpu_stat_dirs(layout: CgroupLayout, cgroup_path: str) -> CpuStatDirs | None:
    """The directories for a cgroup path relative to its hierarchy (`/kubepods.slice/...`).

    v1 needs both the cpu and cpuacct hierarchies; the path is the same in both on Kubernetes
    nodes. None when no hierarchy has the cpu or cpuacct controller.
    """
    cpu = layout.hierarchy_for("cpu")
    if cpu is not None and cpu.version == 2:
        return CpuStatDirs(2, cpu.path_of(cgroup_path), None)
    cpuacct = layout.v1.get("cpuacct")
    if cpu is None and cpuacct is None:
        return None
    return CpuStatDirs(
        1,
        cpu.path_of(cgroup_path) if cpu is not None else None,
        cpuacct.path_of(cgroup_path) if cpuacct is not None else None,
    )


def read_cgroup_cpu(layout: CgroupLayout, cgroup_path: str) -> CgroupCpuStat | None:
    """CPU accounting of one cgroup, v1 or v2; None when unavailable (testkit.cpu_reasons says why)."""
    dirs = locate_cpu_stat_dirs(layout, cgroup_path)
    if dirs is None:
        return None
    if dirs.cgroup_version == 2:
        return read_v2_cpu_stat(dirs.cpu_dir) if dirs.cpu_dir is not None else None
    return read_v1_cpu_stat(dirs.cpu_dir, dirs.cpuacct_dir)


# -- deltas -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuDelta:
    """Rates between two readings of one cgroup. All None with reset=True when counters went
    backwards (cgroup recreated under the same path)."""

    elapsed_s: float
    usage_cores: float | None  # CPUs used on average (1.5 = one and a half CPUs)
    user_cores: float | None
    system_cores: float | None
    throttled_fraction: float | None  # throttled periods / elapsed periods; None if no period ran
    throttled_s_per_s: float | None  # throttled time per wall second (summed over CPUs)
    quota_cores: float | None  # the quota in effect at the later reading
    reset: bool = False

    @property
    def quota_utilisation(self) -> float | None:
        """usage / quota: near 1.0 means the cgroup runs at its own limit."""
        if self.usage_cores is None or not self.quota_cores:
            return None
        return self.usage_cores / self.quota_cores


def cpu_delta(prev: CgroupCpuStat, cur: CgroupCpuStat, elapsed_s: float) -> CpuDelta:
    """Rates over `elapsed_s` seconds of monotonic time between the two readings."""
    if elapsed_s <= 0:
        raise ValueError(f"elapsed time must be positive, got {elapsed_s}")
    counters = ("usage_ns", "nr_periods", "nr_throttled", "throttled_ns")
    went_back = any(getattr(cur, c) < getattr(prev, c) for c in counters)
    if went_back or prev.cgroup_version != cur.cgroup_version:
        return CpuDelta(elapsed_s, None, None, None, None, None, cur.quota_cores, reset=True)
    elapsed_ns = elapsed_s * NS_PER_S
    periods = cur.nr_periods - prev.nr_periods
    return CpuDelta(
        elapsed_s=elapsed_s,
        usage_cores=(cur.usage_ns - prev.usage_ns) / elapsed_ns,
        user_cores=_optional_rate(prev.user_ns, cur.user_ns, elapsed_ns),
        system_cores=_optional_rate(prev.system_ns, cur.system_ns, elapsed_ns),
        throttled_fraction=(cur.nr_throttled - prev.nr_throttled) / periods if periods > 0 else None,
        throttled_s_per_s=(cur.throttled_ns - prev.throttled_ns) / elapsed_ns,
        quota_cores=cur.quota_cores,
    )


def _optional_rate(before: int | None, after: int | None, elapsed_ns: float) -> float | None:
    # The user/system split is tick-sampled (v1) or rescaled (v2) and is not a reset signal.
    if before is None or after is None or after < before:
        return None
    return (after - before) / elapsed_ns


# -- the per-tick reader ------------------------------------------------------------------------


class CgroupCpuReader:
    """One cgroup's CPU accounting, read often and cheaply: directories resolved once, and the limit
    files (quota, period) only when asked (``limits=True``: first read, wheel turns, now and then
    while it runs), since only an actuator or a resize changes them. ``cpu.stat`` (v1) is read only
    while a quota is set: without one nothing is throttled and its counters stand still. The v1
    user/system split (``cpuacct.stat``) is read with the limits: between two such reads it is that
    read's (usage itself, ``cpuacct.usage``, is read every time).
    Same results as :func:`read_cgroup_cpu` with fresh limits."""

    def __init__(self, layout: CgroupLayout, cgroup_path: str, clock_ticks: int | None = None) -> None:
        dirs = locate_cpu_stat_dirs(layout, cgroup_path)
        self.version = dirs.cgroup_version if dirs is not None else 0
        self.ticks = clock_ticks or os.sysconf("SC_CLK_TCK")
        cpu = str(dirs.cpu_dir) if dirs is not None and dirs.cpu_dir is not None else None
        acct = str(dirs.cpuacct_dir) if dirs is not None and dirs.cpuacct_dir is not None else None
        self.cpu_dir = cpu
        # Only the directories are kept (the file paths are made when read): six full paths kept per
        # watched cgroup were ~1 KiB each of the agent's memory at node scale.
        # Where cpu and cpuacct are mounted together (cpu,cpuacct) both are one directory: one string.
        self.acct_dir = (cpu if acct == cpu else acct) or None
        self.quota_us: int | None = None
        self.period_us: int | None = None
        self.bandwidth = False  # v1: the cpu controller has CFS bandwidth files
        self._limits_read = False
        self._acct: dict[str, int] | None = None  # v1 cpuacct.stat as of the last read of the limits

    @property
    def usage_file(self) -> str | None:
        return f"{self.acct_dir}/cpuacct.usage" if self.acct_dir else None

    @property
    def acct_file(self) -> str | None:
        return f"{self.acct_dir}/cpuacct.stat" if self.acct_dir else None

    @property
    def stat_file(self) -> str | None:
        return f"{self.cpu_dir}/cpu.stat" if self.cpu_dir else None

    @property
    def quota_file(self) -> str | None:
        return f"{self.cpu_dir}/{CPU_MAX.v1_names[0]}" if self.cpu_dir and self.version == 1 else None

    @property
    def period_file(self) -> str | None:
        return f"{self.cpu_dir}/{CPU_MAX.v1_names[1]}" if self.cpu_dir and self.version == 1 else None

    @property
    def max_file(self) -> str | None:
        return f"{self.cpu_dir}/{CPU_MAX.v2_name}" if self.cpu_dir and self.version == 2 else None

    def files(self) -> list[str]:
        """Every file it may read (to close them where they are kept open)."""
        return [f for f in (self.usage_file, self.acct_file, self.stat_file, self.quota_file, self.period_file,
                            self.max_file) if f is not None]

    def read(self, limits: bool = False, read_small: ReadText = read_small,
             read_usage: ReadText | None = None) -> CgroupCpuStat | None:
        """``read_small``: how to read one file (HotFiles.read keeps hot ones open); ``read_usage``: how to
        read its usage file (``cpuacct.usage`` on v1, ``cpu.stat`` on v2), where the caller notes it."""
        usage = read_usage or read_small
        if self.version == 2:
            return self._read_v2(limits or not self._limits_read, read_small, usage)
        if self.version == 1:
            return self._read_v1(limits or not self._limits_read, read_small, usage)
        return None

    def _read_v1(self, limits: bool, read_small: ReadText, read_usage: ReadText) -> CgroupCpuStat | None:
        if self.usage_file is None or self.acct_file is None:
            return None
        usage_text = read_usage(self.usage_file)
        usage = None if usage_text is None else CPUACCT_USAGE.parse_or_none(1, usage_text)
        if usage is None:
            return None
        # The user/system split (cpuacct.stat) is read with the limits, not every tick: nothing per tick
        # needs it, and it was one of the two files read for every active cgroup.
        if limits or self._acct is None:
            acct_text = read_small(self.acct_file)
            if acct_text is None:
                return None
            self._acct = parse_flat_keyed(acct_text)
        acct = self._acct
        if limits and self.quota_file is not None and self.period_file is not None:
            limits_v1 = _v1_limits(read_small(self.quota_file), read_small(self.period_file))
            if limits_v1 is None:
                if self.cpu_dir is not None and not os.path.isdir(self.cpu_dir):
                    return None  # vanished
                self.bandwidth, self.quota_us, self.period_us = False, None, None  # CONFIG_CFS_BANDWIDTH=n
            else:
                self.bandwidth, self.quota_us, self.period_us = True, limits_v1.quota_us, limits_v1.period_us
            self._limits_read = True
        stat: dict[str, int] = {}
        if self.bandwidth and self.quota_us is not None and self.stat_file is not None:
            stat_text = read_small(self.stat_file)
            if stat_text is None:
                return None  # vanished since the limits were read
            stat = parse_flat_keyed(stat_text)
        return _v1_stat(usage, acct.get("user"), acct.get("system"), self.ticks, stat, self.quota_us, self.period_us)

    def _read_v2(self, limits: bool, read_small: ReadText, read_usage: ReadText) -> CgroupCpuStat | None:
        if self.stat_file is None:
            return None
        text = read_usage(self.stat_file)
        stat = None if text is None else parse_flat_keyed(text)
        if stat is None or "usage_usec" not in stat:
            return None
        if limits and self.max_file is not None:
            cpu_max = read_small(self.max_file)
            if cpu_max is not None:
                parsed = CPU_MAX.parse_or_none(2, cpu_max)
                if parsed is None:
                    return None  # guessing "unlimited" would hide a throttled cgroup
                self.quota_us, self.period_us = parsed.quota_us, parsed.period_us
            elif self.cpu_dir is not None and not os.path.isdir(self.cpu_dir):
                return None  # vanished between the two reads
            else:
                self.quota_us = self.period_us = None  # the root: no cpu.max
            self._limits_read = True
        return _v2_stat(stat, self.quota_us, self.period_us)
