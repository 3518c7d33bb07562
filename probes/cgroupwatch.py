# SPDX-License-Identifier: Apache-2.0
"""Which cgroups' files to read this tick: the cost follows what happened, not how many cgroups exist.

A node with 300 pods has ~900 pod, container and QoS cgroups, and almost all of them are idle almost
all the time. Reading a dozen files of each one every tick cost the agent a quarter of a core. The
kernel already says who moved: the BPF probes key their maps by cgroup, and a task cannot use CPU,
allocate or connect without first being woken, which runqlat counts. So a cgroup is read when

- it is new (first sight: everything);
- a probe's per-cgroup count moved for it or for one of its descendants (a pod sums its containers);
- its CPU usage moved at its last read (a lone spinner never waits, so it is followed while it runs):
  then its usage file is looked at first, and a cgroup whose usage stood still (the woken task went
  back to sleep) is not read further and is not new;
- it is on the every-tick PSI list (latency-sensitive pods: their stalls are the victim signal, and a
  task blocked on IO accumulates stall time without waking);
- its turn comes on the slow wheel: every cgroup once per ``slow_refresh_ticks`` (30), spread evenly over
  the ticks, for a run no probe saw: the turn reads its usage file (kept open: one pread) and the rest
  of its CPU files only when that moved since its last read;
- its slow turn comes: one wheel turn in ``slow_files_turns`` (4, so every 120 ticks), for what moves
  without activity: its cpuset (the CPU manager rewrites a pool), its memory usage (page cache reclaimed
  by others; ``memory.stat`` when that changed) and whether it has pressure files now.

Lateness that follows (at 1 s ticks): a cpuset rewritten, or memory that moved, while the cgroup stays
idle is seen up to 120 s late (it was 30 s before the slow turn: the two reads were two thirds of an idle
turn's); a CPU run no probe saw, up to 30 s late, as before. Memory (``memory.stat``) is also read on first
sight, every tick while a probe saw the cgroup reclaim, and at most every ``memory_refresh_ticks`` while it
is active, and then (not reclaiming) only when its usage file's text changed since its last read; a cgroup
without a memory reading (no memory files at its last read: the controller not enabled for it yet) is
looked at again on its slow turn only, not each time it wakes (memory files appearing: up to 120 s late);
one without CPU files (listed from another hierarchy, or not made there yet) is looked for them on its slow
turn, or when a probe sees it run.
CPU limits (quota, period) are read on the wheel when its usage moved and every ``memory_refresh_ticks``
while it keeps running, not for a task that wakes now and then. Unread cgroups keep their last readings;
``changed`` says which were read this tick, so consumers do per-cgroup work only for those.
Cgroup ids are the directories' inode numbers (what the BPF side reports), taken once per new path.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from probes.cgroupfiles import (
    CPU_PRESSURE,
    CPU_STAT,
    CPUACCT_USAGE,
    CPUACCT_USAGE_PERCPU,
    CPUSET_EFFECTIVE_CPUS,
    MEMORY_USAGE,
    PRESSURE,
    CgroupFileParseError,
)
from probes.cgroupfs import CgroupLayout, Hierarchy, relative_dir
from probes.cpuacct import CgroupCpuReader, CgroupCpuStat
from probes.host import HotFiles, read_small
from probes.memstat import MemStat, MemStatReader
from probes.psi import RESOURCES, PsiReading

SLOW_REFRESH_TICKS = 30  # every cgroup's usage is looked at least this often (ticks), activity or not
# Its cpuset, memory usage and whether it has pressure files: on one wheel turn in this many (120 ticks)
SLOW_FILES_TURNS = 4
MEMORY_REFRESH_TICKS = 5  # memory.stat of an active cgroup that is not reclaiming: at most this often


_File = tuple[str, str]  # a kind of file: its hierarchy's Hierarchy.prefix and the file's name


@dataclass(frozen=True, slots=True)
class _Files:
    """Where the files a watched cgroup is read through are: per kind of file, the prefix of its hierarchy
    (:attr:`Hierarchy.prefix`) and its name; None where there is no such hierarchy. One per CgroupWatch: a
    watched cgroup keeps its relative directory and makes a file's full name when it reads it (five full
    names kept per cgroup were ~1.2 KiB each, 1 MiB at 300 pods). One attribute per kind, so a misspelt
    kind is an AttributeError, not a file silently absent."""

    cpuset: _File | None = None  # its effective CPUs
    percpu: _File | None = None  # v1 cpuacct.usage_percpu
    usage: _File | None = None  # cpuacct.usage on v1, cpu.stat on v2: did it run since its last turn?
    memory_usage: _File | None = None  # memory.usage_in_bytes on v1, memory.current on v2
    psi_probe: _File | None = None  # v2 cpu.pressure: whose presence says it has pressure files
    v2: str | None = None  # the v2 mount's prefix, where pressure files are

    @staticmethod
    def of_layout(layout: CgroupLayout) -> _Files:
        cpuset_h, cpuacct_h, cpu_h, mem_h = (layout.hierarchy_for("cpuset"), layout.v1.get("cpuacct"),
                                             layout.hierarchy_for("cpu"), layout.hierarchy_for("memory"))
        usage = percpu = None
        if cpuacct_h is not None:
            percpu = (cpuacct_h.prefix, CPUACCT_USAGE_PERCPU.name(1))
            usage = (cpuacct_h.prefix, CPUACCT_USAGE.name(1))
        elif cpu_h is not None and cpu_h.version == 2:
            usage = (cpu_h.prefix, CPU_STAT.name(2))
        v2 = layout.v2.prefix if layout.v2 is not None else None
        return _Files(
            cpuset=(cpuset_h.prefix, *CPUSET_EFFECTIVE_CPUS.names(cpuset_h.version)) if cpuset_h is not None else None,
            percpu=percpu, usage=usage,
            memory_usage=(mem_h.prefix, MEMORY_USAGE.name(mem_h.version)) if mem_h is not None else None,
            psi_probe=(v2, CPU_PRESSURE.name(2)) if v2 is not None else None, v2=v2)


_NEVER = 1 << 62  # a tick no reading was taken at: "moved at _NEVER" is "not known not to have moved"


@dataclass(slots=True)  # three per watched cgroup: no per-instance dict
class _Seen:
    """One kind of a watched cgroup's readings (cpu, memory, psi): its usage file's text (its pressure
    files' texts) at its last read, the tick of that read, and of the last read that found it changed."""

    text: object = None
    read_at: int = -1
    moved_at: int = _NEVER

    def note(self, text: str | None, tick: int) -> bool:
        """A read of its usage file: kept for the next comparison; True if the same text as at its last read."""
        same = text is not None and self.text == text
        self.text = text
        self.read_at = tick
        if not same:
            self.moved_at = tick
        return same


@dataclass(slots=True)  # one per watched cgroup: no per-instance dict
class _Watched:
    """One listed cgroup: where its files are and when it was last read."""

    path: str
    slot: int
    files: _Files
    has_psi: bool = False  # its v2 directory has pressure files
    last_memory_tick: int = -1_000_000
    cpu_reader: CgroupCpuReader | None = None
    mem_reader: MemStatReader | None = None
    last_limits_tick: int = -1_000_000
    cpuset_text: str | None = None  # its cpuset file's text at its last read
    # Per kind of reading: its usage file's (pressure files') text at its last read, and when it was read
    # and last found changed. A child's wheel turn is skipped when its parent, read this turn, has not
    # moved since.
    cpu_seen: _Seen = field(default_factory=_Seen)
    memory_seen: _Seen = field(default_factory=_Seen)
    psi_seen: _Seen = field(default_factory=_Seen)
    rel: str = field(init=False, default="")  # its directory after a hierarchy's prefix (relative_dir), made once

    def __post_init__(self) -> None:
        self.rel = relative_dir(self.path)

    def file(self, kind: _File | None) -> str | None:
        """Its file of one kind (an attribute of ``_Files``), None where there is no such hierarchy."""
        return None if kind is None else kind[0] + self.rel + kind[1]

    def files_kept(self) -> list[str]:
        """Every file of it that may be kept open (to close them when it goes)."""
        return [*(self.cpu_reader.files() if self.cpu_reader else ()), *(self.mem_reader.files() if self.mem_reader else ()),
                *(file for kind in (self.files.percpu, self.files.usage, self.files.memory_usage)
                  if (file := self.file(kind)) is not None),
                *(os.path.join(self.psi_dir, f"{r}.pressure") for r in RESOURCES if self.psi_dir is not None)]

    @property
    def psi_dir(self) -> str | None:
        """The v2 directory holding its pressure files (ending in "/"), when it has them."""
        return self.files.v2 + self.rel if self.has_psi and self.files.v2 is not None else None


class _NotingReader:
    """A file reader that notes the text of the cgroup's usage files as the cgroup's readers ask for them
    (``usage`` for its CPU usage file, ``memory_usage`` for its memory usage file: ``_Seen.note``): a wheel
    turn that finds the same text skips that kind's other files, also when the cgroup was read (it ran)
    since its last turn. Its other files are read through ``read``. One per watch and way of reading,
    pointed at the cgroup being read: no closure, dict or file name made per read. A kind the watch has
    no file of (``_Files``) is not noted."""

    __slots__ = ("notes_cpu", "notes_memory", "read", "tick", "watched")

    def __init__(self, files: _Files, read: Callable[[str], str | None]) -> None:
        self.read = read
        self.notes_cpu = files.usage is not None
        self.notes_memory = files.memory_usage is not None
        self.watched: _Watched | None = None
        self.tick = 0

    def usage(self, file: str) -> str | None:
        """Its CPU usage file (``_Files.usage``), noted."""
        assert self.watched is not None
        return self._noted(file, self.watched.cpu_seen if self.notes_cpu else None)

    def memory_usage(self, file: str) -> str | None:
        """Its memory usage file (``_Files.memory_usage``), noted."""
        assert self.watched is not None
        return self._noted(file, self.watched.memory_seen if self.notes_memory else None)

    def _noted(self, file: str, seen: _Seen | None) -> str | None:
        """The file's text, noted in ``seen`` (None: a kind the watch has no file of, not noted)."""
        text = self.read(file)
        if seen is not None:
            seen.note(text, self.tick)
        return text


_PRESSURE_NAMES = tuple(PRESSURE[resource].name(2) for resource in RESOURCES)  # in RESOURCES order
FILES_KEPT_PER_CGROUP = 6  # at most, of an active cgroup: CPU usage and stat, per-CPU usage, memory, pressure


class CgroupWatch:
    """The readings of every listed cgroup, kept current at a cost that follows activity."""

    def __init__(self, layout: CgroupLayout, slow_refresh_ticks: int = SLOW_REFRESH_TICKS,
                 memory_refresh_ticks: int = MEMORY_REFRESH_TICKS, slow_files_turns: int = SLOW_FILES_TURNS) -> None:
        self.layout = layout
        self.slow_refresh_ticks = max(1, slow_refresh_ticks)
        self.slow_files_turns = max(1, slow_files_turns)
        self.memory_refresh_ticks = max(1, memory_refresh_ticks)
        self.cpu_h = layout.hierarchy_for("cpu")
        self.mem_h = layout.hierarchy_for("memory")
        self.cpuset_h = layout.hierarchy_for("cpuset")
        self.cpuacct_h = layout.v1.get("cpuacct")
        self.v2 = layout.v2
        # Hierarchies whose ids BPF maps may report, to map an id back to a listed path.
        self._id_hierarchies = [h for h in {self.cpu_h, self.mem_h, layout.cpu} if h is not None]
        self.files = _Files.of_layout(layout)
        self.hot = HotFiles()  # files of cgroups read tick after tick (active ones), kept open
        self._noting_plain = _NotingReader(self.files, read_small)
        self._noting_hot = _NotingReader(self.files, self.hot.read)
        self.watched: dict[str, _Watched] = {}
        self._wheel: list[set[str]] = [set() for _ in range(self.slow_refresh_ticks)]
        self._next_slot = 0
        self._unread: set[str] = set()  # listed, not read yet
        self._listed_last: object = None
        self._moving: set[str] = set()  # CPU usage moved at the last read: read again next tick
        self._psi_moved: set[str] = set()  # its last new pressure reading had stall totals moving
        # (the every-tick PSI list, the watched cgroups of it) as last worked out; None after any cgroup
        # was added or dropped
        self._psi_of: tuple[frozenset[str], set[str]] | None = None
        self._path_of_id: dict[tuple[str, int], str] = {}
        self._ids_of_path: dict[str, list[tuple[str, int]]] = {}
        self.tick_count = 0
        # Readings (listed cgroups only), updated in place for the cgroups read.
        self.cpu: dict[str, CgroupCpuStat] = {}
        self.mem: dict[str, MemStat] = {}
        self.psi: dict[str, dict[str, PsiReading]] = {}
        self.psi_read_s: dict[str, float] = {}  # monotonic time of each PSI reading (rates need their own interval)
        self.cpus: dict[str, tuple[int, ...]] = {}
        self.percpu: dict[str, tuple[int, ...]] = {}

    # -- listing -----------------------------------------------------------------------------
    def set_listed(self, paths: Iterable[str]) -> None:
        """The cgroups to watch; new ones are read in full at the next tick, gone ones forgotten.

        Callers that hand the same (immutable) collection again cost one identity check.
        """
        if isinstance(paths, frozenset) and paths is self._listed_last:
            return
        self._listed_last = paths
        listed = paths if isinstance(paths, (set, frozenset)) else set(paths)
        for path in self.watched.keys() - listed:
            self._drop(path)
        for path in sorted(listed - self.watched.keys(), key=_depth):  # parents first: children join their turn
            self._add(path)

    def _add(self, path: str) -> None:
        parent = self.watched.get(path.rpartition("/")[0])
        # A cgroup takes its turn with its parent (a pod's containers with their pod), whose reading that
        # turn may vouch for it (see tick), unless that turn already holds twice the average and a few more.
        if parent is not None and len(self._wheel[parent.slot]) < 2 * (len(self.watched) // self.slow_refresh_ticks) + 4:
            slot = parent.slot
        else:
            slot = self._next_slot
            self._next_slot = (slot + 1) % self.slow_refresh_ticks
        w = _Watched(path, slot, self.files, cpu_reader=CgroupCpuReader(self.layout, path),
                     mem_reader=MemStatReader(self.layout, path) if self.mem_h is not None else None)
        w.has_psi = _has_psi(w)
        self.watched[path] = w
        self._psi_of = None
        self._wheel[slot].add(path)
        self._unread.add(path)
        ids = []
        for h in self._id_hierarchies:
            try:
                ino = os.stat(h.dir_of(path)).st_ino
            except OSError:
                continue
            key = (str(h.mount), ino)
            self._path_of_id[key] = path
            ids.append(key)
        self._ids_of_path[path] = ids

    def close(self) -> None:
        self.hot.close()

    def _drop(self, path: str) -> None:
        w = self.watched.pop(path)
        self._psi_of = None
        # An open file pins a removed cgroup in the kernel: close this one's now.
        self.hot.close(w.files_kept())
        self._wheel[w.slot].discard(path)
        self._unread.discard(path)
        self._moving.discard(path)
        self._psi_moved.discard(path)
        for key in self._ids_of_path.pop(path, ()):
            if self._path_of_id.get(key) == path:
                del self._path_of_id[key]
        for readings in (self.cpu, self.mem, self.psi, self.psi_read_s, self.cpus, self.percpu):
            readings.pop(path, None)

    # -- activity ----------------------------------------------------------------------------
    def path_of_id(self, cgroup_id: int, hierarchy: Hierarchy | None) -> str | None:
        if hierarchy is None:
            return None
        return self._path_of_id.get((str(hierarchy.mount), cgroup_id))

    # -- one tick ----------------------------------------------------------------------------
    def tick(self, active: Iterable[str] = (), memory_moved: Iterable[str] = (),
             psi_every_tick: Iterable[str] = (), errors: list[str] | None = None) -> set[str]:
        """Read what is due; returns the cgroups read (their readings replaced) this tick. ``memory_moved``:
        active cgroups whose memory a probe saw move (reclaim): their memory files are read this tick."""
        t = self.tick_count = self.tick_count + 1
        active_set = _with_ancestors(active, self.watched)
        memory_set = _with_ancestors(memory_moved, self.watched)
        slot = t % self.slow_refresh_ticks
        unread, self._unread = self._unread, set()
        due_full = self._wheel[slot] | unread
        # This slot's turn of the slower wheel (cpuset, memory usage, pressure files appearing): the slots
        # take it in turn, so each tick reads about as many of those files.
        slow_turn = (t // self.slow_refresh_ticks + slot) % self.slow_files_turns == 0
        due_cpu = (active_set | memory_set | self._moving) - due_full
        due_psi = self._psi_listed(psi_every_tick) - due_full - due_cpu
        # Those are read again next tick, through open files: room for all of them (usage, cpu.stat, per-CPU
        # usage, memory, pressure), or each read would reopen its file; and every usage file (a wheel turn's).
        self.hot.fit(FILES_KEPT_PER_CGROUP * len(due_cpu) + len(RESOURCES) * len(due_psi) + len(self.watched))
        changed: set[str] = set()
        still: set[str] = set()  # read in full this tick and found as at their last read
        for path in sorted(due_full, key=_depth):  # parents first
            w = self.watched[path]
            slow = slow_turn or path in unread  # first sight: everything
            memory = slow or path in memory_set  # and every tick while a probe sees it reclaim
            parent = self.watched.get(path.rpartition("/")[0])
            if parent is not None and parent.path in still and path in self.cpu \
                    and _vouched_for(w, parent, memory and path in self.mem):
                if slow:
                    _read_cpuset(w, self.cpus, self.cpuset_h)
                if path in self.psi:  # as an unchanged read: the next stall's rate is over the time since now
                    self.psi_read_s[path] = time.monotonic()
                continue
            if self._read(w, t, full=True, memory=memory, slow=slow, errors=errors):
                changed.add(path)
            else:
                still.add(path)
        for path in due_cpu:
            w = self.watched[path]
            if path not in active_set and path not in memory_set and self._still(w):
                # Followed only because it ran at its last read, and its usage stands still since: it
                # stopped (a woken task went back to sleep), nothing else of it is read, or new.
                self._moving.discard(path)
                if self._read_psi(w, hot=True):
                    changed.add(path)
                continue
            # One without a memory reading (no memory files at its last read) is looked at again on its
            # slow turn, not each time it wakes.
            memory = path in memory_set or (path in self.mem and t - w.last_memory_tick >= self.memory_refresh_ticks)
            # Memory not seen moving and the same memory usage text as at its last read: its memory reading is
            # current (memory.stat and four more files on v1 not read again for a task that woke briefly).
            if memory and path not in memory_set and path in self.mem and self._unchanged(
                    w, self.files.memory_usage, self.hot.read):
                memory = False
                w.last_memory_tick = t
            self._read(w, t, full=False, memory=memory, errors=errors)
            changed.add(path)
        for path in due_psi:
            if self._read_psi(self.watched[path], hot=True):
                changed.add(path)
        return changed

    def _set_has_psi(self, w: _Watched, has_psi: bool) -> None:
        if has_psi != w.has_psi:
            w.has_psi = has_psi
            self._psi_of = None  # the every-tick PSI list holds only those that have pressure files

    def _unchanged(self, w: _Watched, kind: _File | None, read: Callable[[str], str | None] = read_small) -> bool:
        """Of a cgroup read before: is its usage file of ``kind`` (``self.files.usage`` or ``.memory_usage``)
        the same text as at its last read (a turn, or a read because it ran)? Then the other files of that
        kind are not read: the readings are current, and an idle cgroup's wheel turn costs a few small
        reads. ``read``: the hot reader where it is read often."""
        if kind is None:
            return False
        text = read(kind[0] + w.rel + kind[1])
        if kind is self.files.usage:
            return w.cpu_seen.note(text, self.tick_count)
        return w.memory_seen.note(text, self.tick_count)

    def _still(self, w: _Watched) -> bool:
        """A followed cgroup (it ran at its last read) whose CPU usage file reads as then: it did not run."""
        return w.path in self.cpu and self._unchanged(w, self.files.usage, self.hot.read)

    def _psi_listed(self, psi_every_tick: Iterable[str]) -> set[str]:
        """The watched cgroups of the every-tick PSI list that have pressure files; none where no cgroup
        has them (v1), and worked out again only when a cgroup was added or dropped, found to have pressure
        files or not, or a new (frozen) PSI list came (it is most pods: a set a tick at 1,000 pods). A list
        that may change in place is worked out each tick."""
        if self.v2 is None:
            return set()
        watched = self.watched
        if not isinstance(psi_every_tick, frozenset):
            return {p for p in psi_every_tick if p in watched and watched[p].has_psi}
        if self._psi_of is None or self._psi_of[0] is not psi_every_tick:
            self._psi_of = (psi_every_tick, {p for p in psi_every_tick if p in watched and watched[p].has_psi})
        return self._psi_of[1]

    def _read(self, w: _Watched, t: int, *, full: bool, memory: bool, errors: list[str] | None,
              slow: bool = False) -> bool:
        """Read what is due of one cgroup; False when a wheel turn found nothing changed (nothing replaced).
        ``slow``: its slow turn (see tick): its cpuset, and whether it has pressure files now."""
        path = w.path
        # Wheel turns come once per cgroup per turn of the wheel: plain reads. A cgroup read outside
        # its turn is active, and likely read again next tick: its files stay open.
        read = self._noting_plain if full else self._noting_hot
        read.watched, read.tick = w, t
        moving = False
        replaced = False
        # A wheel turn reads its CPU files when its usage moved; one without them (at its last read), on its slow turn.
        if not full or (not self._unchanged(w, self.files.usage, self.hot.read) if path in self.cpu else slow):
            replaced = True
            before = self.cpu.get(path)
            # Quota and period: on wheel turns, and every few ticks while it keeps running (it ran at its
            # last read too): an actuator or a resize changes them, nothing else does, and they matter
            # while it runs. A task that wakes now and then is not a reason to read them (3 files on v1).
            limits = full or (path in self._moving and t - w.last_limits_tick >= self.memory_refresh_ticks)
            if limits:
                w.last_limits_tick = t
            cpu = w.cpu_reader.read(limits, read.read, read.usage) if w.cpu_reader is not None else None
            if cpu is None:
                self.cpu.pop(path, None)
            else:
                self.cpu[path] = cpu
                # First sight counts as moving: one more read tells whether it runs without ever waking.
                moving = before is None or before.usage_ns != cpu.usage_ns
        if moving:
            self._moving.add(path)
        else:
            self._moving.discard(path)
        if memory and not (full and path in self.mem and self._unchanged(w, self.files.memory_usage)):
            mem = w.mem_reader.read(read.read, read.memory_usage) if w.mem_reader is not None else None
            w.last_memory_tick = t
            if mem is None:  # no memory files (no such controller for it, or gone): new only if it had some
                replaced = self.mem.pop(path, None) is not None or replaced
            else:
                self.mem[path] = mem
                replaced = True
        if slow:
            _read_cpuset(w, self.cpus, self.cpuset_h)
            if not w.has_psi:  # one that has them is told by its reads (see _read_psi): no stat a turn
                self._set_has_psi(w, _has_psi(w))
        percpu_file = w.file(self.files.percpu) if moving else None
        if percpu_file is not None:  # where it ran moves only when it runs (and at first sight)
            text = read.read(percpu_file)
            if text is not None:
                try:
                    self.percpu[path] = CPUACCT_USAGE_PERCPU.parse(1, text)
                except CgroupFileParseError as e:
                    if errors is not None:
                        errors.append(f"{path}: cpuacct.usage_percpu {e}")
        return self._read_psi(w, hot=not full) or replaced

    def _read_psi(self, w: _Watched, hot: bool = False) -> bool:
        """Read its pressure files; False when nothing is new for the detector: the files hold the text of
        the last read (no stall since, averages unchanged) and that read already said its stalls stopped.

        Then the readings stay the same objects (consumers skip them: no row, no store sample) and only
        their time moves, so the next stall's rate is taken over the ticks since this read, not since the
        last change. The one read after a stall that finds the totals standing still is new (a rate of 0
        ends the stall), the reads after it are not. ``hot``: read every tick, so its files stay open."""
        psi_dir = w.psi_dir
        if psi_dir is None:
            return False
        path = w.path
        read = self.hot.read if hot else read_small
        texts = [read(psi_dir + name) for name in _PRESSURE_NAMES]  # no pathlib a tick
        if not hot and texts.count(None) == len(texts) and not _has_psi(w):
            # Its pressure files went (the cgroup is going): as a wheel turn that found no psi_probe file.
            self._set_has_psi(w, False)
            return False
        w.psi_seen.read_at = self.tick_count
        if texts == w.psi_seen.text and path in self.psi and path not in self._psi_moved:
            self.psi_read_s[path] = time.monotonic()
            return False
        w.psi_seen.moved_at = self.tick_count
        w.psi_seen.text = texts
        readings = _psi_readings(texts)
        if readings:
            before = self.psi.get(path)
            if before is not None and _totals(before) != _totals(readings):
                self._psi_moved.add(path)
            else:
                self._psi_moved.discard(path)
            self.psi[path] = readings
            self.psi_read_s[path] = time.monotonic()
        else:
            self._psi_moved.discard(path)
            self.psi.pop(path, None)
            self.psi_read_s.pop(path, None)
        return True


def _vouched_for(w: _Watched, parent: _Watched, has_memory: bool) -> bool:
    """On its wheel turn: its parent, read in full this turn and found as at its last read, has not moved
    since before this cgroup's own last read of each kind; then neither did it: its readings are current.

    A parent's CPU usage is the sum of its children's and only grows, its pressure totals count its
    children's stalls, and its memory usage holds its children's charges: unchanged since the child's
    read, none of them moved (memory: unless one child freed exactly what another charged). On a node of
    kubelet pods this skips the container turns of idle pods: two of their three reads on v1, more on v2
    (pressure files). ``has_memory``: it has a memory reading (none where its memory files are absent).
    Usage files are the watch's (``w.files``, the parent's too): where one kind has none, neither has one
    and that kind says nothing; pressure files are each cgroup's own (``psi_dir``)."""
    files = w.files
    if files.usage is not None and w.cpu_seen.read_at <= parent.cpu_seen.moved_at:
        return False
    if has_memory and files.memory_usage is not None and w.memory_seen.read_at <= parent.memory_seen.moved_at:
        return False
    return w.psi_dir is None or (parent.psi_dir is not None and w.psi_seen.read_at > parent.psi_seen.moved_at)


def _with_ancestors(paths: Iterable[str], watched: Mapping[str, _Watched]) -> set[str]:
    """The watched cgroups among ``paths`` and all their watched ancestors (they sum their children)."""
    out: set[str] = set()
    for path in paths:
        p = path
        while p and p not in out:
            if p in watched:
                out.add(p)
            parent = p.rpartition("/")[0]
            if parent == p:
                break
            p = parent
    return out


def _psi_readings(texts: list[str | None]) -> dict[str, PsiReading]:
    """Its pressure files' texts (in RESOURCES order, None where absent) as readings, the unparsable left out."""
    readings: dict[str, PsiReading] = {}
    for resource, text in zip(RESOURCES, texts, strict=True):
        try:
            lines = PRESSURE[resource].parse(2, text) if text is not None else None
        except CgroupFileParseError:
            lines = None
        if lines:
            readings[resource] = PsiReading(resource, lines.get("some"), lines.get("full"))
    return readings


def _has_psi(w: _Watched) -> bool:
    probe = w.file(w.files.psi_probe)
    return probe is not None and os.path.exists(probe)


def _read_cpuset(w: _Watched, cpus: dict[str, tuple[int, ...]], hierarchy: Hierarchy | None) -> None:
    """Its effective CPUs, on its turn: they change without activity (the CPU manager rewrites a pool)."""
    cpuset_file = w.file(w.files.cpuset)
    if cpuset_file is None or hierarchy is None:
        return
    text = read_small(cpuset_file)
    # The same text as at its last turn: the parsed set is current (cpusets change rarely, and parsing every
    # idle cgroup's list on each turn was a visible part of the wheel).
    if text is not None and (text != w.cpuset_text or w.path not in cpus):
        w.cpuset_text = text
        with contextlib.suppress(CgroupFileParseError):  # a value we cannot trust is skipped
            cpus[w.path] = CPUSET_EFFECTIVE_CPUS.parse(hierarchy.version, text)


def _totals(readings: Mapping[str, PsiReading]) -> list[tuple[str, int | None, int | None]]:
    """The stall totals of a cgroup's pressure readings (what its rates are made of)."""
    return [(resource, r.some.total_us if r.some else None, r.full.total_us if r.full else None)
            for resource, r in readings.items()]

def changed_ids(before: Mapping[int, int] | None, now: Mapping[int, int],
                among: Iterable[int] | None = None) -> list[int]:
    """Ids whose activity count differs from ``before`` (all of them when there is no before). ``among``:
    only these ids are looked at, in their order (those a probe says moved); ids not in ``now`` are not."""
    if before is None:
        return list(now)
    if among is None:
        return [cgid for cgid, n in now.items() if before.get(cgid) != n]
    return [cgid for cgid in among if cgid in now and before.get(cgid) != now[cgid]]


def _depth(path: str) -> int:
    return path.count("/")
