# SPDX-License-Identifier: Apache-2.0
"""Pressure stall information (PSI): node-wide and per-cgroup readings, rates, and kernel triggers.

File format (kernel/sched/psi.c, psi_show):

    some avg10=1.23 avg60=0.50 avg300=0.10 total=123456
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

avgN are the share of wall time stalled, in percent; `total` is the cumulative stall time in
microseconds. Quirks kept as the file says them:
- node-level cpu "full" is printed but always zero (undefined for the whole system); per-cgroup
  cpu "full" is real;
- irq.pressure (only with CONFIG_IRQ_TIME_ACCOUNTING) has a "full" line and no "some" line, so
  `PsiReading.some` is optional.

Per-cgroup PSI exists only in cgroup v2. On a hybrid host the v1 hierarchies have no pressure
files: a task's PSI is accounted to its cgroup in the unified tree (the `0::` line of
/proc/<pid>/cgroup), whatever its v1 cgroups are. Writing 0 to a cgroup's `cgroup.pressure` hides
its pressure files (kernel >= 6.1).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, NamedTuple

from probes.cgroupfiles import CGROUP_PRESSURE, CPU_PRESSURE, PID_STATUS, PRESSURE, PROC_PRESSURE, PsiLine
from probes.cgroupfs import CgroupLayout
from probes.host import HostPaths

RESOURCES: tuple[str, ...] = ("cpu", "memory", "io", "irq")
StallKind = Literal["some", "full"]

# Trigger window rules enforced by psi_trigger_create(); checked before writing so the caller gets
# a message instead of a bare EINVAL.
WINDOW_MIN_US = 500_000
WINDOW_MAX_US = 10_000_000
# Without CAP_SYS_RESOURCE triggers run on the 2 s averaging worker instead of a real-time psimon
# thread, so the kernel only accepts windows that are whole multiples of 2 s. The kernel checks
# the capability (of the opener's credentials), not the uid: root without it is unprivileged too.
UNPRIVILEGED_WINDOW_STEP_US = 2_000_000
CAP_SYS_RESOURCE = 24


@dataclass(frozen=True)
class PsiReading:
    resource: str  # "cpu" | "memory" | "io" | "irq"
    some: PsiLine | None  # None only for irq, which reports "full" alone
    full: PsiLine | None


# -- parsing and reading ----------------------------------------------------------------------


def resource_of(path: Path) -> str:
    """`cpu` for both `/proc/pressure/cpu` and `<cgroup>/cpu.pressure`."""
    return path.name.removesuffix(".pressure")


class _Unreadable(NamedTuple):
    reason: str
    absent: bool  # the file does not exist (as opposed to: exists but unreadable / garbage)


def _load_pressure(read: Callable[[], dict[str, PsiLine] | None], path: Path, resource: str) -> PsiReading | _Unreadable:
    """One pressure file through its declaration's ``read_or_none`` (``path`` names it in reasons)."""
    try:
        lines = read()
    except OSError as e:
        hint = ""
        if e.errno == errno.EOPNOTSUPP:
            hint = " (IRQ time accounting off at run time)" if resource == "irq" else " (PSI disabled)"
        return _Unreadable(f"{path}: {e.strerror or e}{hint}", absent=False)
    if lines is None:
        return _Unreadable(f"{path} absent", absent=True)
    if not lines:
        return _Unreadable(f"{path}: no parsable some/full line", absent=False)
    return PsiReading(resource, lines.get("some"), lines.get("full"))


def read_cgroup_pressure(cgroup_dir: str | os.PathLike[str], resource: str) -> PsiReading | None:
    """One pressure file of a v2 cgroup; None when it is absent, vanished, unreadable or holds no valid line."""
    declared = PRESSURE[resource]
    result = _load_pressure(partial(declared.read_or_none, cgroup_dir, 2), declared.path(cgroup_dir, 2), resource)
    return result if isinstance(result, PsiReading) else None


@dataclass(frozen=True)
class NodePsi:
    readings: dict[str, PsiReading]
    unavailable: dict[str, str]  # resource -> one-line reason

    def get(self, resource: str) -> PsiReading | None:
        return self.readings.get(resource)


def read_node_psi(paths: HostPaths | None = None) -> NodePsi:
    """/proc/pressure/{cpu,memory,io,irq}; each missing one is listed with the likely reason."""
    paths = paths or HostPaths()
    pressure_dir = PROC_PRESSURE.at(paths, resource="cpu").parent
    readings: dict[str, PsiReading] = {}
    unavailable: dict[str, str] = {}
    if not pressure_dir.is_dir():
        for r in RESOURCES:
            unavailable[r] = f"{r}: {pressure_dir} absent (kernel without CONFIG_PSI, or booted with psi=0)"
        return NodePsi(readings, unavailable)
    for r in RESOURCES:
        result = _load_pressure(partial(PROC_PRESSURE.read_or_none, paths, resource=r),
                                PROC_PRESSURE.at(paths, resource=r), r)
        if isinstance(result, PsiReading):
            readings[r] = result
        elif result.absent and r == "irq":
            unavailable[r] = f"irq: {result.reason} (kernel without CONFIG_IRQ_TIME_ACCOUNTING)"
        else:
            unavailable[r] = f"{r}: {result.reason}"
    return NodePsi(readings, unavailable)


def read_cgroup_psi(cgroup_dir: str | os.PathLike[str]) -> dict[str, PsiReading]:
    """The pressure files of one v2 cgroup; empty when it vanished or its PSI is off."""
    readings: dict[str, PsiReading] = {}
    for r in RESOURCES:
        reading = read_cgroup_pressure(cgroup_dir, r)
        if reading is not None:
            readings[r] = reading
    return readings


# -- where per-cgroup PSI is available ----------------------------------------------------------


@dataclass(frozen=True)
class CgroupPsiSource:
    """The v2 cgroup directory whose pressure files describe a cgroup or task, or why there is none."""

    cgroup_dir: Path | None
    reason: str | None = None  # set when per-cgroup PSI is not available there

    @property
    def available(self) -> bool:
        return self.cgroup_dir is not None and self.reason is None


def cgroup_psi_scope(layout: CgroupLayout) -> str:
    """One line for logs: which cgroups have PSI on this host."""
    if layout.v2 is None:
        return "none: no cgroup v2 hierarchy (per-cgroup PSI exists only in v2)"
    if not (layout.v2.mount / CPU_PRESSURE.name(2)).exists():
        return f"none: no pressure files in {layout.v2.mount} (kernel without CONFIG_PSI, or psi=0)"
    if layout.v1:
        return (
            f"unified tree only ({layout.v2.mount}): a task's PSI is that of its v2 cgroup "
            "(the 0:: line of /proc/<pid>/cgroup), not of its v1 cgroups"
        )
    return "every cgroup (pure v2)"


def cgroup_psi_source(layout: CgroupLayout, v2_path: str) -> CgroupPsiSource:
    """Per-cgroup PSI for a cgroup given by its path in the v2 tree (`/kubepods.slice/...`).

    On a hybrid host the path must be the one in the unified tree, which need not match the
    cgroup's v1 paths; `cgroup_psi_source_for_pid` maps a task to it.
    """
    if layout.v2 is None:
        return CgroupPsiSource(None, "no cgroup v2 hierarchy on this host: per-cgroup PSI exists only in v2")
    return _psi_state_of(layout.v2.path_of(v2_path))


def _psi_state_of(cgroup_dir: Path) -> CgroupPsiSource:
    try:
        enabled = CGROUP_PRESSURE.read_or_none(cgroup_dir, 2)
    except OSError as e:
        return CgroupPsiSource(cgroup_dir, f"{cgroup_dir}/cgroup.pressure: {e.strerror or e}")
    if not cgroup_dir.is_dir():
        return CgroupPsiSource(None, f"cgroup {cgroup_dir} does not exist (removed?)")
    # cgroup.pressure appeared in 6.1; older kernels have PSI always on for every v2 cgroup.
    if enabled == 0:
        return CgroupPsiSource(cgroup_dir, f"PSI disabled for {cgroup_dir} (cgroup.pressure = 0)")
    if not (cgroup_dir / CPU_PRESSURE.name(2)).exists():
        return CgroupPsiSource(
            cgroup_dir, f"no pressure files in {cgroup_dir} (kernel without CONFIG_PSI, or psi=0)"
        )
    return CgroupPsiSource(cgroup_dir)


# -- rates --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PsiRate:
    """Share of wall time stalled between two readings (0..1; 0.25 = 25 % = avg-style percent/100)."""

    resource: str
    elapsed_s: float
    some: float | None
    full: float | None
    reset: bool = False  # a counter went backwards (group recreated): no rate for this interval


def psi_rate(prev: PsiReading, cur: PsiReading, elapsed_s: float) -> PsiRate:
    """Δtotal_us / Δt for some and full. `elapsed_s` is the monotonic time between the two reads."""
    if elapsed_s <= 0:
        raise ValueError(f"elapsed time must be positive, got {elapsed_s}")
    if prev.resource != cur.resource:
        raise ValueError(f"readings of different resources: {prev.resource} vs {cur.resource}")
    deltas: dict[str, int | None] = {}
    for kind in ("some", "full"):
        before, after = getattr(prev, kind), getattr(cur, kind)
        deltas[kind] = None if before is None or after is None else after.total_us - before.total_us
    if any(d is not None and d < 0 for d in deltas.values()):
        return PsiRate(cur.resource, elapsed_s, None, None, reset=True)
    elapsed_us = elapsed_s * 1e6
    # Not clamped to 1: a value slightly above 1 is read jitter and is better seen than hidden.
    some, full = (None if d is None else d / elapsed_us for d in (deltas["some"], deltas["full"]))
    return PsiRate(cur.resource, elapsed_s, some, full)


# -- triggers -----------------------------------------------------------------------------------


def has_cap_sys_resource(paths: HostPaths | None = None, pid: int | str = "self") -> bool:
    """Whether this process may use sub-2 s trigger windows (CAP_SYS_RESOURCE in CapEff)."""
    try:
        status = PID_STATUS.read_or_none(paths or HostPaths(), pid=pid)
    except (OSError, ValueError):
        return False
    return status is not None and status.cap_eff is not None and bool(status.cap_eff >> CAP_SYS_RESOURCE & 1)


def validate_trigger(
    kind: str, stall_us: int, window_us: int, *, privileged: bool, resource: str | None = None
) -> None:
    """Raise ValueError if the kernel would refuse this trigger."""
    if kind not in ("some", "full"):
        raise ValueError(f"trigger kind must be 'some' or 'full', not {kind!r}")
    if resource == "irq" and kind != "full":
        raise ValueError("irq pressure only accepts 'full' triggers")
    for name, value in (("stall", stall_us), ("window", window_us)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"trigger {name} must be an int in microseconds, not {value!r}")
    if not WINDOW_MIN_US <= window_us <= WINDOW_MAX_US:
        raise ValueError(
            f"trigger window {window_us} us is outside 500 ms..10 s ({WINDOW_MIN_US}..{WINDOW_MAX_US} us)"
        )
    if not 0 < stall_us <= window_us:
        raise ValueError(f"trigger stall {stall_us} us must be > 0 and <= the window ({window_us} us)")
    if not privileged and window_us % UNPRIVILEGED_WINDOW_STEP_US:
        raise ValueError(
            f"trigger window {window_us} us: without CAP_SYS_RESOURCE the kernel only accepts "
            f"windows that are multiples of 2 s ({UNPRIVILEGED_WINDOW_STEP_US} us)"
        )


@dataclass(frozen=True)
class PsiTrigger:
    path: Path
    kind: StallKind
    stall_us: int
    window_us: int

    @property
    def resource(self) -> str:
        return resource_of(self.path)

    def spec(self) -> bytes:
        # NUL-terminated: writes to /proc/pressure/* overwrite the buffer's last byte with NUL,
        # so without it the window's last digit would be cut off.
        return f"{self.kind} {self.stall_us} {self.window_us}".encode() + b"\0"


@dataclass(frozen=True)
class TriggerEvent:
    trigger: PsiTrigger
    at: float  # time.monotonic() when the event was collected
    ended: bool = False  # the watch is over (file gone, PSI disabled, ...); no more events from it
    reason: str | None = None  # why it ended


class PsiTriggerWatcher:
    """Kernel PSI triggers on pressure files, one open fd per trigger (the kernel allows one per fd).

    Not thread-safe: one thread adds and waits. Use as a context manager or call close().
    """

    def __init__(self, privileged: bool | None = None) -> None:
        # Decided once, as the kernel does at open time from the opener's credentials.
        self.privileged = has_cap_sys_resource() if privileged is None else privileged
        self._poller = select.poll()
        self._watches: dict[int, PsiTrigger] = {}
        self._pending: list[TriggerEvent] = []

    @property
    def active(self) -> list[PsiTrigger]:
        return list(self._watches.values())

    def add(
        self, path: str | os.PathLike[str], kind: StallKind, stall_us: int, window_us: int
    ) -> PsiTrigger:
        """Register a trigger. Bad parameters raise ValueError; a file that is gone or refuses the
        trigger for another reason gives an ended event on the next wait()."""
        trigger = PsiTrigger(Path(path), kind, stall_us, window_us)
        validate_trigger(kind, stall_us, window_us, privileged=self.privileged, resource=trigger.resource)
        try:
            fd = os.open(trigger.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            self._pending.append(self._ended(trigger, f"cannot open {trigger.path}: {e.strerror or e}"))
            return trigger
        try:
            os.write(fd, trigger.spec())
        except OSError as e:
            os.close(fd)
            if e.errno == errno.EINVAL:
                raise ValueError(f"kernel rejected trigger {trigger.spec()!r} on {trigger.path}") from None
            reason = f"cannot set trigger on {trigger.path}: {e.strerror or e}"
            self._pending.append(self._ended(trigger, reason))
            return trigger
        self._watches[fd] = trigger
        self._poller.register(fd, select.POLLPRI)
        return trigger

    def wait(self, timeout_s: float | None) -> list[TriggerEvent]:
        """Events until the first wakeup or timeout (None = forever); [] on timeout.

        Returns at once with ended events still to report, and when nothing is watched (no fd
        could ever wake us).
        """
        events, self._pending = self._pending, []
        if not self._watches:
            return events
        if events:
            timeout_ms: int | None = 0
        else:
            timeout_ms = None if timeout_s is None else max(0, math.ceil(timeout_s * 1000))
        ready = self._poller.poll(timeout_ms)
        now = time.monotonic()
        for fd, revents in ready:
            trigger = self._watches.get(fd)
            if trigger is None:
                continue
            # Checked before POLLPRI: a removed cgroup reports POLLERR|POLLPRI.
            if revents & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                self._forget(fd)
                events.append(self._ended(trigger, _why_gone(trigger.path), now))
            elif revents & select.POLLPRI:
                events.append(TriggerEvent(trigger, now))
        return events

    def close(self) -> None:
        """Release every trigger (closing its fd destroys it in the kernel)."""
        for fd in list(self._watches):
            self._forget(fd)
        self._pending.clear()

    def __enter__(self) -> PsiTriggerWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _forget(self, fd: int) -> None:
        self._watches.pop(fd, None)
        with contextlib.suppress(KeyError):
            self._poller.unregister(fd)
        os.close(fd)

    @staticmethod
    def _ended(trigger: PsiTrigger, reason: str, at: float | None = None) -> TriggerEvent:
        return TriggerEvent(trigger, time.monotonic() if at is None else at, ended=True, reason=reason)


def _why_gone(path: Path) -> str:
    cgroup_dir = path.parent
    if path.name.endswith(".pressure"):
        with contextlib.suppress(OSError):
            if CGROUP_PRESSURE.read_or_none(cgroup_dir, 2) == 0:
                return f"PSI was disabled for {cgroup_dir} (cgroup.pressure = 0)"
        # rmdir takes a cgroup's files away before its directory: a pressure file gone while PSI is on
        # is the cgroup going (in a TCG guest the poll woke between the two).
        if not cgroup_dir.is_dir() or not path.exists():
            return f"cgroup {cgroup_dir} was removed"
    if not path.exists():
        return f"{path} is gone"
    return f"kernel reported an error on {path}"
