# SPDX-License-Identifier: Apache-2.0
"""NodeCollector on real cgroups: one snapshot per tick, idle cgroups not re-read every tick."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from probes.cgroupfiles import CgroupFileParseError, parse_cpu_list
from probes.cgroupwatch import CgroupWatch
from probes.collect import NodeCollector

pytestmark = pytest.mark.root


def _rel(cg, controller: str = "cpu") -> str:
    h = cg.layout.hierarchy_for(controller)
    return "/" + str(cg.dirs[controller].relative_to(h.mount))


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpu_list("") == ()
    # Malformed lists are refused whole (the collector then skips the value), never half-read.
    for bad in ("1,x,3", "0-100000000,2", "3-1,-1,5"):  # the second: garbage, not a huge tuple
        with pytest.raises(CgroupFileParseError):
            parse_cpu_list(bad)


def test_idle_cgroup_keeps_its_reading_and_a_busy_one_is_read_again(make_cgroup):
    idle = make_cgroup("idle", controllers=("cpu", "cpuacct", "cpuset"))
    busy = make_cgroup("busy", controllers=("cpu", "cpuacct", "cpuset"))
    paths = [_rel(idle), _rel(busy)]
    hog = subprocess.Popen([sys.executable, "-c", "import time\nend=time.monotonic()+20\nwhile time.monotonic()<end: pass"],
                           preexec_fn=busy.preexec)
    try:
        with NodeCollector(probes=(), cgroup_paths=lambda: paths) as c:
            c.collect()  # first sight: both read, and read again next tick to see whether they move
            time.sleep(0.3)
            first = c.collect()  # the spinner's usage moved: it is followed; the idle one is not
            time.sleep(0.3)
            second = c.collect()
            # The idle cgroup's reading is the same object (not re-read); the busy one moved on.
            assert second.cgroup_cpu[paths[0]] is first.cgroup_cpu[paths[0]]
            assert second.cgroup_cpu[paths[1]].usage_ns > first.cgroup_cpu[paths[1]].usage_ns
            assert second.changed_paths == {paths[1]}
            assert second.cgroup_cpus[paths[0]] == tuple(range(len(second.node_cpu_per_cpu)))
            # On its turn of the slow wheel an idle cgroup's usage is looked at: the same text as at its
            # last read keeps the same reading (nothing new, no consumer work) ...
            for _ in range(c.watch.slow_refresh_ticks):
                assert paths[0] not in c.collect().changed_paths
            assert c.collect().cgroup_cpu[paths[0]] is first.cgroup_cpu[paths[0]]
            # ... and a run no probe saw (none is loaded here) is read on its next turn.
            subprocess.run([sys.executable, "-c", "sum(range(10**6))"], preexec_fn=idle.preexec, check=True)
            for _ in range(c.watch.slow_refresh_ticks):
                third = c.collect()
                if paths[0] in third.changed_paths:
                    break
            assert third.cgroup_cpu[paths[0]].usage_ns > first.cgroup_cpu[paths[0]].usage_ns
            # A cgroup that disappears drops out of the next snapshot.
            idle.remove()
            paths.pop(0)
            assert _rel(idle) not in c.collect().cgroup_cpu
    finally:
        hog.kill()
        hog.wait()


WAKER = "import sys, time\nfor line in sys.stdin:\n    end = time.monotonic() + 0.02\n    while time.monotonic() < end:\n" \
        "        pass\n"


def _wait_asleep(pid: int, timeout: float = 60.0) -> None:
    """Until the task sleeps (state S: blocked on its stdin again): from then on its CPU usage stands still."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "S":
        assert time.monotonic() < deadline, f"task {pid} did not go back to sleep in {timeout:.0f} s"
        time.sleep(0.01)


def test_idle_pod_files_are_not_read_each_tick_and_a_woken_one_is_read_next_tick(make_cgroup, monkeypatch):
    """The kernel says who moved: runqlat's per-cgroup count. A sleeping pod costs no file read per tick;
    the tick after its task wakes up, its files are read again."""
    sleeper = make_cgroup("sleeper", controllers=("cpu", "cpuacct", "cpuset", "memory"))
    waker = make_cgroup("waker", controllers=("cpu", "cpuacct", "cpuset", "memory"))
    paths = [_rel(sleeper), _rel(waker)]
    procs = [subprocess.Popen(["sleep", "60"], preexec_fn=sleeper.preexec),
             subprocess.Popen([sys.executable, "-c", WAKER], preexec_fn=waker.preexec, stdin=subprocess.PIPE, text=True)]
    reads: Counter[str] = Counter()  # the watch's reads of each cgroup's files
    read = CgroupWatch._read

    def counted(self, w, *args, **kwargs):
        reads[w.path] += 1
        return read(self, w, *args, **kwargs)

    monkeypatch.setattr(CgroupWatch, "_read", counted)
    try:
        time.sleep(0.5)  # the interpreter has started and blocks on stdin
        with NodeCollector(probes=("runqlat",), cgroup_paths=lambda: paths) as c:
            watch = c.watch
            watch.slow_refresh_ticks = 10_000  # no wheel turn inside the test: only activity reads
            watch._wheel = [set() for _ in range(watch.slow_refresh_ticks)]
            c.collect()  # first sight: both read in full
            c.collect()  # and once more: neither moved, so neither is followed
            before = {p: reads[p] for p in paths}
            for _ in range(5):
                time.sleep(0.1)
                snap = c.collect()
                assert not snap.changed_paths & set(paths)
            assert {p: reads[p] for p in paths} == before  # idle: not one read in 5 ticks
            procs[1].stdin.write("wake\n")
            procs[1].stdin.flush()
            time.sleep(0.3)
            _wait_asleep(procs[1].pid)  # its 20 ms of work done
            snap = c.collect()
            assert paths[1] in snap.changed_paths, "the woken pod is read the tick after its wakeup"
            assert reads[paths[1]] == before[paths[1]] + 1
            assert paths[0] not in snap.changed_paths
            assert reads[paths[0]] == before[paths[0]]
            # Ground truth: the usage the collector read is the kernel's, and it moved with the work.
            assert snap.cgroup_cpu[paths[1]].usage_ns == int(waker.read("cpuacct", "cpuacct.usage"))
            # The tick after, its usage (it ran at its last read) is looked at once more: it stood still, so
            # nothing else of it is read and nothing of it is new; its reading is still the kernel's.
            read_once = snap.cgroup_cpu[paths[1]]
            snap = c.collect()
            assert paths[1] not in snap.changed_paths and reads[paths[1]] == before[paths[1]] + 1
            assert snap.cgroup_cpu[paths[1]] is read_once
            assert read_once.usage_ns == int(waker.read("cpuacct", "cpuacct.usage"))
            assert paths[1] not in watch._moving, "not followed any more"
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_followed_cgroups_files_stay_open_and_close_when_it_goes(make_cgroup):
    """Files of a cgroup read tick after tick are kept open and re-read at offset 0 (kernfs makes the
    text anew), giving the kernel's current numbers; when the cgroup is removed they are closed, since
    an open file would pin the removed cgroup in the kernel."""
    busy = make_cgroup("hot", controllers=("cpu", "cpuacct", "cpuset", "memory"))
    paths = [_rel(busy)]
    fds_before = len(os.listdir("/proc/self/fd"))
    hog = subprocess.Popen([sys.executable, "-c", "import time\nend=time.monotonic()+1.5\nwhile time.monotonic()<end: pass"],
                           preexec_fn=busy.preexec)
    try:
        with NodeCollector(probes=(), cgroup_paths=lambda: paths) as c:
            usages = []
            for _ in range(4):
                time.sleep(0.2)
                usages.append(c.collect().cgroup_cpu[paths[0]].usage_ns)
            assert usages == sorted(usages) and usages[-1] > usages[0], usages  # re-read, not a stale text
            usage_file = c.watch.watched[paths[0]].cpu_reader.usage_file
            assert usage_file in c.watch.hot._fds, "a followed cgroup's usage file is kept open"
            hog.wait(timeout=30)
            time.sleep(0.1)
            c.collect()  # read once more at rest: the kernel's final number
            kernel = int(busy.read("cpuacct", "cpuacct.usage"))
            assert c.collect().cgroup_cpu[paths[0]].usage_ns == kernel
            busy.remove()
            assert c.watch.hot.read(usage_file) is None  # removed: ENODEV on the open file, nothing to reopen
            paths.clear()
            c.collect()
            assert not c.watch.hot._fds, "a removed cgroup's files are closed"
        assert len(os.listdir("/proc/self/fd")) <= fds_before
    finally:
        hog.kill()
        hog.wait()


def test_open_files_fit_what_is_read_every_tick(tmp_path, monkeypatch):
    """Past its bound, the least recently used file is closed just before it is read again, so every
    read reopens: the bound follows the files read each tick, and shrinks back (closing the least
    recently used) when fewer are, slowly."""
    from probes import host

    files = []
    for i in range(400):
        f = tmp_path / f"f{i}"
        f.write_text(str(i))
        files.append(str(f))
    opens = Counter()
    real_open = os.open
    monkeypatch.setattr(host.os, "open", lambda path, *a, **kw: (opens.update([path]), real_open(path, *a, **kw))[1])
    hot = host.HotFiles()
    try:
        for _ in range(2):
            assert [hot.read(f) for f in files] == [str(i) for i in range(400)]
        assert sum(opens.values()) == 800, "at the default bound of 256, 400 files a tick are reopened each read"
        opens.clear()
        hot.fit(400)
        for _ in range(3):
            assert [hot.read(f) for f in files] == [str(i) for i in range(400)]
        assert sum(opens.values()) == 400 - 256, "once they fit, each file is opened once"
        assert len(hot._fds) == 400
        hot.fit(10)
        assert len(hot._fds) == 396 and list(hot._fds) == files[-396:], "1 % a tick, least recently used first"
        for _ in range(200):
            hot.fit(10)
        assert len(hot._fds) == 256 and list(hot._fds) == files[-256:], "back to the floor once fewer are read"
    finally:
        hot.close()


def test_a_pods_idle_containers_take_its_turn_and_are_read_when_it_moved(make_cgroup, monkeypatch):
    """On the slow wheel a container takes its turn with its pod; while the pod's CPU usage and memory
    stand still since the container's last read, the container's own files are not read (the pod's
    usage is the sum of its containers'). A container that ran unseen (no probe loaded here) moved its
    pod, and its next turn reads it: its usage is the kernel's."""
    controllers = ("cpu", "cpuacct", "cpuset", "memory")
    pod = make_cgroup("pod", controllers=controllers)
    ctrs = [make_cgroup("pod/c1", controllers=controllers), make_cgroup("pod/c2", controllers=controllers)]
    paths = [_rel(pod), *(_rel(c) for c in ctrs)]
    reads: Counter[str] = Counter()
    read = CgroupWatch._read

    def counted(self, w, *args, **kwargs):
        reads[w.path] += 1
        return read(self, w, *args, **kwargs)

    monkeypatch.setattr(CgroupWatch, "_read", counted)
    with NodeCollector(probes=(), cgroup_paths=lambda: paths) as c:
        watch = c.watch
        first = c.collect()  # first sight: all read
        c.collect()  # and once more (first sight counts as moving): nothing moved
        assert len({watch.watched[p].slot for p in paths}) == 1, "the containers did not join their pod's turn"
        for _ in range(watch.slow_refresh_ticks):  # the first turn reads all (first sight read them together)
            c.collect()
        reads.clear()
        for _ in range(watch.slow_refresh_ticks):
            c.collect()
        assert reads == Counter({paths[0]: 1}), reads  # the pod's turn vouched for both containers
        assert c.collect().cgroup_cpu[paths[2]] is first.cgroup_cpu[paths[2]]
        subprocess.run([sys.executable, "-c", "sum(range(10**6))"], preexec_fn=ctrs[1].preexec, check=True)
        usage = ctrs[1].dirs["cpuacct"] / "cpuacct.usage"
        truth = int(usage.read_text()) if usage.exists() else None
        reads.clear()
        for _ in range(watch.slow_refresh_ticks):
            snap = c.collect()
        assert reads[paths[0]] >= 1 and reads[paths[1]] >= 1 and reads[paths[2]] >= 1, reads
        assert snap.cgroup_cpu[paths[2]].usage_ns > first.cgroup_cpu[paths[2]].usage_ns
        if truth is not None:  # v1: cpuacct.usage is the reading's source, exactly
            assert snap.cgroup_cpu[paths[2]].usage_ns == truth


def test_a_wheel_turn_reads_pressure_files_without_looking_for_them(make_cgroup, monkeypatch):
    """A cgroup found to have pressure files (at first sight) is not looked for them again (a stat) on
    each wheel turn: reading them says they are there. Its pressure reading stays the kernel's."""
    from probes import cgroupwatch

    cg = make_cgroup("pod", controllers=("cpu", "cpuacct", "unified"))
    if not (cg.dirs["unified"] / "cpu.pressure").exists():
        pytest.skip("no pressure files in the v2 tree (PSI off)")
    path = _rel(cg)
    looked: list[str] = []
    real_exists = os.path.exists
    monkeypatch.setattr(cgroupwatch.os.path, "exists", lambda p: (looked.append(p), real_exists(p))[1])
    with NodeCollector(probes=(), cgroup_paths=lambda: [path]) as c:
        c.collect()
        assert looked, "first sight looks for its pressure files"
        looked.clear()
        for _ in range(2 * c.watch.slow_refresh_ticks):  # two wheel turns
            snap = c.collect()
        assert not looked, looked
        some = snap.cgroup_psi[path]["cpu"].some
        kernel = (cg.dirs["unified"] / "cpu.pressure").read_text().split()[4]
        assert some is not None and f"total={some.total_us}" == kernel
