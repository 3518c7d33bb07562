# SPDX-License-Identifier: Apache-2.0
"""The runqlat snapshot reads its striped slot tables (a few change words of each slot's copies) and
decodes only the slots that changed: a tick's Python work follows what ran, not how many cgroups the
node has."""

from __future__ import annotations

import errno
import struct

from probes.striped_slots import SLOT_READ_AHEAD, StripedSlots

VALUE = 24  # two counters, then the owner key (8 bytes), like struct runq_cgroup_stats' tail
CPUS = 2
KEY = struct.Struct("<Q")


class FakeSlotMaps:
    """A striped slot array (CPUS copies a slot, slot k's at k * CPUS + i) and its index, as the kernel
    would hand them out; read with syscalls (no map_mmap)."""

    def __init__(self, entries: int = 4096) -> None:
        self.copies = [[bytes(VALUE)] * CPUS for _ in range(entries)]
        self.index: dict[bytes, int] = {}
        self.prefix_reads: list[int] = []
        self.index_reads = 0

    def put(self, slot: int, cpu: int, key: int, count: int) -> None:
        self.copies[slot][cpu] = struct.pack("<QQ", count, count * 10) + KEY.pack(key)
        self.index[KEY.pack(key)] = slot

    def map_array_prefix(self, name: str, n: int) -> bytes:
        self.prefix_reads.append(n)
        return b"".join(b"".join(c) for c in self.copies)[: n * VALUE]

    def map_lookup(self, name: str, key: bytes) -> list[bytes]:
        return list(self.copies[int.from_bytes(key, "little")])

    def map_items(self, name: str, split: bool = True):
        self.index_reads += 1
        return [(k, v.to_bytes(4, "little")) for k, v in self.index.items()]


def _slots(maps: FakeSlotMaps) -> StripedSlots:
    return StripedSlots(maps, "index", "stats", "free", VALUE, KEY.size, CPUS, (0, 1, 2))  # type: ignore[arg-type]


def test_only_changed_slots_come_back_and_an_idle_tick_has_none() -> None:
    maps = FakeSlotMaps()
    for slot in range(300):
        maps.put(slot, slot % CPUS, 1000 + slot, 1)
    slots = _slots(maps)
    first = slots.read_changed()
    assert [c.slot for c in first] == list(range(300))
    assert all(c.old_key is None and c.key == KEY.pack(1000 + c.slot) for c in first)
    assert slots.read_changed() == []  # nothing ran: nothing to decode
    maps.put(7, 1, 1007, 5)  # one cgroup's task waited on the other CPU
    (change,) = slots.read_changed()
    assert (change.slot, change.old_key, change.key) == (7, KEY.pack(1007), KEY.pack(1007))
    assert slots.values(change.key, change.raw) == [bytes(VALUE), maps.copies[7][1]]
    assert maps.index_reads == 0  # keys came from the slots' own owner fields


def test_freed_reused_and_new_slots_past_the_read_ahead() -> None:
    maps = FakeSlotMaps()
    for slot in range(10):
        maps.put(slot, 0, 500 + slot, 1)
    slots = _slots(maps)
    slots.read_changed()
    # userspace freed slot 3 (zeroed on every CPU); the last slot in use was freed too
    maps.copies[3] = [bytes(VALUE)] * CPUS
    maps.copies[9] = [bytes(VALUE)] * CPUS
    changes = {c.slot: c for c in slots.read_changed()}
    assert {s: (c.old_key, c.key) for s, c in changes.items()} == {3: (KEY.pack(503), None), 9: (KEY.pack(509), None)}
    # a new cgroup reuses slot 3, and many new ones take never-used slots far past the read-ahead
    maps.put(3, 1, 900, 2)
    for slot in range(9, 9 + 2 * SLOT_READ_AHEAD):
        maps.put(slot, 0, 10_000 + slot, 1)
    changes = {c.slot: c for c in slots.read_changed()}
    assert (changes[3].old_key, changes[3].key) == (None, KEY.pack(900))
    assert set(changes) == {3, *range(9, 9 + 2 * SLOT_READ_AHEAD)}
    assert slots.read_changed() == []


def test_a_slot_whose_cpu_copies_disagree_takes_its_key_from_the_index() -> None:
    """A slot freed and reused while a CPU was still writing it: one copy names the old owner."""
    maps = FakeSlotMaps()
    maps.put(0, 0, 41, 1)
    slots = _slots(maps)
    slots.read_changed()
    maps.put(0, 1, 42, 3)  # the new owner, indexed at slot 0; CPU 0's copy still says 41
    del maps.index[KEY.pack(41)]
    (change,) = slots.read_changed()
    assert maps.index_reads == 1 and change.key == KEY.pack(42) and change.old_key == KEY.pack(41)
    assert slots.values(change.key, change.raw) == [maps.copies[0][1]]  # the stale copy is left out


def test_moved_cgroup_slots_decode_at_once_as_copy_by_copy() -> None:
    """decode_cgroup_slots (all of a tick's moved slots in one numpy pass) gives what decoding and
    merging each copy does: summed slots, sums, counts and split counters, the largest all-time max;
    a slot none of whose copies are its own decodes empty."""
    import random

    from probes.hist import HIST_SLOTS, LatencyHistogram
    from probes.runqlat import CGROUP_STATS_SIZE, WaitSplit, decode_cgroup_slots

    rng = random.Random(39)

    def copy() -> bytes:
        words = [rng.randrange(1 << rng.choice((8, 20, 40, 60))) for _ in range(HIST_SLOTS + 3 + 7)]
        return struct.pack(f"<{len(words)}Q", *words) + KEY.pack(rng.randrange(1, 1 << 63))

    slots = [[copy() for _ in range(n)] for n in (2, 1, 0, 8, 3, 2)]
    assert all(len(v) == CGROUP_STATS_SIZE for values in slots for v in values)
    got = decode_cgroup_slots(slots)
    want = [(LatencyHistogram.decode_percpu(values), WaitSplit.decode_percpu(values)) for values in slots]
    assert got == want
    assert got[2] == (LatencyHistogram.empty(), WaitSplit())
    assert decode_cgroup_slots([]) == [] and decode_cgroup_slots([[]]) == [(LatencyHistogram.empty(), WaitSplit())]
    assert all(type(n) is int for n in got[0][0].slots)  # Python ints, as struct gives: no numpy scalars leak


class FakeIndexedSlots:
    """The calls free() makes: the index (key -> 4-byte slot), the stats copies zeroed one by one (no
    map_mmap), the free stack; with or without a kernel that takes a hash entry out in one call."""

    def __init__(self, take: str) -> None:
        self.index = {KEY.pack(k): (k - 100).to_bytes(4, "little") for k in range(100, 104)}
        self.calls: list[str] = []
        self.pushed: list[bytes] = []
        self.take = take  # "works", "einval" (a kernel before 5.14) or "absent" (an engine without it)

    def map_lookup(self, name: str, key: bytes) -> bytes | None:
        self.calls.append(f"lookup {name}")
        return self.index.get(key)

    def map_delete(self, name: str, key: bytes) -> bool:
        self.calls.append(f"delete {name}")
        return self.index.pop(key, None) is not None

    def map_zero(self, name: str, key: bytes) -> None:
        self.calls.append(f"zero {name}")

    def map_push(self, name: str, value: bytes) -> None:
        self.calls.append(f"push {name}")
        self.pushed.append(value)


class TakingSlots(FakeIndexedSlots):
    def map_take(self, name: str, key: bytes) -> bytes | None:
        self.calls.append(f"take {name}")
        if self.take == "einval":
            raise OSError(errno.EINVAL, "bpf_map_lookup_and_delete_elem: Invalid argument")
        return self.index.pop(key, None)


def test_a_freed_slot_leaves_the_index_in_one_call_where_the_kernel_can() -> None:
    """Quiet pairs give their slots back by the hundred: the index entry goes with one lookup-and-delete
    (Linux 5.14+), not a lookup then a delete; a kernel that refuses it (EINVAL) and an engine without
    it get the two calls, with the same slots freed, zeroed and pushed."""
    zeroes = ["zero stats"] * CPUS
    runs = {}
    for maps in (TakingSlots("works"), TakingSlots("einval"), FakeIndexedSlots("absent")):
        slots = StripedSlots(maps, "index", "stats", "free", VALUE, KEY.size, CPUS, (0, 1, 2))  # type: ignore[arg-type]
        assert slots.free(KEY.pack(101)) and slots.free(KEY.pack(103))
        assert not slots.free(KEY.pack(101))  # gone already
        runs[maps.take] = maps.calls
        assert maps.pushed == [(1).to_bytes(4, "little"), (3).to_bytes(4, "little")]
        assert set(maps.index) == {KEY.pack(100), KEY.pack(102)}
    assert runs["works"] == [*["take index", *zeroes, "push free"] * 2, "take index"]
    # refused once, then never asked again
    assert runs["einval"] == ["take index", *["lookup index", "delete index", *zeroes, "push free"] * 2,
                              "lookup index"]
    assert runs["absent"] == [*["lookup index", "delete index", *zeroes, "push free"] * 2, "lookup index"]


class MappedSlotMaps(FakeSlotMaps):
    """The same slots in one mapped array (BPF_F_MMAPABLE): read in place, candidates looked at alone."""

    def __init__(self, entries: int = 256) -> None:
        super().__init__(entries)
        self.buf = bytearray(entries * CPUS * VALUE)

    def put(self, slot: int, cpu: int, key: int, count: int) -> None:
        super().put(slot, cpu, key, count)
        at = (slot * CPUS + cpu) * VALUE
        self.buf[at : at + VALUE] = self.copies[slot][cpu]

    def clear(self, slot: int) -> None:
        self.copies[slot] = [bytes(VALUE)] * CPUS
        self.buf[slot * CPUS * VALUE : (slot + 1) * CPUS * VALUE] = bytes(CPUS * VALUE)

    def map_mmap(self, name: str) -> bytearray:
        return self.buf


def test_a_candidate_read_gives_what_a_whole_read_gives_for_its_slots() -> None:
    """A busy victim's pairs make thousands of candidate slots a tick of which a few moved: the
    candidate read (numpy over the candidates, Python over the moved ones only) reports exactly the
    moved, new and freed slots among them, in slot order, with their copies, whatever form the
    candidates come in (a set, a list with repeats, slots outside the table)."""
    whole_maps, cand_maps = MappedSlotMaps(), MappedSlotMaps()
    for maps in (whole_maps, cand_maps):
        for slot in range(0, 120, 2):
            maps.put(slot, slot % CPUS, 2000 + slot, 1)
    whole, cand = _slots(whole_maps), _slots(cand_maps)
    assert [(c.slot, c.key) for c in whole.read_changed()] == [(c.slot, c.key) for c in cand.read_changed()]
    for maps in (whole_maps, cand_maps):
        maps.put(10, 1, 2010, 7)  # moved
        maps.put(31, 0, 2031, 1)  # a new pair in a never-used slot
        maps.clear(40)  # zeroed by the other side (its key gone)
        maps.put(118, 0, 2118, 3)
    # (a freed slot's copies mean nothing: its key is None)
    want = [(c.slot, c.old_key, c.key, c.raw if c.key else b"") for c in whole.read_changed()]
    assert [w[0] for w in want] == [10, 31, 40, 118]
    candidates: list[int] = [118, 10, 40, 31, 10, 2, 4, -1, 10**6, 118]  # moved, idle, outside the table
    got = [(c.slot, c.old_key, c.key, c.raw if c.key else b"") for c in cand.read_changed(candidates)]
    assert got == want and got[2][2] is None and got[0][3] == whole_maps.buf[10 * CPUS * VALUE : 11 * CPUS * VALUE]
    assert cand.read_changed(set(range(0, 256))) == []  # nothing moved since
