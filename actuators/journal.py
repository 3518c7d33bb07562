# SPDX-License-Identifier: Apache-2.0
"""Write-ahead journal of every file the actuators change, so every change can be undone.

The original value of a file is on disk *before* the file is first written (atomic: temp file,
fsync, rename, fsync of the directory), so a crash at any point leaves enough to restore it.

API (paths are absolute; values are the raw strings of the file)::

    journal = Journal("/var/lib/noisyneighbor/journal")   # or a temp dir in tests
    journal.reconcile()              # at start: restore what a crashed run left changed
    writes = journal.apply("act-1", plan.writes, kind="suppress")   # all-or-nothing
    journal.revert("act-1")          # undo one action: its files back to their pre-action values
    journal.restore_all()            # clean shutdown: every owned file back to its original

- :meth:`Journal.apply` writes a sequence of :class:`actuators.base.FileWrite` (or ``(path, new)``
  pairs) in order. If one fails, the ones already written are rolled back in reverse order and
  :class:`actuators.base.ActionError` is raised; nothing stays half-applied.
- Undo order is the reverse of the *last* write of each file, each file restored once. That is what
  nested cpuset changes need (koordlet's order: union of old and new top-down, then the new set
  bottom-up; the undo then restores parents before children) and what cfs quota + burst need
  (burst is written after quota, so it is restored first).
- A file is *owned* from its first write until it is restored; its original is recorded once, so it
  is restored once to the value it had before we touched it, however many times we changed it.
- We never clobber a change someone else made: a file whose current value is neither what we wrote
  nor its original is left alone and reported as ``foreign`` (kubelet/systemd re-applied their own
  value; fighting them is koordlet issue #1734).
- :meth:`Journal.reconcile` (after a crash) restores originals, or with ``reown=True`` keeps the
  entries so this run owns them and restores them later.
- File I/O goes through :func:`actuators.cgroupfile.read_file` / ``write_file`` by default; pass
  ``read``/``write`` callables to journal other kinds of files (e.g. resctrl schemata).

Thread-safe (one lock); one journal directory per agent process.

Format compatibility (what lets an upgrade or a rollback restore what the other version changed): the file
says ``version`` (the entries' format) and ``min_reader_version`` (the oldest reader that can restore it).
A reader takes every version up to its own, and a newer one whose ``min_reader_version`` it meets (it
ignores entry fields it does not know: a newer format may add fields, never change the meaning of these).
A journal it cannot read is refused with one line and left in place, never removed: the changes it
records stay restorable by an agent that can. Version 1 files written before ``min_reader_version``
existed (the format of 0.1.0) read as ``min_reader_version`` 1.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from actuators.base import ActionError, FileWrite, Plan
from actuators.cgroupfile import (
    CgroupFileError,
    CgroupVanished,
    ResourceUnavailable,
    read_file,
    same_value,
    write_file,
)

DEFAULT_JOURNAL_DIR = Path("/var/lib/noisyneighbor/journal")
JOURNAL_FILE = "journal.json"
# The entries' format this code writes, and the oldest reader that can restore what it writes. Bump
# FORMAT_VERSION for a change of format; keep MIN_READER_VERSION low as long as older readers can still
# restore (added fields), raise it only when they could not (a changed meaning).
FORMAT_VERSION = 1
MIN_READER_VERSION = 1

log = logging.getLogger("noisyneighbor.actuators.journal")


@dataclass
class JournalEntry:
    """One owned file."""

    path: str
    original: str
    last_written: str | None  # read back after our last write; None while a write is in flight
    pending: str | None  # the value being written (crash between journal and write)
    seq: int  # order of our last write to it; undo goes in decreasing seq
    action_id: str  # the action that last wrote it
    kind: str = ""
    first_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class AppliedWrite:
    """One write as done: ``before`` is the value just before this action, ``after`` as read back."""

    path: str
    before: str
    after: str


@dataclass
class RestoreReport:
    restored: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)  # already held the original
    vanished: list[str] = field(default_factory=list)  # cgroup gone: nothing to restore
    foreign: list[str] = field(default_factory=list)  # someone else changed it since: left alone
    failed: list[str] = field(default_factory=list)  # "path: reason"
    reowned: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        parts = [f"{k}={len(v)}" for k, v in asdict(self).items() if v]
        return " ".join(parts) or "nothing to restore"


def _check_entry(e: JournalEntry) -> None:
    """Field types as written by _save(): an entry that is not is corrupt (restore would trip on it)."""
    str_fields = {"path": e.path, "original": e.original, "action_id": e.action_id, "kind": e.kind}
    for name, value in str_fields.items():
        if not isinstance(value, str):
            raise TypeError(f"entry {name} is {type(value).__name__}, not a string")
    for name, value in (("last_written", e.last_written), ("pending", e.pending)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"entry {name} is {type(value).__name__}, not a string or null")
    if not isinstance(e.seq, int) or isinstance(e.seq, bool):
        raise TypeError(f"entry seq is {type(e.seq).__name__}, not an integer")
    if not isinstance(e.first_at, int | float) or isinstance(e.first_at, bool):
        raise TypeError(f"entry first_at is {type(e.first_at).__name__}, not a number")


class JournalError(Exception):
    """The journal itself cannot be read or written; one line."""


class JournalTooNew(JournalError):
    """A journal written in a format this code cannot restore (a newer agent's); left in place."""


_ENTRY_FIELDS = frozenset(JournalEntry.__dataclass_fields__)


def _entry(raw: object, *, strict: bool) -> JournalEntry:
    """One entry of the file; a newer format's fields this code does not know are dropped (``strict``
    False), a known format's unknown field is corruption."""
    if not isinstance(raw, dict):
        raise TypeError(f"entry is {type(raw).__name__}, not an object")
    if not strict:
        raw = {k: v for k, v in raw.items() if k in _ENTRY_FIELDS}
    return JournalEntry(**raw)


ReadFn = Callable[[str], str]
WriteFn = Callable[[str, str], None]


class JournalStore:
    """The journal's file: its format and versions (module docstring), read whole, saved atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise JournalError(f"cannot create journal directory {self.directory}: {e.strerror or e}") from None

    @property
    def file(self) -> Path:
        return self.directory / JOURNAL_FILE

    def load(self) -> list[JournalEntry]:
        """The entries on disk ([] without a file); JournalError when the file is unreadable, corrupt or too new."""
        try:
            raw = self.file.read_text()
        except FileNotFoundError:
            return []
        except OSError as e:
            raise JournalError(f"cannot read journal {self.file}: {e.strerror or e}") from None
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict):
                raise ValueError(f"top level is {type(doc).__name__}, not an object")
            version, min_reader = doc.get("version"), doc.get("min_reader_version", 1)
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise ValueError(f"unsupported version {version!r}")
            if version > FORMAT_VERSION and (not isinstance(min_reader, int) or min_reader > FORMAT_VERSION):
                raise JournalTooNew(f"journal {self.file} is format {version}, which needs a reader of format "
                                    f"{min_reader} or newer (this one reads up to {FORMAT_VERSION}): run the agent "
                                    f"version that wrote it (`noisyneighbor restore`), do not remove it")
            entries = [_entry(e, strict=version <= FORMAT_VERSION) for e in doc["entries"]]
            for e in entries:
                _check_entry(e)
        except (ValueError, TypeError, KeyError) as e:
            # The reason may quote the file (a key with a newline in it): one line, whatever it holds.
            reason = " ".join(str(e).split())
            raise JournalError(f"journal {self.file} is corrupt ({reason}); inspect it, then remove it") from None
        return entries

    def save(self, entries: Iterable[JournalEntry], *, sync_directory: bool = True) -> None:
        """Put the entries on disk: a temp file, fsynced, renamed over the journal.

        ``sync_directory=False`` leaves the rename itself to the next commit of the filesystem: after a
        crash the journal is then the previous version or this one, both complete. Apply uses it for the
        state after its writes: the version before them (made durable first) already restores them.
        """
        ordered = sorted(entries, key=lambda e: e.seq)
        if not ordered:
            self._remove_file()
            return
        doc = {
            "version": FORMAT_VERSION,
            "min_reader_version": MIN_READER_VERSION,
            "pid": os.getpid(),
            "saved_at": time.time(),
            "entries": [asdict(e) for e in ordered],
        }
        data = json.dumps(doc, indent=1, sort_keys=True).encode()
        try:
            fd, tmp = tempfile.mkstemp(prefix=".journal-", dir=self.directory)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.file)
            if sync_directory:
                dfd = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        except OSError as e:
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)
            raise JournalError(f"cannot write journal {self.file}: {e.strerror or e}") from None

    def _remove_file(self) -> None:
        """An empty journal is no file. Removing it needs no fsync: if a crash undoes the unlink, the
        entries before it come back and the next start finds their files at their originals already
        (left alone). Writing an empty file instead would need fsyncs that, on a disk saturated by other
        IO, took longer than a pod's stop grace (CI under load), or risk a zero-length file after a
        crash, which the next start would refuse as corrupt."""
        try:
            self.file.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise JournalError(f"cannot remove empty journal {self.file}: {e.strerror or e}") from None


class Journal:
    """Owned files, their originals and what each action wrote; the file side is :class:`JournalStore`."""

    def __init__(
        self,
        directory: str | os.PathLike[str] = DEFAULT_JOURNAL_DIR,
        *,
        read: ReadFn | None = None,
        write: WriteFn | None = None,
    ) -> None:
        self._store = JournalStore(Path(directory))
        self.directory = self._store.directory
        self._read: ReadFn = read or read_file
        self._write: WriteFn = write or write_file
        self._lock = threading.RLock()
        self._entries: dict[str, JournalEntry] = {}
        self._seq = 0
        # per action, what it wrote (in memory: after a crash only originals matter)
        self._actions: dict[str, list[AppliedWrite]] = {}
        self._load()

    @property
    def file(self) -> Path:
        return self._store.file

    def _load(self) -> None:
        entries = self._store.load()
        self._entries = {e.path: e for e in entries}
        self._seq = max((e.seq for e in entries), default=0)

    def _save(self, *, sync_directory: bool = True) -> None:
        self._store.save(self._entries.values(), sync_directory=sync_directory)

    # -- queries -----------------------------------------------------------------------------
    def owned(self) -> dict[str, JournalEntry]:
        with self._lock:
            return {p: JournalEntry(**asdict(e)) for p, e in self._entries.items()}

    def original(self, path: str) -> str | None:
        with self._lock:
            e = self._entries.get(str(path))
            return None if e is None else e.original

    # -- changing files ----------------------------------------------------------------------
    def apply(
        self, action_id: str, writes: Iterable[FileWrite | tuple[str, str]], *, kind: str = ""
    ) -> list[AppliedWrite]:
        """Write all, in order, journaling each original first; on any failure roll back and raise ActionError.

        The journal goes to disk twice per action, not twice per file: once durably before the first
        write (every original and intended value), once after the last (what was written, without the
        directory fsync). On a disk saturated by other IO each durable save is a wait on the
        filesystem's commit, and a tick that acts waits for it.
        """
        items = [(w.path, w.new) if isinstance(w, FileWrite) else (str(w[0]), w[1]) for w in writes]
        with self._lock:
            try:
                fresh = self._record_intent(action_id, kind, items)
            except (CgroupFileError, JournalError, OSError) as e:
                raise ActionError(f"{_one_line(e)} (nothing written)") from None
            done: list[AppliedWrite] = []
            try:
                for path, new in items:
                    done.append(self._write_one(path, new))
            except (CgroupFileError, JournalError, OSError) as e:
                self._forget_unwritten(fresh, {w.path for w in done})
                problems = self._undo(done)
                extra = f"; rollback problems: {'; '.join(problems)}" if problems else ""
                raise ActionError(f"{_one_line(e)} (rolled back {len(done)} earlier write(s){extra})") from None
            with contextlib.suppress(JournalError):  # the durable intent already restores these writes
                self._save(sync_directory=False)
            self._actions.setdefault(action_id, []).extend(done)
            return done

    def _record_intent(self, action_id: str, kind: str, items: list[tuple[str, str]]) -> set[str]:
        """Journal (durably) the original of every file the action will write, before any is written.

        Returns the paths this action owns for the first time. On failure nothing stays journaled for
        them and the error propagates."""
        fresh: set[str] = set()
        try:
            for path, new in items:
                self._seq += 1
                entry = self._entries.get(path)
                if entry is None:
                    self._entries[path] = JournalEntry(path, self._read(path).strip(), None, new, self._seq,
                                                       action_id, kind)
                    fresh.add(path)
                else:
                    entry.pending, entry.seq, entry.action_id = new, self._seq, action_id
                    entry.kind = kind or entry.kind
            self._save()  # the originals are on disk before any file changes
        except BaseException:
            self._forget_unwritten(fresh, set())
            raise
        return fresh

    def _forget_unwritten(self, fresh: set[str], written: set[str]) -> None:
        """Drop the intent for files the action did not get to: new entries go, older ones lose pending."""
        for path in fresh - written:
            self._entries.pop(path, None)
        for path, entry in self._entries.items():
            if path not in written:
                entry.pending = None

    def _write_one(self, path: str, new: str) -> AppliedWrite:
        before = self._read(path).strip()
        entry = self._entries[path]  # journaled by _record_intent
        entry.pending = new
        try:
            self._write(path, new)
        except BaseException:
            if entry.last_written is None and same_value(self._read_quietly(path), entry.original):
                del self._entries[path]  # never changed: not ours
            else:
                entry.pending = None
            raise
        after = (self._read_quietly(path) or new).strip()
        entry.last_written, entry.pending = after, None
        return AppliedWrite(path, before, after)

    def _undo(self, done: Sequence[AppliedWrite]) -> list[str]:
        """Restore each file in ``done`` to its pre-action value: reverse order of last write, once each."""
        problems: list[str] = []
        for w, before in _pre_action_values(done):
            try:
                self._write(w.path, before)
            except CgroupVanished:
                pass
            except CgroupFileError as e:
                problems.append(_one_line(e))
                continue
            entry = self._entries.get(w.path)
            if entry is not None and same_value(before, entry.original):
                del self._entries[w.path]
            elif entry is not None:
                entry.last_written = (self._read_quietly(w.path) or before).strip()
        with contextlib.suppress(JournalError):
            self._save()
        return problems

    def revert(self, action_id: str) -> RestoreReport:
        """Undo one action: its files back to the values they had before it (reverse order, once each).

        A file changed since by someone else is left alone (``foreign``).
        """
        report = RestoreReport()
        with self._lock:
            done = self._actions.pop(action_id, [])
            for w, before in _pre_action_values(done):
                entry = self._entries.get(w.path)
                ours = entry.last_written if entry is not None else w.after
                if not self._put_back(w.path, before, [ours], report):
                    continue
                if entry is not None and same_value(before, entry.original):
                    del self._entries[w.path]
                elif entry is not None:
                    entry.last_written = (self._read_quietly(w.path) or before).strip()
            self._save()
        return report

    def restore_all(self) -> RestoreReport:
        """Clean shutdown: every owned file back to its original, newest write first, once each."""
        with self._lock:
            report = self._restore_entries(list(self._entries.values()))
            self._actions.clear()
            return report

    def reconcile(self, *, reown: bool = False) -> RestoreReport:
        """At start: deal with what a previous (crashed) run left in the journal.

        Default: restore the originals. ``reown=True``: keep the entries (this run now owns the files and
        restores them at its own shutdown); only entries whose cgroup vanished are dropped.
        """
        with self._lock:
            entries = list(self._entries.values())
            if not reown:
                report = self._restore_entries(entries)
            else:
                report = RestoreReport()
                for e in entries:
                    current = self._read_quietly(e.path)
                    if current is None:
                        report.vanished.append(e.path)
                        del self._entries[e.path]
                    else:
                        e.last_written, e.pending = current.strip(), None
                        report.reowned.append(e.path)
                if entries:
                    self._save()
            if entries:
                log.info("journal reconcile (%s): %s", "reown" if reown else "restore", report.summary())
            return report

    def _restore_entries(self, entries: list[JournalEntry]) -> RestoreReport:
        report = RestoreReport()
        for e in sorted(entries, key=lambda e: -e.seq):
            # Before our first write is recorded (last_written None) any current value may be ours.
            ours = [v for v in (e.last_written, e.pending) if v is not None] if e.last_written is not None else []
            if self._put_back(e.path, e.original, ours, report, unchanged_if_equal=True):
                self._entries.pop(e.path, None)
        # Nothing to restore, nothing to save: the agent reconciles an empty journal at every start.
        if entries:
            self._save()
        return report

    def _put_back(self, path: str, value: str, ours: list[str], report: RestoreReport,
                  unchanged_if_equal: bool = False) -> bool:
        """Write ``value`` back to ``path``; True when it was written (``report.restored``).

        Not written, and said in ``report``: the file vanished (entry dropped), someone else changed
        it since (its value is none of ``ours``; entry dropped, left alone), it already holds
        ``value`` (with ``unchanged_if_equal``), or the read/write failed (entry kept, to retry).
        """
        try:
            current = self._read_or_none(path)
        except CgroupFileError as exc:
            report.failed.append(_one_line(exc))
            return False
        if current is None:
            report.vanished.append(path)
            self._entries.pop(path, None)
            return False
        if unchanged_if_equal and same_value(current, value):
            report.unchanged.append(path)
            self._entries.pop(path, None)
            return False
        if ours and not any(same_value(current, v) for v in ours):
            report.foreign.append(path)
            log.warning("not restoring %s: changed by someone else since (now %r, we wrote %r)",
                        path, current.strip(), ours[0])
            self._entries.pop(path, None)
            return False
        try:
            self._write(path, value)
        except CgroupVanished:
            report.vanished.append(path)
            self._entries.pop(path, None)
            return False
        except CgroupFileError as e:
            report.failed.append(_one_line(e))
            return False  # entry kept: a later restore_all/reconcile tries again
        report.restored.append(path)
        return True

    def _read_or_none(self, path: str) -> str | None:
        # Gone (cgroup removed, or the file absent on this host) reads as None; other errors propagate.
        try:
            return self._read(path)
        except (CgroupVanished, ResourceUnavailable):
            return None


    def _read_quietly(self, path: str) -> str | None:
        try:
            return self._read(path)
        except CgroupFileError:
            return None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _pre_action_values(done: Sequence[AppliedWrite]) -> list[tuple[AppliedWrite, str]]:
    """Each path of an action once, latest write first, with the value it had before the action
    (the earliest ``before`` of that path within it): the order and values an undo writes."""
    out: list[tuple[AppliedWrite, str]] = []
    seen: set[str] = set()
    for w in reversed(done):
        if w.path not in seen:
            seen.add(w.path)
            out.append((w, next(x.before for x in done if x.path == w.path)))
    return out


class PlanKeys:
    """Journal action keys for applied plans, unique per apply.

    A key made from ``id(plan)`` alone is not unique: once a plan object is freed, a later plan can
    get the same id and its revert would find the earlier action's writes (and restore the earlier
    "before" values). So each apply takes a fresh key, remembered under the plan's id until revert.
    """

    def __init__(self, kind: object) -> None:
        self.kind = kind
        self._keys: dict[int, str] = {}
        self._seq = itertools.count(1)

    def for_apply(self, plan: Plan) -> str:
        key = f"{self.kind}:{id(plan):x}:{next(self._seq)}"
        self._keys[id(plan)] = key
        return key

    def for_revert(self, plan: Plan) -> str | None:
        return self._keys.pop(id(plan), None)


class JournaledFileActuator:
    """Base for actuators whose plans are file writes: ``apply``/``revert`` go through the journal.

    Subclasses set ``kind`` and implement ``plan``. Each applied plan is one journal action, keyed by
    the plan object (the manager keeps the plan alive while the action is active).
    """

    kind: object = ""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._plan_keys = PlanKeys(self.kind)

    def apply(self, plan: Plan) -> None:
        self.journal.apply(self._plan_keys.for_apply(plan), plan.writes, kind=str(self.kind))

    def revert(self, plan: Plan) -> None:
        key = self._plan_keys.for_revert(plan)
        if key is None:
            raise ActionError(f"revert of {self.kind}: this plan was not applied by this actuator")
        report = self.journal.revert(key)
        if report.failed:
            raise ActionError(f"revert of {self.kind} incomplete: {'; '.join(report.failed)}")
