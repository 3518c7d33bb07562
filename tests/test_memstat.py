# SPDX-License-Identifier: Apache-2.0
"""memory.stat / memory.events readers: v2 and v1 fixture hosts, vanished cgroups, /proc/vmstat, real kernel."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from probes.cgroupfs import discover
from probes.host import HostPaths
from probes.memstat import (
    MemStat,
    MemStatReader,
    node_vmstat,
    parse_flat_keyed,
    parse_v1,
    parse_v2,
    read_memstat,
    read_node_vmstat,
    read_v1_memstat,
    read_v2_memstat,
)
from tests.ground_truth import cgroup_reclaim_pgsteal

POD = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"

# A 6.18 v2 memory.stat, abridged only where nothing here reads it.
V2_MEMORY_STAT = """anon 104857600
file 52428800
kernel 4194304
kernel_stack 327680
pagetables 1048576
sec_pagetables 0
percpu 0
sock 0
vmalloc 0
shmem 0
zswap 0
zswapped 0
file_mapped 8388608
file_dirty 4096
file_writeback 0
swapcached 0
anon_thp 0
file_thp 0
shmem_thp 0
inactive_anon 104726528
active_anon 131072
inactive_file 41943040
active_file 10485760
unevictable 0
slab_reclaimable 1048576
slab_unreclaimable 2097152
slab 3145728
workingset_refault_anon 0
workingset_refault_file 131079
workingset_activate_anon 0
workingset_activate_file 1500
workingset_restore_anon 0
workingset_restore_file 0
workingset_nodereclaim 0
pgdemote_kswapd 0
pgdemote_direct 0
pgdemote_khugepaged 0
pgdemote_proactive 0
pgpromote_success 0
pgscan 190000
pgsteal 182784
pgscan_kswapd 1000
pgscan_direct 189000
pgscan_khugepaged 0
pgscan_proactive 0
pgsteal_kswapd 900
pgsteal_direct 181884
pgsteal_khugepaged 0
pgsteal_proactive 0
pgfault 2319
pgmajfault 7
pgrefill 12
pgactivate 40
pgdeactivate 3
pglazyfree 0
pglazyfreed 0
swpin_zero 0
swpout_zero 0
thp_fault_alloc 0
thp_collapse_alloc 0
"""
V2_MEMORY_EVENTS = "low 0\nhigh 42\nmax 465\noom 1\noom_kill 1\noom_group_kill 0\n"

# This kernel's (6.18) v1 memory.stat: no pgscan/pgsteal; pgpgin/pgpgout are per-folio events.
V1_MEMORY_STAT = """cache 56651776
rss 8671232
rss_huge 0
shmem 0
mapped_file 0
dirty 0
writeback 0
workingset_refault_anon 0
workingset_refault_file 131079
swap 0
swapcached 0
pgpgin 4518
pgpgout 2367
pgfault 2319
pgmajfault 0
inactive_anon 8658944
active_anon 12288
inactive_file 45015040
active_file 11636736
unevictable 0
hierarchical_memory_limit 67108864
hierarchical_memsw_limit 9223372036854771712
total_cache 60000000
total_rss 9000000
total_rss_huge 0
total_shmem 0
total_mapped_file 0
total_dirty 0
total_writeback 0
total_workingset_refault_anon 0
total_workingset_refault_file 140000
total_swap 0
total_swapcached 0
total_pgpgin 5000
total_pgpgout 2500
total_pgfault 2400
total_pgmajfault 1
total_inactive_anon 8658944
total_active_anon 12288
total_inactive_file 45015040
total_active_file 11636736
total_unevictable 0
"""
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"

VMSTAT = """nr_free_pages 5953219
pgpgin 1268680
allocstall_dma 0
allocstall_dma32 3
allocstall_normal 40
allocstall_movable 2
allocstall_device 0
pgsteal_kswapd 1000
pgsteal_direct 500
pgsteal_khugepaged 0
pgsteal_proactive 0
pgscan_kswapd 1200
pgscan_direct 700
pgscan_khugepaged 0
pgscan_proactive 0
pgscan_direct_throttle 0
pgscan_anon 0
pgscan_file 190000
pgsteal_anon 0
pgsteal_file 184284
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def v2_host(root: Path) -> HostPaths:
    cg = root / "sys/fs/cgroup"
    write(cg / "cgroup.controllers", "cpuset cpu io memory pids\n")
    write(cg / "memory.stat", V2_MEMORY_STAT)  # the root has memory.stat only
    d = cg / POD.lstrip("/")
    write(d / "memory.stat", V2_MEMORY_STAT)
    write(d / "memory.events", V2_MEMORY_EVENTS)
    write(d / "memory.current", "161480704\n")
    write(d / "memory.max", "268435456\n")
    write(root / "proc/vmstat", VMSTAT)
    return HostPaths.under(root)


def v1_host(root: Path) -> HostPaths:
    cg = root / "sys/fs/cgroup"
    write(cg / "unified/cgroup.controllers", "\n")
    d = cg / "memory" / POD.lstrip("/")
    write(d / "memory.stat", V1_MEMORY_STAT)
    write(d / "memory.usage_in_bytes", "69000000\n")
    write(d / "memory.limit_in_bytes", "67108864\n")
    write(d / "memory.failcnt", "584\n")
    write(d / "memory.oom_control", V1_OOM_CONTROL)
    return HostPaths.under(root)


# -- parsing ------------------------------------------------------------------------------------


def _lean_read(layout, path: str) -> MemStat | None:
    """The agent's per-tick reader (paths built once): same results as read_memstat."""
    return MemStatReader(layout, path).read()


BOTH_READERS = pytest.mark.parametrize("read_mem", [read_memstat, _lean_read], ids=["read_memstat", "lean"])


def test_parse_flat_keyed_skips_garbage() -> None:
    assert parse_flat_keyed("anon 1\nbroken\nfile x\n\na b c\noom 2\n") == {"anon": 1, "oom": 2}


def test_formats_are_not_confused() -> None:
    assert parse_v1(V2_MEMORY_STAT) is None  # no cache/total_cache
    assert parse_v2(V1_MEMORY_STAT) is None  # no anon/file
    assert parse_v2("") is None and parse_v1("") is None


# -- v2 -----------------------------------------------------------------------------------------


@BOTH_READERS
def test_v2_cgroup(read_mem, tmp_path: Path) -> None:
    layout = discover(v2_host(tmp_path))
    m = read_mem(layout, POD)
    assert m is not None and m.cgroup_version == 2
    assert (m.usage_bytes, m.limit_bytes) == (161480704, 268435456)
    assert (m.anon_bytes, m.file_bytes) == (104857600, 52428800)
    assert (m.pgscan, m.pgsteal, m.pgscan_direct, m.pgsteal_direct) == (190000, 182784, 189000, 181884)
    assert (m.pgscan_kswapd, m.pgsteal_kswapd) == (1000, 900)
    assert (m.pgfault, m.pgmajfault) == (2319, 7)
    assert (m.workingset_refault_anon, m.workingset_refault_file) == (0, 131079)
    assert (m.events_low, m.events_high, m.events_max) == (0, 42, 465)
    assert (m.events_oom, m.events_oom_kill, m.events_oom_group_kill) == (1, 1, 0)
    assert (m.pgpgin, m.pgpgout, m.failcnt) == (None, None, None)  # v1-only fields
    if read_mem is read_memstat:  # every key as read; the agent's per-tick reader keeps the named fields only
        assert m.stat["pgrefill"] == 12 and m.events["high"] == 42
    else:
        assert (m.stat, m.events) == ({}, {})


@BOTH_READERS
def test_v2_unlimited_root_and_old_kernel_events(read_mem, tmp_path: Path) -> None:
    paths = v2_host(tmp_path)
    d = paths.cgroup_root / POD.lstrip("/")
    write(d / "memory.max", "max\n")
    write(d / "memory.events", "low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n")  # before oom_group_kill (5.16)
    layout = discover(paths)
    m = read_mem(layout, POD)
    assert m is not None and m.limit_bytes is None and m.events_max == 3 and m.events_oom_group_kill is None
    root = read_mem(layout, "/")
    assert root is not None and root.pgsteal == 182784
    assert (root.usage_bytes, root.limit_bytes, root.events_max) == (None, None, None)


@BOTH_READERS
def test_v2_vanished_cgroup_is_none(read_mem, tmp_path: Path) -> None:
    paths = v2_host(tmp_path)
    layout = discover(paths)
    d = paths.cgroup_root / POD.lstrip("/")
    (d / "memory.stat").unlink()  # the cgroup went away between listing and reading
    assert read_mem(layout, POD) is None
    shutil.rmtree(d)
    assert read_mem(layout, POD) is None
    assert read_v2_memstat(d) is None
    assert read_mem(layout, "/no/such/cgroup") is None


@BOTH_READERS
def test_v2_without_memory_controller(read_mem, tmp_path: Path) -> None:
    write(tmp_path / "sys/fs/cgroup/cgroup.controllers", "cpu io\n")
    # Pure v2 hosts give the v2 hierarchy for every controller; without memory.stat the answer is None.
    assert read_mem(discover(HostPaths.under(tmp_path)), "/") is None


# -- v1 -----------------------------------------------------------------------------------------


@BOTH_READERS
def test_v1_cgroup_prefers_hierarchical_totals(read_mem, tmp_path: Path) -> None:
    layout = discover(v1_host(tmp_path))
    m = read_mem(layout, POD)
    assert m is not None and m.cgroup_version == 1
    assert (m.usage_bytes, m.limit_bytes, m.failcnt) == (69000000, 64 << 20, 584)
    assert (m.anon_bytes, m.file_bytes) == (9000000, 60000000)  # total_rss, total_cache
    assert (m.pgpgin, m.pgpgout, m.pgfault, m.pgmajfault) == (5000, 2500, 2400, 1)
    assert m.workingset_refault_file == 140000
    assert m.events_oom_kill == 2
    assert (m.pgscan, m.pgsteal, m.pgscan_direct, m.events_max) == (None, None, None, None)  # not in v1


def test_v1_unlimited_and_local_only_keys(tmp_path: Path) -> None:
    paths = v1_host(tmp_path)
    d = paths.cgroup_root / "memory" / POD.lstrip("/")
    write(d / "memory.limit_in_bytes", "9223372036854771712\n")
    write(d / "memory.stat", "\n".join(line for line in V1_MEMORY_STAT.splitlines() if not line.startswith("total_")))
    m = read_v1_memstat(d)
    assert m is not None and m.limit_bytes is None
    assert (m.file_bytes, m.pgpgout, m.workingset_refault_file) == (56651776, 2367, 131079)


@BOTH_READERS
def test_v1_vanished_cgroup_is_none(read_mem, tmp_path: Path) -> None:
    paths = v1_host(tmp_path)
    d = paths.cgroup_root / "memory" / POD.lstrip("/")
    shutil.rmtree(d)
    assert read_mem(discover(paths), POD) is None


# -- node ---------------------------------------------------------------------------------------


def test_vmstat_reclaim_counters(tmp_path: Path) -> None:
    node = read_node_vmstat(v2_host(tmp_path))
    assert node is not None
    assert node.allocstall == {"dma": 0, "dma32": 3, "normal": 40, "movable": 2, "device": 0}
    assert node.allocstall_total == 45
    assert (node.pgscan_direct, node.pgsteal_direct, node.pgscan_kswapd, node.pgsteal_kswapd) == (700, 500, 1200, 1000)
    # pgsteal_{anon,file} count every reclaim; minus the global kinds leaves cgroup-limit reclaim.
    assert cgroup_reclaim_pgsteal(node) == 184284 - 1000 - 500
    assert read_node_vmstat(HostPaths.under(tmp_path / "nothing")) is None
    old = node_vmstat(parse_flat_keyed("allocstall 7\npgsteal_direct 1\n"))  # pre-4.8 single counter: not a zone
    assert old.allocstall_total == 0 and cgroup_reclaim_pgsteal(old) is None


@pytest.mark.vm
def test_this_kernels_vmstat_has_reclaim_counters() -> None:
    node = read_node_vmstat()
    assert node is not None
    assert {"dma32", "normal", "movable"} <= set(node.allocstall), node.allocstall
    for value in (node.pgscan_direct, node.pgsteal_direct, node.pgscan_kswapd, cgroup_reclaim_pgsteal(node)):
        assert value is not None and value >= 0


# -- real kernel --------------------------------------------------------------------------------


@pytest.mark.vm
@pytest.mark.root
def test_real_v1_or_v2_memory_cgroup(make_cgroup) -> None:
    layout = discover()
    hierarchy = layout.hierarchy_for("memory")
    if hierarchy is None:
        pytest.skip("no memory controller on this host")
    cg = make_cgroup("mem", ("memory",))
    d = cg.path("memory")
    limit_file = "memory.limit_in_bytes" if hierarchy.version == 1 else "memory.max"
    cg.write("memory", limit_file, str(64 << 20))
    m = read_v1_memstat(d) if hierarchy.version == 1 else read_v2_memstat(d)
    assert m is not None and m.cgroup_version == hierarchy.version
    assert m.limit_bytes == 64 << 20
    assert m.usage_bytes == 0 and m.file_bytes == 0 and m.anon_bytes == 0
    if hierarchy.version == 1:
        assert m.failcnt == 0 and m.pgpgin == 0 and m.events_oom_kill == 0
        # What this kernel's v1 memory.stat has (and has not): reported, not assumed.
        print("v1 memory.stat keys:", " ".join(k for k in m.stat if not k.startswith("total_")))
        assert m.pgscan == m.stat.get("total_pgscan", m.stat.get("pgscan"))
    else:
        assert m.events_max == 0 and m.pgsteal == 0
    cg.remove()
    assert read_v1_memstat(d) is None and read_v2_memstat(d) is None
