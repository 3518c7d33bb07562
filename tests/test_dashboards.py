"""Dashboards and alert rules: in sync with the exporter, unit-tested with promtool, and every query run
by the real Prometheus against the exporter fed by real probes while test cgroups interfere."""

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
from pathlib import Path

import pytest
import yaml

from noisyneighbor import exporter as ex
from probes.gpu import GpuCollector
from tests.conftest import require_tool
from tests.exporter_support import CONTROLLERS, ProbeSet, Scraper
from tests.prometheus_server import PrometheusServer

DASHBOARDS = Path(__file__).resolve().parent.parent / "dashboards"
_spec = importlib.util.spec_from_file_location("nn_dashboards_generate", DASHBOARDS / "generate.py")
generate = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = generate  # dataclasses look their module up while the file runs
_spec.loader.exec_module(generate)

METRIC_RE = re.compile(r"\bnoisyneighbor_[a-z0-9_]+")
KNOWN_SAMPLES = {n: d.name for d in ex.METRICS.values() for n in d.sample_names}

# Queries that may come back empty in the integration test, by the metric that makes them empty.
ALLOWED_EMPTY = {
    ex.INCIDENTS_OPEN: "no detector wired into this test yet (the lead wires detector -> exporter): no incidents",
    ex.INCIDENTS: "no detector wired: no incidents",
    ex.INCIDENT_CONFIDENCE: "no detector wired: no incidents",
    ex.CULPRIT_SCORE: "no detector wired: no culprits",
    ex.ACTIONS: "no actuator manager wired: no actions",
    ex.ACTION_ACTIVE: "no actuator manager wired: no actions",
    ex.ACTION_SUPPRESS_CORES: "no actuator manager wired: no suppress actions",
}
GPU_METRICS = {ex.GPU_UTILIZATION, ex.GPU_MEMORY_USED, ex.GPU_MEMORY_TOTAL}


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
        assert variables["datasource"]["type"] == "datasource"
        assert variables["node"]["definition"].startswith("label_values(")
        if name == "pod-interference.json":
            assert {"namespace", "pod"} <= set(variables)
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
            assert names, f"{name}/{title}: no noisyneighbor metric in {expr}"
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


# -- integration -------------------------------------------------------------------------------------

WORKER = r"""
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t = time.perf_counter()
    while time.perf_counter() - t < 0.0015:
        pass
    time.sleep(0.005)
"""
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
    stress = require_tool("stress-ng")
    require_tool("prometheus")
    cpu = str((os.cpu_count() or 1) - 1)
    probes = ProbeSet()
    gpu = GpuCollector()
    scraper = Scraper(exporter_kwargs={"node": "nn-int"})
    procs: list[subprocess.Popen] = []
    stop = threading.Event()
    feeder: threading.Thread | None = None
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        # BestEffort QoS level with a CPU cap (what koordlet's suppress sets), a BE hog pod below it,
        # and a guaranteed victim pod: one container that needs CPU and connects, one that fills page
        # cache through a memory limit.
        be = make_cgroup("kubepods.slice/kubepods-besteffort.slice", CONTROLLERS)
        _set_quota(be, 50000)
        hog_uid, victim_uid = str(uuid.uuid4()), str(uuid.uuid4())
        hog = make_cgroup(_container(f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
                                     f"{hog_uid.replace('-', '_')}.slice"), CONTROLLERS)
        victim_pod = f"kubepods.slice/kubepods-pod{victim_uid.replace('-', '_')}.slice"
        app = make_cgroup(_container(victim_pod), CONTROLLERS)
        _set_quota(app, 40000)
        filler = make_cgroup(_container(victim_pod), CONTROLLERS)
        v1_memory = probes.layout.hierarchy_for("memory").version == 1
        filler.write("memory", "memory.limit_in_bytes" if v1_memory else "memory.max", str(24 << 20))
        scraper.labeler.pods.update({hog_uid: ("batch", "crunch"), victim_uid: ("shop", "web")})
        cgroups = [be, hog, app, filler]

        seconds = str(RUN_S + 30)
        procs += [
            subprocess.Popen(["taskset", "-c", cpu, stress, "--cpu", "2", "--cpu-method", "int64", "-t", seconds,
                              "--quiet"], preexec_fn=hog.preexec),
            subprocess.Popen(["taskset", "-c", cpu, sys.executable, "-c", WORKER, seconds], preexec_fn=app.preexec),
            subprocess.Popen([sys.executable, "-c", CONNECTOR, str(listener.getsockname()[1]), str(closed_port),
                              seconds], preexec_fn=app.preexec),
            subprocess.Popen([sys.executable, "-c", FILLER, str(tmp_path / "fill"), seconds],
                             preexec_fn=filler.preexec),
        ]
        accepting = threading.Thread(target=_accept_forever, args=(listener, stop), daemon=True)
        accepting.start()

        def feed() -> None:
            while not stop.is_set():
                scraper.exporter.update(probes.snapshot(cgroups, gpus=gpu.collect()))
                stop.wait(1.0)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        rules = _write_rule_groups(tmp_path)
        with PrometheusServer([scraper.target], rule_files=[rules]) as prom:
            assert prom.wait_for(f'{ex.EXPORTER_LAST_UPDATE}{{node="nn-int"}}', timeout=20), prom.log_tail()
            time.sleep(RUN_S)
            report = _run_all_queries(prom, gpu.status.state == "on")
            rule_health = prom.api("rules")
    finally:
        stop.set()
        for p in procs:
            p.kill()
            p.wait()
        if feeder is not None:
            feeder.join(timeout=5)
        listener.close()
        scraper.close()
        probes.close()
        gpu.close()

    empty, allowed, checked = report
    print(f"\n{checked} queries run; allowed empty ({len(allowed)}):")
    for line in allowed:
        print("  ", line)
    assert not empty, "queries without data:\n" + "\n".join(empty)
    for group in rule_health["groups"]:
        for rule in group["rules"]:
            assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"


def _accept_forever(listener: socket.socket, stop: threading.Event) -> None:
    listener.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
            conn.close()
        except OSError:
            continue


def _run_all_queries(prom: PrometheusServer, gpu_on: bool) -> tuple[list[str], list[str], int]:
    allowed_empty = dict(ALLOWED_EMPTY)
    if not gpu_on:
        allowed_empty.update({name: "no NVIDIA GPU / NVML on this machine" for name in GPU_METRICS})
    empty: list[str] = []
    allowed: list[str] = []
    checked = 0

    def check(where: str, expr: str) -> None:
        nonlocal checked
        checked += 1
        result = prom.query(expr)
        if _finite(result):
            return
        reasons = sorted({allowed_empty[n] for n in _metrics_in(expr) if n in allowed_empty})
        if reasons:
            allowed.append(f"{where}: {'; '.join(reasons)}")
        else:
            empty.append(f"{where}: {expr} -> {result[:2]}")

    for name, text in generate.build_all().items():
        dash = __import__("json").loads(text)
        subst = {"__rate_interval": "10s"}
        for var in dash["templating"]["list"]:
            if var["type"] != "query":
                continue
            values = _label_values(prom, var["definition"], subst)
            want = {"node": "nn-int", "namespace": "shop", "pod": "web"}[var["name"]]
            assert want in values, f"{name}: variable {var['name']} offers {values}, not {want}"
            subst[var["name"]] = want
        for title, expr in generate.iter_queries(dash):
            for var in sorted(subst, key=len, reverse=True):
                expr = expr.replace(f"${var}", subst[var])
            check(f"{name} / {title}", expr)

    # Alerts: the expression must evaluate; a quiet node fires none of them, so what must have data is
    # every metric they read (an alert on a metric that is never exported could never fire).
    for rule in _alert_rules():
        prom.query(rule["expr"])
        for metric in _metrics_in(rule["expr"]):
            check(f"alert {rule['alert']} reads {metric}", f'{metric}{{node="nn-int"}}')
    return empty, allowed, checked
