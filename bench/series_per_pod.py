#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Metric series the real agent exports per idle pod, against the budget (issue 17: <= 30 per idle pod).

Starts `noisyneighbor agent` (all probes, dry-run, standalone pod source) as in bench.agent_footprint,
creates ``--pods`` owned BestEffort pods of two kinds, each shaped as the kubelet makes them (a pod cgroup
and one container cgroup holding the process), waits for the agent to list them, scrapes ``/metrics``
once and counts the series whose ``cgroup`` label is a pod's cgroup or its container's:

- ``sleeping``: one process that never wakes (a pause container and nothing else);
- ``waking``: one process that wakes once a second (an idle service: a health check, a timer), so
  each interval has a few run-queue waits and the pod gets its latency histogram.

Prints, per kind, the series per pod (min / median / max) against the budget and the families of the
median pod, and the node-level series (no cgroup label). Cgroups are removed at the end, also on failure.

    sudo .venv/bin/python -m bench.series_per_pod              # 5 idle pods
    sudo .venv/bin/python -m bench.series_per_pod --pods 20 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.agent_footprint import CONTROLLERS, AgentUnderTest, pod_name  # noqa: E402
from detector.runtime import POD_LIST_MAX_AGE_S  # noqa: E402
from testkit.sandbox import OwnedCgroup, cleanup_prefix  # noqa: E402

BUDGET_PER_IDLE_POD = 30


def count_series(text: str, cgroups: set[str]) -> tuple[dict[str, Counter], int]:
    """(pod cgroup name -> Counter of series per family of it and its containers, node-level series
    without a cgroup label)."""
    per_pod: dict[str, Counter] = {cg: Counter() for cg in cgroups}
    node_level = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            cg = sample.labels.get("cgroup")
            if cg is None:
                node_level += 1
                continue
            key = next((c for c in cgroups if f"/{c}" in f"{cg}/"), None)  # the pod or a cgroup below it
            if key is not None:
                per_pod[key][family.name] += 1
    return per_pod, node_level


KINDS = {
    "sleeping": ["sleep", "3600"],
    "waking": ["sh", "-c", "while :; do sleep 1; done"],
}


def run(pods: int, interval: float, settle: float) -> dict:
    owned: dict[str, list[OwnedCgroup]] = {kind: [] for kind in KINDS}
    containers: list[OwnedCgroup] = []
    sleepers: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="nn-series-") as tmp:
        agent = AgentUnderTest(Path(tmp), interval)
        try:
            agent.wait_ready()
            for kind, command in KINDS.items():
                for _ in range(pods):
                    pod = OwnedCgroup(pod_name("besteffort"), CONTROLLERS).create()
                    owned[kind].append(pod)
                    container = OwnedCgroup(f"{pod.name}/cri-containerd-{uuid.uuid4().hex}{uuid.uuid4().hex}.scope",
                                            CONTROLLERS).create()
                    containers.append(container)
                    sleepers.append(subprocess.Popen(command, preexec_fn=container.preexec))
            # Idle cgroups that no pod source names are found by the walk of the hierarchy, which runs
            # when the pod list changes and otherwise every POD_LIST_MAX_AGE_S.
            time.sleep(settle + POD_LIST_MAX_AGE_S + 1)
            text = agent.get("/metrics").decode()
        finally:
            for p in sleepers:
                p.kill()
                p.wait()
            agent.stop()
            for cg in reversed([*[c for cgs in owned.values() for c in cgs], *containers]):
                cg.remove()
            cleanup_prefix()
    result: dict = {"pods_per_kind": pods, "budget": BUDGET_PER_IDLE_POD, "kinds": {}}
    for kind, cgs in owned.items():
        per_pod, node_level = count_series(text, {cg.dirs["cpu"].name for cg in cgs})
        totals = sorted(sum(c.values()) for c in per_pod.values())
        median = statistics.median(totals)
        median_pod = min(per_pod.values(), key=lambda c: abs(sum(c.values()) - median))
        result["kinds"][kind] = {
            "series_per_pod": {"min": totals[0], "median": median, "max": totals[-1]},
            "ratio_to_budget": round(median / BUDGET_PER_IDLE_POD, 2),
            "families_of_median_pod": dict(sorted(median_pod.items())),
        }
        result["node_level_series"] = node_level
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pods", type=int, default=5)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = run(args.pods, args.interval, args.settle)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for kind, r in result["kinds"].items():
        s = r["series_per_pod"]
        print(f"{kind} pods ({result['pods_per_kind']}): series per pod min {s['min']}  median {s['median']}  "
              f"max {s['max']}   budget {result['budget']}: {r['ratio_to_budget']}x")
        for family, n in r["families_of_median_pod"].items():
            print(f"  {n:4d}  {family}")
    print(f"node-level series (no cgroup label): {result['node_level_series']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
