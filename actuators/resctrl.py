"""Resctrl (Intel RDT / AMD PQoS) actuator: L3 cache ways and memory bandwidth per QoS group.

Koordlet's layout: one control group per QoS class (``LSR``, ``LS``, ``BE``) directly under the
resctrl mount, each with a ``schemata`` holding ``L3:<dom>=<hex mask>;...`` and ``MB:<dom>=<n>;...``
lines, and the pods' task ids written into its ``tasks`` file.

Everything goes through two injectable seams so tests can use a temp dir that behaves like the
kernel: :class:`HostPaths` (where ``/proc`` and ``/sys/fs/resctrl`` are) and :class:`ResctrlFs`
(every read, write, mkdir and rmdir). A temp dir accepts any write, so the fake ``ResctrlFs`` in
``tests/fake_resctrl.py`` validates like the kernel does and fills ``info/last_cmd_status``.

Kernel facts this module relies on (fs/resctrl/ctrlmondata.c):
- a schemata write must end in a newline; all lines of one write are validated before any is
  applied, so one write is atomic, but writes to several lines or groups are not: ``apply`` writes
  one line per write (so the failing line is known) through :class:`actuators.journal.Journal`
  (originals on disk before the first write, rollback of the lines already written) and removes the
  groups it created;
- after any failed command, ``info/last_cmd_status`` holds the reason (or ``ok`` when the kernel
  gave none, e.g. an unknown domain id);
- ``tasks`` takes one id per write here (the kernel also accepts a comma list but stops at the
  first failure with the earlier ids moved, which is harder to account for); a task that exited
  gives ESRCH;
- removing a group moves its tasks back to the default group.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from actuators.base import ActionError, FileWrite, Plan, Refused
from actuators.cgroupfile import (
    CgroupFileError,
    CgroupVanished,
    CgroupWriteError,
    ResourceUnavailable,
    read_file,
    write_file,
)
from actuators.journal import DEFAULT_JOURNAL_DIR, Journal, JournalError, PlanKeys
from detector.decisions import ActionKind, Decision, ResctrlAmount, Target
from detector.policy import ResourceQosStrategy
from probes.host import VANISHED_ERRNOS, HostPaths, read_text_or_none

log = logging.getLogger(__name__)

QOS_GROUPS = ("LSR", "LS", "BE")
AMD_MB_UNLIMITED = 2048  # AMD MBA takes absolute units; 2048 means "no limit"
INTEL_MB_MAX = 100
MONITOR_FILES = ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes")


# -- support detection ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CpuRdtFlags:
    vendor: str  # "intel" | "amd" | "other" | "unknown"
    cat_l3: bool = False
    mba: bool = False
    cqm_llc: bool = False
    cqm_mbm_total: bool = False
    cqm_mbm_local: bool = False


def parse_cpuinfo(text: str) -> CpuRdtFlags:
    """Vendor and RDT flags from the first processor block of ``/proc/cpuinfo``."""
    vendor_id = ""
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "vendor_id" and not vendor_id:
            vendor_id = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
        if vendor_id and flags:
            break
    vendor = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "amd"}.get(
        vendor_id, "other" if vendor_id else "unknown")
    return CpuRdtFlags(
        vendor=vendor,
        cat_l3="cat_l3" in flags,
        mba="mba" in flags,
        cqm_llc="cqm_llc" in flags,
        cqm_mbm_total="cqm_mbm_total" in flags,
        cqm_mbm_local="cqm_mbm_local" in flags,
    )


@dataclass(frozen=True, slots=True)
class ResctrlSupport:
    cpu: CpuRdtFlags
    mounted: bool
    root: Path  # where the resctrl filesystem is (or would be) on this host root
    reason: str = ""  # why it is unavailable; empty when available

    @property
    def available(self) -> bool:
        return not self.reason

    @property
    def monitoring(self) -> bool:
        return self.available and (self.cpu.cqm_llc or self.cpu.cqm_mbm_total or self.cpu.cqm_mbm_local)

    @property
    def status(self) -> str:
        if self.reason:
            return f"resctrl unavailable: {self.reason}"
        parts = [p for p, ok in (("L3 CAT", self.cpu.cat_l3), ("MBA", self.cpu.mba),
                                 ("LLC occupancy", self.cpu.cqm_llc),
                                 ("MBM total", self.cpu.cqm_mbm_total), ("MBM local", self.cpu.cqm_mbm_local)) if ok]
        return f"resctrl available at {self.root} ({self.cpu.vendor}): {', '.join(parts)}"


def resctrl_root(paths: HostPaths) -> Path:
    return paths.sys / "fs/resctrl"


def detect_support(paths: HostPaths | None = None) -> ResctrlSupport:
    """Is resctrl usable here? Needs a CPU flag (``cat_l3`` or ``mba``) and a mounted resctrl fs."""
    paths = paths or HostPaths()
    root = resctrl_root(paths)
    try:
        cpuinfo = (paths.proc / "cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        return ResctrlSupport(CpuRdtFlags("unknown"), False, root, f"cannot read {paths.proc / 'cpuinfo'}: {e.strerror}")
    cpu = parse_cpuinfo(cpuinfo)
    mounts = read_text_or_none(paths.proc / "mounts") or ""
    mounted = any(len(f) > 2 and f[2] == "resctrl" for f in (line.split() for line in mounts.splitlines()))
    if not (cpu.cat_l3 or cpu.mba):
        reason = f"the CPU ({cpu.vendor}) has neither cat_l3 nor mba in /proc/cpuinfo flags"
    elif not mounted:
        reason = "resctrl is not mounted (no resctrl entry in /proc/mounts; mount -t resctrl resctrl /sys/fs/resctrl)"
    elif not (root / "info").is_dir():
        reason = f"resctrl is mounted but {root}/info does not exist (host root mismatch?)"
    else:
        reason = ""
    return ResctrlSupport(cpu, mounted, root, reason)


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


# -- info, schemata, masks --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class L3Info:
    cbm_mask: int
    min_cbm_bits: int
    num_closids: int
    shareable_bits: int

    @property
    def ways(self) -> int:
        return self.cbm_mask.bit_count()


@dataclass(frozen=True, slots=True)
class MbInfo:
    bandwidth_gran: int
    min_bandwidth: int
    num_closids: int
    delay_linear: bool


@dataclass(frozen=True, slots=True)
class ResctrlInfo:
    l3: L3Info | None
    mb: MbInfo | None
    vendor: str

    @property
    def max_groups(self) -> int:
        """Control groups the hardware allows, the default group included (the smallest closid count)."""
        counts = [r.num_closids for r in (self.l3, self.mb) if r is not None]
        return min(counts) if counts else 0


def _read_int(fs: ResctrlFs, path: Path, base: int = 10) -> int:
    text = fs.read(path).strip()
    try:
        return int(text, base)
    except ValueError:
        raise ActionError(f"resctrl: unexpected content {text[:40]!r} in {path}") from None


def read_info(root: Path, vendor: str, fs: ResctrlFs | None = None) -> ResctrlInfo:
    fs = fs or KernelResctrlFs()
    info = root / "info"
    l3 = mb = None
    if (info / "L3").is_dir():
        l3 = L3Info(
            cbm_mask=_read_int(fs, info / "L3/cbm_mask", 16),
            min_cbm_bits=_read_int(fs, info / "L3/min_cbm_bits"),
            num_closids=_read_int(fs, info / "L3/num_closids"),
            shareable_bits=_read_int(fs, info / "L3/shareable_bits", 16),
        )
    if (info / "MB").is_dir():
        mb = MbInfo(
            bandwidth_gran=_read_int(fs, info / "MB/bandwidth_gran"),
            min_bandwidth=_read_int(fs, info / "MB/min_bandwidth"),
            num_closids=_read_int(fs, info / "MB/num_closids"),
            delay_linear=_read_int(fs, info / "MB/delay_linear") == 1,
        )
    if l3 is None and mb is None:
        raise ActionError(f"resctrl: neither {info}/L3 nor {info}/MB exists (CDP on, or no allocation support)")
    return ResctrlInfo(l3, mb, vendor)


def parse_schemata(text: str) -> dict[str, dict[int, str]]:
    """``{"L3": {0: "7ff", 1: "7ff"}, "MB": {0: "100", ...}}``; the kernel pads names and values."""
    result: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or not name.strip():
            continue
        domains: dict[int, str] = {}
        for item in rest.split(";"):
            dom, eq, value = item.partition("=")
            if eq and dom.strip().isdigit():
                domains[int(dom)] = value.strip()
        result[name.strip()] = domains
    return result


def format_line(resource: str, values: dict[int, str]) -> str:
    return f"{resource}:" + ";".join(f"{dom}={values[dom]}" for dom in sorted(values))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def l3_mask(l3: L3Info, start_percent: int, end_percent: int) -> int:
    """Ways [ceil(ways*start%), ceil(ways*end%)) of ``cbm_mask``, contiguous, at least ``min_cbm_bits``.

    Koordlet's formula; when rounding leaves fewer than ``min_cbm_bits`` (or no) ways, the range is
    widened upwards first, then downwards, so the group still gets a mask the kernel accepts.
    """
    if not 0 <= start_percent < end_percent <= 100:
        raise Refused(f"resctrl: L3 range {start_percent}%..{end_percent}% is not 0 <= start < end <= 100")
    ways = l3.ways
    low_bit = (l3.cbm_mask & -l3.cbm_mask).bit_length() - 1
    if ways == 0 or ((l3.cbm_mask >> low_bit) + 1) & (l3.cbm_mask >> low_bit):
        raise ActionError(f"resctrl: cbm_mask {l3.cbm_mask:x} is not a contiguous run of ways")
    start = _ceil_div(ways * start_percent, 100)
    end = _ceil_div(ways * end_percent, 100)
    need = max(1, l3.min_cbm_bits)
    if end - start < need:
        end = min(ways, start + need)
        start = max(0, end - need)
    return ((1 << end) - (1 << start)) << low_bit


def mb_value(info: ResctrlInfo, percent: int) -> int:
    """The MB schemata value for ``percent`` of the bandwidth.

    Intel: a percent rounded up to ``bandwidth_gran``, at least ``min_bandwidth``, at most 100.
    AMD: absolute units where 2048 is unlimited; we map ``percent`` to that share of 2048 (rounded
    up), so 100 % stays unlimited.
    """
    if info.mb is None:
        raise Refused("resctrl: this host has no MBA (no info/MB)")
    if not 1 <= percent <= 100:
        raise Refused(f"resctrl: MBA {percent}% is not within 1..100")
    mb = info.mb
    if info.vendor == "amd":
        value = AMD_MB_UNLIMITED if percent == 100 else _ceil_div(AMD_MB_UNLIMITED * percent, 100)
        return min(AMD_MB_UNLIMITED, max(value, mb.min_bandwidth, 1))
    gran = max(1, mb.bandwidth_gran)
    return min(INTEL_MB_MAX, max(_ceil_div(percent, gran) * gran, mb.min_bandwidth))


def qos_strategy_decisions(strategy: ResourceQosStrategy) -> list[Decision]:
    """One RESCTRL decision per enabled class of a koordinator ``resource-qos-config`` (for :meth:`plan_groups`)."""
    decisions = []
    for group, qos in (("LSR", strategy.lsr), ("LS", strategy.ls), ("BE", strategy.be)):
        if qos.enable:
            amount = ResctrlAmount(group, qos.cat_range_start_percent, qos.cat_range_end_percent, qos.mba_percent)
            decisions.append(Decision(ActionKind.RESCTRL, Target(cgroup="", qos=group), amount,
                                      reason=f"resource-qos-config resctrlQOS for {group}"))
    return decisions


# -- tasks and monitoring ---------------------------------------------------------------------


@dataclass(slots=True)
class TaskAssignment:
    group: str
    added: list[int] = field(default_factory=list)
    already: int = 0  # ids that were in the group before
    vanished: list[int] = field(default_factory=list)  # exited before we could move them (ESRCH)
    moved_from: dict[int, str] = field(default_factory=dict)  # tid -> group it was in ("" = default)


@dataclass(frozen=True, slots=True)
class DomainMonitoring:
    domain: int
    llc_occupancy_bytes: int | None
    mbm_total_bytes: int | None
    mbm_local_bytes: int | None


def _parse_tids(text: str | None) -> set[int]:
    return {int(t) for t in (text or "").split() if t.isdigit()}


def cgroup_task_source(paths: HostPaths) -> Callable[[Target], list[int]]:
    """Thread ids of a target cgroup and its descendants, from the cpu hierarchy (v1 ``tasks``, v2 ``cgroup.threads``)."""
    from probes.cgroupfs import discover

    def tids(target: Target) -> list[int]:
        hierarchy = discover(paths).cpu
        if hierarchy is None or not target.cgroup:
            return []
        name = "tasks" if hierarchy.version == 1 else "cgroup.threads"
        found: set[int] = set()
        for dirpath, _dirs, files in os.walk(hierarchy.path_of(target.cgroup)):
            if name in files:
                found |= _parse_tids(read_text_or_none(Path(dirpath) / name))
        return sorted(found)

    return tids


@dataclass(slots=True)
class _Applied:
    created: list[Path] = field(default_factory=list)  # groups apply made with mkdir
    moves: list[TaskAssignment] = field(default_factory=list)


# -- the actuator -----------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


class ResctrlActuator:
    """Sets L3 ways and MBA for the LSR/LS/BE groups and moves the target's tasks into the group."""

    kind = ActionKind.RESCTRL

    def __init__(
        self,
        paths: HostPaths | None = None,
        fs: ResctrlFs | None = None,
        journal: Journal | None = None,
        journal_dir: str | os.PathLike[str] | None = None,
        task_source: Callable[[Target], Iterable[int]] | None = None,
    ) -> None:
        self.paths = paths or HostPaths()
        self.fs: ResctrlFs = fs or KernelResctrlFs()
        self.io = ResctrlFileIO(resctrl_root(self.paths), self.fs)
        # Built lazily so merely constructing the actuator (e.g. to print its status) creates no directory.
        self._journal = journal
        self._plan_keys = PlanKeys(self.kind)
        self._journal_dir = Path(journal_dir) if journal_dir is not None else DEFAULT_JOURNAL_DIR / "resctrl"
        self.task_source = task_source if task_source is not None else cgroup_task_source(self.paths)
        self.root = resctrl_root(self.paths)
        # What each applied plan did beyond file contents (groups made, tasks moved), which the journal
        # cannot restore; keyed by the journal action id.
        self._applied: dict[str, _Applied] = {}

    # -- state ---------------------------------------------------------------------------------
    def support(self) -> ResctrlSupport:
        return detect_support(self.paths)

    def info(self) -> ResctrlInfo:
        support = self.support()
        if not support.available:
            raise Refused(support.status)
        return read_info(self.root, support.cpu.vendor, self.fs)

    def group_dir(self, group: str) -> Path:
        return self.root / group if group else self.root

    def last_cmd_status(self) -> str:
        return self.io.last_cmd_status()

    # -- plan ----------------------------------------------------------------------------------
    def plan(self, decision: Decision) -> Plan:
        return self.plan_groups([decision])

    def plan_groups(self, decisions: Sequence[Decision]) -> Plan:
        """One all-or-nothing plan for several groups (e.g. the whole ResourceQosStrategy)."""
        if not decisions:
            raise Refused("resctrl: nothing to plan")
        info = self.info()
        writes: list[FileWrite] = []
        summaries: list[str] = []
        groups = [d.amount.group for d in decisions if isinstance(d.amount, ResctrlAmount)]
        if len(set(groups)) != len(groups):
            raise Refused(f"resctrl: a plan names a group twice: {', '.join(groups)}")
        for decision in decisions:
            write, summary = self._plan_one(decision, info)
            writes.append(write)
            summaries.append(summary)
        return Plan(decision=decisions[0], summary="; ".join(summaries), writes=tuple(writes))

    def _plan_one(self, decision: Decision, info: ResctrlInfo) -> tuple[FileWrite, str]:
        amount = decision.amount
        if decision.kind != ActionKind.RESCTRL or not isinstance(amount, ResctrlAmount):
            raise Refused(f"resctrl: cannot carry out a {decision.kind} decision")
        if amount.group not in QOS_GROUPS:
            raise Refused(f"resctrl: group {amount.group!r} is not one of {', '.join(QOS_GROUPS)}")
        schemata_path = self.group_dir(amount.group) / "schemata"
        exists = self.group_dir(amount.group).is_dir()
        # Domain ids come from the schemata the kernel shows; a new group has the default group's domains.
        current_text = self._read(schemata_path if exists else self.root / "schemata")
        current = parse_schemata(current_text)
        lines: list[str] = []
        parts: list[str] = []
        if info.l3 is not None and "L3" in current:
            mask = l3_mask(info.l3, amount.l3_start_percent, amount.l3_end_percent)
            lines.append(format_line("L3", {dom: f"{mask:x}" for dom in current["L3"]}))
            parts.append(f"L3 {amount.l3_start_percent}-{amount.l3_end_percent}% = {mask:x}")
        elif amount.l3_start_percent != 0 or amount.l3_end_percent != 100:
            raise Refused("resctrl: an L3 range was asked for but this host has no L3 CAT")
        if info.mb is not None and "MB" in current:
            value = mb_value(info, amount.mba_percent)
            lines.append(format_line("MB", dict.fromkeys(current["MB"], str(value))))
            parts.append(f"MB {amount.mba_percent}% = {value}")
        elif amount.mba_percent != 100:
            raise Refused("resctrl: an MBA limit was asked for but this host has no MBA")
        if not lines:
            raise Refused("resctrl: the schemata has neither L3 nor MB lines")
        verb = "set" if exists else "create"
        summary = f"resctrl {verb} {amount.group}: {', '.join(parts)}"
        return FileWrite(str(schemata_path), current_text if exists else None, "\n".join(lines) + "\n"), summary

    # -- apply ---------------------------------------------------------------------------------
    @property
    def journal(self) -> Journal:
        if self._journal is None:
            self._journal = Journal(self._journal_dir, read=self.io.read, write=self.io.write)
        return self._journal

    def apply(self, plan: Plan) -> None:
        """Create missing groups, write the schemata lines through the journal, move the target's tasks.

        Lines are written one per write so the failing one is known; the journal records each
        original before the first write and rolls back what was written if a later line fails. On
        any failure the tasks moved so far go back, created groups are removed, and
        :class:`ActionError` carries the kernel's ``last_cmd_status``.
        """
        key = self._plan_keys.for_apply(plan)
        try:
            journal = self.journal  # before any mkdir: a journal that cannot be opened must change nothing
        except JournalError as e:
            raise ActionError(f"resctrl: {e}") from None
        state = _Applied()
        assignment = TaskAssignment(self._group_of(plan))
        journaled = False
        try:
            lines: list[tuple[str, str]] = []
            for write in plan.writes:
                group_dir = Path(write.path).parent
                if not group_dir.is_dir():
                    self.io.mkdir(group_dir)
                    state.created.append(group_dir)
                lines.extend((write.path, line) for line in write.new.splitlines())
            journal.apply(key, lines, kind=str(self.kind))
            journaled = True
            # Only the decision's own target is moved: a multi-group policy plan sets schemata only.
            tids = list(self.task_source(plan.decision.target))
            if tids:
                self._assign(assignment.group, tids, assignment)
        except (ActionError, CgroupFileError) as e:
            self._move_back([assignment])
            if journaled:
                journal.revert(key)
            removed = self._remove_groups(state.created)
            raise ActionError(f"{_one_line(str(e))}; removed {len(removed)} new group(s)") from None
        state.moves.append(assignment)
        self._applied[key] = state

    @staticmethod
    def _group_of(plan: Plan) -> str:
        amount = plan.decision.amount
        if not isinstance(amount, ResctrlAmount):
            raise ActionError(f"resctrl: plan for a {plan.decision.kind} decision")
        return amount.group

    def _read(self, path: Path) -> str:
        try:
            return self.fs.read(path)
        except OSError as e:
            raise ActionError(f"resctrl: cannot read {path}: {e.strerror or e}") from None

    def _remove_groups(self, groups: Iterable[Path]) -> list[Path]:
        removed: list[Path] = []
        for group in reversed(list(groups)):
            try:
                self.fs.rmdir(group)
                removed.append(group)
            except OSError as e:
                if e.errno in VANISHED_ERRNOS:
                    continue
                log.error("resctrl: cannot remove group %s: %s", group, e.strerror or e)
        return removed

    # -- tasks ---------------------------------------------------------------------------------
    def _current_groups_of(self) -> dict[int, str]:
        owner: dict[int, str] = {}
        for group in ("", *QOS_GROUPS):
            tasks = self.group_dir(group) / "tasks"
            with contextlib.suppress(OSError):
                for tid in _parse_tids(self.fs.read(tasks)):
                    owner[tid] = group
        return owner

    def assign_tasks(self, group: str, tids: Iterable[int]) -> TaskAssignment:
        """Move tasks into ``group`` one id per write, skipping ids already there; exited tasks are skipped."""
        result = TaskAssignment(group)
        self._assign(group, tids, result)
        return result

    def _assign(self, group: str, tids: Iterable[int], result: TaskAssignment) -> None:
        """Fills ``result`` as it goes, so a failure part way leaves an exact record of what moved."""
        tasks_path = self.group_dir(group) / "tasks"
        try:
            present = _parse_tids(self.fs.read(tasks_path))
        except OSError as e:
            raise ActionError(f"resctrl: cannot read {tasks_path}: {e.strerror or e}") from None
        owners = self._current_groups_of()
        for tid in dict.fromkeys(tids):
            if tid in present:
                result.already += 1
                continue
            try:
                self.fs.write(tasks_path, f"{tid}\n")
            except OSError as e:
                if e.errno in VANISHED_ERRNOS:
                    result.vanished.append(tid)
                    continue
                raise ActionError(
                    f"resctrl: moving task {tid} into {group or 'the default group'} failed: "
                    f"{e.strerror or e} (last_cmd_status: {self.last_cmd_status()})"
                ) from None
            result.added.append(tid)
            result.moved_from[tid] = owners.get(tid, "")

    def _move_back(self, assignments: Iterable[TaskAssignment]) -> list[str]:
        errors: list[str] = []
        for assignment in assignments:
            for tid, origin in assignment.moved_from.items():
                try:
                    self.fs.write(self.group_dir(origin) / "tasks", f"{tid}\n")
                except OSError as e:
                    if e.errno not in VANISHED_ERRNOS:
                        errors.append(f"task {tid} -> {origin or 'default group'}: {e.strerror}")
        return errors

    # -- revert --------------------------------------------------------------------------------
    def revert(self, plan: Plan) -> None:
        """Move moved tasks back, restore the schemata through the journal, remove groups apply created."""
        key = self._plan_keys.for_revert(plan)
        state = self._applied.pop(key, None) if key is not None else None
        if state is None:
            raise ActionError("resctrl revert: this plan was not applied by this actuator (nothing recorded)")
        errors = self._move_back(state.moves)
        report = self.journal.revert(key)
        errors.extend(report.failed)
        if report.foreign:
            log.warning("resctrl revert: left alone (changed by someone else since): %s", ", ".join(report.foreign))
        self._remove_groups(state.created)
        errors.extend(f"group {g} still exists" for g in state.created if g.is_dir())
        if errors:
            raise ActionError("resctrl revert incomplete: " + "; ".join(errors))

    # -- monitoring ----------------------------------------------------------------------------
    def read_monitoring(self, group: str) -> list[DomainMonitoring]:
        """LLC occupancy and MBM byte counters per L3 domain; empty without monitoring.

        The kernel prints ``Unavailable`` (no RMID counter yet) or ``Error``: those read as None.
        """
        mon_data = self.group_dir(group) / "mon_data"
        if not mon_data.is_dir():
            return []
        result: list[DomainMonitoring] = []
        for entry in sorted(mon_data.iterdir()):
            prefix = "mon_L3_"
            if not entry.name.startswith(prefix) or not entry.name[len(prefix):].isdigit():
                continue
            values: dict[str, int | None] = {}
            for name in MONITOR_FILES:
                try:
                    text = self.fs.read(entry / name).strip()
                except OSError as e:
                    if e.errno not in (*VANISHED_ERRNOS, errno.EINVAL, errno.EIO):
                        raise
                    text = ""
                values[name] = int(text) if text.isdigit() else None
            result.append(DomainMonitoring(int(entry.name[len(prefix):]), values["llc_occupancy"],
                                           values["mbm_total_bytes"], values["mbm_local_bytes"]))
        return result
