# SPDX-License-Identifier: Apache-2.0
"""The resctrl actuator: applies schemata and moves the pods' tasks into the QoS groups, journalled."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from actuators.base import ActionError, FileWrite, Plan, Refused
from actuators.cgroupfile import (
    CgroupFileError,
)
from actuators.journal import DEFAULT_JOURNAL_DIR, Journal, JournalError, PlanKeys
from actuators.resctrl.fs import KernelResctrlFs, ResctrlFileIO, ResctrlFs, _one_line
from actuators.resctrl.schemata import (
    QOS_GROUPS,
    ResctrlInfo,
    format_line,
    l3_mask,
    mb_value,
    parse_schemata,
    read_info,
)
from actuators.resctrl.support import ResctrlSupport, detect_support, resctrl_root
from detector.decisions import ActionKind, Decision, ResctrlAmount, Target
from probes.cgroupfiles import CGROUP_THREADS, VANISHED_ERRNOS, CgroupFileParseError, parse_pids
from probes.host import HostPaths

log = logging.getLogger("actuators.resctrl")  # the name it had as one module


# -- tasks --------------------------------------------------------------------------------------


@dataclass(slots=True)
class TaskAssignment:
    group: str
    added: list[int] = field(default_factory=list)
    already: int = 0  # ids that were in the group before
    vanished: list[int] = field(default_factory=list)  # exited before we could move them (ESRCH)
    moved_from: dict[int, str] = field(default_factory=dict)  # tid -> group it was in ("" = default)


def cgroup_task_source(paths: HostPaths) -> Callable[[Target], list[int]]:
    """Thread ids of a target cgroup and its descendants, from the cpu hierarchy (v1 ``tasks``, v2 ``cgroup.threads``)."""
    from probes.cgroupfs import discover

    def tids(target: Target) -> list[int]:
        hierarchy = discover(paths).cpu
        if hierarchy is None or not target.cgroup:
            return []
        name = CGROUP_THREADS.name(hierarchy.version)
        found: set[int] = set()
        for dirpath, _dirs, files in os.walk(hierarchy.path_of(target.cgroup)):
            if name in files:
                found.update(CGROUP_THREADS.read_or_none(dirpath, hierarchy.version) or ())
        return sorted(found)

    return tids


@dataclass(slots=True)
class _Applied:
    created: list[Path] = field(default_factory=list)  # groups apply made with mkdir
    moves: list[TaskAssignment] = field(default_factory=list)


# -- the actuator -----------------------------------------------------------------------------


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
            with contextlib.suppress(OSError, CgroupFileParseError):
                for tid in parse_pids(self.fs.read(tasks)):  # a resctrl group's tasks: cgroup.threads' format
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
            present = set(parse_pids(self.fs.read(tasks_path)))
        except OSError as e:
            raise ActionError(f"resctrl: cannot read {tasks_path}: {e.strerror or e}") from None
        except CgroupFileParseError as e:
            raise ActionError(f"resctrl: {tasks_path}: {e}") from None
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
