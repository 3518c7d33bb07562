# SPDX-License-Identifier: Apache-2.0
"""The bench's side of the counterfactual (bench/scenarios/metrics.py, cfcheck.py): the culprit's
counterfactual p99 recorded before the action, compared with the victim's runqueue p99 after it."""

from __future__ import annotations

from probes.hist import HIST_SLOTS, IntervalHistogram


def _hist(counts: dict[int, int], sum_ns: int) -> IntervalHistogram:
    slots = [0] * HIST_SLOTS
    for slot, n in counts.items():
        slots[slot] = n
    return IntervalHistogram(tuple(slots), sum_ns, sum(slots), None)


def test_the_bench_records_the_counterfactual_and_the_runq_p99_after_the_action():
    from bench.scenarios.metrics import ActionRecordLite, PassResult, Truth, score

    result = PassResult("cpu-neighbor", "mitigate", 10.0, 20.0)
    result.actions.append(ActionRecordLite(3.0, "suppress", "batch", "applied", ""))
    # The last before the action (+ its tick) for the pod the action moved: 1.6; the other pod's is not it.
    result.counterfactual += [(2.0, "batch", 1.8), (3.1, "other", 0.1), (3.1, "batch", 1.6), (6.0, "batch", 9.9)]
    quiet = _hist({10: 99, 11: 1}, 0).slots  # after the action: p99 inside slot 10 ([512, 1024) µs)
    result.runq_ticks += [(float(t), quiet, 0, 100) for t in range(4, 14)]
    result.runq_ticks.append((1.0, _hist({14: 100}, 0).slots, 0, 100))  # before: not in the window
    s = score(Truth(victim="web", culprit="batch", causes=("neighbor_cpu",)), result)
    assert s.runq_p99_without_culprit_ms == 1.6
    assert s.runq_p99_after_ms is not None and 0.512 <= s.runq_p99_after_ms <= 1.024


def test_the_bench_compares_pods_moved_together_with_their_joint_counterfactual():
    from bench.scenarios.metrics import ActionRecordLite, PassResult, Truth, moved_by_first_action, score

    # the same tick's two suppresses (and a later one that is not theirs)
    assert moved_by_first_action([(2.0, "batch"), (2.01, "batch-small"), (9.0, "other")]) == "batch+batch-small"
    assert moved_by_first_action([(2.0, "batch"), (2.0, "batch")]) == "batch"  # a record listed twice
    result = PassResult("cpu-neighbor-two", "mitigate", 10.0, 20.0)
    result.actions += [ActionRecordLite(3.0, "suppress", "batch-small", "verified", ""),
                       ActionRecordLite(3.0, "suppress", "batch", "verified", "")]
    result.counterfactual += [(3.1, "batch", 3.2), (3.1, "batch-small", 0.0), (3.1, "batch+batch-small", 0.05)]
    result.runq_ticks += [(float(t), _hist({4: 100}, 0).slots, 0, 100) for t in range(4, 14)]
    s = score(Truth(victim="web", culprit="batch", causes=("neighbor_cpu",)), result)
    assert s.runq_p99_without_culprit_ms == 0.05 and s.runq_p99_within is True


def test_the_after_window_takes_only_ticks_that_began_in_it():
    """A tick is recorded at its end: one whose loop stalled across the action (4.2 -> 6.5 s) holds the
    waits from before the action, and is not 'after' though it ends after the settle time."""
    from bench.scenarios.metrics import ticks_within

    ticks = [(t, (), 0, 1) for t in (3.1, 4.2, 6.5, 7.0, 8.0, 14.2)]
    assert [t[0] for t in ticks_within(ticks, 6.2, 14.2)] == [7.0, 8.0]
    assert [t[0] for t in ticks_within(list(reversed(ticks)), 4.0, 9.0)] == [6.5, 7.0, 8.0]  # any order
    assert ticks_within([], 0.0, 1.0) == []


def test_the_cfcheck_report_reads_a_runs_json_as_the_score_does():
    import random

    from bench.scenarios.cfcheck import check_pass, main

    quiet = list(_hist({4: 199, 11: 1}, 0).slots)  # one wait of 1-2 ms in 200
    tail = list(_hist({4: 196, 11: 4}, 0).slots)  # 2 % of them: the after-p99 is in the tail
    p = {"scenario": "global-reclaim", "mode": "mitigate",
         "actions": [{"at_s": 6.0, "kind": "memory_suppress", "target": "batch", "state": "applied", "summary": ""}],
         "runq_ticks": [[float(t), quiet, 0, 200] for t in range(-10, 6)] + [[float(t), tail, 0, 200] for t in range(8, 14)],
         "counterfactual": [[5.0, "batch", 0.9], [6.2, "other", 0.1], [6.2, "batch", 0.3], [9.0, "batch", 5.0]],
         # kernel work in its waits: 1 ms/s before the onset, 40 during the incident, 10 left after the cap
         "kernel_work": [[float(t), 1.0] for t in range(-10, 0)] + [[float(t), 40.0] for t in range(0, 7)]
                        + [[float(t), 10.0] for t in range(8, 14)]}
    c = check_pass(p, random.Random(1))
    assert c is not None and c.moved == "batch" and c.without_ms == 0.3  # the last before the action, for its pod
    # After: the ticks from 8 s on, but the one at 8 s covers 5-8 s (none recorded between): not in it.
    assert c.long_before == (10, 2000) and c.long_after == (20, 1000)
    assert c.after_ms is not None and 1.024 <= c.after_ms < 2.048
    assert c.after_interval_ms is not None and c.after_interval_ms[0] <= c.after_ms <= c.after_interval_ms[1]
    assert c.before_ms is not None and c.before_ms < 1.024  # one long wait in 200 before the onset: the bulk
    # the window is the ticks from -3.5 to 6.5 s: three of the before-onset 1s, seven 40s
    assert c.kernel_work_ms_per_s == (1.0, (3 * 1.0 + 7 * 40.0) / 10, 10.0)
    older = check_pass({k: v for k, v in p.items() if k != "kernel_work"}, random.Random(1))  # runs before the field
    assert older is not None and older.kernel_work_ms_per_s == (None, None, None)
    assert check_pass({**p, "mode": "detect"}, random.Random(1)) is None
    from bench.scenarios.metrics import cf_within as within

    assert within(0.3, c.after_ms) is False and within(0.11, 0.06) is True and within(0.13, 0.06) is False
    assert within(1.2, 1.0) is True and within(0.74, 1.0) is False and within(None, 1.0) is None
    assert main([]) == 2 and main(["/nonexistent.json"]) == 2
    # A cap leaves the grower running where it was: both shown, not judged; an eviction is judged.
    assert c.in_place and not check_pass(_with_kind(p, "evict"), random.Random(1)).in_place


def _with_kind(p: dict, kind: str) -> dict:
    return {**p, "actions": [{**a, "kind": kind} for a in p["actions"]]}


def test_the_bench_does_not_judge_a_counterfactual_against_a_culprit_capped_in_place():
    """Issue 28 compares the counterfactual with the p99 after the action moved the culprit away; a memory
    cap leaves the grower streaming through its page cache (docs/benchmarks.md, global reclaim)."""
    from bench.scenarios.metrics import ActionRecordLite, PassResult, Truth, score

    truth = Truth(victim="web", culprit="grower", causes=("reclaim",))
    judged = {}
    for kind in ("memory_suppress", "evict"):
        result = PassResult("global-reclaim", "mitigate", 10.0, 20.0)
        result.actions.append(ActionRecordLite(3.0, kind, "grower", "verified", ""))
        result.counterfactual.append((3.1, "grower", 0.11))
        result.runq_ticks += [(float(t), _hist({10: 99, 11: 1}, 0).slots, 0, 100) for t in range(4, 14)]
        s = score(truth, result)
        assert s.runq_p99_without_culprit_ms == 0.11 and s.runq_p99_after_ms is not None  # both shown
        judged[kind] = s.runq_p99_within
    assert judged == {"memory_suppress": None, "evict": False}
