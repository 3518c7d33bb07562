# SPDX-License-Identifier: Apache-2.0
"""The per-node series budget (noisyneighbor.exporter.NODE_SERIES_BUDGET): what one node exports without a
cgroup label stays within it at any CPU count. What grows with CPUs (the runqueue histogram of all tasks,
softirq per CPU x vector) is summed over CPUs unless ``--per-cpu-series`` asks for it per CPU.

The root tests count a real agent's scrape on the machine they run on (2 CPUs on the dev host; in the VM
lane at its CPU count: `make test-vm VM_ARGS="--cpus 64 --memory 8G" PYTEST_ARGS=tests/test_series_budget.py`
for a 64-vCPU node); the pure test builds 2-, 64- and 192-CPU snapshots so the arithmetic is checked here too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from noisyneighbor.exporter import NODE_SERIES_BUDGET, Exporter, render_text
from probes import runqlat, softirq
from probes.cgroupfs import discover
from probes.hist import HIST_SLOTS, LatencyHistogram
from probes.runqlat import RunqSnapshot
from probes.snapshot import NodeSnapshot
from probes.softirq import VECTORS, SoftirqSnapshot, SoftirqStats
from testkit.exporter_support import AgentProcess, write_config

HIST_SERIES = 20  # a histogram's series with the default buckets: 17 buckets, +Inf, _sum, _count
SOFTIRQ = tuple(name.removesuffix("_total")
                for name in (softirq.SOFTIRQ_DELAY, softirq.SOFTIRQ_RUNTIME, softirq.SOFTIRQ_ENTRIES))


def node_level(text: str) -> tuple[Counter, int]:
    """(node-level series by family, series carrying a non-empty cpu label) of one scrape."""
    families: Counter = Counter()
    with_cpu = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            with_cpu += bool(sample.labels.get("cpu"))
            if "cgroup" not in sample.labels:
                families[family.name] += 1
    return families, with_cpu


def _large_node_snapshot(cpus: int) -> NodeSnapshot:
    hist = LatencyHistogram(tuple(range(HIST_SLOTS)), 10**9, sum(range(HIST_SLOTS)), 10**6)
    stats = {(cpu, vector): SoftirqStats(hist, hist, 7) for cpu in range(cpus) for vector in VECTORS}
    return NodeSnapshot(monotonic_s=1.0, wall_s=100.0,
                        plugins={"runqlat": RunqSnapshot(1.0, {}, [hist] * cpus, {}, {}, {}, 0, False),
                                 "softirq": SoftirqSnapshot(1.0, stats, {})})


@pytest.mark.parametrize("cpus", [2, 64, 192])
def test_node_series_do_not_grow_with_cpus_unless_asked(cpus: int) -> None:
    snap = _large_node_snapshot(cpus)
    lean = Exporter(CollectorRegistry(), node="n1", layout=discover())
    full = Exporter(CollectorRegistry(), node="n1", layout=discover(), per_cpu_series=True)
    for exporter in (lean, full):
        exporter.update(snap)
    lean_families, lean_cpu = node_level(render_text(lean).decode())
    full_families, _ = node_level(render_text(full).decode())
    assert lean_cpu == 0
    assert sum(lean_families[f] for f in SOFTIRQ) == len(VECTORS) * (2 * HIST_SERIES + 1)
    assert lean_families[runqlat.CPU_RUNQ_LATENCY] == HIST_SERIES
    assert sum(lean_families.values()) <= NODE_SERIES_BUDGET
    # Opt-in: per CPU x vector, ~41 series a pair (26k at 64 CPUs), and the sums are the same.
    assert sum(full_families[f] for f in SOFTIRQ) == cpus * len(VECTORS) * (2 * HIST_SERIES + 1)
    assert full_families[runqlat.CPU_RUNQ_LATENCY] == cpus * HIST_SERIES
    lean_scrape = {(s.name, frozenset(s.labels.items())): s.value
                   for f in text_string_to_metric_families(render_text(lean).decode()) for s in f.samples}
    assert lean_scrape[(softirq.SOFTIRQ_ENTRIES, frozenset({("node", "n1"), ("vector", "NET_RX")}))] == 7 * cpus
    assert lean_scrape[(runqlat.CPU_RUNQ_LATENCY + "_count", frozenset({("node", "n1")}))] \
        == cpus * snap.probe("runqlat").per_cpu[0].count


def test_labels_that_grow_with_cpus_are_dropped_together_unless_asked() -> None:
    """A per-CPU family may have another label that grows with the node (an IRQ line: multi-queue devices
    have one per CPU): MetricSpec.per_cpu_labels are all summed away without --per-cpu-series."""
    from noisyneighbor.exporter import MetricDef

    d = MetricDef("noisyneighbor_made_up_seconds_total", "counter", "made up", ("cpu", "irq", "kind"), per_cpu=True,
                  per_cpu_labels=("cpu", "irq"))
    assert d.lean_labels(("3", "41", "edge")) == ("edge",)
    softirq_def = MetricDef(softirq.SOFTIRQ_ENTRIES, "counter", "x", ("cpu", "vector"), per_cpu=True)
    assert softirq_def.lean_labels(("3", "NET_RX")) == ("NET_RX",)  # the default: cpu only
    lean = Exporter(CollectorRegistry(), node="n1", layout=discover())
    full = Exporter(CollectorRegistry(), node="n1", layout=discover(), per_cpu_series=True)
    assert full.label_names(d) == ("cpu", "irq", "kind")
    assert lean.label_names(dataclasses.replace(d, name=softirq.SOFTIRQ_ENTRIES)) == ("kind",)


def _scrape_real_agent(tmp_path: Path, *extra: str) -> str:
    config = write_config(tmp_path / "policy.yaml", {"kubernetes": {"pod_source": "standalone"}})
    agent = AgentProcess(config, tmp_path, "--dry-run", "--interval", "1", *extra)
    try:
        agent.wait_ready(timeout=600)  # a 64-vCPU TCG guest takes minutes to load the probes
        deadline = time.monotonic() + 600
        while json.loads(agent.get("/healthz")[1]).get("ticks", 0) < 3:  # node histograms past the first tick
            assert time.monotonic() < deadline, "the agent did not tick three times"
            time.sleep(0.5)
        return agent.scrape_text()
    finally:
        agent.terminate()


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.vm
def test_real_scrape_meets_the_node_series_budget_at_this_nodes_cpu_count(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the agent loads BPF programs")
    families, with_cpu = node_level(_scrape_real_agent(tmp_path))
    total = sum(families.values())
    biggest = ", ".join(f"{name} {n}" for name, n in families.most_common(6))
    assert total <= NODE_SERIES_BUDGET, (
        f"{total} node-level series at {os.cpu_count()} CPUs, budget {NODE_SERIES_BUDGET}; biggest: {biggest}")
    assert with_cpu == 0, f"{with_cpu} series carry a cpu label without --per-cpu-series"
    assert families[SOFTIRQ[2]] == len(VECTORS) and families[runqlat.CPU_RUNQ_LATENCY] == HIST_SERIES, \
        f"node softirq/runqueue series missing: {biggest}"


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.vm
def test_per_cpu_series_are_there_when_asked(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the agent loads BPF programs")
    text = _scrape_real_agent(tmp_path, "--per-cpu-series")
    cpus = {s.labels["cpu"] for f in text_string_to_metric_families(text) for s in f.samples
            if f.name == SOFTIRQ[2]}
    possible = Path("/sys/devices/system/cpu/possible").read_text().strip()
    last = int(possible.split(",")[-1].split("-")[-1])
    assert cpus == {str(c) for c in range(last + 1)}, (possible, sorted(cpus, key=int)[:5])
