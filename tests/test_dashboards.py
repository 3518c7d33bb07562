# SPDX-License-Identifier: Apache-2.0
"""Dashboards and alert rules: in sync with the exporter, unit-tested with promtool, and every query run
by the real Prometheus against the real agent (probes, detector, actuators) while test cgroups interfere."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from noisyneighbor import exporter as ex
from noisyneighbor import metric_names
from probes.cgroupfs import discover
from testkit.exporter_support import CONTROLLERS, REPO, AgentProcess, write_config
from testkit.fakekube import FakeKube, make_pod
from testkit.sandbox import shield
from testkit.tools import require_tool
from tests.prometheus_server import PrometheusServer

DASHBOARDS = Path(__file__).resolve().parent.parent / "dashboards"
_spec = importlib.util.spec_from_file_location("nn_dashboards_generate", DASHBOARDS / "generate.py")
generate = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = generate  # dataclasses look their module up while the file runs
_spec.loader.exec_module(generate)

METRIC_RE = re.compile(r"\bnoisyneighbor_[a-z0-9_]+")


def _sample_names(d: ex.MetricDef) -> tuple[str, ...]:
    """The names a family's series appear under in Prometheus."""
    return (f"{d.name}_bucket", f"{d.name}_sum", f"{d.name}_count") if d.type == "histogram" else (d.name,)


KNOWN_SAMPLES = {n: d.name for d in ex.METRICS.values() for n in _sample_names(d)}

# Queries that may come back empty in the integration test, by a selector in the query that cannot
# match anything on this machine. Everything else must have data from the real agent.
ALLOWED_EMPTY = {
    'kind="resctrl"': "no resctrl here (no RDT CPU flags / resctrl not mounted): the resctrl actuator is off",
    'kind="evict"': "no apiserver here: eviction needs the Kubernetes API, so the evict actuator is off",
    'state=~"refused|failed"': "nothing in this scenario is refused or fails for certain (refusals here come only "
    "from decisions on other work's cgroups outside --act-only, which may or may not happen)",
    'state="reverted"': "applied actions are held for the whole run (verify_intervals above it) so that "
    "'in effect' panels have data; the revert path is tested in test_actuator_framework",
}
GPU_METRICS = {metric_names.GPU_UTILIZATION, metric_names.GPU_MEMORY_USED, metric_names.GPU_MEMORY_TOTAL}


def _alert_rules() -> list[dict]:
    spec = yaml.safe_load((DASHBOARDS / "alerts.yaml").read_text())["spec"]
    return [rule for group in spec["groups"] for rule in group["rules"]]


def _write_rule_groups(directory: Path) -> Path:
    """promtool and Prometheus read plain rule groups: the PrometheusRule's spec."""
    doc = yaml.safe_load((DASHBOARDS / "alerts.yaml").read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    path = directory / "alerts.rules.yaml"
    path.write_text(yaml.safe_dump(doc["spec"], sort_keys=False))
    return path


def _metrics_in(expr: str) -> set[str]:
    return {KNOWN_SAMPLES.get(name, name) for name in METRIC_RE.findall(expr)}


# -- static ------------------------------------------------------------------------------------------


def test_generated_dashboards_are_in_sync(tmp_path):
    built = generate.build_all()
    assert set(built) == {p.name for p in DASHBOARDS.glob("*.json")}
    for name, text in built.items():
        assert (DASHBOARDS / name).read_text() == text, f"{name} is stale: run dashboards/generate.py"
    assert generate.main(["--check"]) == 0
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1  # nothing there: reported, not raised


def test_dashboards_are_grafana_39_with_variables_and_known_metrics():
    for name, text in generate.build_all().items():
        dash = __import__("json").loads(text)
        assert dash["schemaVersion"] >= 39
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert list(variables)[:3] == ["datasource", "cluster", "node"], "datasource -> cluster -> node, as mixins"
        assert variables["datasource"]["type"] == "datasource"
        assert variables["node"]["definition"].startswith("label_values(")
        # cluster: hidden (single-cluster default), All = .* so series without the label match too.
        cluster, node = variables["cluster"], variables["node"]
        assert cluster["hide"] == 2 and cluster["includeAll"] and cluster["allValue"] == ".*"
        assert '"$cluster"' in node["definition"]
        # node: several at once, All by default (the pod dashboard needs no node first).
        assert node["multi"] and node["includeAll"] and node["allValue"] == ".*" and node["current"]["value"] == "$__all"
        if name == "pod-interference.json":
            assert {"namespace", "pod"} <= set(variables)
        for title, expr in generate.iter_queries(dash):
            if "noisyneighbor_" in expr:
                assert 'cluster=~"$cluster"' in expr, f"{name}/{title}: no cluster selector"
                assert 'node="$node"' not in expr, f"{name}/{title}: node is multi-select: node=~"
        [incidents] = dash["annotations"]["list"]
        assert "noisyneighbor_incidents_open" in incidents["expr"] and incidents["enable"]
    # A Prometheus with several clusters' series: the same dashboards with the cluster variable shown.
    for name, text in generate.build_all(show_cluster=True).items():
        shown = {v["name"]: v for v in __import__("json").loads(text)["templating"]["list"]}
        assert shown["cluster"]["hide"] == 0, name
        assert text.replace('"hide": 0', '"hide": 2') != text
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids))
        for panel in dash["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            g = panel["gridPos"]
            assert g["x"] + g["w"] <= 24
        for title, expr in generate.iter_queries(dash):
            names = METRIC_RE.findall(expr)
            # up{app_kubernetes_io_name=...}: what Prometheus knows of an agent it cannot scrape (it exports nothing)
            assert names or 'up{app_kubernetes_io_name="noisyneighbor"' in expr, \
                f"{name}/{title}: no noisyneighbor metric in {expr}"
            unknown = [n for n in names if n not in KNOWN_SAMPLES]
            assert not unknown, f"{name}/{title}: not exported: {unknown}"


def test_alert_rules_pass_promtool_unit_tests(tmp_path):
    promtool = require_tool("promtool")
    _write_rule_groups(tmp_path)
    shutil.copyfile(DASHBOARDS / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    check = subprocess.run([promtool, "check", "rules", "alerts.rules.yaml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    res = subprocess.run([promtool, "test", "rules", "alerts_test.yaml"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for rule in _alert_rules():
        unknown = [n for n in METRIC_RE.findall(rule["expr"]) if n not in KNOWN_SAMPLES]
        assert not unknown, f"{rule['alert']}: not exported: {unknown}"
    tested = set(re.findall(r"alertname: (\w+)", (DASHBOARDS / "alerts_test.yaml").read_text()))
    assert tested == {r["alert"] for r in _alert_rules()}, "every alert has a unit test"


def _deploy_generate():
    spec = importlib.util.spec_from_file_location("nn_deploy_generate", REPO / "deploy" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_alert_has_an_absolute_runbook_url_from_one_prefix():
    """As mixins write them: absolute (Alertmanager and Slack show it as a link), one configurable prefix."""
    deploy_generate = _deploy_generate()
    prefix = deploy_generate.DEFAULT_RUNBOOK_URL_PREFIX
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    anchors = {h.strip().lower() for h in re.findall(r"^## (\S+)\s*$", runbooks, re.M)}
    for rule in _alert_rules():
        url = rule["annotations"].get("runbook_url", "")
        assert url == f"{prefix}#{rule['alert'].lower()}", (rule["alert"], url)
        assert url.split("#", 1)[1] in anchors, f"{rule['alert']}: no section in docs/runbooks.md"
    # Another prefix changes every URL and nothing else.
    mine = "https://wiki.example.com/sre/noisyneighbor"
    text = (DASHBOARDS / "alerts.yaml").read_text()
    changed = deploy_generate.with_runbook_prefix(text, mine)
    urls = [r["annotations"]["runbook_url"] for g in yaml.safe_load(changed)["spec"]["groups"] for r in g["rules"]]
    assert urls and all(u.startswith(mine + "#") for u in urls)
    assert changed.replace(mine, prefix) == text


def test_victim_alerts_carry_namespace_pod_and_every_aggregation_keeps_cluster():
    for rule in _alert_rules():
        for by in re.findall(r"\bby \(([^)]*)\)", rule["expr"]):
            assert "cluster" in [x.strip() for x in by.split(",")], f"{rule['alert']}: by ({by}) drops cluster"
        assert not re.search(r"\bwithout \(", rule["expr"]), rule["alert"]
        if "noisyneighbor_incidents_open" in rule["expr"]:
            assert re.search(r'label_replace\(.*"namespace", "\$1", "victim_namespace"', rule["expr"], re.S)
            assert re.search(r'"pod", "\$1", "victim_pod"', rule["expr"])
            assert "namespace" in rule["annotations"]["summary"] and "pod" in rule["annotations"]["summary"]


# Runbook words that name something to set or run. Config keys are written with their section
# (`actuators.evict_enabled`, `resource-threshold-config.cpuSuppressPolicy: cfsQuota`) or as a top-level key.
_CODE = re.compile(r"`([^`\n]+)`")
_IDENT = re.compile(r"[a-z][A-Za-z0-9_-]*")


def _config_paths() -> set[str]:
    """Every key path the agent's config takes: deploy/base/config.yaml writes out the whole schema, and
    the loader refuses unknown keys (checked here: the file loads)."""
    from detector.policy import load_policy

    load_policy(REPO / "deploy" / "base" / "config.yaml")
    doc = yaml.safe_load((REPO / "deploy" / "base" / "config.yaml").read_text())
    paths: set[str] = set()

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                path = f"{prefix}.{k}" if prefix else str(k)
                paths.add(path)
                walk(v, path)

    walk(doc, "")
    return paths


def _runbook_config_key(token: str, sections: set[str], top_level: set[str]) -> str | None:
    """The config key path a runbook token names (None: not a config key)."""
    key = token.split(":", 1)[0].strip()
    first = key.split(".", 1)[0]
    if "." in key and first in sections and all(_IDENT.fullmatch(p.replace("<kind>", "x").replace("*", "x"))
                                                for p in key.split(".")):
        return key
    if key in top_level and key not in sections:
        return key
    if "." not in key and "_" in key and key == key.lower() and _IDENT.fullmatch(key) and ":" in token:
        return key  # `some_key: value` without its section: must still be a key somewhere
    return None


def test_every_runbook_step_names_a_real_setting_or_command():
    from noisyneighbor import kubectl_plugin
    from noisyneighbor.cli import build_parser

    paths = _config_paths()
    doc = yaml.safe_load((REPO / "deploy" / "base" / "config.yaml").read_text())
    sections = {k for k, v in doc.items() if isinstance(v, dict)}
    top_level = set(doc)
    cli, plugin = build_parser(), kubectl_plugin.build_parser()
    flags = {opt for parser in (cli, plugin) for action in parser._actions for opt in action.option_strings}
    for sub in (cli, plugin):
        for action in sub._actions:
            for choice in (getattr(action, "choices", None) or {}).values() if isinstance(
                    getattr(action, "choices", None), dict) else ():
                flags |= {opt for a in choice._actions for opt in a.option_strings}
    text = (REPO / "docs" / "runbooks.md").read_text()
    checked = {"keys": 0, "flags": 0, "commands": 0}
    for token in _CODE.findall(text):
        key = _runbook_config_key(token, sections, top_level)
        if key is not None:
            pattern = re.compile("^" + re.escape(key).replace(re.escape("<kind>"), "[a-z]+")
                                 .replace(re.escape("*"), "[a-z_]+") + "$")
            leaf_ok = "." not in key and any(p.rsplit(".", 1)[-1] == key for p in paths)
            assert leaf_ok or any(pattern.match(p) for p in paths), f"runbook names config key {key!r}: not in the schema"
            checked["keys"] += 1
        elif re.fullmatch(r"--[a-z][a-z-]*", token):
            assert token in flags, f"runbook names flag {token}: no noisyneighbor or kubectl noisyneighbor flag"
            checked["flags"] += 1
        elif token.startswith(("kubectl noisyneighbor ", "noisyneighbor ")):
            argv = token.split()
            argv = argv[2:] if argv[0] == "kubectl" else argv[1:]
            parser = plugin if token.startswith("kubectl") else cli
            argv = [a.replace("$NODE", "node-1") for a in argv]
            try:
                parser.parse_args(argv)
            except SystemExit:
                pytest.fail(f"runbook command does not parse: {token}")
            checked["commands"] += 1
    assert checked["keys"] >= 3 and checked["flags"] >= 3 and checked["commands"] >= 2, checked


def test_the_runbook_check_catches_a_setting_that_does_not_exist():
    doc = yaml.safe_load((REPO / "deploy" / "base" / "config.yaml").read_text())
    sections = {k for k, v in doc.items() if isinstance(v, dict)}
    paths = _config_paths()
    for made_up in ("actuators.map_size", "slo.runq_p99_ms_max: 3", "probe_map_size: 4096"):
        key = _runbook_config_key(made_up, sections, set(doc))
        assert key is not None and key not in paths, made_up
    assert _runbook_config_key("key_map_full", sections, set(doc)) is None  # a label value, not a key


def test_every_alert_waits_before_firing():
    """A `for:` on every alert: one bad evaluation (a scrape gap, a counter's extrapolation) pages nobody."""
    for rule in _alert_rules():
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), f"{rule['alert']} has no for:"


def test_availability_alerts_cover_a_dead_and_an_unready_agent():
    """An agent that cannot be scraped exports nothing: those alerts must read what Prometheus and
    kube-state-metrics know, not the agent's own series."""
    by_name = {r["alert"]: r for r in _alert_rules()}
    assert re.search(r'\bup\{app_kubernetes_io_name="noisyneighbor"\} == 0', by_name["NoisyNeighborAgentDown"]["expr"])
    assert not METRIC_RE.findall(by_name["NoisyNeighborAgentDown"]["expr"])
    assert "kube_daemonset_status_number_ready" in by_name["NoisyNeighborAgentNotReady"]["expr"]
    assert 'kube_daemonset_labels{label_app_kubernetes_io_name="noisyneighbor"}' in \
        by_name["NoisyNeighborAgentNotReady"]["expr"]


# Labels that select the agent whatever its objects are called: the pod label the ServiceMonitor copies onto
# its targets, and the DaemonSet label kube-state-metrics exports (with its allowlist).
AGENT_SELECTING_LABELS = {"app_kubernetes_io_name", "label_app_kubernetes_io_name"}
LITERAL_MATCHER = re.compile(r'\b(\w+)\s*(?:=~|!~|!=|=)\s*"([^"]*)"')


def _name_selectors(expr: str) -> list[str]:
    """Matchers on a literal value naming the agent ("noisyneighbor" in it) by any label but the selecting ones:
    job, daemonset, service, pod, container, namespace all change with a namePrefix, a Helm release, a namespace."""
    return [f'{label}="{value}"' for label, value in LITERAL_MATCHER.findall(expr)
            if "noisyneighbor" in value.lower() and label not in AGENT_SELECTING_LABELS]


def test_no_alert_or_dashboard_query_selects_the_agent_by_a_name():
    queries = [(f"alert {r['alert']}", r["expr"]) for r in _alert_rules()]
    for name, text in generate.build_all().items():
        dash = __import__("json").loads(text)
        queries += [(f"{name}/{title}", expr) for title, expr in generate.iter_queries(dash)]
        queries += [(f"{name} variable {v['name']}", str(v.get("definition", ""))) for v in dash["templating"]["list"]]
    assert len(queries) > 20
    named = {where: found for where, expr in queries if (found := _name_selectors(expr))}
    assert not named, named
    # the check itself: what the alerts had before they selected by label
    assert _name_selectors('kube_daemonset_status_number_ready{daemonset=~"(.+-)?noisyneighbor(-.+)?"}')
    assert _name_selectors('up{job="noisyneighbor"} == 0')
    assert not _name_selectors('up{app_kubernetes_io_name="noisyneighbor"} == 0')


# -- integration -------------------------------------------------------------------------------------

LS_WORKER = REPO / "testkit" / "workloads" / "ls_worker.py"
CONNECTOR = r"""
import socket, sys, time
port, closed, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + seconds
i = 0
while time.monotonic() < end:
    i += 1
    try:
        socket.create_connection(("127.0.0.1", closed if i % 10 == 0 else port), timeout=2).close()
    except OSError:
        pass
    time.sleep(0.05)
"""
FILLER = r"""
import os, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
chunk = b"\xa5" * (1 << 20)
end = time.monotonic() + seconds
while time.monotonic() < end:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for i in range(48):
        os.write(fd, chunk)
        if i % 8 == 7:
            os.fdatasync(fd)
    os.close(fd)
    time.sleep(0.2)
os.unlink(path)
"""
RUN_S = 22.0


def _container(pod_slice: str) -> str:
    return f"{pod_slice}/cri-containerd-{uuid.uuid4().hex}{uuid.uuid4().hex}.scope"


def _set_quota(cg, quota_us: int, period_us: int = 100000) -> None:
    if (cg.path("cpu") / "cpu.cfs_quota_us").exists():
        cg.write("cpu", "cpu.cfs_period_us", str(period_us))
        cg.write("cpu", "cpu.cfs_quota_us", str(quota_us))
    else:
        cg.write("cpu", "cpu.max", f"{quota_us} {period_us}")


def _finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def _label_values(prom: PrometheusServer, definition: str, subst: dict[str, str]) -> list[str]:
    m = re.fullmatch(r"label_values\((.*), (\w+)\)", definition)
    assert m, definition
    selector, label = m.group(1), m.group(2)
    for var, value in subst.items():
        selector = selector.replace(f"${var}", value)
    series = prom.api("series", **{"match[]": selector, "start": f"{time.time() - 300:.0f}"})
    return sorted({s[label] for s in series if label in s})


@pytest.mark.root
@pytest.mark.slow
def test_every_panel_and_alert_query_returns_data_from_real_prometheus(make_cgroup, tmp_path):
    """The real agent (subprocess: probes, detector, enforcing actuators, exporter) scraped by Prometheus."""
    stress = require_tool("stress-ng")
    require_tool("prometheus")
    layout = discover()
    if layout.hierarchy_for("cpu") is None or layout.hierarchy_for("cpu").version != 1:
        pytest.skip("the test sets CFS quotas through cgroup v1 files")
    cpu, other_cpu = str((os.cpu_count() or 1) - 1), "0"
    procs: list[subprocess.Popen] = []
    stop = threading.Event()
    agent: AgentProcess | None = None
    unshield: Callable[[], None] | None = None
    kube = FakeKube(node_name="nn-int").start()
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        # BestEffort QoS level with a CPU cap (what koordlet's suppress sets) and a BE hog pod below it;
        # LS victims: "web" (a worker that needs CPU and connects, and a container filling page cache
        # through a memory limit) and "web-1" on the hog's CPU, "api" at its own small CFS quota.
        be = make_cgroup("kubepods.slice/kubepods-besteffort.slice", CONTROLLERS)
        # Our pods first on both CPUs against the rest of the node (CI load spins on CPU 0, where
        # "api" runs; other test runs use CPU 1): otherwise the node's other work, not the hog or
        # api's own quota, explains the victims' wait, and no action is decided (actions panels empty).
        # The agent goes below the same directory, in a cgroup of its own, as a node daemon in its
        # own pod would: left at the root it would get 1/17 of the hog's CPU and miss its scrapes.
        unshield = shield(be)
        agent_cg = make_cgroup("agent")
        _set_quota(be, 90000)  # capped, yet the hog still dominates its CPU: it is every victim's top culprit
        hog_uid, victim_uid, victim2_uid, api_uid = (str(uuid.uuid4()) for _ in range(4))
        hog = make_cgroup(_container(f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
                                     f"{hog_uid.replace('-', '_')}.slice"), CONTROLLERS)
        victim_pod = f"kubepods.slice/kubepods-pod{victim_uid.replace('-', '_')}.slice"
        app = make_cgroup(_container(victim_pod), CONTROLLERS)
        _set_quota(app, 40000)
        filler = make_cgroup(_container(victim_pod), CONTROLLERS)
        v1_memory = layout.hierarchy_for("memory").version == 1
        filler.write("memory", "memory.limit_in_bytes" if v1_memory else "memory.max", str(24 << 20))
        app2 = make_cgroup(_container(f"kubepods.slice/kubepods-pod{victim2_uid.replace('-', '_')}.slice"),
                           CONTROLLERS)
        api_pod = make_cgroup(f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                              f"{api_uid.replace('-', '_')}.slice", CONTROLLERS)
        _set_quota(api_pod, 10000)  # 0.1 core for a worker that needs 0.3: throttled at its own limit
        api = make_cgroup(_container(f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                                     f"{api_uid.replace('-', '_')}.slice"), CONTROLLERS)
        kube.add_pod(make_pod("crunch", "batch", hog_uid, qos_class="BE", node_name="nn-int"))
        kube.add_pod(make_pod("web", "shop", victim_uid, qos_class="LS", node_name="nn-int",
                              requests={"cpu": "1", "memory": "256Mi"}, limits={"cpu": "1", "memory": "256Mi"}))
        kube.add_pod(make_pod("web-1", "shop", victim2_uid, qos_class="LS", node_name="nn-int",
                              requests={"cpu": "1", "memory": "256Mi"}, limits={"cpu": "1", "memory": "256Mi"}))
        kube.add_pod(make_pod("api", "shop", api_uid, qos_class="LS", node_name="nn-int",
                              requests={"cpu": "100m"}, limits={"cpu": "100m"}))

        seconds = str(RUN_S + 60)
        worker = [sys.executable, str(LS_WORKER), "--seconds", seconds]
        procs += [
            subprocess.Popen(["taskset", "-c", cpu, stress, "--cpu", "2", "--cpu-method", "int64", "-t", seconds,
                              "--quiet"], preexec_fn=hog.preexec),
            subprocess.Popen(["taskset", "-c", cpu, *worker], preexec_fn=app.preexec, stdout=subprocess.DEVNULL),
            subprocess.Popen(["taskset", "-c", cpu, *worker], preexec_fn=app2.preexec, stdout=subprocess.DEVNULL),
            subprocess.Popen(["taskset", "-c", other_cpu, *worker], preexec_fn=api.preexec, stdout=subprocess.DEVNULL),
            subprocess.Popen([sys.executable, "-c", CONNECTOR, str(listener.getsockname()[1]), str(closed_port),
                              seconds], preexec_fn=app.preexec),
            subprocess.Popen([sys.executable, "-c", FILLER, str(tmp_path / "fill"), seconds],
                             preexec_fn=filler.preexec),
        ]
        accepting = threading.Thread(target=_accept_forever, args=(listener, stop), daemon=True)
        accepting.start()
        config = write_config(tmp_path / "config.yaml", {
            "slo": {"runq_p99_ms": 1.0},
            # Enforcing, and verification longer than the run: applied actions stay in effect while
            # Prometheus looks (a later decision on the same target is refused while it is verified).
            "actuators": {"dry_run": False, "verify_intervals": 10000, "cooldown_seconds": 0},
            "kubernetes": {"pod_source": "kubelet", "kubelet_url": kube.url, "kubelet_token_file": None},
            "resource-threshold-config": {"cpuSuppressPolicy": "cfsQuota"},
            # the node is saturated on purpose: at koordlet's 50 % share-pool guard the burst loop (issue 19)
            # would put api's base quota back every tick, and no burst would be in effect to chart
            "cpu-burst-config": {"policy": "auto", "sharePoolThresholdPercent": 100},
        })
        # Endpoint auth as the DaemonSet runs it (--auth kubernetes --auth-metrics): the apiserver (FakeKube)
        # knows Prometheus' token and grants it get /metrics; Prometheus scrapes with it.
        (tmp_path / "agent-sa-token").write_text("agent-token")
        (tmp_path / "prometheus-token").write_text("prometheus-token")
        kube.add_user("prometheus-token", "system:serviceaccount:monitoring:prometheus")
        kube.grant("system:serviceaccount:monitoring:prometheus", "/metrics")
        # Enforcing on a shared node: the agent may only change the cgroups this test created.
        agent = AgentProcess(config, tmp_path, "--incident-log", str(tmp_path / "incidents.jsonl"),
                             "--act-only", f"{_cpu_rel(be)}/*", "--act-only", f"{_cpu_rel(api_pod)}",
                             "--auth", "kubernetes", "--auth-metrics", "--auth-apiserver", kube.url,
                             "--auth-token-file", str(tmp_path / "agent-sa-token"), node="nn-int", cgroup=agent_cg)
        rules = _write_rule_groups(tmp_path)
        # The job named with a prefix, as a kustomize namePrefix would: the queries select the agent by the label
        # the ServiceMonitor copies from the pod, not by the job.
        with PrometheusServer([agent.target], rule_files=[rules], target_labels=[{"cluster": "c1"}],
                              bearer_token_file=tmp_path / "prometheus-token", job="team-a-noisyneighbor",
                              labels={"app_kubernetes_io_name": "noisyneighbor"}) as prom:
            agent.wait_ready()
            # Another caller without a token (any pod on the network) gets nothing.
            unauthenticated = agent.get("/metrics")[0], agent.get("/top")[0], agent.get("/diagnose")[0]
            assert prom.wait_for(f'{ex.EXPORTER_LAST_UPDATE}{{node="nn-int"}}', timeout=20), prom.log_tail()
            time.sleep(RUN_S)
            report = _run_all_queries(prom, gpu_on=_agent_gpu_on(agent), memory_paths_differ=_memory_paths_differ(app))
            rule_health = prom.api("rules")
            # How the scrapes went: a panel without data is either a missing series or scrapes that failed.
            scrapes = {name: prom.query(f"{fn}({metric}[{int(RUN_S) + 10}s])")
                       for name, fn, metric in (("up min", "min_over_time", "up"), ("scrapes", "count_over_time", "up"),
                                                ("scrape s max", "max_over_time", "scrape_duration_seconds"))}
            targets = [(t.get("health"), t.get("lastError"), t.get("lastScrapeDuration"))
                       for t in prom.api("targets").get("activeTargets", [])]
            actions = [a for a in agent.audit() if a.get("event") == "action"]
    finally:
        stop.set()
        rc = agent.terminate() if agent is not None else 0
        for p in procs:
            p.kill()
            p.wait()
        listener.close()
        kube.stop()
        if unshield is not None:
            unshield()

    empty, allowed, checked = report
    print(f"\n{checked} queries run; allowed empty ({len(allowed)}):")
    for line in allowed:
        print("  ", line)
    print("actions:", sorted({(a["kind"], a["state"], a["target_display"]) for a in actions}))
    incidents = tmp_path / "incidents.jsonl"
    for line in incidents.read_text().splitlines() if incidents.exists() else []:
        inc = __import__("json").loads(line)
        print("incident:", inc["event"], inc.get("victim", {}).get("display"), inc.get("cause"),
              [c.get("target", {}).get("display") for c in inc.get("culprits") or []][:3])
    assert rc == 0, f"agent exit code {rc} after SIGTERM:\n{agent.log_tail()}"
    assert unauthenticated == (401, 401, 401), unauthenticated
    scrape_summary = {name: [r["value"][1] for r in result] for name, result in scrapes.items()}
    print("scrapes:", scrape_summary, "targets:", targets)
    assert not empty, f"queries without data (scrapes {scrape_summary}, targets {targets}):\n" + "\n".join(empty)
    for group in rule_health["groups"]:
        for rule in group["rules"]:
            assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
    # SIGTERM restored what the actuators changed.
    assert be.read("cpu", "cpu.cfs_quota_us").strip() == "90000"
    assert api_pod.read("cpu", "cpu.cfs_quota_us").strip() == "10000"
    assert (hog.path("cpu").parent / "cpu.cfs_quota_us").read_text().strip() == "-1"  # the hog pod's cgroup


def _cpu_rel(cg) -> str:
    return str(cg.dirs["cpu"].relative_to(discover().hierarchy_for("cpu").mount))


def _memory_paths_differ(cg) -> bool:
    """Whether this test process sits in different cgroups in the cpu and memory hierarchies.

    The collector reads a cgroup's files at one path in every hierarchy, as kubelet lays pods out. Our
    test cgroups nest under this process's own cgroup in each hierarchy, so where those differ (a
    sandbox that put us in memory:/some/where) the memory files of our pod cgroups are not found.
    """
    layout = discover()
    cpu_rel = cg.dirs["cpu"].relative_to(layout.hierarchy_for("cpu").mount)
    mem_rel = cg.dirs["memory"].relative_to(layout.hierarchy_for("memory").mount)
    return cpu_rel != mem_rel


def _agent_gpu_on(agent: AgentProcess) -> bool:
    return (agent.wait_ready().get("gpu") or {}).get("state") == "on"


def _accept_forever(listener: socket.socket, stop: threading.Event) -> None:
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
            conn.close()
        except OSError:
            continue


def _run_all_queries(prom: PrometheusServer, gpu_on: bool, memory_paths_differ: bool = False
                     ) -> tuple[list[str], list[str], int]:
    allowed_empty: dict[str, str] = {}
    if not gpu_on:
        allowed_empty.update({name: "no NVIDIA GPU / NVML on this machine" for name in GPU_METRICS})
    # Absent on a node whose probes run (it is 1 only while degraded): this kernel has BTF, or this test skips.
    allowed_empty[ex.AGENT_DEGRADED] = ("this kernel has BTF, so noisyneighbor_agent_degraded (no_btf) is absent "
                                        "here; tests/test_deploy.py's agent on a host root without BTF reads it")
    if memory_paths_differ:
        allowed_empty.update({name: "this test process is in another cgroup in the memory hierarchy than in cpu, "
                              "so our pod cgroups' memory files are at other paths than the collector reads"
                              for name in (ex.CGROUP_MEMORY_USAGE, ex.CGROUP_MEMORY_LIMIT)})
    empty: list[str] = []
    allowed: list[str] = []
    checked = 0

    def check(where: str, expr: str) -> None:
        nonlocal checked
        checked += 1
        result = prom.query(expr)
        if _finite(result):
            return
        reasons = sorted({allowed_empty[n] for n in _metrics_in(expr) if n in allowed_empty}
                         | {reason for selector, reason in ALLOWED_EMPTY.items() if selector in expr})
        if reasons:
            allowed.append(f"{where}: {'; '.join(reasons)}")
        else:
            empty.append(f"{where}: {expr} -> {result[:2]}")

    # Prometheus scrapes the agent twice, once labelled cluster="c1": every panel must have data for the
    # series without the label (cluster=~"", a single-cluster Prometheus), with it, and with All (.*).
    for cluster in ("", "c1", ".*"):
        for name, text in generate.build_all().items():
            dash = __import__("json").loads(text)
            subst = {"__rate_interval": "10s", "cluster": cluster}
            for var in dash["templating"]["list"]:
                if var["type"] != "query":
                    continue
                values = _label_values(prom, var["definition"], subst)
                if var["name"] == "cluster":
                    assert values == ["c1"], f"{name}: cluster offers {values}"
                    continue
                want = {"node": "nn-int", "namespace": "shop", "pod": "web"}[var["name"]]
                assert want in values, f"{name}: variable {var['name']} offers {values}, not {want} (cluster {cluster!r})"
                subst[var["name"]] = want
            for title, expr in generate.iter_queries(dash):
                for var in sorted(subst, key=len, reverse=True):
                    expr = expr.replace(f"${var}", subst[var])
                check(f"{name} / {title} (cluster=~{cluster!r})", expr)

    # Alerts: the expression must evaluate; a quiet node fires none of them, so what must have data is
    # every metric they read (an alert on a metric that is never exported could never fire).
    for rule in _alert_rules():
        prom.query(rule["expr"])
        for metric in _metrics_in(rule["expr"]):
            check(f"alert {rule['alert']} reads {metric}", f'{metric}{{node="nn-int"}}')
    return empty, allowed, checked
