"""Signals come from the plugins: each probe plugin's ``signal_extractor`` (probes/plugin.py) produces
exactly the fields it declares, and every catalog signal a plugin names (``ProbePlugin.signals``) is
one of them or derived by the detector from them. A plugin's test module (tests/test_<module>.py)
provides ``active_interval()``: an interval of its own in which something moved."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from detector.signals import DERIVED_FROM, NodeSignals, WorkloadSignals
from probes.plugin import SIGNAL_STAGES
from probes.registry import PLUGINS

WITH_SIGNALS = [p for p in PLUGINS if p.signals or p.signal_extractor is not None]
ROW_FIELDS = {f.name for f in dataclasses.fields(WorkloadSignals)}
NODE_FIELDS = {f.name for f in dataclasses.fields(NodeSignals)}


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
