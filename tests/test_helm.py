# SPDX-License-Identifier: Apache-2.0
"""The Helm chart (deploy/helm/noisyneighbor) is the kustomize manifests, rendered by a real helm 4.

Its templates are generated from deploy/base and deploy/components (deploy/chart.py via deploy/generate.py),
so these tests compare parsed objects: `helm template` with the defaults against `kubectl kustomize
deploy/base`, with every component on against the base with every component, and each component alone.
Every rendering is validated by kubernetes-validate (strict); `helm lint` must be clean.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.tools import require_tool

kubernetes_validate = pytest.importorskip("kubernetes_validate")

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy" / "helm" / "noisyneighbor"
sys.path.insert(0, str(REPO / "deploy"))
import chart  # noqa: E402 - deploy/ is not a package

HELM_CACHE = Path("/var/cache/noisyneighbor/helm/helm")  # where scripts/setup.sh test puts it
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
NAMESPACE = "noisyneighbor"


def helm() -> str:
    found = shutil.which("helm") or (str(HELM_CACHE) if HELM_CACHE.exists() else None)
    if found is None:
        pytest.skip("helm is not installed (scripts/setup.sh test installs it into /var/cache/noisyneighbor/helm)")
    return found


def helm_template(*sets: str, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    args = [helm(), "template", "nn", str(CHART), "-n", namespace]
    for s in sets:
        args += ["--set", s]
    res = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d is not None]


@functools.cache
def _kustomize(components: tuple[str, ...]) -> str:
    require_tool("kubectl")
    return json.dumps(chart.render_with(components))


def kustomized(*components: str) -> list[dict[str, Any]]:
    return json.loads(_kustomize(tuple(components)))


def by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    out = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(out) == len(docs), "two objects of one kind and name"
    return out


def _on(*components: str) -> list[str]:
    return [f"components.{chart.COMPONENT_VALUES[c]}=true" for c in components]


def config_checksum(helm_docs: list[dict[str, Any]]) -> str:
    [ds] = [d for d in helm_docs if d["kind"] == "DaemonSet"]
    return ds["spec"]["template"]["metadata"]["annotations"][chart.CONFIG_CHECKSUM_ANNOTATION]


def _without_checksum(helm_docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chart's objects less the one thing kustomize does otherwise: the pod template's config checksum
    (a sha256 Helm computes; kustomize rolls the pods by the config map's hashed name instead)."""
    assert re.fullmatch(r"[0-9a-f]{64}", config_checksum(helm_docs)), config_checksum(helm_docs)
    docs = copy.deepcopy(helm_docs)
    for d in docs:
        if d["kind"] == "DaemonSet":
            meta = d["spec"]["template"]["metadata"]
            del meta["annotations"][chart.CONFIG_CHECKSUM_ANNOTATION]
            if not meta["annotations"]:
                del meta["annotations"]
    return docs


def _assert_same(helm_docs: list[dict[str, Any]], kustomize_docs: list[dict[str, Any]]) -> None:
    """The same objects, but that the chart names the config map without kustomize's hash suffix and
    rolls the pods by a checksum annotation instead."""
    h, k = by_key(_without_checksum(helm_docs)), by_key(chart.without_name_hashes(kustomize_docs))
    assert h.keys() == k.keys(), (sorted(h.keys() - k.keys()), sorted(k.keys() - h.keys()))
    for key in h:
        assert h[key] == k[key], f"{key} differs between the chart and kustomize"


def _validate(docs: list[dict[str, Any]]) -> None:
    version = kubernetes_validate.latest_version()
    for doc in docs:
        if doc["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_helm_lint_is_clean():
    res = subprocess.run([helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "[ERROR]" not in res.stdout and "[WARNING]" not in res.stdout, res.stdout + res.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in res.stdout


def test_the_defaults_render_the_kustomize_base():
    docs = helm_template()
    _assert_same(docs, kustomized())
    _validate(docs)


def test_every_component_on_renders_the_base_with_every_component():
    docs = helm_template(*_on(*chart.COMPONENT_VALUES))
    _assert_same(docs, kustomized(*chart.COMPONENT_VALUES))
    _validate(docs)


@pytest.mark.parametrize("component", sorted(chart.COMPONENT_VALUES))
def test_each_component_alone_renders_what_kustomize_does(component: str):
    _assert_same(helm_template(*_on(component)), kustomized(component))


def test_every_component_directory_has_a_switch():
    dirs = {p.parent.name for p in (REPO / "deploy" / "components").glob("*/kustomization.yaml")}
    assert dirs == set(chart.COMPONENT_VALUES)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["components"]) == set(chart.COMPONENT_VALUES.values())
    assert not any(values["components"].values()), "components are opt-in"


def test_values_reach_the_objects(tmp_path: Path):
    from noisyneighbor.cli import build_parser

    docs = by_key(helm_template(
        "image.repository=registry.example.com/nn", "image.tag=1.2.3", "actuators.enabled=true",
        "probes={runqlat,softirq}", "auth.metrics=false", "resources.limits.memory=512Mi",
        "monitoring.labels.release=kps", "dashboards.namespace=monitoring",
        *_on("servicemonitor", "prometheusrule", "grafana-dashboards"), namespace="nn-system"))
    ds = docs[("DaemonSet", "noisyneighbor")]
    c = ds["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "registry.example.com/nn:1.2.3" and ds["metadata"]["namespace"] == "nn-system"
    args = build_parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in c["args"]])
    assert args.dry_run is None and args.probes == ("runqlat", "softirq")
    assert args.auth == "kubernetes" and not args.auth_metrics
    assert c["resources"]["limits"]["memory"] == "512Mi"
    assert docs[("ServiceMonitor", "noisyneighbor")]["metadata"]["labels"]["release"] == "kps"
    assert docs[("PrometheusRule", "noisyneighbor")]["metadata"]["labels"]["release"] == "kps"
    dashboards = [d for d in docs.values() if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert len(dashboards) == len(list((REPO / "dashboards").glob("*.json")))
    assert {d["metadata"]["namespace"] for d in dashboards} == {"monitoring"}
    binding = docs[("ClusterRoleBinding", "noisyneighbor")]
    assert binding["subjects"][0]["namespace"] == "nn-system"
    # Grafana's {{pod}} legends and the alerts' {{ $labels.node }} come through untouched, not templated.
    rule = yaml.safe_dump(docs[("PrometheusRule", "noisyneighbor")])
    assert "{{ $labels.node }}" in rule
    # auth off: the agent serves everyone (an explicit choice)
    ds_open = by_key(helm_template("auth.enabled=false"))[("DaemonSet", "noisyneighbor")]
    assert "--auth" not in ds_open["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_generator_refuses_a_change_it_cannot_express():
    base = {"spec": {"args": ["a", "b"], "x": 1}}
    with pytest.raises(chart.ChartError, match="removes"):
        chart._mark_diff(base, {"spec": {"args": ["a", "b"]}}, "eviction", "DaemonSet")
    with pytest.raises(chart.ChartError, match="cannot express"):
        chart._mark_diff(base, {"spec": {"args": ["b"], "x": 1}}, "eviction", "DaemonSet")


def test_the_chart_is_in_sync_with_the_manifests():
    res = subprocess.run([sys.executable, str(REPO / "deploy" / "generate.py"), "--check"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr


def _texts(tree: Path) -> dict[Path, str]:
    return {p.relative_to(tree): p.read_text() for p in tree.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_a_config_edit_changes_one_chart_file_and_rolls_the_pods(tmp_path: Path):
    """Editing deploy/base/config.yaml (an SLO, say) changes one generated file, the chart's config map template:
    its name and the DaemonSet's reference to it stay. `generate.py --check` names that one file while it is
    stale, and Helm's checksum annotation on the pod template changes, so `helm upgrade` rolls the agents."""
    require_tool("kubectl")
    shutil.copytree(REPO / "deploy", tmp_path / "deploy", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "dashboards", tmp_path / "dashboards")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    deploy = tmp_path / "deploy"
    config = deploy / "base" / "config.yaml"
    config.write_text(config.read_text().replace("runq_p99_ms: 5.0 ", "runq_p99_ms: 4.0 ", 1))
    before = _texts(deploy)
    assert before[Path("base/config.yaml")] != (REPO / "deploy/base/config.yaml").read_text()

    def generate(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(deploy / "generate.py"), *args], capture_output=True, text=True,
                              timeout=300)

    config_template = Path("helm/noisyneighbor/templates/configmap-noisyneighbor-config.yaml")
    stale = generate("--check")
    assert stale.returncode == 1 and f": {config_template}: run deploy/generate.py" in stale.stderr, stale.stderr
    assert generate().returncode == 0 and generate("--check").returncode == 0
    after = _texts(deploy)
    assert after.keys() == before.keys(), (sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys()))
    assert {p for p in after if after[p] != before[p]} == {config_template}

    def rendered(chart_dir: Path) -> list[dict[str, Any]]:
        res = subprocess.run([helm(), "template", "nn", str(chart_dir), "-n", NAMESPACE], capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        return [d for d in yaml.safe_load_all(res.stdout) if d is not None]

    old, new = rendered(CHART), rendered(deploy / "helm" / "noisyneighbor")
    assert config_checksum(old) != config_checksum(new)
    changed = {k for k, d in by_key(_without_checksum(new)).items() if by_key(_without_checksum(old))[k] != d}
    assert changed == {("ConfigMap", "noisyneighbor-config")}


def test_apparmor_and_max_surge_in_the_values():
    """values.yaml says why the profile is Unconfined and that maxSurge stays 0; the value reaches the pod."""
    values = (CHART / "values.yaml").read_text()
    assert yaml.safe_load(values)["appArmorProfile"] == {"type": "Unconfined"}
    assert "ptrace" in values and "maxSurge stays 0" in values and "journal" in values
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == ">=1.30.0-0"  # the field's version
    for sets, want in (((), {"type": "Unconfined"}),
                       (("appArmorProfile.type=Localhost", "appArmorProfile.localhostProfile=nn-agent"),
                        {"type": "Localhost", "localhostProfile": "nn-agent"})):
        [ds] = [d for d in helm_template(*sets) if d["kind"] == "DaemonSet"]
        assert ds["spec"]["template"]["spec"]["securityContext"]["appArmorProfile"] == want
        assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 0
