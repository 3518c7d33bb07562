# SPDX-License-Identifier: Apache-2.0
"""Softirq probe vs the kernel's own count (/proc/softirqs), a NET_RX flood between two test network
namespaces, and stall events from bottom halves held off on one CPU."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from probes.engine import LibbpfEngine, ProbeError
from probes.host import HostPaths, possible_cpu_count
from probes.softirq import (
    VECTORS,
    SoftirqDelta,
    SoftirqInterval,
    SoftirqProbe,
    SoftirqSnapshot,
    SoftirqStats,
    summarize,
)
from testkit.procfiles import read_proc_softirqs
from testkit.timing import slowdown
from testkit.workloads.loopback_udp import loopback_udp
from tests.ground_truth import softirq_missed_allowance

pytestmark = [pytest.mark.root, pytest.mark.vm]
ROOT = Path(__file__).resolve().parent.parent


# ---- helpers ----------------------------------------------------------------------------------------


def _bracket_check(p1, truth1, p2, p3, truth2, p4, keys):
    """Reads were p1, truth1, p2 … p3, truth2, p4: the kernel's count over [truth1, truth2] must lie
    between the probe's over [p2, p3] and over [p1, p4], but for a run in flight at a read (the
    kernel counts it just before the probe does; one per CPU and vector) and, on the low side, the
    share of runs the probe misses (tests/ground_truth.py)."""
    bad = []
    for k in keys:
        truth = truth2[k] - truth1[k]
        low = p3.stats[k].entries - p2.stats[k].entries
        high = p4.stats[k].entries - p1.stats[k].entries
        if not low - 1 <= truth <= high + 1 + softirq_missed_allowance(truth):
            bad.append((k, low, truth, high))
    return bad


def _entries(before: SoftirqSnapshot, after: SoftirqSnapshot, vector: str) -> int:
    return sum(s.entries - before.stats[k].entries for k, s in after.stats.items() if k[1] == vector)


def _runtime_ns(before: SoftirqSnapshot, after: SoftirqSnapshot, vector: str) -> int:
    return sum(s.runtime.sum_ns - before.stats[k].runtime.sum_ns for k, s in after.stats.items() if k[1] == vector)


# ---- a bounded bottom-half stall: BPF_PROG_TEST_RUN of a program that spins in bpf_loop ---------------
#
# bpf_test_run() runs the program between local_bh_disable() and local_bh_enable(): softirqs raised on
# that CPU meanwhile (timer tick, RCU, IPIs) stay pending until it returns, then run in the caller's
# context — the same signature as a slow syscall holding softirqs off (the cadvisor memory.stat case).
# The spin is bounded twice: by a ktime deadline and by bpf_loop's iteration count.

_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine, 321)


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _spin_program(hold_ns: int) -> bytes:
    return b"".join([
        _insn(0x85, imm=5),  # r0 = bpf_ktime_get_ns()
        _insn(0x07, dst=0, imm=hold_ns),  # r0 += hold_ns
        _insn(0x7B, dst=10, src=0, off=-8),  # *(u64 *)(r10 - 8) = r0  (the deadline)
        _insn(0xB7, dst=1, imm=1 << 23),  # r1 = max iterations (bpf_loop's limit)
        _insn(0x18, dst=2, src=4, imm=7), _insn(0),  # r2 = &callback (insn 12; BPF_PSEUDO_FUNC)
        _insn(0xBF, dst=3, src=10),  # r3 = r10
        _insn(0x07, dst=3, imm=-8),  # r3 -= 8
        _insn(0xB7, dst=4, imm=0),  # r4 = 0
        _insn(0x85, imm=181),  # bpf_loop(r1, r2, r3, r4)
        _insn(0xB7, dst=0, imm=0),  # return 0
        _insn(0x95),
        # callback(index, ctx): 1 (stop) once bpf_ktime_get_ns() >= *ctx
        _insn(0x79, dst=6, src=2, off=0),
        _insn(0x85, imm=5),
        _insn(0x3D, dst=0, src=6, off=2),
        _insn(0xB7, dst=0, imm=0),
        _insn(0x95),
        _insn(0xB7, dst=0, imm=1),
        _insn(0x95),
    ])


def _btf_two_funcs() -> bytes:
    """Minimal BTF: `int main(void)` and `int cb(void)` (the verifier wants func_info for callbacks)."""
    strings = b"\0int\0main\0cb\0"
    types = b"".join([
        struct.pack("<IIII", 1, 1 << 24, 4, (1 << 24) | 32),  # [1] INT "int" size 4, signed, 32 bits
        struct.pack("<III", 0, 13 << 24, 1),  # [2] FUNC_PROTO returning [1], no args
        struct.pack("<III", 5, 12 << 24, 2),  # [3] FUNC "main"
        struct.pack("<III", 10, 12 << 24, 2),  # [4] FUNC "cb"
    ])
    return struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings)) + types + strings


def _bpf(libc, cmd: int, attr: bytes) -> tuple[int, bytes]:
    buf = ctypes.create_string_buffer(attr, 144)
    r = libc.syscall(_SYS_BPF, cmd, buf, 144)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bpf({cmd}): {os.strerror(e)}")
    return r, buf.raw


def hold_bottom_halves(hold_ns: int) -> int:
    """Keep softirqs off on the calling CPU for hold_ns (≤ 100 ms). Returns the kernel's run duration."""
    assert 0 < hold_ns <= 100_000_000
    libc = ctypes.CDLL(None, use_errno=True)
    blob = ctypes.create_string_buffer(_btf_two_funcs())
    log = ctypes.create_string_buffer(1 << 16)
    btf_fd, _ = _bpf(libc, 18, struct.pack("<QQIII", ctypes.addressof(blob), ctypes.addressof(log), len(blob) - 1,
                                           len(log), 1))  # BPF_BTF_LOAD
    code = _spin_program(hold_ns)
    insns = ctypes.create_string_buffer(code)
    lic = ctypes.create_string_buffer(b"GPL")
    func_info = ctypes.create_string_buffer(struct.pack("<IIII", 0, 3, 12, 4))
    try:
        prog_fd, _ = _bpf(libc, 5, struct.pack(  # BPF_PROG_LOAD, BPF_PROG_TYPE_SOCKET_FILTER
            "<IIQQIIQII16sIIIIQI", 1, len(code) // 8, ctypes.addressof(insns), ctypes.addressof(lic), 1, len(log),
            ctypes.addressof(log), 0, 0, b"nn_test_hold_bh", 0, 0, btf_fd, 8, ctypes.addressof(func_info), 2))
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror}: {log.value.decode(errors='replace')[-500:]}") from None
    finally:
        os.close(btf_fd)
    try:
        data = ctypes.create_string_buffer(64)
        _, out = _bpf(libc, 10, struct.pack("<IIIIQQII", prog_fd, 0, 64, 0, ctypes.addressof(data), 0, 1, 0))
        return struct.unpack_from("<IIIIQQII", out)[7]  # BPF_PROG_TEST_RUN duration (ns)
    finally:
        os.close(prog_fd)


# ---- fixtures -----------------------------------------------------------------------------------------


_FLOOD = """
import socket, sys, time
n, limit = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent, deadline = 0, time.monotonic() + limit
while sent < n and time.monotonic() < deadline:
    s.sendto(b"x" * 64, (sys.argv[3], 9))
    sent += 1
print(sent)
"""

_PACED = """
import socket, sys, time
limit = float(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
deadline = time.monotonic() + limit
while time.monotonic() < deadline:  # ~8 datagrams every 0.5 ms, until killed or the time limit
    for _ in range(8):
        s.sendto(b"x" * 64, (sys.argv[2], 9))
    time.sleep(0.0005)
"""


def _flood(ns: str, dst: str, packets: int, seconds: float) -> tuple[int, float]:
    """UDP datagrams from inside `ns` to `dst` (discard port, nobody listens), bounded by count and time."""
    t0 = time.monotonic()
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", _FLOOD, str(packets), str(seconds), dst],
                         check=True, capture_output=True, text=True, timeout=seconds + 30)
    return int(out.stdout.strip()), time.monotonic() - t0


# ---- tests --------------------------------------------------------------------------------------------


@pytest.mark.smoke
@pytest.mark.parametrize("attach_mode", ["tp_btf", "raw_tp"])
def test_entry_counts_match_proc_softirqs(attach_mode):
    """For every CPU and vector, the probe's entries over a window equal /proc/softirqs', but for runs in
    flight at a read and the few the probe misses (tests/ground_truth.py)."""
    with SoftirqProbe(attach_mode=attach_mode, stall_threshold_ns=0) as probe:
        assert probe.status.attach_mode == attach_mode
        p1 = probe.snapshot()
        t1 = read_proc_softirqs()
        p2 = probe.snapshot()
        sent = loopback_udp(5000, 3.0)
        time.sleep(0.3)  # a few ticks: TIMER, RCU, SCHED
        p3 = probe.snapshot()
        t2 = read_proc_softirqs()
        p4 = probe.snapshot()

    keys = sorted(t2, key=lambda k: (k[0], VECTORS.index(k[1])))
    assert set(keys) <= set(p4.stats), f"probe lacks rows: {set(keys) - set(p4.stats)}"
    truth_total = sum(t2[k] - t1[k] for k in keys)
    probe_total = sum(p3.stats[k].entries - p2.stats[k].entries for k in keys)
    truth_net_rx = sum(t2[k] - t1[k] for k in keys if k[1] == "NET_RX")
    print(f"{attach_mode}: sent {sent}; /proc/softirqs {truth_total} runs ({truth_net_rx} NET_RX), "
          f"probe {probe_total} (inner window), agreement {100 * probe_total / max(truth_total, 1):.3f} %")
    for k in keys:
        if t2[k] - t1[k]:
            print(f"  cpu{k[0]} {k[1]:8} truth {t2[k] - t1[k]:7}  probe {p3.stats[k].entries - p2.stats[k].entries:7}"
                  f"..{p4.stats[k].entries - p1.stats[k].entries}")
    assert truth_net_rx >= 1000, "too little activity: the test proves nothing"
    assert _bracket_check(p1, t1, p2, p3, t2, p4, keys) == []
    # The delay histogram only holds entries whose raise was seen; it can never exceed the entries.
    for k in keys:
        s3, s2 = p3.stats[k], p2.stats[k]
        assert s3.delay.count - s2.delay.count <= s3.entries - s2.entries + 3
        assert s3.runtime.count - s2.runtime.count <= s3.entries - s2.entries + 3


def test_net_rx_flood_between_namespaces(veth_pair):
    """A bounded UDP flood across a veth pair: NET_RX runs and their run time rise far above a quiet
    baseline measured just before, and /proc/softirqs agrees on the count."""
    packets = 100_000
    with SoftirqProbe(stall_threshold_ns=0) as probe:
        q0 = probe.snapshot()
        time.sleep(1.0)
        q1 = probe.snapshot()
        t1 = read_proc_softirqs()
        f0 = probe.snapshot()
        sent, took = _flood(veth_pair["a"], veth_pair["dst"], packets, 5.0)
        f1 = probe.snapshot()
        t2 = read_proc_softirqs()
        rows = summarize(f0, f1)

    quiet_s = q1.monotonic_s - q0.monotonic_s
    flood_s = f1.monotonic_s - f0.monotonic_s
    base_rate = _entries(q0, q1, "NET_RX") / quiet_s
    base_rt_rate = _runtime_ns(q0, q1, "NET_RX") / quiet_s
    flood_n = _entries(f0, f1, "NET_RX")
    flood_rt = _runtime_ns(f0, f1, "NET_RX")
    truth_n = sum(t2[k] - t1[k] for k in t2 if k[1] == "NET_RX")
    print(f"sent {sent} in {took:.2f} s; NET_RX baseline {base_rate:.0f}/s, {base_rt_rate / 1e6:.2f} ms/s; "
          f"flood {flood_n} runs ({flood_n / flood_s:.0f}/s), {flood_rt / 1e6:.1f} ms run time "
          f"({flood_rt / 1e6 / flood_s:.1f} ms/s); /proc/softirqs NET_RX {truth_n}")
    for r in rows:
        if r["vector"] == "NET_RX":
            print("  ", r)
    # What a Python sender reaches in 5 s follows the machine's speed (a loaded host, a TCG guest ~10x slower).
    speed = 1 / slowdown()
    assert sent >= 20_000 * speed, "the flood did not get going"
    # Each datagram crosses the veth and is received in its own NET_RX run (netif_rx → backlog).
    assert flood_n - base_rate * flood_s >= 0.5 * sent
    assert flood_n / flood_s >= 5 * base_rate + 1000 * speed
    assert flood_rt - base_rt_rate * flood_s >= 0.5 * sent * 100  # ≥ 100 ns of softirq work per datagram
    assert flood_rt / flood_s >= 5 * base_rt_rate
    assert abs(flood_n - truth_n) <= max(0.001 * truth_n, 10)
    net_rx_rows = [r for r in rows if r["vector"] == "NET_RX"]
    assert net_rx_rows and sum(r["entries"] for r in net_rx_rows) == flood_n
    assert max(r["runtime_s_per_s"] for r in net_rx_rows) > 0


# The holder (hold_bottom_halves) is a BPF_PROG_TEST_RUN, which holds bottom halves off on 6.18 (this
# host). On 6.1 (the VM lane) it does not: there NET_RX ran inside the holder's run, raised and entered
# in its context 44 µs apart (measured 2026-11-25), so no holder can make the stall. Kernels between
# the two are not measured: the test runs where the holder was seen to hold.
HOLDER_HOLDS_BH_FROM = (6, 18)


def _kernel_version() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def test_stall_event_names_the_task_that_held_softirqs_off(make_cgroup, veth_pair):
    """A task keeps bottom halves off for 40 ms on one CPU (like cadvisor's slow memory.stat reads in the
    'network stalls on Kubernetes' story) while packets for that CPU keep arriving (RPS steers the veth's
    receive work there: an IPI raises NET_RX on it). The stall events give that CPU, a delay ≥ the 10 ms
    default threshold, and that task and its cgroup both as what ran while the softirq waited and as the
    context that finally ran it — not ksoftirqd."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two CPUs: one holds softirqs off, the other sends")
    if _kernel_version() < HOLDER_HOLDS_BH_FROM:
        pytest.skip(f"kernel {os.uname().release}: BPF_PROG_TEST_RUN does not hold bottom halves off here "
                    "(measured on 6.1), so the test's holder cannot stall a softirq")
    cg = make_cgroup("holder")
    cg_id = os.stat(cg.path("cpu")).st_ino
    cpu = os.cpu_count() - 1
    subprocess.run(["ip", "netns", "exec", veth_pair["b"], "sh", "-c",
                    f"echo {1 << cpu:x} > /sys/class/net/{veth_pair['dev_b']}/queues/rx-0/rps_cpus"],
                   check=True, timeout=10)
    hold_ns = 40_000_000
    child = f"import os, sys; sys.path.insert(0, {str(ROOT)!r}); " \
            f"from tests.test_softirq import hold_bottom_halves; print(os.getpid(), hold_bottom_halves({hold_ns}))"
    with SoftirqProbe() as probe:
        assert probe.stall_threshold_ns == 10_000_000
        sender = subprocess.Popen(["ip", "netns", "exec", veth_pair["a"], "taskset", "-c", "0", sys.executable, "-c",
                                   _PACED, str(10 * slowdown()), veth_pair["dst"]])  # an attempt starts a Python
        try:
            time.sleep(0.3)
            mine: list = []
            attempts = 0
            def stalled_net_rx() -> bool:
                return any(e.vector == "NET_RX" and e.delay_ns >= 10_000_000 for e in mine)

            while not stalled_net_rx() and attempts < 3 and sender.poll() is None:
                attempts += 1
                holder = subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-c", child], cwd=ROOT,
                                        preexec_fn=cg.preexec, capture_output=True, text=True, timeout=30)
                assert holder.returncode == 0, holder.stderr
                pid, held_ns = (int(x) for x in holder.stdout.split()[-2:])
                time.sleep(0.05)
                mine += [e for e in probe.poll_stalls(100) if e.entry_tgid == pid]
        finally:
            sender.kill()
            sender.wait()
    for e in mine:
        print(e)
    print(f"attempts {attempts}, held {held_ns / 1e6:.1f} ms")
    assert mine, f"no stall event from the bottom-half holder in {attempts} attempts"
    for e in mine:
        assert e.cpu == cpu
        assert not e.in_ksoftirqd
        assert e.entry_cgroup_id == cg_id
        assert e.raise_tgid == e.entry_tgid and e.entry_comm == e.raise_comm
    delayed = [e for e in mine if e.delay_ns >= 10_000_000]
    assert "NET_RX" in {e.vector for e in delayed}
    for e in delayed:
        assert e.raise_seen and e.raise_cgroup_id == cg_id
        assert e.delay_ns <= held_ns + 20_000_000


def test_ksoftirqd_flag_marks_only_the_per_cpu_ksoftirqd_threads():
    """Threshold 1 ns: every softirq run is an event. Runs in ksoftirqd/N carry the flag, on CPU N, with
    that kthread's pid; no other run does. (The flag itself is exercised by ordinary background work.)"""
    ksoftirqd = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                m = re.fullmatch(r"ksoftirqd/(\d+)", (d / "comm").read_text().strip())
                if m:
                    ksoftirqd[int(d.name)] = int(m.group(1))
    assert ksoftirqd, "no ksoftirqd threads found"
    flagged, others = [], 0
    with SoftirqProbe(stall_threshold_ns=1, stall_ring_bytes=16 << 20) as probe:
        stop = threading.Event()
        worker = threading.Thread(target=lambda: [loopback_udp(2000, 0.5) for _ in range(10) if not stop.is_set()])
        worker.start()
        try:
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline and (len(flagged) < 3 or others < 100):
                for e in probe.poll_stalls(50):
                    if e.in_ksoftirqd:
                        flagged.append(e)
                    else:
                        others += 1
                        assert not e.entry_comm.startswith("ksoftirqd/"), e
        finally:
            stop.set()
            worker.join()
    print(f"{len(flagged)} runs in ksoftirqd, {others} elsewhere")
    assert others >= 100
    if not flagged:
        pytest.skip("no softirq ran in ksoftirqd during the window (a quiet machine): flag not exercised")
    for e in flagged:
        assert ksoftirqd.get(e.entry_pid) == e.cpu, e
        assert e.entry_comm == f"ksoftirqd/{e.cpu}"


def test_no_threshold_means_no_stall_events():
    with SoftirqProbe(stall_threshold_ns=0) as probe:
        loopback_udp(500, 1.0)
        assert probe.poll_stalls(10) == []
        snap = probe.snapshot()
    assert snap.drops == dict.fromkeys(snap.drops, 0)
    assert sum(s.entries for s in snap.stats.values()) > 0


def test_layouts_match_the_object():
    """The Python decoders and the compiled object agree on struct sizes."""
    from probes.softirq import _STATS, _StallEvent

    with SoftirqProbe(stall_threshold_ns=0) as probe:
        obj = probe.probe.obj  # type: ignore[attr-defined]
        assert obj.map("stats").value_size == _STATS.size
        assert obj.map("stats").max_entries == len(VECTORS) * possible_cpu_count(HostPaths())  # every CPU's vectors
    assert ctypes.sizeof(_StallEvent) == 104  # _Static_assert in softirq.bpf.c


def test_a_read_copies_out_only_the_cpu_vectors_that_moved():
    """The stats array is read in place: a tick looks at two counters of every CPU x vector and copies
    out only those that moved; the others are the last read's objects (what `delta` skips)."""
    from probes.softirq import _STATS

    with SoftirqProbe(stall_threshold_ns=0) as probe:
        assert probe._mapped is not None, "the stats array should be mmapable (read without a copy)"
        s1, b1 = probe.snapshot(), probe.bytes_read
        s2, b2 = probe.snapshot(), probe.bytes_read
    moved = [k for k in s2.stats if s2.stats[k] is not s1.stats[k]]
    for k in moved:
        a, b = s1.stats[k], s2.stats[k]
        assert (b.entries, b.runtime.count) != (a.entries, a.runtime.count), k
    assert b2 - b1 == len(s2.stats) * 16 + len(moved) * _STATS.size
    # Vectors nobody raises here (HI, BLOCK, IRQ_POLL) never move: most slots are not copied.
    assert len(moved) <= len(s2.stats) * 7 // 10, moved


def test_missing_object_is_one_clear_line(tmp_path):
    with pytest.raises(ProbeError) as exc:
        SoftirqProbe(engine=LibbpfEngine(object_dir=tmp_path))
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("softirq: off") and "make bpf" in msg


def test_kernel_without_btf_is_one_clear_line(tmp_path):
    fake = HostPaths(sys=tmp_path)
    with pytest.raises(ProbeError) as exc:
        SoftirqProbe(engine=LibbpfEngine(paths=fake))
    assert "no BTF" in str(exc.value) and "\n" not in str(exc.value)


# ---- parsing and summaries (no kernel needed) -----------------------------------------------------------

SOFTIRQS_TEXT = """\
                    CPU0       CPU1       CPU2
          HI:          1          0          0
       TIMER:      15129      15417         12
      NET_TX:          4          0          0
      NET_RX:     143626    1589222          7
       BLOCK:          0      77072          0
    IRQ_POLL:          0          0          0
     TASKLET:          1          1          0
       SCHED:      29080      27694          3
     HRTIMER:          0          0          0
         RCU:      35296     136511          9
"""


def test_proc_softirqs_parses_every_cpu_and_vector(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "softirqs").write_text(SOFTIRQS_TEXT)
    got = read_proc_softirqs(HostPaths.under(tmp_path))
    assert len(got) == 30
    assert got[(1, "NET_RX")] == 1589222 and got[(2, "RCU")] == 9 and got[(0, "HI")] == 1
    assert {v for _, v in got} == set(VECTORS)


def test_proc_softirqs_on_this_kernel_has_every_vector():
    got = read_proc_softirqs()
    assert {v for _, v in got} == set(VECTORS)
    assert {c for c, _ in got} == set(range(len({c for c, _ in got})))


def _stats(entries: int, run_ns: list[int], delay_ns: list[int]) -> SoftirqStats:
    from probes.hist import HIST_SLOTS, LatencyHistogram

    def hist(values: list[int]) -> LatencyHistogram:
        slots = [0] * HIST_SLOTS
        for v in values:
            slots[min((v // 1000).bit_length(), HIST_SLOTS - 1)] += 1
        return LatencyHistogram(tuple(slots), sum(values), len(values), max(values, default=0))

    return SoftirqStats(hist(delay_ns), hist(run_ns), entries)


def test_summarize_rows_per_cpu_and_vector():
    empty = _stats(0, [], [])
    prev = SoftirqSnapshot(10.0, {(0, "NET_RX"): _stats(5, [1000] * 5, [500] * 5), (0, "TIMER"): empty,
                                  (1, "NET_RX"): empty}, {})
    cur = SoftirqSnapshot(12.0, {(0, "NET_RX"): _stats(105, [1000] * 5 + [10_000] * 100, [500] * 5 + [2000] * 99),
                                 (0, "TIMER"): empty, (1, "NET_RX"): _stats(1, [20_000_000], [15_000_000])}, {})
    rows = summarize(prev, cur)
    assert [(r["cpu"], r["vector"]) for r in rows] == [(0, "NET_RX"), (1, "NET_RX")]
    r0, r1 = rows
    assert r0["entries"] == 100 and r0["delay_samples"] == 99
    assert r0["runtime_s"] == pytest.approx(100 * 10e-6)
    assert r0["runtime_s_per_s"] == pytest.approx(100 * 10e-6 / 2.0)
    assert 2.0 <= r0["delay_p50_us"] <= 4.0 and r0["runtime_max_us"] == pytest.approx(10.0)
    assert r1["runtime_max_us"] == pytest.approx(20_000.0) and r1["delay_max_us"] == pytest.approx(15_000.0)
    # (0, TIMER) is the same object in both snapshots (the probe hands it again when nothing moved): no row.
    assert len(summarize(prev, cur, include_idle=True)) == 2
    import json

    json.dumps(rows)  # JSON-able


def active_interval() -> SoftirqInterval:
    """An interval in which two CPUs ran softirqs (tests/test_signal_plugins.py runs the extractor on it)."""
    from probes.hist import HIST_SLOTS, IntervalHistogram

    def hist(count: int, sum_ns: int) -> IntervalHistogram:
        return IntervalHistogram(tuple([count] + [0] * (HIST_SLOTS - 1)), sum_ns, count, None)

    return SoftirqInterval(1.0, {(0, "NET_RX"): SoftirqDelta(5, hist(5, 5000), hist(5, 2_000_000)),
                                 (1, "TIMER"): SoftirqDelta(3, hist(3, 900), hist(3, 600_000))})


def test_softirq_signals_per_cpu_and_through_where_a_workload_ran():
    from probes.softirq import PLUGIN

    extractor = PLUGIN.signal_extractor
    node = extractor.node(active_interval(), 0.5)
    assert node["softirq_ms_per_s_by_cpu"] == {0: 4.0, 1: 1.2}
    exposed = extractor.exposure({0: 0.75, 1: 0.25}, node)
    assert exposed["softirq_ms_per_s"] == 0.75 * 4.0 + 0.25 * 1.2
    assert exposed["softirq_delay_p99_ns"] == max(node["softirq_delay_p99_ns_by_cpu"].values())
