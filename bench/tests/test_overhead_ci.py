# SPDX-License-Identifier: Apache-2.0
"""bench/overhead_ci.py: bootstrap intervals of overhead.py's paired median loss, from its JSON."""

from __future__ import annotations

import json

import pytest

from bench.overhead_ci import analyse, interval, main, paired


def _runs(rows: list[tuple[int, str, float | None]], workload: str = "pipe") -> list[dict]:
    return [{"workload": workload, "round": r, "arm": arm, "throughput": tp, "error": None if tp else "failed"}
            for r, arm, tp in rows]


def test_paired_ratios_skip_rounds_where_an_arm_failed():
    runs = _runs([(0, "none", 100.0), (0, "noisyneighbor", 95.0),
                  (1, "none", 200.0), (1, "noisyneighbor", None),
                  (2, "none", 50.0), (2, "noisyneighbor", 45.0)])
    assert paired(runs, "pipe", "noisyneighbor", "none") == [0.95, 0.9]


def test_interval_brackets_the_median_and_is_exact_without_spread():
    assert interval([0.95] * 21) == pytest.approx((5.0, 5.0, 5.0))
    ratios = [0.90, 0.92, 0.94, 0.95, 0.96, 0.98, 1.00] * 3
    loss, low, high = interval(ratios)
    assert loss == pytest.approx(5.0)
    assert 0.0 <= low < loss < high <= 10.0
    assert interval(ratios, seed=1) == interval(ratios, seed=1)  # reproducible from the JSON


def test_analyse_reports_every_arm_and_each_over_floor():
    rows = []
    for r in range(5):
        rows += [(r, "none", 100.0), (r, "floor", 98.0), (r, "noisyneighbor", 95.0), (r, "bcc-runqlat", 97.0)]
    data = {"workloads": ["pipe"], "arms": ["none", "floor", "noisyneighbor", "bcc-runqlat"], "runs": _runs(rows)}
    intervals, vs_floor = analyse(data)
    assert {(i.arm, round(i.loss_pct, 6)) for i in intervals} == {
        ("floor", 2.0), ("noisyneighbor", 5.0), ("bcc-runqlat", 3.0)}
    assert vs_floor == {("pipe", "noisyneighbor"): pytest.approx(95 / 98),
                        ("pipe", "bcc-runqlat"): pytest.approx(97 / 98)}


def test_no_floor_arm_means_no_ratio_over_floor():
    rows = [(r, arm, tp) for r in range(3) for arm, tp in (("none", 100.0), ("noisyneighbor", 95.0))]
    _, vs_floor = analyse({"workloads": ["pipe"], "arms": ["none", "noisyneighbor"], "runs": _runs(rows)})
    assert vs_floor == {}


def test_not_an_overhead_json_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"runs": []}))
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an overhead.py JSON" in err
