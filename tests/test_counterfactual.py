"""The counterfactual per culprit (detector/counterfactual.py, runq_cf in bpf/runqlat.bpf.c): the victim's
runqueue p99 and wait per second with a culprit's share of each wait taken out.

- arithmetic: moves applied to a histogram, by hand;
- the kernel: the moves a real BE hog causes conserve the victim's wait count (each wait leaves one
  slot for one other), only ever move waits down, and what remains without the hog is the victim's
  wait behind everyone else; the incident carries it (JSON, text, metric).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from detector.counterfactual import VictimWindow, describe
from probes.hist import HIST_SLOTS, IntervalHistogram
from probes.runqlat import CulpritStats, RunqLatProbe, add_slots, counterfactual_histogram
from tests.conftest import slowdown
from tests.scenario_support import scenario_harness
from tests.test_detector_scenarios import VICTIM_CPU, _policy


def _hist(counts: dict[int, int], sum_ns: int) -> IntervalHistogram:
    slots = [0] * HIST_SLOTS
    for slot, n in counts.items():
        slots[slot] = n
    return IntervalHistogram(tuple(slots), sum_ns, sum(slots), None)


def _moves(moves: dict[int, int]) -> tuple[int, ...]:
    out = [0] * HIST_SLOTS
    for slot, m in moves.items():
        out[slot] = m
    return tuple(out)


def test_moves_applied_by_hand():
    # 100 waits: 95 of ~10 µs (slot 4) and 5 of ~6 ms (slot 13). The culprit ran 5.9 ms of each long one:
    # without it they are ~100 µs (slot 7). p99 drops from the 6 ms slot to the 100 µs slot.
    victim = _hist({4: 95, 13: 5}, 95 * 10_000 + 5 * 6_000_000)
    moves = _moves({13: -5, 7: +5})
    without = counterfactual_histogram(victim, moves, 5 * 5_900_000)
    assert without.count == victim.count and without.slots[13] == 0 and without.slots[7] == 5
    assert without.sum_ns == 95 * 10_000 + 5 * 100_000
    assert 4_096_000 <= victim.quantile_ns(0.99) <= 8_192_000
    assert 64_000 <= without.quantile_ns(0.99) <= 128_000
    # moves never push a slot below zero (two containers of one pod moving the same wait)
    assert min(counterfactual_histogram(victim, _moves({13: -9, 2: +9}), 0).slots) == 0


def test_window_cost_and_its_words():
    w = VictimWindow()
    for _ in range(4):
        w.add(_hist({4: 95, 13: 5}, 95 * 10_000 + 5 * 6_000_000), 1.0, {"batch": _moves({13: -5, 7: 5})},
              {"batch": 5 * 5_900_000})
    cost = w.cost("batch")
    assert cost is not None
    assert cost.p99_without_ns < cost.p99_ns and cost.added_ns == cost.p99_ns - cost.p99_without_ns
    assert cost.wait_ms_per_s == pytest.approx((95 * 10_000 + 5 * 6_000_000) / 1e6)
    assert cost.wait_ms_per_s_without == pytest.approx((95 * 10_000 + 5 * 100_000) / 1e6)
    nobody = w.cost("someone-else")
    assert nobody is not None and nobody.p99_without_ns == nobody.p99_ns
    text = describe("batch", "web", cost)
    assert text.startswith("batch added ") and "ms to web's runqueue p99 (" in text and "without it" in text


def test_culprit_stats_carry_the_moves_through_add_and_delta():
    a = CulpritStats(10, 1, 0, _moves({9: -2, 3: 2}))
    b = CulpritStats(30, 3, 0, _moves({9: -5, 3: 4, 2: 1}))
    assert (b.delta(a).cf_slots[9], b.delta(a).cf_slots[3], b.delta(a).cf_slots[2]) == (-3, 2, 1)
    assert (a + b).cf_slots[9] == -7
    assert add_slots((), (), 1) == () and CulpritStats(1, 1, 0).delta(CulpritStats(0, 0, 0)).cf_slots == ()


def test_the_kernel_work_a_culprit_caused_comes_out_with_it():
    # 100 waits of ~10 µs and 5 of ~6 ms, each 3 ms behind the culprit and 2.9 ms behind ksoftirqd (the
    # node): without the culprit alone they are ~3 ms (slot 12); without its kernel work too ~100 µs (slot 7).
    w = VictimWindow()
    for _ in range(3):
        w.add(_hist({4: 95, 13: 5}, 95 * 10_000 + 5 * 6_000_000), 1.0, {"flood": _moves({13: -5, 12: 5}),
              "/": _moves({13: -5, 12: 5})}, {"flood": 5 * 3_000_000, "/": 5 * 2_900_000},
              {"flood": _moves({12: -5, 7: 5})}, {"flood": 5 * 2_900_000})
    own, with_node = w.cost("flood"), w.cost("flood", kernel_work=True)
    assert own is not None and with_node is not None
    assert 2_048_000 <= own.p99_without_ns < 4_096_000
    assert 64_000 <= with_node.p99_without_ns < 128_000
    assert with_node.wait_ms_per_s_without == pytest.approx((95 * 10_000 + 5 * 100_000) / 1e6)
    text = describe("flood", "web", with_node, "ksoftirqd")
    assert "without it and the kernel work it caused (ksoftirqd)" in text


def test_waits_only_the_kernel_lengthened_come_out_with_the_culprits_kernel_work():
    # 100 waits of ~10 µs and 6 of ~6 ms: 3 behind the culprit (moved to ~3 ms by it, to ~100 µs by the
    # softirq work around it) and 3 only softirq work lengthened (the node's own pair: from 6 ms to ~100 µs).
    w = VictimWindow()
    for _ in range(3):
        w.add(_hist({4: 100, 13: 6}, 100 * 10_000 + 6 * 6_000_000), 1.0, {"flood": _moves({13: -3, 12: 3})},
              {"flood": 3 * 3_000_000}, {"flood": _moves({12: -3, 7: 3}), "/": _moves({13: -3, 7: 3})},
              {"flood": 3 * 2_900_000, "/": 3 * 5_900_000})
    own, kernel = w.cost("flood"), w.cost("flood", kernel_work=True)
    assert own is not None and kernel is not None
    assert 4_096_000 <= own.p99_without_ns < 8_192_000  # the 3 kernel-only waits still hold the p99
    assert 64_000 <= kernel.p99_without_ns < 128_000
    assert kernel.wait_ms_per_s_without == pytest.approx((100 * 10_000 + 6 * 100_000) / 1e6)
    node = w.cost("/", kernel_work=True)  # the node itself: its moves once, not twice
    assert node is not None and node.wait_ms_per_s_without == pytest.approx(
        (100 * 10_000 + 6 * 6_000_000 - 3 * 5_900_000) / 1e6)


def test_only_the_causes_that_declare_kernel_work_cost_it():
    from detector import causes
    from detector.decisions import Cause

    assert causes.spec(Cause.SOFTIRQ).kernel_work == "ksoftirqd"
    assert causes.spec(Cause.RECLAIM).kernel_work == ""  # capping the grower does not stop kswapd
    assert causes.spec(Cause.NEIGHBOR_CPU).kernel_work == ""


def _steer_net_rx(veth_pair: dict, cpu: int) -> None:
    """RPS on the receiving veth (our own namespace): its NET_RX work runs on `cpu`, raised by an IPI."""
    subprocess.run(["ip", "netns", "exec", veth_pair["b"], "sh", "-c",
                    f"echo {1 << cpu:x} > /sys/class/net/{veth_pair['dev_b']}/queues/rx-0/rps_cpus"],
                   check=True, timeout=10)


def _softirq_run_ns(before, after, cpu: int) -> int:
    """Softirq run time on `cpu` between two softirq probe snapshots, every vector."""
    return sum(s.runtime.sum_ns - (before.stats[k].runtime.sum_ns if k in before.stats else 0)
               for k, s in after.stats.items() if k[0] == cpu)


def _flooded_window(make_cgroup, veth_pair, hog: bool):
    """The victim (and a CPU hog in a cgroup of its own) on the last CPU while a UDP flood from the first
    CPU has its receive work steered there. Returns the probe snapshots and truths of a 3 s window."""
    from probes.softirq import SoftirqProbe
    from tests.test_softirq import _FLOOD
    from tests.test_who_ran_instead import (
        CPU,
        VICTIM,
        _ino,
        _run_delay,
        _set_weight,
        _start,
        _tids,
        _wait_for_tasks,
        _window,
    )

    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two CPUs: one sends, the victim's receives")
    cpu = int(CPU)
    _steer_net_rx(veth_pair, cpu)
    victim = make_cgroup("victim")
    groups = {victim: 1}
    procs: list[subprocess.Popen] = []
    try:
        _start([sys.executable, "-c", VICTIM], victim, procs)
        if hog:
            heavy = make_cgroup("heavy", controllers=("cpu", "cpuacct"))
            _set_weight(heavy, 1024)
            _start([sys.executable, "-c", "while True: pass"], heavy, procs)
            groups[heavy] = 1
        _wait_for_tasks(groups)
        (tid,) = _tids(victim)
        everyone = [t for cg in groups for t in _tids(cg)]
        seconds = 3 * slowdown()
        procs.append(subprocess.Popen(["ip", "netns", "exec", veth_pair["a"], "taskset", "-c", "0", sys.executable,
                                       "-c", _FLOOD, str(10**9), str(seconds + 20 * slowdown()), veth_pair["dst"]],
                                      stdout=subprocess.DEVNULL))
        with RunqLatProbe() as probe, SoftirqProbe(stall_threshold_ns=0) as sirq:
            time.sleep(1.0 * slowdown())  # the sender's interpreter starts
            s0 = sirq.snapshot()
            before, after, t0, t1 = _window(probe, everyone, seconds, lambda: {"run_delay": _run_delay(tid)})
            s1 = sirq.snapshot()
        ids = {"victim": _ino(victim), **({"heavy": _ino(heavy)} if hog else {})}
        return before, after, t1["run_delay"] - t0["run_delay"], _softirq_run_ns(s0, s1, cpu), ids, probe
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _node_pair(before, after, victim: int, node: int) -> CulpritStats:
    pair = after.culprits.get((victim, node))
    assert pair is not None, "no (victim, node) pair: the softirq work in its waits was not seen"
    return pair.delta(before.culprits.get((victim, node)))


@pytest.mark.vm
@pytest.mark.root
def test_softirq_work_alone_in_the_victims_waits_comes_out_as_kernel_work(make_cgroup, veth_pair):
    """The victim alone on its CPU, NET_RX steered there: its waits are woken on an idle CPU whose
    softirq work (run on top of the idle task, charged to it by the kernel) keeps it from running. The
    node's own pair moves those waits down by that work (runq_counterfactual.node_slots): the moves
    conserve the waits, only shorten them, and take out no more than the victim waited (schedstat) nor
    than the softirq work the CPU ran (the softirq probe)."""
    before, after, run_delay, softirq_ns, ids, probe = _flooded_window(make_cgroup, veth_pair, hog=False)
    v = ids["victim"]
    hist = after.per_cgroup[v].delta(before.per_cgroup.get(v))
    node = _node_pair(before, after, v, probe.node_cgroup_id)
    moves = node.cf_node_slots
    print(f"victim {hist.count} waits, {hist.sum_ns / 1e6:.1f} ms (schedstat {run_delay / 1e6:.1f} ms); softirq "
          f"on its CPU {softirq_ns / 1e6:.1f} ms; in its waits {node.cf_node_ns / 1e6:.2f} ms over "
          f"{sum(x for x in moves if x > 0)} waits; moves {moves}")
    assert moves and sum(moves) == 0, moves  # each wait it moves leaves one slot for another
    assert moves[max(i for i, x in enumerate(moves) if x)] < 0, moves  # only ever shorter
    assert 0 < node.cf_node_ns <= hist.sum_ns
    assert node.cf_node_ns <= softirq_ns * 1.05 + 1_000_000
    assert abs(hist.sum_ns - run_delay) <= 0.05 * run_delay + 2_000_000  # the histogram is the kernel's wait


@pytest.mark.vm
@pytest.mark.root
def test_softirq_work_in_waits_behind_a_hog_comes_out_after_the_hog(make_cgroup, veth_pair):
    """A CPU hog shares the victim's CPU and NET_RX is steered there. Softirq work on top of the hog is
    the hog's part; what ran on top of anyone else inside the same waits (ksoftirqd, the idle task) is
    the further move of the hog's pair (node_slots): after the hog's own moves, conserving the waits,
    only shortening them, and no more than the softirq work the CPU ran."""
    before, after, run_delay, softirq_ns, ids, _ = _flooded_window(make_cgroup, veth_pair, hog=True)
    v, h = ids["victim"], ids["heavy"]
    hist = after.per_cgroup[v].delta(before.per_cgroup.get(v))
    heavy = after.culprits[(v, h)].delta(before.culprits.get((v, h)))
    node, moves = heavy.cf_node_slots, heavy.cf_slots
    print(f"victim {hist.count} waits, {hist.sum_ns / 1e6:.1f} ms (schedstat {run_delay / 1e6:.1f} ms); hog "
          f"{heavy.wait_ns / 1e6:.1f} ms of it; softirq on the CPU {softirq_ns / 1e6:.1f} ms; outside the hog in "
          f"its waits {heavy.cf_node_ns / 1e6:.2f} ms; node moves {node}")
    assert heavy.wait_ns > 0.3 * hist.sum_ns  # the hog is what the victim waits behind
    assert node and sum(node) == 0, node
    assert node[max(i for i, x in enumerate(node) if x)] < 0, node
    assert 0 < heavy.cf_node_ns <= min(softirq_ns * 1.05 + 1_000_000, hist.sum_ns - heavy.wait_ns + 1_000_000)
    iv = IntervalHistogram(hist.slots, hist.sum_ns, hist.count, None)
    alone = counterfactual_histogram(iv, moves, heavy.wait_ns)
    both = counterfactual_histogram(iv, add_slots(moves, node, 1), heavy.wait_ns + heavy.cf_node_ns)
    assert abs(both.count - alone.count) <= max(3, 0.03 * hist.count), (both.count, alone.count)
    assert both.sum_ns < alone.sum_ns


@pytest.fixture
def scenario(make_cgroup):
    yield from scenario_harness(make_cgroup, VICTIM_CPU, _policy)


@pytest.mark.root
@pytest.mark.slow
def test_a_be_hogs_cost_to_the_victim_from_the_kernel(scenario):
    s = scenario(_policy(runq_p99_ms=2.0))
    ls = s.pod("web", "LS")
    be = s.pod("batch", "BE", shares=2048)
    s.ls_worker(ls, [VICTIM_CPU], seconds=30)
    s.hog(be, [VICTIM_CPU], seconds=30)
    be_key = f"pod:{be.uid}"
    moved = 0
    for _ in range(10):
        s.run_for(1)
        row = s.detector.last.workloads.get(f"pod:{ls.uid}") if s.detector.last else None
        if row is None or row.runq_hist is None:
            continue
        m = row.cf_moves.get(be_key)
        if not m:
            continue
        moved += sum(x for x in m if x > 0)
        assert sum(m) == 0, m  # every wait that leaves a slot lands in another
        top = max(i for i, x in enumerate(m) if x)
        assert m[top] < 0, m  # the highest slot touched loses waits: taking the hog out only shortens them
        without = counterfactual_histogram(row.runq_hist, m, int(row.ran_instead_ns.get(be_key, 0)))
        # The histogram and the moves are read one after the other: a wait that ended between the two
        # reads has its move in this tick and its count in the next, so a slot may go below zero (clipped)
        # by the few waits of that gap. Over the window both are whole.
        clipped = sum(max(0, -(n + x)) for n, x in zip(row.runq_hist.slots, m, strict=True))
        assert clipped <= max(3, 0.03 * row.runq_hist.count), (row.runq_hist.slots, m)
        assert without.count == row.runq_hist.count + clipped
        assert without.sum_ns <= row.runq_hist.sum_ns
    assert moved > 0, "the hog lengthened the victim's waits enough to change their slot"
    incidents = s.incidents_for(ls)
    named = [c for inc in incidents for c in inc.culprits if c.target.cgroup == be.path]
    assert named, [i.to_dict() for i in incidents]
    c = named[-1]
    assert c.runq_p99_without_ns is not None and c.victim_runq_p99_ns is not None
    assert c.runq_p99_without_ns < c.victim_runq_p99_ns, c
    assert c.wait_ms_per_s_without is not None and c.wait_ms_per_s_without < c.victim_wait_ms_per_s, c
    assert "runq_p99_without_ns" in incidents[-1].to_dict()["culprits"][0]


def test_the_cost_reads_in_json_text_html_and_the_metric():
    from detector.decisions import Cause, Target
    from detector.model import Culprit, Incident
    from noisyneighbor.diagnose import DiagnoseReport, render_text
    from noisyneighbor.exporter import Exporter
    from noisyneighbor.exporter import render_text as metrics_text
    from noisyneighbor.report_html import render_html
    from probes.snapshot import NodeSnapshot

    victim = Target("/kubepods.slice/v", "v", "shop", "web", "LS")
    batch = Culprit(Target("/kubepods.slice/b", "b", "batch", "batch-x", "BE"), 0.9, who_ran_instead_share=0.7,
                    victim_runq_p99_ns=5.0e6, runq_p99_without_ns=1.9e6, victim_wait_ms_per_s=120.0,
                    wait_ms_per_s_without=40.0)
    inc = Incident("i1", victim, Cause.NEIGHBOR_CPU, 1.0, 0.7, "runq_p99_ns", culprits=[batch])
    assert inc.to_dict()["culprits"][0]["runq_p99_without_ns"] == 1.9e6
    report = DiagnoseReport(0.0, 10.0, 10, {}, [inc], [], [],
                            series={"i1": {"victim:runq_p99_ns": [(0.5, 4e6), (5.0, 5e6)]}})
    text = render_text(report)
    assert "batch/batch-x added 3.1 ms to shop/web's runqueue p99 (5.0 \u2192 1.9 ms without it; wait 120 \u2192 40 ms/s)" \
        in text, text
    html = render_html(report)
    assert "p99 without batch/batch-x" in html and "5.0 \u2192 1.9 ms" in html
    exporter = Exporter(None, node="n")
    exporter.update(NodeSnapshot(monotonic_s=1.0, wall_s=1.0), [inc])
    metrics = metrics_text(exporter).decode()
    line = next(x for x in metrics.splitlines() if x.startswith("noisyneighbor_incident_culprit_runq_p99_without_seconds{"))
    assert 'culprit_pod="batch-x"' in line and line.endswith(" 0.0019")


def test_the_bench_records_the_counterfactual_and_the_runq_p99_after_the_action():
    from bench.scenarios.metrics import ActionRecordLite, PassResult, Truth, score

    result = PassResult("cpu-neighbor", "mitigate", 10.0, 20.0)
    result.actions.append(ActionRecordLite(3.0, "suppress", "batch", "applied", ""))
    result.counterfactual += [(2.0, 1.8), (3.1, 1.6), (6.0, 9.9)]  # the last before the action (+ its tick): 1.6
    quiet = _hist({10: 99, 11: 1}, 0).slots  # after the action: p99 inside slot 10 ([512, 1024) µs)
    result.runq_ticks += [(float(t), quiet, 0, 100) for t in range(4, 14)]
    result.runq_ticks.append((1.0, _hist({14: 100}, 0).slots, 0, 100))  # before: not in the window
    s = score(Truth(victim="web", culprit="batch", causes=("neighbor_cpu",)), result)
    assert s.runq_p99_without_culprit_ms == 1.6
    assert s.runq_p99_after_ms is not None and 0.512 <= s.runq_p99_after_ms <= 1.024
