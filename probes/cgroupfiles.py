# SPDX-License-Identifier: Apache-2.0
"""Every kernel file the runtime reads or writes, declared once: cgroup files with their controller and
their v1 and v2 names, /proc and /sys files with their path, and the one parser of each.

Cgroup files (:class:`CgroupFile`; ``-``: the version has none)

======================== ========== ============================================ =========================
declaration              controller v1 file(s)                                   v2 file
======================== ========== ============================================ =========================
CPU_MAX                  cpu        ``cpu.cfs_quota_us`` + ``cpu.cfs_period_us`` ``cpu.max``
CPU_BURST                cpu        ``cpu.cfs_burst_us``                         ``cpu.max.burst``
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
PROC_STAT, PROC_VMSTAT, PROC_ZONEINFO, PROC_PRESSURE, PID_CGROUP, PID_STAT, PID_STATUS,
PID_NET_DEV, PID_NET_SNMP, PID_NET_NETSTAT, PID_NET_FIB_TRIE, PID_NET_IF_INET6, PID_NS_NET, PID_MAX,
PROC_SELF_FDINFO, SYS_CPU_ONLINE, SYS_CPU_POSSIBLE, SYS_CPU_THREAD_SIBLINGS, SYS_NODE_CPULIST, PROC_CPUINFO,
PROC_MOUNTS.

Every read goes through a declaration: ``KernelFile.read(paths, pid=42)`` / ``read_or_none``, and
``CgroupFile.read(cgroup_dir, version)`` / ``read_or_none`` (``path`` and ``paths`` where a caller keeps the
file open itself, as the per-tick readers and the PSI triggers do). The actuators write through
``actuators.cgroupfile.CgroupFiles``, which finds a declaration's file in its hierarchy.

A parser declared here raises :class:`CgroupFileParseError` (one line, the bad text quoted) on anything
the kernel would not have written, or skips what it cannot read where the file is a list of counters
(``parse_flat_keyed``). Who reads decides what bad input means: a probe reader must not fail a tick,
so it catches the error and skips the value (:meth:`CgroupFile.parse_or_none`); an actuator must not plan
from a guess, so the error surfaces (``actuators.cgroupfile`` prefixes the file's path). Both sides give
the same message for the same text because there is one parser. Every parser is a function of this
module: it imports no probe and no actuator (the probes build their records from what it returns).

``probes/`` never imports ``actuators/``; the actuators import this module.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")

MAX_CPUS = 8192  # the kernel's largest NR_CPUS: a list naming CPUs past it is not the kernel's

# Errors that mean "the file or the object behind it went away while we looked": a cgroup removed
# mid-read gives ENOENT or ENODEV, a task that exited gives ESRCH.
VANISHED_ERRNOS = frozenset({errno.ENOENT, errno.ENODEV, errno.ESRCH, errno.ENOTDIR})


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


Parser = Callable[..., Any]


def _read_text(path: str | os.PathLike[str]) -> str:
    """A pseudo-file whole, by one open and few reads (no text wrapper: some are read every tick).
    OSError as the kernel gave it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:  # kernfs hands a file out whole when the buffer is larger
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)


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
        return self.parse_v1(*texts) if version == 1 else self.parse_v2(*texts)

    def path(self, cgroup_dir: str | os.PathLike[str], version: int) -> Path:
        """The (first) file of the cgroup at ``cgroup_dir`` in a hierarchy of ``version``."""
        return Path(cgroup_dir, self.name(version))

    def paths(self, cgroup_dir: str | os.PathLike[str], version: int) -> tuple[Path, ...]:
        """Every file the value is read from (v1 CFS bandwidth: quota, then period)."""
        return tuple(Path(cgroup_dir, n) for n in self.names(version))

    def raw(self, cgroup_dir: str | os.PathLike[str], version: int, part: int = 0) -> str | None:
        """The raw text of the file (``part``: which of the v1 names), for a reader that parses several
        files together; None when the cgroup or the file is gone, other OSErrors raised."""
        try:
            return _read_text(os.path.join(cgroup_dir, self.names(version)[part]))
        except OSError as e:
            if e.errno in VANISHED_ERRNOS:
                return None
            raise

    def read(self, cgroup_dir: str | os.PathLike[str], version: int) -> T:
        """The value of the cgroup at ``cgroup_dir``; OSError when a file cannot be read (KeyError when the
        version has no such file), CgroupFileParseError when it is malformed."""
        names = self.names(version)
        if not names:
            raise KeyError(f"{self.v2_name or self.v1_names} has no cgroup v{version} file")
        return self.parse(version, *(_read_text(os.path.join(cgroup_dir, n)) for n in names))

    def read_or_none(self, cgroup_dir: str | os.PathLike[str], version: int) -> T | None:
        """A probe reader's view: None when the cgroup vanished or the text is malformed."""
        try:
            return self.read(cgroup_dir, version)
        except OSError as e:
            if e.errno in VANISHED_ERRNOS:
                return None
            raise
        except CgroupFileParseError:
            return None

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
    parse: Parser | None  # None: a file opened for its descriptor, never read (PID_NS_NET)

    def at(self, paths: Any, **fields: object) -> Path:
        """The file under ``paths`` (a HostPaths): ``PID_STAT.at(paths, pid=42)``."""
        return Path(self.under(getattr(paths, self.root), **fields))

    def under(self, root_dir: str | os.PathLike[str], **fields: object) -> str:
        """The file as text under its root directory (``paths.proc`` for a /proc file): :meth:`at` without the
        HostPaths and Path objects, for hot paths (a listen-queue read stats each pod's task's network
        namespace: 1,000 a read at 1,000 pods)."""
        return os.path.join(root_dir, self.path.format(**fields))

    def parse_text(self, text: str) -> T:
        if self.parse is None:
            raise TypeError(f"{self.path} is opened, not read")
        return self.parse(text)

    def read(self, paths: Any, **fields: object) -> T:
        """The parsed file under ``paths``; OSError when unreadable, CgroupFileParseError when malformed."""
        return self.parse_text(_read_text(self.under(getattr(paths, self.root), **fields)))

    def read_or_none(self, paths: Any, **fields: object) -> T | None:
        """None when the file (or the task behind it) is gone; other errors as :meth:`read` raises them."""
        try:
            return self.read(paths, **fields)
        except OSError as e:
            if e.errno in VANISHED_ERRNOS:
                return None
            raise


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
    """One integer (cpu.max.burst, memory.current, cpuacct.usage)."""
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
    comm: str = ""  # the command, between the first "(" and the last ")"


def parse_pid_stat(text: str) -> TaskStat:
    """/proc/<pid>/stat: the fields after the command (which may hold spaces and parentheses)."""
    fields = text.rpartition(")")[2].split()
    # fields[0] is field 3 (state): utime 14, stime 15, policy 41
    try:
        return TaskStat(int(fields[38]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
                        text[text.find("(") + 1:text.rfind(")")])
    except (IndexError, ValueError):
        raise CgroupFileParseError(f"not a task's stat line ({_quoted(text)})") from None


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """What /proc/<pid>/status says of a task's CPUs and capabilities."""

    cpus_allowed: tuple[int, ...]  # Cpus_allowed_list, through the cpu-list guard; () when absent
    cap_eff: int | None  # CapEff bits; None when absent or not hex


def parse_task_status(text: str) -> TaskStatus:
    """/proc/<pid>/status: Cpus_allowed_list and CapEff."""
    cpus: tuple[int, ...] = ()
    cap_eff: int | None = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Cpus_allowed_list":
            cpus = parse_cpu_list(value)
        elif key == "CapEff":
            with contextlib.suppress(ValueError):
                cap_eff = int(value.strip(), 16)
    return TaskStatus(cpus, cap_eff)


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


@dataclass(frozen=True)
class PsiLine:
    """One "some" or "full" line of a pressure file."""

    avg10: float  # percent of wall time stalled, averaged over 10 s
    avg60: float
    avg300: float
    total_us: int  # cumulative stall time since the group was created


def parse_pressure(text: str) -> dict[str, PsiLine]:
    """The "some"/"full" lines of a pressure file; unparsable or incomplete lines are skipped."""
    lines: dict[str, PsiLine] = {}
    for raw in text.splitlines():
        fields = raw.split()
        if not fields or fields[0] not in ("some", "full") or fields[0] in lines:
            continue
        values = dict(f.split("=", 1) for f in fields[1:] if "=" in f)
        try:
            line = PsiLine(
                avg10=float(values["avg10"]),
                avg60=float(values["avg60"]),
                avg300=float(values["avg300"]),
                total_us=int(values["total"]),
            )
        except (KeyError, ValueError):
            continue
        averages = (line.avg10, line.avg60, line.avg300)
        if line.total_us < 0 or not all(math.isfinite(a) and a >= 0 for a in averages):
            continue
        lines[fields[0]] = line
    return lines


def parse_zoneinfo_watermarks(text: str) -> dict[str, int]:
    """{min, low, high, managed, present}: pages summed over every zone of every node in /proc/zoneinfo."""
    sums = {"min": 0, "low": 0, "high": 0, "managed": 0, "present": 0}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] in sums and fields[1].isdigit():
            sums[fields[0]] += int(fields[1])
    return sums


def parse_proc_pairs(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/snmp and netstat: pairs of lines `Prefix: names...` / `Prefix: values...`."""
    out: dict[str, dict[str, int]] = {}
    lines = text.splitlines()
    for header, values in zip(lines[::2], lines[1::2], strict=False):
        prefix, _, names = header.partition(":")
        vprefix, _, nums = values.partition(":")
        if prefix != vprefix:
            continue
        with contextlib.suppress(ValueError):
            out[prefix] = dict(zip(names.split(), (int(v) for v in nums.split()), strict=False))
    return out


def parse_fib_trie_local(text: str) -> frozenset[str]:
    """The IPv4 addresses of a net/fib_trie's `/32 host LOCAL` entries: the namespace's own addresses."""
    out: set[str] = set()
    last = ""
    for line in text.splitlines():
        entry = line.strip()
        if entry.startswith("|-- "):
            last = entry[4:]
        elif entry.startswith("/32 host LOCAL") and last:
            out.add(last)
    return frozenset(out)


def parse_if_inet6(text: str) -> frozenset[str]:
    """The IPv6 addresses of net/if_inet6 (first column, 32 hex digits); other lines skipped."""
    out: set[str] = set()
    for line in text.splitlines():
        raw = line.split()[0] if line.split() else ""
        if len(raw) == 32:
            with contextlib.suppress(ValueError):
                out.add(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(raw)))
    return frozenset(out)


def parse_fdinfo(text: str) -> dict[str, int]:
    """`key: value` lines of /proc/<pid>/fdinfo/<fd> whose value is a number (a BPF program's run_cnt,
    run_time_ns, recursion_misses); the others are skipped."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            fields[key.strip()] = int(value)
    return fields


class Mount(NamedTuple):
    source: str
    target: str
    fstype: str


def parse_mounts(text: str) -> tuple[Mount, ...]:
    """/proc/mounts: (source, mount point, filesystem type) of each line; short lines skipped."""
    return tuple(Mount(*f[:3]) for f in (line.split() for line in text.splitlines()) if len(f) > 2)


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """The first processor block of /proc/cpuinfo: what every CPU of the node shares."""

    vendor_id: str  # "GenuineIntel", "AuthenticAMD", ...; "" when the file has none
    flags: frozenset[str]


def parse_cpuinfo(text: str) -> CpuInfo:
    """Vendor and flags from the first processor block of /proc/cpuinfo."""
    vendor_id = ""
    flags: frozenset[str] = frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "vendor_id" and not vendor_id:
            vendor_id = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        if vendor_id and flags:
            break
    return CpuInfo(vendor_id, flags)


def parse_pid_cgroup(text: str) -> dict[str, str]:
    """/proc/<pid>/cgroup: the cgroup path per controller (`cpu`, `memory`, ...) and `""` for v2's `0::`
    line. Named v1 hierarchies (`name=systemd`) are left out; a line without two colons is refused."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        hier_id, sep, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep and sep2):
            raise CgroupFileParseError(f"not a /proc/<pid>/cgroup line ({_quoted(line)})")
        if hier_id == "0":
            result[""] = path
            continue
        for c in controllers.split(","):
            if not c.startswith("name="):
                result[c] = path
    return result


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
CPU_PRESSURE: CgroupFile[dict[str, PsiLine]] = CgroupFile("cpu", (), "cpu.pressure", parse_pressure, parse_pressure)
MEMORY_PRESSURE: CgroupFile[dict[str, PsiLine]] = CgroupFile("memory", (), "memory.pressure", parse_pressure,
                                                             parse_pressure)
IO_PRESSURE: CgroupFile[dict[str, PsiLine]] = CgroupFile("io", (), "io.pressure", parse_pressure, parse_pressure)
IRQ_PRESSURE: CgroupFile[dict[str, PsiLine]] = CgroupFile("", (), "irq.pressure", parse_pressure,
                                                          parse_pressure)  # CONFIG_IRQ_TIME_ACCOUNTING only
PRESSURE: dict[str, CgroupFile[dict[str, PsiLine]]] = {"cpu": CPU_PRESSURE, "memory": MEMORY_PRESSURE, "io": IO_PRESSURE,
                                        "irq": IRQ_PRESSURE}
CGROUP_PRESSURE: CgroupFile[int] = CgroupFile("", (), "cgroup.pressure", parse_int, parse_int)  # "0": PSI off here
CGROUP_CONTROLLERS: CgroupFile[frozenset[str]] = CgroupFile("", (), "cgroup.controllers", parse_words, parse_words)
CGROUP_PROCS: CgroupFile[tuple[int, ...]] = CgroupFile("cpu", ("cgroup.procs",), "cgroup.procs", parse_pids,
                                                       parse_pids)
CGROUP_THREADS: CgroupFile[tuple[int, ...]] = CgroupFile("cpu", ("tasks",), "cgroup.threads", parse_pids, parse_pids)

# -- /proc and /sys -----------------------------------------------------------------------------

PROC_STAT: KernelFile[tuple[CpuTimes | None, dict[int, CpuTimes]]] = KernelFile("proc", "stat", parse_proc_stat)
PROC_VMSTAT: KernelFile[dict[str, int]] = KernelFile("proc", "vmstat", parse_flat_keyed)
PROC_ZONEINFO: KernelFile[dict[str, int]] = KernelFile("proc", "zoneinfo", parse_zoneinfo_watermarks)
PROC_PRESSURE: KernelFile[dict[str, PsiLine]] = KernelFile("proc", "pressure/{resource}", parse_pressure)
PID_CGROUP: KernelFile[dict[str, str]] = KernelFile("proc", "{pid}/cgroup", parse_pid_cgroup)
PID_STAT: KernelFile[TaskStat] = KernelFile("proc", "{pid}/stat", parse_pid_stat)
PID_STATUS: KernelFile[TaskStatus] = KernelFile("proc", "{pid}/status", parse_task_status)
PID_NET_DEV: KernelFile[int] = KernelFile("proc", "{pid}/net/dev", parse_netdev_packets)
PID_NET_SNMP: KernelFile[dict[str, dict[str, int]]] = KernelFile("proc", "{pid}/net/snmp", parse_proc_pairs)
PID_NET_NETSTAT: KernelFile[dict[str, dict[str, int]]] = KernelFile("proc", "{pid}/net/netstat", parse_proc_pairs)
PID_NET_FIB_TRIE: KernelFile[frozenset[str]] = KernelFile("proc", "{pid}/net/fib_trie", parse_fib_trie_local)
PID_NET_IF_INET6: KernelFile[frozenset[str]] = KernelFile("proc", "{pid}/net/if_inet6", parse_if_inet6)
# A task's network namespace ("thread-self": the calling thread's): opened for setns(), never read.
PID_NS_NET: KernelFile[None] = KernelFile("proc", "{pid}/ns/net", None)
PID_MAX: KernelFile[int] = KernelFile("proc", "sys/kernel/pid_max", parse_int)
# A BPF program's run count and time (kernel.bpf_stats_enabled), read every tick.
PROC_SELF_FDINFO: KernelFile[dict[str, int]] = KernelFile("proc", "self/fdinfo/{fd}", parse_fdinfo)
PROC_CPUINFO: KernelFile[CpuInfo] = KernelFile("proc", "cpuinfo", parse_cpuinfo)
PROC_MOUNTS: KernelFile[tuple[Mount, ...]] = KernelFile("proc", "mounts", parse_mounts)
SYS_CPU_POSSIBLE: KernelFile[tuple[int, ...]] = KernelFile("sys", "devices/system/cpu/possible", parse_cpu_list)
SYS_CPU_ONLINE: KernelFile[tuple[int, ...]] = KernelFile("sys", "devices/system/cpu/online", parse_cpu_list)
SYS_CPU_THREAD_SIBLINGS: KernelFile[tuple[int, ...]] = KernelFile(
    "sys", "devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", parse_cpu_list)
SYS_NODE_CPULIST: KernelFile[tuple[int, ...]] = KernelFile("sys", "devices/system/node/node{node}/cpulist",
                                                           parse_cpu_list)

CGROUP_FILES: dict[str, CgroupFile[Any]] = {k: v for k, v in globals().items() if isinstance(v, CgroupFile)}
KERNEL_FILES: dict[str, KernelFile[Any]] = {k: v for k, v in globals().items() if isinstance(v, KernelFile)}
