# SPDX-License-Identifier: Apache-2.0
"""Policy loading: defaults, our format, the Koordinator ConfigMap (real examples from the seed notes), bad input."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from detector.policy import (
    ActuatorPolicy,
    CpuBurstStrategy,
    Policy,
    PolicyError,
    ResourceQosStrategy,
    ResourceThresholdStrategy,
    SloThresholds,
    load_policy,
)

REPO = Path(__file__).resolve().parents[1]
SEED = Path("/work/shared/seeds/004_ad33013365e8e3bb.txt")
ANOLIS = {"kubernetes.io/kernel": "anolis", "kubernetes.io/hostname": "n1"}


def _seed_configmaps() -> list[str]:
    if not SEED.exists():
        pytest.skip(f"{SEED} (Koordinator's documented ConfigMap examples) is not on this machine")
    blocks = re.findall(r"```\n(.*?)```", SEED.read_text(encoding="utf-8"), re.S)
    return [b for b in blocks if "kind: ConfigMap" in b and "slo-controller-config" in b]


def _write(tmp_path: Path, text: str, name: str = "policy.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_match_koordlet():
    p = load_policy(None)
    assert p == Policy()
    rt = p.resource_threshold
    assert (rt.enable, rt.cpu_suppress_threshold_percent, rt.cpu_suppress_policy, rt.cpu_suppress_min_cpus) == (
        True, 65, "cpuset", 2)
    assert (rt.memory_evict_threshold_percent, rt.memory_evict_lower_percent, rt.memory_evict_lower) == (70, None, 68)
    assert (rt.cpu_evict_be_satisfaction_upper_percent, rt.cpu_evict_be_satisfaction_lower_percent) == (90, 60)
    assert (rt.cpu_evict_enabled, rt.memory_evict_enabled) == (False, False)
    assert p.cpu_burst == CpuBurstStrategy("none", 1000, 300, -1, 50)
    assert (p.resource_qos.be.cat_range_end_percent, p.resource_qos.ls.cat_range_end_percent) == (30, 100)
    assert not p.resource_qos.lsr.enable and p.resource_qos.be.mba_percent == 100
    assert p.actuators.dry_run and not p.actuators.evict_enabled
    assert (p.slo.runq_p99_ms, p.slo.k_sigma, p.slo.clear_windows) == (5.0, 4.0, 5)
    assert (p.pod_source, p.interval_seconds, p.ls_cgroups) == ("auto", 1.0, ())


def test_deploy_config_is_the_documented_default():
    assert load_policy(REPO / "deploy/base/config.yaml") == Policy()


def test_empty_file_is_defaults(tmp_path: Path):
    assert load_policy(_write(tmp_path, "")) == Policy()


def test_our_format_yaml(tmp_path: Path):
    p = load_policy(_write(tmp_path, """
interval_seconds: 0.5
incident_log: /tmp/incidents.jsonl
slo: {runq_p99_ms: 2, kSigma: 3.5, clear_windows: 3}
actuators: {dry_run: false, evictEnabled: true, evictions_per_minute: 1}
kubernetes: {node_name: n1, pod_source: kubelet, kubelet_read_only_port: 10255}
standalone: {ls_cgroups: [system.slice/nginx.service], be_cgroups: "batch.slice/*"}
resource-threshold-config: {cpuSuppressThresholdPercent: 50, cpuSuppressPolicy: cfsQuota, memoryEvictLowerPercent: 60}
cpu_burst: {policy: auto}
resource-qos-config: {beClass: {resctrlQOS: {enable: true, catRangeEndPercent: 20, mbaPercent: 40}}}
"""))
    assert p.interval_seconds == 0.5 and p.incident_log == "/tmp/incidents.jsonl"
    assert p.slo == SloThresholds(runq_p99_ms=2.0, k_sigma=3.5, clear_windows=3)
    assert isinstance(p.slo.runq_p99_ms, float)
    assert p.actuators == ActuatorPolicy(dry_run=False, evict_enabled=True, evictions_per_minute=1)
    assert (p.node_name, p.pod_source, p.kubelet_read_only_port) == ("n1", "kubelet", 10255)
    assert p.ls_cgroups == ("system.slice/nginx.service",) and p.be_cgroups == ("batch.slice/*",)
    assert p.resource_threshold == ResourceThresholdStrategy(
        cpu_suppress_threshold_percent=50, cpu_suppress_policy="cfsQuota", memory_evict_lower_percent=60)
    assert p.cpu_burst.policy == "auto" and p.cpu_burst.cpu_burst_enabled and p.cpu_burst.cfs_quota_burst_enabled
    assert p.resource_qos.be == dataclasses.replace(ResourceQosStrategy().be, enable=True, cat_range_end_percent=20,
                                                    mba_percent=40)
    assert p.resource_qos.ls == ResourceQosStrategy().ls


def test_churn_timings_pod_vanish_grace_and_quiet_pair_age(tmp_path: Path):
    """The two timings a node with pod churn lives by (and the soak bench compresses): how long a gone pod
    stays named, and how long a who-ran-instead pair may stay quiet before its kernel slot goes."""
    assert (Policy().pod_vanish_grace_seconds, Policy().runq_pair_quiet_seconds) == (60.0, 60.0)
    p = load_policy(_write(tmp_path, "runq_pair_quiet_seconds: 10\nkubernetes: {vanish_grace_seconds: 5}\n"))
    assert (p.pod_vanish_grace_seconds, p.runq_pair_quiet_seconds) == (5.0, 10.0)
    path = _write(tmp_path, "runq_pair_quiet_seconds: 0\n")
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    assert str(e.value).startswith(f"{path}: runq_pair_quiet_seconds: ") and "\n" not in str(e.value)
    path = _write(tmp_path, "kubernetes: {vanish_grace_seconds: -1}\n")
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    assert str(e.value).startswith(f"{path}: kubernetes.vanish_grace_seconds: ")


def test_our_format_json_and_cfs_quota_alias(tmp_path: Path):
    doc = {"resource_threshold": {"cpu_suppress_policy": "cfs_quota"}, "slo": {"runq_p99_ms": 1}}
    p = load_policy(_write(tmp_path, json.dumps(doc), "p.json"))
    assert p.resource_threshold.cpu_suppress_policy == "cfsQuota" and p.slo.runq_p99_ms == 1.0


def test_koordinator_section_as_json_string_with_node_strategies(tmp_path: Path):
    text = """
cpu-burst-config: |
  {"clusterStrategy": {"policy": "cpuBurstOnly", "cpuBurstPercent": 500},
   "nodeStrategies": [
     {"name": "gpu", "nodeSelector": {"matchLabels": {"pool": "gpu"}}, "policy": "none"},
     {"name": "anolis", "nodeSelector": {"matchExpressions": [{"key": "kubernetes.io/kernel", "operator": "In",
                                                              "values": ["anolis"]}]}, "cfsQuotaBurstPercent": 400},
     {"name": "all", "nodeSelector": {}, "cpuBurstPercent": 100}]}
"""
    path = _write(tmp_path, text)
    first = load_policy(path, node_labels=ANOLIS).cpu_burst  # the first match wins, later ones ignored
    assert (first.policy, first.cpu_burst_percent, first.cfs_quota_burst_percent) == ("cpuBurstOnly", 500, 400)
    other = load_policy(path, node_labels={"pool": "cpu"}).cpu_burst  # only the empty selector matches
    assert (other.policy, other.cpu_burst_percent, other.cfs_quota_burst_percent) == ("cpuBurstOnly", 100, 300)
    gpu = load_policy(path, node_labels={"pool": "gpu"}).cpu_burst
    assert gpu.policy == "none"


def test_seed_configmap_cluster_and_node_strategies(tmp_path: Path):
    template = next(b for b in _seed_configmaps() if "nodeStrategies" in b and "resource-qos-config" in b)
    path = _write(tmp_path, template, "slo-controller-config.yaml")

    cluster = load_policy(path)  # no labels: clusterStrategy only
    rt = cluster.resource_threshold
    assert (rt.enable, rt.cpu_suppress_threshold_percent, rt.cpu_suppress_policy) == (False, 65, "cpuset")
    assert (rt.memory_evict_threshold_percent, rt.memory_evict_lower_percent) == (70, 65)
    assert rt.cpu_evict_be_usage_threshold_percent == 90
    assert cluster.cpu_burst == CpuBurstStrategy("none", 1000, 300, -1, 50)
    assert cluster.resource_qos.be.cat_range_end_percent == 30 and not cluster.resource_qos.be.enable
    # Our own sections are untouched by a ConfigMap.
    assert cluster.slo == SloThresholds() and cluster.actuators == ActuatorPolicy()

    anolis = load_policy(path, node_labels=ANOLIS)
    assert anolis.resource_threshold.cpu_evict_be_usage_threshold_percent == 80  # nodeStrategies override
    assert anolis.resource_threshold.memory_evict_lower_percent == 65  # the rest from clusterStrategy
    assert (anolis.cpu_burst.policy, anolis.cpu_burst.cfs_quota_burst_percent) == ("cfsQuotaBurstOnly", 400)
    assert anolis.cpu_burst.cpu_burst_percent == 1000
    # The anolis beClass override only touches memoryQOS (not ours): resctrl stays from the cluster.
    assert anolis.resource_qos == cluster.resource_qos


def test_seed_configmap_minimal_and_broken_examples(tmp_path: Path):
    blocks = _seed_configmaps()
    minimal = [b for b in blocks if '"memoryEvictThresholdPercent": 70\n      }\n    }' in b]
    assert minimal, "the memory-evict example ConfigMap is in the seed notes"
    p = load_policy(_write(tmp_path, minimal[0]))
    assert p.resource_threshold.enable and p.resource_threshold.memory_evict_threshold_percent == 70
    # The cpu-evict example in the notes has a stray "9" after the JSON: it must be refused, precisely.
    broken = [b for b in blocks if "CPUEvictTimeWindowSeconds" in b]
    assert broken
    path = _write(tmp_path, broken[0], "cpu-evict.yaml")
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    assert str(e.value) == f"{path}: data.resource-threshold-config: not valid JSON: Extra data at line 9 column 2"
    # Fixed, the Go-style capitalised key is accepted (encoding/json matches keys case-insensitively).
    fixed = broken[0].replace("}9", "}")
    p = load_policy(_write(tmp_path, fixed, "fixed.yaml"))
    rt = p.resource_threshold
    assert (rt.cpu_evict_time_window_seconds, rt.cpu_evict_be_satisfaction_upper_percent) == (60, 80)


@pytest.mark.parametrize(("text", "message"), [
    ("slo:\n  runq_p99_msx: 3\n", "slo.runq_p99_msx: unknown key (did you mean 'runq_p99_ms'?)"),
    ("resource-threshold-config:\n  cpuSupressThresholdPercent: 3\n",
     "resource-threshold-config.cpuSupressThresholdPercent: unknown key (did you mean 'cpuSuppressThresholdPercent'?)"),
    ("sloo: {}\n", "sloo: unknown key (did you mean 'slo'?)"),
    ("frobnicate: 1\n", "frobnicate: unknown key"),
    ("slo:\n  runq_p99_ms: fast\n", "slo.runq_p99_ms: expected a number, got a string 'fast'"),
    ("actuators:\n  dry_run: 1\n", "actuators.dry_run: expected true or false, got an integer 1"),
    ("actuators:\n  max_changes_per_minute: 2.5\n", "actuators.max_changes_per_minute: expected an integer, got a number 2.5"),
    ("resource-threshold-config:\n  cpuSuppressThresholdPercent: 120\n",
     "resource-threshold-config.cpuSuppressThresholdPercent: must be a percent in 0..100, got 120"),
    ("resource-threshold-config:\n  cpuSuppressPolicy: quota\n",
     "resource-threshold-config.cpuSuppressPolicy: must be one of cpuset, cfsQuota, got 'quota'"),
    ("cpu-burst-config:\n  policy: always\n",
     "cpu-burst-config.policy: must be one of none, cpuBurstOnly, cfsQuotaBurstOnly, auto, got 'always'"),
    ("kubernetes:\n  pod_source: etcd\n",
     "kubernetes.pod_source: must be one of auto, kubelet, apiserver, standalone, got 'etcd'"),
    ("kubernetes:\n  kubelet_read_only_port: 70000\n", "kubernetes.kubelet_read_only_port: must be in 1..65535, got 70000"),
    ("slo:\n  clear_windows: 0\n", "slo.clear_windows: must be >= 1, got 0"),
    ("slo:\n  breach_seconds: 100000\n", "slo.breach_seconds: must be in 0..86400, got 100000"),
    ("slo:\n  runq_p99_ms: .nan\n", "slo.runq_p99_ms: must be >= 0, got nan"),
    ("standalone:\n  be_cgroups: [1, 2]\n", "standalone.be_cgroups: expected a list of strings, got a list"),
    ("slo: [1, 2]\n", "slo: expected a mapping, got a list"),
    ("- a\n- b\n", "top level: expected a mapping, got a list"),
    ("slo: {runq_p99_ms: 1\n", "not valid YAML or JSON: line 2 column 1: expected ',' or '}', but got '<stream end>'"),
    ("resource-threshold-config:\n  cpuEvictBESatisfactionLowerPercent: 95\n",
     "resource-threshold-config.cpuEvictBESatisfactionLowerPercent: must not exceed cpuEvictBESatisfactionUpperPercent"
     " (95 > 90)"),
    ("resource-threshold-config:\n  memoryEvictLowerPercent: 80\n",
     "resource-threshold-config.memoryEvictLowerPercent: must not exceed memoryEvictThresholdPercent (80 > 70)"),
    ("resource-qos-config:\n  beClass: {resctrlQOS: {catRangeStartPercent: 50}}\n",
     "resource-qos-config.beClass.resctrlQOS.catRangeStartPercent: must not exceed catRangeEndPercent (50 > 30)"),
    ("resource-qos-config:\n  beClass: {resctrlQOS: {mbaPercent: 0}}\n",
     "resource-qos-config.beClass.resctrlQOS.mbaPercent: must be in 1..100, got 0"),
    ("resource-qos-config:\n  bClass: {}\n", "resource-qos-config.bClass: unknown key (did you mean 'beClass'?)"),
])
def test_bad_input_one_exact_line(tmp_path: Path, text: str, message: str):
    path = _write(tmp_path, text)
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    assert str(e.value) == f"{path}: {message}"
    assert "\n" not in str(e.value)


def test_bad_configmap_node_strategy_names_the_piece(tmp_path: Path):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "data": {
        "resource-threshold-config": json.dumps({
            "clusterStrategy": {"enable": True},
            # Wrong even though it does not match this node: every node reports the same error.
            "nodeStrategies": [{"name": "x", "nodeSelector": {"matchLabels": {"pool": "x"}},
                                "memoryEvictThresholdPercent": "70"}]}),
        "system-config": "{ not json: ignored, not ours }",
    }}
    path = _write(tmp_path, json.dumps(cm))
    with pytest.raises(PolicyError) as e:
        load_policy(path, node_labels={"pool": "y"})
    assert str(e.value) == (f"{path}: data.resource-threshold-config.nodeStrategies[0].memoryEvictThresholdPercent: "
                            "expected an integer, got a string '70'")
    cm["data"]["resource-threshold-config"] = json.dumps({"nodeStrategies": [
        {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}]})
    path = _write(tmp_path, json.dumps(cm))
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    assert str(e.value) == (f"{path}: data.resource-threshold-config.nodeStrategies[0].nodeSelector.matchExpressions[0]"
                            ".operator: must be one of In, NotIn, Exists, DoesNotExist, got 'Near'")


def test_unreadable_files(tmp_path: Path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError) as e:
        load_policy(missing)
    assert str(e.value) == f"{missing}: cannot read: No such file or directory"
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"slo: \xff\xfe\n")
    with pytest.raises(PolicyError) as e:
        load_policy(binary)
    assert str(e.value) == f"{binary}: not UTF-8 text: byte 5"


def test_koordinator_keys_we_do_not_use_are_accepted(tmp_path: Path):
    p = load_policy(_write(tmp_path, json.dumps({
        "resource-qos-config": {"lsClass": {"cpuQOS": {"enable": True, "groupIdentity": 2},
                                            "memoryQOS": {"enable": True}, "resctrlQOS": {"enable": True}},
                                "policies": {"cpuPolicy": "groupIdentity"}},
        "resource-threshold-config": {"cpuEvictPolicy": "evictByRealLimit"},
    })))
    assert p.resource_qos.ls.enable and not p.resource_qos.be.enable


def test_one_key_matcher_two_unknown_key_behaviours():
    """Dataclass sections and flat name lists share one key matcher; only what an unknown key does
    differs: skipped when listed as ignored (keys Koordinator reads), else the same one-line error."""
    from detector.policy.fields import _Ctx, _match_keys

    ctx = _Ctx("p.yaml", {})
    doc = {"cpuSuppressThresholdPercent": 60, "name": "x"}
    names = ["cpu_suppress_threshold_percent"]
    assert _match_keys(doc, names, "rt", ctx, ignored={"name"}) == [
        ("cpu_suppress_threshold_percent", "rt.cpuSuppressThresholdPercent", 60)]
    with pytest.raises(PolicyError) as e:
        _match_keys(doc, names, "rt", ctx)
    assert str(e.value) == "p.yaml: rt.name: unknown key"
    with pytest.raises(PolicyError) as e:
        _match_keys({"nodeNme": "a"}, ["node_name"], "kubernetes", ctx)
    assert str(e.value) == "p.yaml: kubernetes.nodeNme: unknown key (did you mean 'nodeName'?)"
    assert _match_keys(None, names, "rt", ctx) == []
    with pytest.raises(PolicyError) as e:
        _match_keys([1], names, "rt", ctx)
    assert str(e.value) == "p.yaml: rt: expected a mapping, got a list"


# -- an SLO a cause rule divides by (issue 27) -------------------------------------------------------


@pytest.mark.parametrize("field", ["softirq_ms_per_s", "reclaim_stall_ms_per_s"])
def test_an_slo_a_rule_divides_by_is_refused_at_zero_in_one_line(tmp_path: Path, field: str):
    """Defect: ``slo: {softirq_ms_per_s: 0}`` passed validation and ``diagnose`` died with
    ZeroDivisionError in the softirq (or reclaim) cause rule the first time that signal breached."""
    path = _write(tmp_path, f"slo: {{{field}: 0}}\n")
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    assert str(e.value) == f"{path}: slo.{field}: must be > 0 (a cause rule divides by it), got 0"
    with pytest.raises(ValueError, match=f"slo.{field}: must be > 0"):  # built in code, not read from a file
        SloThresholds(**{field: 0.0})
    assert getattr(load_policy(_write(tmp_path, f"slo: {{{field}: 0.5}}\n")).slo, field) == 0.5


def test_the_slo_declarations_say_which_fields_a_rule_divides_by():
    from detector import catalog

    divided = {s.slo.field for s in catalog.SLO_SIGNALS if s.slo.divides}
    assert divided == {"softirq_ms_per_s", "reclaim_stall_ms_per_s"}


def test_the_policy_does_not_import_the_catalog_back():
    """detector.catalog declares the SLOs; the policy reads them. The cycle (catalog -> policy.schema ->
    a late import of the catalog in policy.fields) is gone: the catalog imports nothing of the policy."""
    import ast

    root = Path(__file__).resolve().parent.parent
    tree = ast.parse((root / "detector" / "catalog.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("detector.policy")}, imported
    for path in (root / "detector" / "policy").glob("*.py"):
        assert "from detector.catalog import" not in "".join(
            line for line in path.read_text().splitlines(keepends=True) if line.startswith((" ", "\t"))), path
