# SPDX-License-Identifier: Apache-2.0
"""Signals come from the plugins: each probe plugin's ``signal_extractor`` (probes/plugin.py) produces
exactly the fields it declares, and every catalog signal a plugin names (``ProbePlugin.signals``) is
one of them or derived by the detector from them. A plugin's test module (tests/test_<module>.py)
provides ``active_interval()``: an interval of its own in which something moved.

A plugin may declare fields the row types lack (``SignalExtractor.signal_specs`` / ``node_specs``): the
catalog gets an entry for each signal, every row and node has them at their default while the probe is
off, and the store keeps them; a made-up plugin shows it below, through the real SignalBuilder."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from detector import catalog
from detector import signals as signals_module
from detector.signals import (
    DERIVED_FROM,
    PLUGIN_NODE_FIELDS,
    PLUGIN_ROW_FIELDS,
    PLUGIN_SIGNALS,
    NodeSignals,
    WorkloadSignals,
)
from probes.plugin import SIGNAL_STAGES, NodeFieldSpec, ProbePlugin, SignalExtractor, SignalSpec
from probes.registry import BY_NAME, PLUGINS

WITH_SIGNALS = [p for p in PLUGINS if p.signals or p.signal_extractor is not None]
# The row types' own fields and those the plugins declare.
ROW_FIELDS = {f.name for f in dataclasses.fields(WorkloadSignals)} | set(PLUGIN_SIGNALS) | set(PLUGIN_ROW_FIELDS)
NODE_FIELDS = {f.name for f in dataclasses.fields(NodeSignals)} | set(PLUGIN_NODE_FIELDS)


def produced(plugin) -> tuple[set[str], set[str]]:
    """(WorkloadSignals fields, NodeSignals fields) the plugin's extractor sets on its active interval."""
    extractor = plugin.signal_extractor
    module = plugin.factory.__module__.rsplit(".", 1)[-1]
    interval = importlib.import_module(f"tests.test_{module}").active_interval()
    rows: set[str] = set()
    node: dict = {}
    if extractor.node is not None:
        node = extractor.node(interval, 0.5)
    if extractor.workloads is not None:
        ids = iter(range(1, 1 << 20))
        keys = {}  # every cgroup id its own workload, so nothing is folded away

        def workload_key(cgroup_id: int) -> str:
            return keys.setdefault(cgroup_id, f"w{next(ids)}")

        for values in extractor.workloads(interval, 0.5, workload_key).values():
            rows |= set(values)
    if extractor.exposure is not None:
        rows |= set(extractor.exposure({0: 0.5, 1: 0.5}, node))
    if extractor.every_row is not None:
        rows |= set(extractor.every_row(interval))
    return rows, set(node)


@pytest.mark.parametrize("plugin", WITH_SIGNALS, ids=lambda p: p.name)
def test_a_plugin_produces_what_it_declares(plugin):
    extractor = plugin.signal_extractor
    assert extractor is not None, f"{plugin.name} names signals {plugin.signals} but has no signal_extractor"
    assert extractor.stage in SIGNAL_STAGES
    assert set(extractor.fields) <= ROW_FIELDS and set(extractor.node_fields) <= NODE_FIELDS
    rows, node = produced(plugin)
    assert rows == set(extractor.fields), f"{plugin.name}: declared {sorted(extractor.fields)}, produced {sorted(rows)}"
    assert node == set(extractor.node_fields), \
        f"{plugin.name}: declared {sorted(extractor.node_fields)}, produced {sorted(node)}"
    for signal in plugin.signals:
        needs = DERIVED_FROM.get(signal, (signal,))
        assert set(needs) <= rows, f"{plugin.name} declares signal {signal} but produces none of {needs}"


def test_a_declared_signal_that_is_not_produced_fails():
    plugin = next(p for p in WITH_SIGNALS if p.signal_extractor is not None)
    liar = dataclasses.replace(plugin, signals=(*plugin.signals, "connect_p99_ns"))
    with pytest.raises(AssertionError, match="declares signal connect_p99_ns"):
        test_a_plugin_produces_what_it_declares(liar)
    overclaim = dataclasses.replace(plugin, signal_extractor=dataclasses.replace(
        plugin.signal_extractor, fields=(*plugin.signal_extractor.fields, "connects")))
    with pytest.raises(AssertionError, match="declared"):
        test_a_plugin_produces_what_it_declares(overclaim)


# -- a plugin that declares its own signal --------------------------------------------------------------

FAKE_SIGNAL = SignalSpec("fakeirq_ms_per_s", "Fake IRQ time on its CPUs", "ms/s", noise_floor=1.0)
FAKE_NODE = NodeFieldSpec("fakeirq_ms_per_s_by_cpu")


def _fake_plugin() -> ProbePlugin:
    """A probe whose interval is {cpu: ms of IRQ time}: node values per CPU, a workload's through where it ran."""

    def exposure(weights: dict[int, float], node: dict) -> dict:
        by_cpu = node["fakeirq_ms_per_s_by_cpu"]
        return {"fakeirq_ms_per_s": sum(w * by_cpu.get(cpu, 0.0) for cpu, w in weights.items())}

    return ProbePlugin(
        name="fakeirq", specs=(), factory=object, delta=lambda prev, cur: cur,
        signals=(FAKE_SIGNAL.name,),
        signal_extractor=SignalExtractor(
            stage="cpus", fields=(FAKE_SIGNAL.name,), node_fields=(FAKE_NODE.name,),
            node=lambda interval, dt: {"fakeirq_ms_per_s_by_cpu": {cpu: ms / dt for cpu, ms in interval.items()}},
            exposure=exposure, signal_specs=(FAKE_SIGNAL,), node_specs=(FAKE_NODE,)))


@pytest.fixture
def fake_registered(monkeypatch):
    """The fake plugin registered as probes.registry would list it (what the detector reads at import)."""
    fake = _fake_plugin()
    monkeypatch.setattr(signals_module, "PLUGINS", (*PLUGINS, fake))
    monkeypatch.setitem(BY_NAME, fake.name, fake)
    monkeypatch.setitem(PLUGIN_SIGNALS, FAKE_SIGNAL.name, FAKE_SIGNAL)
    monkeypatch.setitem(PLUGIN_NODE_FIELDS, FAKE_NODE.name, FAKE_NODE)
    return fake


def _build(fake_snapshots: tuple[dict, dict] | None):
    """One interval of a workload on CPU 0 (0.3 cores), with the fake probe's snapshots or without them (off)."""
    from detector.cgroups import CgroupResolver
    from detector.signals import SignalBuilder
    from detector.workloads import IdMapper, WorkloadIndex
    from probes.cgroupfs import discover
    from probes.cpuacct import CgroupCpuStat
    from probes.host import HostPaths
    from probes.snapshot import NodeSnapshot

    layout = discover(HostPaths())
    builder = SignalBuilder(layout, IdMapper(CgroupResolver(HostPaths(), layout), WorkloadIndex(ls_globs=["/ls-*"])))

    def snap(t: float, usage_ns: int, fake: dict | None) -> NodeSnapshot:
        return NodeSnapshot(monotonic_s=t, wall_s=t, plugins={} if fake is None else {"fakeirq": fake},
                            cgroup_cpus={"/ls-web": (0,)},
                            cgroup_cpu={"/ls-web": CgroupCpuStat(2, usage_ns, None, None, 0, 0, 0, None, None, None, None)})

    before, after = fake_snapshots or (None, None)
    return builder.build(snap(10.0, 0, before), snap(12.0, 600_000_000, after), extra_paths=["/ls-web"])


def test_a_plugin_declared_signal_is_catalogued_as_evidence():
    fake = _fake_plugin()
    (entry,) = catalog.plugin_signals([fake])
    assert (entry.name, entry.label, entry.unit, entry.noise_floor, entry.slo, entry.baseline) == \
        ("fakeirq_ms_per_s", "Fake IRQ time on its CPUs", "ms/s", 1.0, None, False)
    catalog.check_catalog((*catalog.SIGNALS.values(), entry))
    with pytest.raises(catalog.CatalogError, match="twice"):  # one already catalogued is refused
        catalog.check_catalog((*catalog.SIGNALS.values(), *catalog.plugin_signals([fake, fake])))


def test_a_declared_field_the_extractor_does_not_name_is_refused(monkeypatch):
    fake = _fake_plugin()
    monkeypatch.setitem(catalog.SIGNALS, FAKE_SIGNAL.name, catalog.plugin_signals([fake])[0])
    catalog.check_plugin_signals([fake])
    unnamed = dataclasses.replace(fake, signals=())
    with pytest.raises(catalog.CatalogError, match="declares signal 'fakeirq_ms_per_s'"):
        catalog.check_plugin_signals([unnamed])
    stray = dataclasses.replace(fake, signal_extractor=dataclasses.replace(fake.signal_extractor, node_fields=()))
    with pytest.raises(catalog.CatalogError, match="declares node field 'fakeirq_ms_per_s_by_cpu'"):
        catalog.check_plugin_signals([stray])


def test_a_plugin_declared_signal_reaches_the_rows_the_node_and_the_store(fake_registered):
    signals = _build(({0: 0.0, 1: 0.0}, {0: 40.0, 1: 400.0}))  # 20 ms/s of CPU 0, 200 of CPU 1, over 2 s
    assert signals.fakeirq_ms_per_s_by_cpu == {0: 20.0, 1: 200.0}
    row = signals.workloads["/ls-web"]
    assert row.fakeirq_ms_per_s == pytest.approx(20.0)  # it ran on CPU 0 only
    assert row.as_store_values()["fakeirq_ms_per_s"] == pytest.approx(20.0)


def test_with_the_probe_off_every_row_and_node_has_the_default(fake_registered):
    signals = _build(None)
    row = signals.workloads["/ls-web"]
    assert row.fakeirq_ms_per_s == 0.0
    assert "fakeirq_ms_per_s" not in row.as_store_values()  # a probe that is off adds no store series
    assert signals.fakeirq_ms_per_s_by_cpu == {}
    signals.fakeirq_ms_per_s_by_cpu[0] = 1.0  # made once, then kept on this node
    assert signals.fakeirq_ms_per_s_by_cpu == {0: 1.0}
    assert NodeSignals(1.0, {}).fakeirq_ms_per_s_by_cpu == {}  # a fresh one per node
    with pytest.raises(AttributeError, match="no attribute 'fakeirq_typo'"):
        _ = row.fakeirq_typo
    with pytest.raises(AttributeError, match="no attribute 'fakeirq_typo'"):
        _ = signals.fakeirq_typo


def test_a_node_takes_a_plugin_field_its_constructor_does_not_know():
    node = NodeSignals.of(1.0, {}, node_cpu_busy=0.5, fakeirq_ms_per_s_by_cpu={3: 7.0})
    assert node.node_cpu_busy == 0.5 and node.fakeirq_ms_per_s_by_cpu == {3: 7.0}


# -- the first probes' row fields, declared by their plugins --------------------------------------------

def test_a_plugin_row_field_is_fresh_per_row_and_a_statistic_of_no_events_is_not_stored():
    """A field that is no catalog signal (runqlat's per-culprit split) reads its default while unset,
    made once per row; a p99 over no events is stored as unknown (NaN), one over events as itself."""
    import math

    from detector.workloads import Target, Workload

    w = Workload("pod:v", Target("/kubepods.slice/v", "v"))
    quiet, other = WorkloadSignals(w, 1.0), WorkloadSignals(w, 1.0)
    assert (quiet.runq_count, quiet.connects, quiet.runq_hist, quiet.reclaim_by_kind_ms_per_s) == (0, 0, None, {})
    quiet.ran_instead_ns["pod:x"] = 5.0  # kept on this row, not shared with another
    assert quiet.ran_instead_ns == {"pod:x": 5.0} and other.ran_instead_ns == {}
    stored = quiet.as_store_values()
    assert math.isnan(stored["runq_p99_ns"]) and math.isnan(stored["connect_p99_ns"])
    assert stored["steal_ms_per_s"] == stored["reclaim_stall_ms_per_s"] == stored["runq_wait_ms_per_s"] == 0.0
    assert "connects" not in stored and "syn_retransmits_per_s" not in stored  # not stored: no series
    busy = WorkloadSignals.of(w, 1.0, runq_count=3, runq_p99_ns=7e6, connects=1, connect_p99_ns=2e6)
    assert (busy.as_store_values()["runq_p99_ns"], busy.as_store_values()["connect_p99_ns"]) == (7e6, 2e6)
    with pytest.raises(TypeError, match="no field 'runq_typo'"):
        WorkloadSignals.of(w, 1.0, runq_typo=1)


def test_a_declared_row_field_the_extractor_does_not_name_is_refused(monkeypatch):
    from probes.plugin import RowFieldSpec

    fake = _fake_plugin()
    monkeypatch.setitem(catalog.SIGNALS, FAKE_SIGNAL.name, catalog.plugin_signals([fake])[0])
    stray = dataclasses.replace(fake, signal_extractor=dataclasses.replace(
        fake.signal_extractor, row_specs=(RowFieldSpec("fakeirq_lines", dict),)))
    with pytest.raises(catalog.CatalogError, match="declares row field 'fakeirq_lines'"):
        catalog.check_plugin_signals([stray])


def test_a_plugin_declared_slo_is_the_catalogs_in_its_check_order():
    """A plugin's SloSpec becomes the catalog's Slo (its policy key, default, range, gate on the row),
    placed among every SLO by check_order: the breach checks' order and SloThresholds' fields."""
    from probes.plugin import SloSpec

    fake = _fake_plugin()
    slo = SloSpec("fakeirq_ms_per_s", 50.0, check_order=65, range=(0, 1000),
                  gate=lambda row: row.fakeirq_ms_per_s if row.cpu_cores else None)
    declared = dataclasses.replace(FAKE_SIGNAL, slo=slo, baseline=True)
    fake = dataclasses.replace(fake, signal_extractor=dataclasses.replace(fake.signal_extractor, signal_specs=(declared,)))
    (entry,) = catalog.plugin_signals([fake])
    assert (entry.slo.field, entry.slo.default, entry.slo.range, entry.baseline) == ("fakeirq_ms_per_s", 50.0, (0, 1000), True)
    ordered = [s.slo.field for s in catalog._in_order((*catalog.SIGNALS.values(), entry)) if s.slo is not None]
    # after every SLO checked at 65 or before, ahead of every one checked later (PSI's are 70 to 90)
    known = [s.slo.field for s in catalog.SLO_SIGNALS]
    at = sum(1 for s in catalog.SLO_SIGNALS if s.slo.check_order <= 65)
    assert 0 < at < len(known)
    assert ordered == [*known[:at], "fakeirq_ms_per_s", *known[at:]]

    class Row:
        fakeirq_ms_per_s, cpu_cores = 70.0, 0.0

    assert entry.breach_value(Row()) is None  # gated out: it did not run
    Row.cpu_cores = 0.5
    assert entry.breach_value(Row()) == 70.0
