# SPDX-License-Identifier: Apache-2.0
"""Statistics tables of striped slots, read in place: what moved since the last read, and nothing else.

bpf/runqlat.bpf.c keeps a cgroup's (and a who-ran-instead pair's) counters in a slot of a BPF array
with a few copies each (CPUs write their own copy, or share one past the stripes with atomic adds), an
index map from key to slot and a stack of free slots. This module is the user side of that layout,
whatever the statistics are: which slots moved, their copies, and giving a slot back.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from probes.engine import LoadedProbe

SLOT_READ_AHEAD = 64  # slots read past the highest one in use: new keys take the next never-used slots


# What a kernel without BPF_MAP_LOOKUP_AND_DELETE_ELEM for hash maps (before 5.14) says: EINVAL, or
# ENOTSUPP (524, kernel-internal, no errno name), or EOPNOTSUPP.
_TAKE_UNSUPPORTED = frozenset({errno.EINVAL, 524, errno.EOPNOTSUPP})


@dataclass(frozen=True)
class SlotChange:
    """A slot whose values changed since the last read: the key it held then and holds now (None: free)."""

    slot: int
    old_key: bytes | None
    key: bytes | None
    raw: bytes  # its copies as read (see StripedSlots.values)


def mapped_words(probe: LoadedProbe, name: str) -> np.ndarray | None:
    """A mapped BPF array as u64 words (None where it is not mapped: read and zeroed by syscalls)."""
    mapped = probe.map_mmap(name) if hasattr(probe, "map_mmap") else None
    return None if mapped is None else np.frombuffer(mapped, dtype="<u8")


class StripedSlots:
    """Statistics kept in slots of `copies` copies each (bpf/runqlat.bpf.c: a striped array, slot k's
    copies at k * copies + i): `index` maps a key to its slot, each copy ends with the key it belongs
    to (zeros: not used by its CPUs yet), and `free` is the stack of slots the BPF side may reuse.

    The array is read in place where it is mmapable (BPF_F_MMAPABLE), else with batched syscalls. A
    tick looks at `change_words` of each used slot's copies (counters that grow with every update, and
    the owner) and copies out only the slots whose words moved: an idle cgroup costs those few words."""

    def __init__(self, probe: LoadedProbe, index: str, stats: str, free: str, value_size: int,
                 key_size: int, copies: int, change_words: tuple[int, ...],
                 also_zero: tuple[tuple[str, int], ...] = ()) -> None:
        self.probe, self.index, self.stats, self.free_stack, self.value_size = probe, index, stats, free, value_size
        self.key_size, self.copies = key_size, copies
        self.also_zero = also_zero  # (map, value size) indexed by the same slots, zeroed with it when it is freed
        self._aligned = (value_size + 7) // 8 * 8
        self._words = self._aligned // 8 * copies  # u64 words of one slot, every copy
        self._columns = np.array([c * (self._aligned // 8) + w for c in range(copies) for w in change_words])
        self._mapped = mapped_words(probe, stats)
        # Maps zeroed with it: mapped where they can be (else a syscall zeroes the value)
        self._also_mapped = {name: (mapped_words(probe, name), (size + 7) // 8) for name, size in also_zero}
        self._seen = np.zeros((0, len(self._columns)), dtype="<u8")  # change words of the used slots, last read
        self._key_of: dict[int, bytes] = {}  # slot -> the key owning it at the last read_changed
        self._freed: list[tuple[int, bytes]] = []  # (slot, key) freed by userspace since the last read_changed
        # The probe's lookup-and-delete of one key (engines and test doubles without one: None)
        self._take = getattr(probe, "map_take", None)
        self.bytes_read = 0  # read in place (mapped words looked at, slots copied out); not syscalls' copies
        self.bytes_scanned = 0  # the part of it that was change words looked at in place (nothing copied)

    @property
    def used(self) -> int:
        """Slots holding a key at the last read."""
        return len(self._key_of)

    def _rows(self, n: int) -> np.ndarray:
        """The first `n` slots (fewer at the array's end) as a (slots, words) matrix: a view of the
        mapped array, or the bytes of one batched read."""
        if self._mapped is not None:
            got = min(n, len(self._mapped) // self._words)
            return self._mapped[: got * self._words].reshape(got, self._words)
        blob = self.probe.map_array_prefix(self.stats, n * self.copies)
        got = len(blob) // (self._words * 8)
        return np.frombuffer(blob, dtype="<u8", count=got * self._words).reshape(got, self._words)

    def read_changed(self, candidates: Iterable[int] | None = None) -> list[SlotChange]:
        """The slots whose values changed since the last call (all used ones at the first), and those
        userspace freed since.

        `candidates`: look only at these slots (the caller knows nothing else can have moved; mapped
        arrays only). Else every used slot: slots are handed out low first (freed ones reused before new
        ones), so the used ones are a prefix of the array; a few slots past it are looked at for new keys.
        A slot's key comes from its copies' owner field; the index is read only when those disagree (a
        slot freed and reused while a CPU was writing it)."""
        changes = [SlotChange(slot, old, None, b"") for slot, old in self._freed]
        self._freed.clear()
        if candidates is not None and self._mapped is not None:
            return changes + self._read_candidates(candidates)
        n = len(self._seen) + SLOT_READ_AHEAD
        while True:
            rows = self._rows(n)
            got = len(rows)
            seen = rows[:, self._columns]
            in_use = np.flatnonzero(seen.any(axis=1))
            used = int(in_use[-1]) + 1 if len(in_use) else 0
            if got < n or used + SLOT_READ_AHEAD // 2 <= got:  # the array's end, or room past the last used
                break
            n *= 2
        if self._mapped is not None:
            self.bytes_read += seen.nbytes
            self.bytes_scanned += seen.nbytes
        seen, prev = seen[:used], self._seen
        common = min(len(prev), used)
        slots = np.flatnonzero((seen[:common] != prev[:common]).any(axis=1)).tolist()
        slots += [common + int(i) for i in np.flatnonzero(seen[common:].any(axis=1))]  # newly used
        slots += [used + int(i) for i in np.flatnonzero(prev[used:].any(axis=1))]  # freed at the end
        self._seen = seen.copy()
        by_index: dict[int, bytes] = {}
        for slot in slots:
            changes.append(self._change(slot, rows[slot].tobytes() if slot < used else b"", by_index))
        return changes

    def _read_candidates(self, candidates: Iterable[int]) -> list[SlotChange]:
        """read_changed over the given slots only, in place: their change words against the last look."""
        assert self._mapped is not None
        rows = self._mapped[: len(self._mapped) // self._words * self._words].reshape(-1, self._words)
        # Unique by a set (np.unique imports numpy.ma to ask whether the array is masked, ~2 MiB of the
        # agent's RSS for this one call), then sorted and bounded in numpy: a busy victim's pairs are
        # thousands of candidates a tick of which a few moved, so Python touches only the moved ones.
        unique = candidates if isinstance(candidates, (set, frozenset)) else set(candidates)
        slots = np.fromiter(unique, dtype=np.int64, count=len(unique))
        slots.sort()
        slots = slots[(slots >= 0) & (slots < len(rows))]
        if not len(slots):
            return []
        seen = rows[slots[:, None], self._columns[None, :]]
        self.bytes_read += seen.nbytes
        self.bytes_scanned += seen.nbytes
        if len(self._seen) <= slots[-1]:
            grown = np.zeros((int(slots[-1]) + 1, len(self._columns)), dtype="<u8")
            grown[: len(self._seen)] = self._seen
            self._seen = grown
        changed = (seen != self._seen[slots]).any(axis=1)
        self._seen[slots] = seen
        by_index: dict[int, bytes] = {}
        # a moved slot with no change word set was freed (zeroed): nothing to copy out
        return [self._change(slot, rows[slot].tobytes() if in_use else b"", by_index)
                for slot, in_use in zip(slots[changed].tolist(), seen[changed].any(axis=1).tolist(), strict=True)]

    def _change(self, slot: int, raw: bytes, by_index: dict[int, bytes]) -> SlotChange:
        """A moved slot as read (`raw` empty: nothing in it now), its key from its copies' owners."""
        if self._mapped is not None:
            self.bytes_read += len(raw)
        tail = self.value_size - self.key_size
        unused = bytes(self.key_size)
        owners = {raw[at + tail : at + self.value_size] for at in range(0, len(raw), self._aligned)} - {unused}
        if len(owners) > 1:
            if not by_index:
                by_index.update({int.from_bytes(v, "little"): k for k, v in self.probe.map_items(self.index)})  # type: ignore[arg-type]
            key = by_index.get(slot)
        else:
            key = owners.pop() if owners else None
        old = self._key_of.pop(slot, None)
        if key is not None:
            self._key_of[slot] = key
        return SlotChange(slot, old, key, raw)

    def values(self, key: bytes, raw: bytes) -> list[bytes]:
        """The key's copies. A copy still marked for another key (a slot freed and reused while a CPU
        was writing it) is left out."""
        at, unused = self.value_size - len(key), bytes(len(key))
        copies = (raw[i : i + self.value_size] for i in range(0, len(raw), self._aligned))
        return [v for v in copies if v[at:] in (key, unused)]

    def copies_of(self, slot: int) -> list[bytes]:
        """A slot's copies as the kernel holds them now (one lookup each: tests and tools)."""
        first = slot * self.copies
        return [self.probe.map_lookup(self.stats, i.to_bytes(4, "little")) or b""  # type: ignore[misc]
                for i in range(first, first + self.copies)]

    def indexed_keys(self) -> list[bytes]:
        """Every key the index holds now (those taken since the last read included)."""
        return [key for key, _ in list(self.probe.map_items(self.index))]  # type: ignore[misc]

    def _unindex(self, key: bytes) -> bytes | None:
        """Take a key out of the index; its slot (None: it had none). One lookup-and-delete where the
        kernel does that for the index's hash map (Linux 5.14), else a lookup and a delete: quiet pairs
        give their slots back by the hundred, and each syscall saved is one per pair."""
        if self._take is not None:
            try:
                return self._take(self.index, key)  # type: ignore[no-any-return]
            except OSError as e:
                if e.errno not in _TAKE_UNSUPPORTED:
                    raise
                self._take = None  # this kernel cannot: the two calls from now on
        slot = self.probe.map_lookup(self.index, key)
        if slot is None or not self.probe.map_delete(self.index, key):
            return None
        return slot  # type: ignore[return-value]

    def free(self, key: bytes) -> bool:
        """Unindex a key, zero its slot's copies, then let the BPF side reuse the slot."""
        slot = self._unindex(key)
        if slot is None:
            return False
        n = int.from_bytes(slot, "little")  # type: ignore[arg-type]
        # Said by the next read_changed, whatever the BPF side does with the slot meanwhile.
        self._freed.append((n, self._key_of.pop(n, key)))
        if n < len(self._seen):
            self._seen[n] = 0
        if self._mapped is not None:
            self._mapped[n * self._words : (n + 1) * self._words] = 0
        else:
            for i in range(n * self.copies, (n + 1) * self.copies):
                self.probe.map_zero(self.stats, i.to_bytes(4, "little"))
        for name, (words, row) in self._also_mapped.items():
            if words is not None:
                words[n * row : (n + 1) * row] = 0
            else:
                self.probe.map_zero(name, slot)  # type: ignore[arg-type]
        self.probe.map_push(self.free_stack, slot)  # type: ignore[arg-type]
        return True
