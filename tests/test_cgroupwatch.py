# SPDX-License-Identifier: Apache-2.0
"""CgroupWatch's slow wheel on real cgroups: what a turn of an idle cgroup reads, and how late the values
read only on its slow turn (cpuset, memory) can be."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from probes.cgroupfiles import parse_cpu_list
from probes.cgroupwatch import SLOW_FILES_TURNS, SLOW_REFRESH_TICKS, CgroupWatch
from testkit.sandbox import sandbox_layout

pytestmark = pytest.mark.root

CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
SLOW_TURN_TICKS = SLOW_REFRESH_TICKS * SLOW_FILES_TURNS  # the most a cpuset or an idle memory change waits


def _rel(cg, controller: str = "cpu") -> str:
    h = cg.layout.hierarchy_for(controller)
    return "/" + str(cg.dirs[controller].relative_to(h.mount))


@pytest.fixture
def watch() -> Iterator[CgroupWatch]:
    # Re-rooted: this process's memory cgroup may be elsewhere than its cpu one (a test pod then has
    # memory files at its cpu path only through this layout; on a node both are the kubelet's path).
    w = CgroupWatch(sandbox_layout())
    yield w
    w.close()


def _count_file_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, every open of a file and every read of one (os.read, os.pread on a kept descriptor)."""
    calls: list[str] = []
    real_open, real_read, real_pread = os.open, os.read, os.pread
    monkeypatch.setattr(os, "open", lambda path, *a, **kw: (calls.append(f"open {path}"), real_open(path, *a, **kw))[1])
    monkeypatch.setattr(os, "read", lambda fd, *a: (calls.append("read"), real_read(fd, *a))[1])
    monkeypatch.setattr(os, "pread", lambda fd, *a: (calls.append("read"), real_pread(fd, *a))[1])
    return calls


def test_an_idle_cgroups_wheel_turn_reads_its_usage_file_once_and_a_cpuset_change_is_seen_on_its_slow_turn(
        make_cgroup, watch, monkeypatch):
    """Each turn of the wheel (every SLOW_REFRESH_TICKS ticks) of a cgroup whose usage stands still reads
    that one file, through a descriptor kept open (no open). One turn in SLOW_FILES_TURNS also reads its
    cpuset and memory usage: a cpuset rewritten while it is idle is seen within SLOW_TURN_TICKS ticks."""
    cg = make_cgroup("idle", controllers=CONTROLLERS)
    path = _rel(cg)
    watch.set_listed([path])
    watch.tick()  # first sight: everything
    watch.tick()  # and once more (first sight counts as moving): it stood still
    cpus_file = cg.dirs["cpuset"] / "cpuset.effective_cpus"
    assert watch.cpus[path] == parse_cpu_list(cpus_file.read_text())
    calls = _count_file_reads(monkeypatch)
    per_turn: list[list[str]] = []
    for _ in range(SLOW_TURN_TICKS):
        calls.clear()
        assert path not in watch.tick()  # nothing of it is new
        if calls:
            per_turn.append(list(calls))
    monkeypatch.undo()
    assert len(per_turn) == SLOW_FILES_TURNS, per_turn  # one turn every SLOW_REFRESH_TICKS ticks
    slow = [turn for turn in per_turn if len(turn) > 1]
    assert len(slow) == 1, per_turn
    # Its usage file was kept open when it was looked at the tick after its first sight: one read a turn.
    assert all(turn == ["read"] for turn in per_turn if turn not in slow), per_turn
    assert any(call.endswith("cpuset.effective_cpus") for call in slow[0]), slow

    # A cpuset rewritten while the cgroup stays idle (the CPU manager's pool): seen on its slow turn.
    cpus = parse_cpu_list(cpus_file.read_text())
    if len(cpus) < 2:
        pytest.skip("one CPU in this cgroup's cpuset: nothing to change it to")
    cg.write("cpuset", "cpuset.cpus", str(cpus[0]))
    for _ in range(SLOW_TURN_TICKS):
        watch.tick()
        if watch.cpus[path] != cpus:
            break
    assert watch.cpus[path] == (cpus[0],) == parse_cpu_list(cpus_file.read_text()), \
        f"not seen in {SLOW_TURN_TICKS} ticks"


GROWER = ("import sys\nblock = bytearray(48 << 20)\nfor i in range(0, len(block), 4096):\n    block[i] = 1\n"
          "print('grown', flush=True)\nsys.stdin.read()\n")


def test_an_idle_cgroups_memory_change_is_seen_within_its_slow_turns(make_cgroup, watch):
    """Memory that grows while no probe sees the cgroup (none is loaded here: the wheel alone) is read on
    the cgroup's slow turn: its reading is the kernel's within SLOW_TURN_TICKS ticks of the growth."""
    cg = make_cgroup("grower", controllers=CONTROLLERS)
    path = _rel(cg)
    watch.set_listed([path])
    watch.tick()
    watch.tick()
    before = watch.mem[path].usage_bytes
    assert before is not None
    grower = subprocess.Popen([sys.executable, "-c", GROWER], preexec_fn=cg.preexec, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert grower.stdout.readline() == "grown\n"
        usage_file = cg.dirs["memory"] / "memory.usage_in_bytes"
        if not usage_file.exists():
            usage_file = cg.dirs["memory"] / "memory.current"
        for _ in range(SLOW_TURN_TICKS):
            watch.tick()
            now = watch.mem[path].usage_bytes
            if now is not None and now >= before + (40 << 20):
                break
        kernel = int(usage_file.read_text())
        now = watch.mem[path].usage_bytes
        assert now is not None and now >= before + (40 << 20), f"48 MiB grown, {now} read, {kernel} the kernel's"
        # The reading is the kernel's of that tick (it does not move while the grower sleeps, give or take
        # a per-CPU charge batch).
        assert abs(now - kernel) <= 1 << 20, (now, kernel)
    finally:
        grower.kill()
        grower.wait()


def test_a_reclaiming_cgroups_memory_is_looked_at_every_tick_also_on_its_wheel_turns(make_cgroup, watch, monkeypatch):
    """A cgroup a probe sees reclaim has its memory looked at every tick, its wheel turns (slow or not)
    included: its memory files read, or on a wheel turn its memory usage found as at its last read. The
    slow turn holds back only what moves without activity."""
    from probes.memstat import MemStatReader

    cg = make_cgroup("reclaimer", controllers=CONTROLLERS)
    path = _rel(cg)
    watch.set_listed([path])
    watch.tick()
    watch.tick()
    looked: set[int] = set()
    real_read, real_unchanged = MemStatReader.read, CgroupWatch._unchanged

    def unchanged(self, w, kind, *a):
        if kind is self.files.memory_usage:
            looked.add(self.tick_count)
        return real_unchanged(self, w, kind, *a)

    monkeypatch.setattr(MemStatReader, "read", lambda self, *a, **kw: (looked.add(watch.tick_count),
                                                                        real_read(self, *a, **kw))[1])
    monkeypatch.setattr(CgroupWatch, "_unchanged", unchanged)
    for _ in range(SLOW_TURN_TICKS):
        watch.tick(memory_moved=[path])
    assert sorted(set(range(3, 3 + SLOW_TURN_TICKS)) - looked) == [], "ticks its memory was not looked at"
    assert watch.mem[path] is not None
