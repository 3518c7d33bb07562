# SPDX-License-Identifier: Apache-2.0
"""How precise a `bench/overhead.py` median loss is: bootstrap intervals from its saved JSON.

One overhead run gives, per workload and arm, the median over rounds of (arm / the same round's
`none`). On a noisy VM a 5 % target needs to know how far that median could move: this resamples the
paired rounds (with replacement, fixed seed) and prints the 95 % interval of the median loss, and,
when the run had the `floor` arm, the median of each other arm / floor paired by round (the share of
the loss that is the probes' own work rather than the empty programs' dispatch; a variant run in the
bcc slot, see bench/variant_objects.py, is read the same way).

    .venv/bin/python -m bench.overhead_ci /tmp/overhead.json [more.json ...]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESAMPLES = 5000


@dataclass(frozen=True)
class ArmInterval:
    workload: str
    arm: str
    rounds: int
    loss_pct: float  # (1 - median paired ratio) * 100
    low_pct: float   # 95 % bootstrap interval of that loss
    high_pct: float


def paired(runs: list[dict[str, Any]], workload: str, arm: str, against: str) -> list[float]:
    """arm / against throughput, per round where both succeeded."""
    by_round: dict[int, dict[str, float]] = {}
    for r in runs:
        if r["workload"] == workload and r.get("throughput") and not r.get("error"):
            by_round.setdefault(r["round"], {})[r["arm"]] = r["throughput"]
    return [v[arm] / v[against] for _, v in sorted(by_round.items()) if arm in v and against in v]


def interval(ratios: Sequence[float], resamples: int = RESAMPLES, seed: int = 1) -> tuple[float, float, float]:
    """(median loss %, low %, high %) of the median of `ratios`, bootstrap 95 %."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    lo, hi = medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]
    return (1 - statistics.median(ratios)) * 100, (1 - hi) * 100, (1 - lo) * 100


def analyse(data: dict[str, Any]) -> tuple[list[ArmInterval], dict[tuple[str, str], float]]:
    """Intervals per (workload, arm), and per (workload, arm) the paired arm / floor median."""
    out: list[ArmInterval] = []
    vs_floor: dict[tuple[str, str], float] = {}
    for wl in data["workloads"]:
        for arm in data["arms"]:
            if arm == "none":
                continue
            ratios = paired(data["runs"], wl, arm, "none")
            if ratios:
                out.append(ArmInterval(wl, arm, len(ratios), *interval(ratios)))
            over_floor = paired(data["runs"], wl, arm, "floor") if arm != "floor" else []
            if over_floor:
                vs_floor[(wl, arm)] = statistics.median(over_floor)
    return out, vs_floor


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/overhead_ci.py", description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+", type=Path, help="files written by bench/overhead.py --json")
    args = p.parse_args(argv)
    for path in args.json:
        try:
            data = json.loads(path.read_text())
            rows, vs_floor = analyse(data)
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"overhead_ci: {path}: not an overhead.py JSON ({e})", file=sys.stderr)
            return 2
        print(f"{path} ({data.get('started', '?')}):")
        for r in rows:
            print(f"  {r.workload} {r.arm}: loss {r.loss_pct:.1f} %, 95 % interval {r.low_pct:.1f}-{r.high_pct:.1f} % "
                  f"({r.rounds} rounds)")
        for (wl, arm), ratio in vs_floor.items():
            print(f"  {wl}: {arm} / floor, paired by round: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
