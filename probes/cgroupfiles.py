"""Cgroup files read by both the probes and the actuators, declared once: the controller, the v1 and
v2 spellings, and the one parser of each.

===================== ========== ============================================ =========================
declaration           controller v1 file(s)                                   v2 file
===================== ========== ============================================ =========================
CPU_MAX               cpu        ``cpu.cfs_quota_us`` + ``cpu.cfs_period_us`` ``cpu.max``
CPUSET_CPUS           cpuset     ``cpuset.cpus``                              ``cpuset.cpus``
CPUSET_EFFECTIVE_CPUS cpuset     ``cpuset.effective_cpus``                    ``cpuset.cpus.effective``
===================== ========== ============================================ =========================

A parser raises :class:`CgroupFileParseError` (one line, the bad text quoted) on anything the kernel
would not have written. Who reads decides what bad input means: a probe reader must not fail a tick,
so it catches the error and skips the value; an actuator must not plan from a guess, so the error
surfaces (``actuators.cgroupfile`` prefixes the file's path). Both sides give the same message for
the same text because there is one parser.

``probes/`` never imports ``actuators/``; the actuators import this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

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


@dataclass(frozen=True, slots=True)
class CgroupFile(Generic[T]):
    """One logical cgroup file: where it lives in each cgroup version and how its text parses.

    ``parse_v1`` takes one text per name in ``v1_names`` (CFS bandwidth is two files in v1)."""

    controller: str
    v1_names: tuple[str, ...]
    v2_name: str
    parse_v1: Callable[..., T]
    parse_v2: Callable[[str], T]

    def names(self, version: int) -> tuple[str, ...]:
        return self.v1_names if version == 1 else (self.v2_name,)

    def parse(self, version: int, *texts: str) -> T:
        """The value from the texts of :meth:`names` (in that order); CgroupFileParseError if malformed."""
        return self.parse_v1(*texts) if version == 1 else self.parse_v2(*texts)


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
