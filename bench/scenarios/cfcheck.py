# SPDX-License-Identifier: Apache-2.0
"""Issue 28's counterfactual check of a scenario run, pass by pass, from its ``--json`` file.

For every mitigate pass that took an action: the victim's runqueue p99 over the counterfactual's window
(the ticks of the 10 s up to the action), the counterfactual the incident gave for the pod the action
moved (the score's ``runq p99 w/o culprit``), the runqueue p99 after (the score's ``runq p99 after``),
a 95 % interval of that after-p99 from resampling its ticks (bootstrap), and the waits of 1 ms or more
among all the victim's waits in the 10 s before the onset and in the after window. The interval says
how far the after-p99 itself can be trusted: where ~1 % of the waits sit in a millisecond tail, the
p99 of a few ticks flips between the bulk and the tail (docs/benchmarks.md, global-reclaim).

Two more columns say whether the action left the culprit's effect: the victim's runqueue p99 over the
10 s before the onset (what "without the culprit" looked like), and its wait behind the node's kernel
work (kswapd, kcompactd, kdamond, ksoftirqd; ms/s) before the onset, over the counterfactual's window
and after: a grower capped in place keeps streaming, and the kernel work its pages cause stays. So the
last column judges the two within 25 % only where the first action moved the culprit away; after a cap
(metrics.IN_PLACE_ACTIONS) both are shown and it says "not judged: capped in place".

    .venv/bin/python -m bench.scenarios.cfcheck RUN.json [RUN.json ...]
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass

from bench.scenarios.metrics import (
    COUNTERFACTUAL_SLACK_S,
    IN_PLACE_ACTIONS,
    RECOVERY_WINDOW_S,
    SETTLE_AFTER_MITIGATION_S,
    cell,
    cf_within,
    moved_by_first_action,
    runq_ticks_histogram,
    ticks_within,
)
from probes.hist import slot_bounds_us

CF_WINDOW_S = 10.0  # detector.counterfactual.WINDOW_TICKS at 1 s ticks
LONG_WAIT_US = 1024.0  # "1 ms or more": the slots from [1024, 2048) µs up
BOOTSTRAP_DRAWS = 2000

Tick = tuple[float, tuple[int, ...], int, int]  # (s since onset, slots, sum ns, count), as PassResult.runq_ticks


@dataclass(frozen=True)
class CfCheck:
    scenario: str
    moved: str
    window_p99_ms: float | None
    without_ms: float | None
    after_ms: float | None
    after_interval_ms: tuple[float, float] | None
    long_before: tuple[int, int]  # (waits of 1 ms or more, waits) in the 10 s before the onset
    long_after: tuple[int, int]  # ... in the after window
    before_ms: float | None = None  # the victim's runq p99 over the 10 s before the onset
    # Its wait behind the node's kernel work, ms/s: before the onset, over the window, after (None: not recorded).
    kernel_work_ms_per_s: tuple[float | None, float | None, float | None] = (None, None, None)
    in_place: bool = False  # the first action left the culprit running where it was (a memory cap): not judged


def _p99_ms(ticks: list[Tick]) -> float | None:
    hist = runq_ticks_histogram(ticks)
    return None if hist is None else hist.quantile_ns(0.99) / 1e6


def _long(ticks: list[Tick]) -> tuple[int, int]:
    hist = runq_ticks_histogram(ticks)
    if hist is None:
        return 0, 0
    return sum(n for i, n in enumerate(hist.slots) if slot_bounds_us(i)[0] >= LONG_WAIT_US), hist.count


def after_interval(ticks: list[Tick], rng: random.Random) -> tuple[float, float] | None:
    """The 2.5 and 97.5 percentiles of the after-p99 over ticks drawn with replacement."""
    if not ticks:
        return None
    draws = sorted(_p99_ms([rng.choice(ticks) for _ in ticks]) or 0.0 for _ in range(BOOTSTRAP_DRAWS))
    return draws[int(0.025 * BOOTSTRAP_DRAWS)], draws[int(0.975 * BOOTSTRAP_DRAWS) - 1]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def check_pass(p: dict, rng: random.Random) -> CfCheck | None:
    """One pass of the JSON (``passes[i]``); None unless it is a mitigate pass that acted."""
    applied = [a for a in p.get("actions", []) if a["state"] in ("applied", "verified") and a["at_s"] >= 0]
    if p["mode"] != "mitigate" or not applied:
        return None
    ttm, moved = applied[0]["at_s"], moved_by_first_action([(a["at_s"], a["target"]) for a in applied])
    ticks: list[Tick] = [(t[0], tuple(t[1]), t[2], t[3]) for t in p.get("runq_ticks", [])]
    after = ticks_within(ticks, ttm + SETTLE_AFTER_MITIGATION_S, ttm + RECOVERY_WINDOW_S)
    said = [x[-1] for x in p.get("counterfactual", []) if len(x) == 3 and x[1] == moved
            and x[0] <= ttm + COUNTERFACTUAL_SLACK_S]

    def in_window(t: float) -> bool:
        return ttm - CF_WINDOW_S + COUNTERFACTUAL_SLACK_S <= t <= ttm + COUNTERFACTUAL_SLACK_S

    kernel_work = [(x[0], x[1]) for x in p.get("kernel_work", [])]
    # Before the onset: the ticks that began and ended in the 10 s before it, as the after window's. The
    # window is by the ticks' ends: the last ticks the agent had when it acted.
    before = ticks_within(ticks, -CF_WINDOW_S, 0.0)
    return CfCheck(
        scenario=p["scenario"], moved=moved, window_p99_ms=_p99_ms([t for t in ticks if in_window(t[0])]),
        without_ms=said[-1] if said else None, after_ms=_p99_ms(after), after_interval_ms=after_interval(after, rng),
        long_before=_long(before), long_after=_long(after), before_ms=_p99_ms(before),
        kernel_work_ms_per_s=(_mean([v for _, v in ticks_within(kernel_work, -CF_WINDOW_S, 0.0)]),
                              _mean([v for t, v in kernel_work if in_window(t)]),
                              _mean([v for _, v in ticks_within(kernel_work, ttm + SETTLE_AFTER_MITIGATION_S,
                                                                 ttm + RECOVERY_WINDOW_S)])),
        in_place=applied[0]["kind"] in IN_PLACE_ACTIONS)


def _judged(c: CfCheck) -> str:
    return "not judged: capped in place" if c.in_place else cell(cf_within(c.without_ms, c.after_ms))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    rng = random.Random(1)  # the same interval for the same file
    print("| scenario | moved | runq p99 before onset ms | over the window | w/o culprit | after | after 95 % interval "
          "| waits >= 1 ms before onset | after | kernel work ms/s before onset | window | after | within 25 % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in argv:
        try:
            with open(path, encoding="utf-8") as f:
                passes = json.load(f)["passes"]
            rows = [c for c in (check_pass(p, rng) for p in passes) if c is not None]
        except (OSError, KeyError, IndexError, TypeError, ValueError) as e:
            print(f"error: cannot read {path}: {' '.join(str(e).split())}", file=sys.stderr)
            return 2
        for c in rows:
            lo_hi = "-" if c.after_interval_ms is None else f"[{c.after_interval_ms[0]:.2f}, {c.after_interval_ms[1]:.2f}]"
            kw = " | ".join(_ms(v) for v in c.kernel_work_ms_per_s)
            print(f"| {c.scenario} | {c.moved} | {_ms(c.before_ms)} | {_ms(c.window_p99_ms)} | {_ms(c.without_ms)} | "
                  f"{_ms(c.after_ms)} | {lo_hi} | {c.long_before[0]} of {c.long_before[1]} | "
                  f"{c.long_after[0]} of {c.long_after[1]} | {kw} | {_judged(c)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
