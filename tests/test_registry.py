# SPDX-License-Identifier: Apache-2.0
"""probes/registry.py: one declaration per probe, checked against what the rest of the code knows:
the signal catalog, the exporter's metrics, the snapshot's fields, top's views and the BPF objects."""

from __future__ import annotations

import dataclasses

import pytest

from detector.catalog import SIGNALS, CatalogError, check_plugin_signals
from noisyneighbor import exporter as ex
from noisyneighbor.sections import ALL_VIEWS, PROBE_SOURCES, SOURCE_ORDER, VIEW_SOURCES, VIEWS
from noisyneighbor.views import RENDERERS, VIEW_TITLES
from probes.collect import BPF_PROBES
from probes.registry import BY_NAME, DEFAULT_NAMES, NAMES, PLUGINS, plugin
from probes.snapshot import NodeSnapshot


def test_names_are_unique_and_the_defaults_are_the_collectors():
    assert len(NAMES) == len(set(NAMES)) == len(BY_NAME)
    assert BPF_PROBES == DEFAULT_NAMES
    assert DEFAULT_NAMES[:4] == ("runqlat", "softirq", "reclaim", "tcpconnect")
    with pytest.raises(ValueError, match="unknown probe 'nope'; known: runqlat"):
        plugin("nope")


def test_every_plugin_signal_is_catalogued_and_a_typo_is_refused():
    check_plugin_signals(PLUGINS)
    assert all(name in SIGNALS for p in PLUGINS for name in p.signals)
    typo = dataclasses.replace(BY_NAME["runqlat"], signals=("runq_p99_nss",))
    with pytest.raises(CatalogError, match="probe 'runqlat' feeds signal\\(s\\) not in the catalog: runq_p99_nss"):
        check_plugin_signals([typo])


def test_every_plugin_metric_is_an_exporter_metric():
    for p in PLUGINS:
        for name in (*p.metrics, *(spec.name for spec in p.metric_specs)):
            assert name in ex.METRICS, f"{p.name}: {name}"


def test_snapshot_fields_and_mapping_access():
    fields = {f.name for f in dataclasses.fields(NodeSnapshot)}
    for p in PLUGINS:
        assert p.name not in fields, f"{p.name}: a probe's snapshot is in NodeSnapshot.plugins, not a field"
        for spec in p.specs:
            assert spec.name == p.name and spec.object_file.endswith(".bpf.o")
    first, second = NAMES[0], NAMES[1]
    snap = NodeSnapshot(monotonic_s=1.0, wall_s=1.0, plugins={first: "r", "later": "x"})
    assert snap.probe(first) == "r" and snap.probe(second) is None
    assert snap.probe("later") == "x"
    assert list(snap.probe_snapshots()) == list(NAMES)


def test_top_views_follow_the_registry():
    with_view = [p for p in PLUGINS if p.top_view is not None]
    assert (*(p.top_view for p in with_view), "psi") == VIEWS
    assert (*(p.name for p in with_view), "psi") == SOURCE_ORDER
    assert all(VIEW_SOURCES[p.top_view] == (p.name,) for p in with_view)
    assert set(PROBE_SOURCES) == {p.name for p in with_view}
    # every view renders with a title; a plugin's declared table (ProbePlugin.top_table) gets both
    assert set(RENDERERS) == set(VIEW_TITLES) == set(VIEWS)
    assert (*(p.top_view for p in with_view if p.default), "psi") == ALL_VIEWS  # --view all: the default probes'
