# SPDX-License-Identifier: Apache-2.0
"""Every kernel file the runtime reads or writes, declared once: cgroup files with their controller and
their v1 and v2 names, /proc and /sys files with their path, and the one parser of each.

Cgroup files (:class:`CgroupFile`; ``-``: the version has none)

======================== ========== ============================================ =========================
declaration              controller v1 file(s)                                   v2 file
======================== ========== ============================================ =========================
CPU_MAX                  cpu        ``cpu.cfs_quota_us`` + ``cpu.cfs_period_us`` ``cpu.max``
CPU_BURST                cpu        ``cpu.cfs_burst_us``                         ``cpu.max.burst``
CPU_WEIGHT               cpu        ``cpu.shares``                               ``cpu.weight``
CPU_STAT                 cpu        ``cpu.stat``                                 ``cpu.stat``
CPUACCT_USAGE            cpuacct    ``cpuacct.usage``                            -
CPUACCT_USAGE_PERCPU     cpuacct    ``cpuacct.usage_percpu``                     -
CPUACCT_STAT             cpuacct    ``cpuacct.stat``                             -
CPUSET_CPUS              cpuset     ``cpuset.cpus``                              ``cpuset.cpus``
CPUSET_EFFECTIVE_CPUS    cpuset     ``cpuset.effective_cpus``                    ``cpuset.cpus.effective``
CPUSET_MEMS              cpuset     ``cpuset.mems``                              ``cpuset.mems``
MEMORY_STAT              memory     ``memory.stat``                              ``memory.stat``
MEMORY_USAGE             memory     ``memory.usage_in_bytes``                    ``memory.current``
MEMORY_MAX               memory     ``memory.limit_in_bytes``                    ``memory.max``
MEMORY_HIGH              memory     ``memory.limit_in_bytes`` (v1 has no high)   ``memory.high``
MEMORY_EVENTS            memory     ``memory.oom_control``                       ``memory.events``
MEMORY_FAILCNT           memory     ``memory.failcnt``                           -
CPU_PRESSURE ...         (v2)       -                                            ``cpu|memory|io|irq.pressure``
CGROUP_PRESSURE          (v2)       -                                            ``cgroup.pressure``
CGROUP_CONTROLLERS       (v2)       -                                            ``cgroup.controllers``
CGROUP_PROCS             cpu        ``cgroup.procs``                             ``cgroup.procs``
CGROUP_THREADS           cpu        ``tasks``                                    ``cgroup.threads``
======================== ========== ============================================ =========================

/proc and /sys files (:class:`KernelFile`, paths under ``HostPaths.proc`` / ``HostPaths.sys``):
PROC_STAT, PROC_VMSTAT, PROC_ZONEINFO, PROC_SOFTIRQS, PROC_PRESSURE, PID_CGROUP, PID_STAT, PID_STATUS,
PID_NET_DEV, PID_NET_SNMP, PID_NET_NETSTAT, PID_NET_FIB_TRIE, PID_NET_IF_INET6, PID_MAX, PROC_SELF_FDINFO,
SYS_CPU_ONLINE,
SYS_CPU_THREAD_SIBLINGS, SYS_NODE_CPULIST, PROC_CPUINFO, PROC_MOUNTS.

A parser declared here raises :class:`CgroupFileParseError` (one line, the bad text quoted) on anything
the kernel would not have written, or skips what it cannot read where the file is a list of counters
(``parse_flat_keyed``). Who reads decides what bad input means: a probe reader must not fail a tick,
so it catches the error and skips the value (:meth:`CgroupFile.parse_or_none`); an actuator must not plan
from a guess, so the error surfaces (``actuators.cgroupfile`` prefixes the file's path). Both sides give
the same message for the same text because there is one parser. A parser that builds a probe's own
record lives with that probe and is named here by its dotted path (``"probes.psi:parse_pressure"``),
resolved when used, so this module imports no probe.

``probes/`` never imports ``actuators/``; the actuators import this module.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")

MAX_CPUS = 8192  # the kernel's largest NR_CPUS: a list naming CPUs past it is not the kernel's


class CgroupFileParseError(ValueError):
    """A cgroup file's text is not what the kernel writes there; ``str(exc)`` is one line."""


def _quoted(text: str) -> str:
    return repr(" ".join(text.split())[:40])


@dataclass(frozen=True, slots=True)
class CpuMax:
    """CFS bandwidth of one cgroup: ``quota_us`` None means unlimited."""

    quota_us: int | None
    period_us: int

    @property
    def cores(self) -> float | None:
        return None if self.quota_us is None else self.quota_us / self.period_us


Parser = Callable[..., Any] | str  # a function, or "module:function" resolved when first used


def _resolve(parser: Parser) -> Callable[..., Any]:
    if callable(parser):
        return parser
    module, _, name = parser.partition(":")
    found: Any = importlib.import_module(module)
    for part in name.split("."):  # "module:Class.method" for a reader that is a method
        found = getattr(found, part)
    return found


@dataclass(frozen=True, slots=True)
class CgroupFile(Generic[T]):
    """One logical cgroup file: where it lives in each cgroup version and how its text parses.

    ``parse_v1`` takes one text per name in ``v1_names`` (CFS bandwidth is two files in v1). A version
    without the file has no names (``v1_names=()`` or ``v2_name=None``)."""

    controller: str
    v1_names: tuple[str, ...]
    v2_name: str | None
    parse_v1: Parser
    parse_v2: Parser

    def names(self, version: int) -> tuple[str, ...]:
        if version == 1:
            return self.v1_names
        return () if self.v2_name is None else (self.v2_name,)

    def name(self, version: int) -> str:
        """The (first) file name in ``version``; KeyError when that version has none."""
        names = self.names(version)
        if not names:
            raise KeyError(f"{self.v2_name or self.v1_names} has no cgroup v{version} file")
        return names[0]

    def parse(self, version: int, *texts: str) -> T:
        """The value from the texts of :meth:`names` (in that order); CgroupFileParseError if malformed."""
        return _resolve(self.parse_v1)(*texts) if version == 1 else _resolve(self.parse_v2)(*texts)

    def parse_or_none(self, version: int, *texts: str) -> T | None:
        """A reader's view: the value, or None when the text is malformed (it skips the value)."""
        try:
            return self.parse(version, *texts)
        except CgroupFileParseError:
            return None


@dataclass(frozen=True, slots=True)
class KernelFile(Generic[T]):
    """A /proc or /sys file: its path under the host's /proc or /sys (``{pid}``, ``{cpu}``... filled by
    :meth:`at`), and its one parser."""

    root: str  # "proc" | "sys": the HostPaths attribute it lives under
    path: str
    parse: Parser | None  # None: parsed line by line inside its one reader (``reader``)
    reader: str = ""  # "module:function" that reads it, where the parse is not a function of its own

    def at(self, paths: Any, **fields: object) -> Path:
        """The file under ``paths`` (a HostPaths): ``PID_STAT.at(paths, pid=42)``."""
        return Path(getattr(paths, self.root)) / self.path.format(**fields)

    def parse_text(self, text: str) -> T:
        if self.parse is None:
            raise TypeError(f"{self.path} is parsed by {self.reader}")
        return _resolve(self.parse)(text)


# -- parsers ------------------------------------------------------------------------------------


def parse_cpu_max(text: str) -> CpuMax:
    """v2 ``cpu.max``: "max 100000" or "50000 100000"."""
    fields = text.split()
    try:
        if len(fields) != 2:
            raise ValueError
        period = int(fields[1])
        quota = None if fields[0] == "max" else int(fields[0])
    except ValueError:
        raise CgroupFileParseError(f"malformed, expected 'max PERIOD' or 'QUOTA PERIOD' ({_quoted(text)})") from None
    if period <= 0 or (quota is not None and quota <= 0):
        raise CgroupFileParseError(f"quota and period must be positive ({_quoted(text)})")
    return CpuMax(quota, period)


def parse_cfs_quota_period(quota_text: str, period_text: str) -> CpuMax:
    """v1 ``cpu.cfs_quota_us`` (-1 = unlimited) and ``cpu.cfs_period_us``."""
    try:
        quota = int(quota_text.strip())
    except ValueError:
        raise CgroupFileParseError(f"cfs quota is not an integer ({_quoted(quota_text)})") from None
    try:
        period = int(period_text.strip())
    except ValueError:
        raise CgroupFileParseError(f"cfs period is not an integer ({_quoted(period_text)})") from None
    if period <= 0:
        raise CgroupFileParseError(f"cfs period must be positive ({_quoted(period_text)})")
    return CpuMax(None if quota < 0 else quota, period)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """Kernel cpu list ("0-3,8,10-11", may be empty) -> sorted tuple of distinct CPUs.

    CPUs past MAX_CPUS are refused: a garbage '0-100000000' would otherwise build a huge tuple."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise CgroupFileParseError(f"malformed cpu list part {part[:20]!r} ({_quoted(text)})") from None
        if first < 0 or last < first:
            raise CgroupFileParseError(f"bad cpu range {part[:20]!r} ({_quoted(text)})")
        if last >= MAX_CPUS:
            raise CgroupFileParseError(f"cpu {last} is past the kernel's limit of {MAX_CPUS} ({_quoted(text)})")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: tuple[int, ...] | list[int] | set[int] | frozenset[int]) -> str:
    """Sorted, ranges collapsed, the way the kernel prints it ("0-2,5")."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_int(text: str) -> int:
    """One integer (cpu.shares, memory.current, cpuacct.usage)."""
    try:
        return int(text.strip())
    except ValueError:
        raise CgroupFileParseError(f"not an integer ({_quoted(text)})") from None


def parse_limit(text: str) -> int | None:
    """A byte limit: v2 "max" (and v1's page-rounded LONG_MAX, which means the same) is None."""
    if text.strip() == "max":
        return None
    value = parse_int(text)
    return None if value >= V1_UNLIMITED_AT else value


# v1 prints PAGE_COUNTER_MAX * PAGE_SIZE (9223372036854771712 with 4 KiB pages) for "no limit".
V1_UNLIMITED_AT = 1 << 62


def parse_int_list(text: str) -> tuple[int, ...]:
    """Whitespace-separated integers (cpuacct.usage_percpu)."""
    try:
        return tuple(int(t) for t in text.split())
    except ValueError:
        raise CgroupFileParseError(f"not a list of integers ({_quoted(text)})") from None


def parse_pids(text: str) -> tuple[int, ...]:
    """cgroup.procs / cgroup.threads / tasks: one id per line."""
    try:
        return tuple(int(t) for t in text.split())
    except ValueError:
        raise CgroupFileParseError(f"not a list of task ids ({_quoted(text)})") from None


def parse_flat_keyed(text: str) -> dict[str, int]:
    """`key value` lines as ints (cpu.stat, cpuacct.stat, memory.stat, memory.events, oom_control,
    /proc/vmstat); malformed lines are skipped (one bad line must not hide the others)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 2:
            continue
        try:
            out[fields[0]] = int(fields[1])
        except ValueError:
            continue
    return out


def parse_words(text: str) -> frozenset[str]:
    """cgroup.controllers: space-separated names."""
    return frozenset(text.split())


USER_HZ = 100  # /proc/stat unit; fixed at 100 on every Linux ABI that matters here


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """One line of /proc/stat in ns (converted from USER_HZ ticks)."""

    user_ns: int
    nice_ns: int
    system_ns: int
    idle_ns: int
    iowait_ns: int
    irq_ns: int
    softirq_ns: int
    steal_ns: int

    @property
    def busy_ns(self) -> int:
        return self.user_ns + self.nice_ns + self.system_ns + self.irq_ns + self.softirq_ns + self.steal_ns

    @property
    def total_ns(self) -> int:
        return self.busy_ns + self.idle_ns + self.iowait_ns


def parse_proc_stat(text: str) -> tuple[CpuTimes | None, dict[int, CpuTimes]]:
    """(all CPUs, per CPU) from /proc/stat; malformed lines are skipped."""
    scale = 1_000_000_000 // USER_HZ
    total: CpuTimes | None = None
    per_cpu: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        parts = line.split()
        try:
            nums = [int(x) * scale for x in parts[1:9]]
        except ValueError:
            continue
        if len(nums) < 8:
            nums += [0] * (8 - len(nums))
        times = CpuTimes(*nums)
        if parts[0] == "cpu":
            total = times
        elif parts[0][3:].isascii() and parts[0][3:].isdigit():  # "cpu²".isdigit() too, but int() refuses it
            per_cpu[int(parts[0][3:])] = times
    return total, per_cpu


@dataclass(frozen=True, slots=True)
class TaskStat:
    """What /proc/<pid>/stat says of a task's scheduling: its policy and CPU time."""

    policy: int  # SCHED_OTHER 0, SCHED_FIFO 1, SCHED_RR 2, ...
    cpu_s: float  # utime + stime


def parse_pid_stat(text: str) -> TaskStat:
    """/proc/<pid>/stat: the fields after the command (which may hold spaces and parentheses)."""
    fields = text.rpartition(")")[2].split()
    # fields[0] is field 3 (state): utime 14, stime 15, policy 41
    try:
        return TaskStat(int(fields[38]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    except (IndexError, ValueError):
        raise CgroupFileParseError(f"not a task's stat line ({_quoted(text)})") from None


def parse_cpus_allowed(text: str) -> tuple[int, ...]:
    """/proc/<pid>/status: the CPUs the task may run on (Cpus_allowed_list), through the cpu-list guard."""
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.split(":", 1)[1])
    return ()


def parse_netdev_packets(text: str) -> int:
    """rx + tx packets of every interface but lo, from a /proc/<pid>/net/dev text."""
    total = 0
    for line in text.splitlines()[2:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        if name.strip() == "lo" or len(fields) < 10:
            continue
        try:
            total += int(fields[1]) + int(fields[9])
        except ValueError:
            continue
    return total


# -- declarations -------------------------------------------------------------------------------

CPU_MAX: CgroupFile[CpuMax] = CgroupFile(
    "cpu", ("cpu.cfs_quota_us", "cpu.cfs_period_us"), "cpu.max", parse_cfs_quota_period, parse_cpu_max
)
CPUSET_CPUS: CgroupFile[tuple[int, ...]] = CgroupFile(
    "cpuset", ("cpuset.cpus",), "cpuset.cpus", parse_cpu_list, parse_cpu_list
)
# What the cpuset really allows (the configured list intersected with the parent's): what the probes read.
CPUSET_EFFECTIVE_CPUS: CgroupFile[tuple[int, ...]] = CgroupFile(
    "cpuset", ("cpuset.effective_cpus",), "cpuset.cpus.effective", parse_cpu_list, parse_cpu_list
)
CPU_BURST: CgroupFile[int] = CgroupFile("cpu", ("cpu.cfs_burst_us",), "cpu.max.burst", parse_int, parse_int)
# v1 shares and v2 weight are different units: actuators.cgroupfile converts (kernel/sched/core.c).
CPU_WEIGHT: CgroupFile[int] = CgroupFile("cpu", ("cpu.shares",), "cpu.weight", parse_int, parse_int)
CPU_STAT: CgroupFile[dict[str, int]] = CgroupFile("cpu", ("cpu.stat",), "cpu.stat", parse_flat_keyed, parse_flat_keyed)
CPUACCT_USAGE: CgroupFile[int] = CgroupFile("cpuacct", ("cpuacct.usage",), None, parse_int, parse_int)
CPUACCT_USAGE_PERCPU: CgroupFile[tuple[int, ...]] = CgroupFile(
    "cpuacct", ("cpuacct.usage_percpu",), None, parse_int_list, parse_int_list)
CPUACCT_STAT: CgroupFile[dict[str, int]] = CgroupFile("cpuacct", ("cpuacct.stat",), None, parse_flat_keyed,
                                                      parse_flat_keyed)
CPUSET_MEMS: CgroupFile[tuple[int, ...]] = CgroupFile("cpuset", ("cpuset.mems",), "cpuset.mems", parse_cpu_list,
                                                      parse_cpu_list)
MEMORY_STAT: CgroupFile[dict[str, int]] = CgroupFile("memory", ("memory.stat",), "memory.stat", parse_flat_keyed,
                                                     parse_flat_keyed)
MEMORY_USAGE: CgroupFile[int] = CgroupFile("memory", ("memory.usage_in_bytes",), "memory.current", parse_int,
                                           parse_int)
MEMORY_MAX: CgroupFile[int | None] = CgroupFile("memory", ("memory.limit_in_bytes",), "memory.max", parse_limit,
                                                parse_limit)
# What a memory suppress lowers: v2's memory.high throttles and reclaims without an OOM kill; v1 has
# only the hard limit.
MEMORY_HIGH: CgroupFile[int | None] = CgroupFile("memory", ("memory.limit_in_bytes",), "memory.high", parse_limit,
                                                 parse_limit)
MEMORY_FAILCNT: CgroupFile[int] = CgroupFile("memory", ("memory.failcnt",), None, parse_int, parse_int)
MEMORY_EVENTS: CgroupFile[dict[str, int]] = CgroupFile("memory", ("memory.oom_control",), "memory.events",
                                                       parse_flat_keyed, parse_flat_keyed)
CPU_PRESSURE: CgroupFile[Any] = CgroupFile("cpu", (), "cpu.pressure", "probes.psi:parse_pressure",
                                           "probes.psi:parse_pressure")
MEMORY_PRESSURE: CgroupFile[Any] = CgroupFile("memory", (), "memory.pressure", "probes.psi:parse_pressure",
                                              "probes.psi:parse_pressure")
IO_PRESSURE: CgroupFile[Any] = CgroupFile("io", (), "io.pressure", "probes.psi:parse_pressure",
                                          "probes.psi:parse_pressure")
IRQ_PRESSURE: CgroupFile[Any] = CgroupFile("", (), "irq.pressure", "probes.psi:parse_pressure",
                                           "probes.psi:parse_pressure")  # CONFIG_IRQ_TIME_ACCOUNTING only
PRESSURE: dict[str, CgroupFile[Any]] = {"cpu": CPU_PRESSURE, "memory": MEMORY_PRESSURE, "io": IO_PRESSURE,
                                        "irq": IRQ_PRESSURE}
CGROUP_PRESSURE: CgroupFile[int] = CgroupFile("", (), "cgroup.pressure", parse_int, parse_int)  # "0": PSI off here
CGROUP_CONTROLLERS: CgroupFile[frozenset[str]] = CgroupFile("", (), "cgroup.controllers", parse_words, parse_words)
CGROUP_PROCS: CgroupFile[tuple[int, ...]] = CgroupFile("cpu", ("cgroup.procs",), "cgroup.procs", parse_pids,
                                                       parse_pids)
CGROUP_THREADS: CgroupFile[tuple[int, ...]] = CgroupFile("cpu", ("tasks",), "cgroup.threads", parse_pids, parse_pids)

# -- /proc and /sys -----------------------------------------------------------------------------

PROC_STAT: KernelFile[tuple[CpuTimes | None, dict[int, CpuTimes]]] = KernelFile("proc", "stat", parse_proc_stat)
PROC_VMSTAT: KernelFile[Any] = KernelFile("proc", "vmstat", "probes.memstat:parse_vmstat")
PROC_ZONEINFO: KernelFile[dict[str, int]] = KernelFile("proc", "zoneinfo", "probes.memstat:parse_zoneinfo_watermarks")
PROC_SOFTIRQS: KernelFile[Any] = KernelFile("proc", "softirqs", None, "probes.softirq:read_proc_softirqs")
PROC_PRESSURE: KernelFile[Any] = KernelFile("proc", "pressure/{resource}", "probes.psi:parse_pressure")
PID_CGROUP: KernelFile[Any] = KernelFile("proc", "{pid}/cgroup", None, "probes.cgroupfs:self_cgroups")
PID_STAT: KernelFile[TaskStat] = KernelFile("proc", "{pid}/stat", parse_pid_stat)
PID_STATUS: KernelFile[tuple[int, ...]] = KernelFile("proc", "{pid}/status", parse_cpus_allowed)
PID_NET_DEV: KernelFile[int] = KernelFile("proc", "{pid}/net/dev", parse_netdev_packets)
PID_NET_SNMP: KernelFile[Any] = KernelFile("proc", "{pid}/net/snmp", "probes.listenq:_parse_proc_pairs")
PID_NET_NETSTAT: KernelFile[Any] = KernelFile("proc", "{pid}/net/netstat", "probes.listenq:_parse_proc_pairs")
PID_NET_FIB_TRIE: KernelFile[Any] = KernelFile("proc", "{pid}/net/fib_trie", None, "probes.listenq:read_local_addrs")
PID_NET_IF_INET6: KernelFile[Any] = KernelFile("proc", "{pid}/net/if_inet6", None, "probes.listenq:read_local_addrs")
PID_MAX: KernelFile[int] = KernelFile("proc", "sys/kernel/pid_max", parse_int)
# A BPF program's run count and time (kernel.bpf_stats_enabled), read every tick without pathlib.
PROC_SELF_FDINFO: KernelFile[Any] = KernelFile("proc", "self/fdinfo/{fd}", None, "probes.libbpf:BpfObject.program_stats")
PROC_CPUINFO: KernelFile[Any] = KernelFile("proc", "cpuinfo", "actuators.resctrl.support:parse_cpuinfo")
PROC_MOUNTS: KernelFile[Any] = KernelFile("proc", "mounts", None, "actuators.resctrl.support:detect_support")
SYS_CPU_ONLINE: KernelFile[tuple[int, ...]] = KernelFile("sys", "devices/system/cpu/online", parse_cpu_list)
SYS_CPU_THREAD_SIBLINGS: KernelFile[tuple[int, ...]] = KernelFile(
    "sys", "devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", parse_cpu_list)
SYS_NODE_CPULIST: KernelFile[tuple[int, ...]] = KernelFile("sys", "devices/system/node/node{node}/cpulist",
                                                           parse_cpu_list)

CGROUP_FILES: dict[str, CgroupFile[Any]] = {k: v for k, v in globals().items() if isinstance(v, CgroupFile)}
KERNEL_FILES: dict[str, KernelFile[Any]] = {k: v for k, v in globals().items() if isinstance(v, KernelFile)}
