# SPDX-License-Identifier: Apache-2.0
"""README.md's quick start: each path is two commands and what they install is agent + dashboards + alerts.

The commands are read from README.md itself (the blocks after the quickstart markers) and rendered: the
helm command as `helm template` with the same flags, the kustomize one with `kubectl kustomize`. The
image build is checked against docker/Dockerfile (the file exists, the tag matches what is installed).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import yaml

from testkit.tools import require_tool
from tests.test_helm import helm

REPO = Path(__file__).resolve().parent.parent


def _block(marker: str) -> list[str]:
    text = (REPO / "README.md").read_text()
    m = re.search(rf"<!-- {marker}:.*?-->\n```sh\n(.*?)```", text, re.S)
    assert m, f"README.md has no {marker} block"
    return [ln for ln in m.group(1).splitlines() if ln.strip()]


def _what_it_installs(docs: list[dict]) -> dict[str, list]:
    kinds: dict[str, list] = {}
    for d in docs:
        kinds.setdefault(d["kind"], []).append(d)
    return kinds


def _check_complete(docs: list[dict], namespace: str, image: str) -> None:
    kinds = _what_it_installs(docs)
    [ds] = kinds["DaemonSet"]
    assert ds["metadata"]["namespace"] == namespace
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == image
    [sm], [rule] = kinds["ServiceMonitor"], kinds["PrometheusRule"]
    assert sm["metadata"]["labels"]["release"] == rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"]["groups"] and all("for" in r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r)
    dashboards = [c for c in kinds["ConfigMap"] if c["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(dashboards) == len(list((REPO / "dashboards").glob("*.json")))
    assert {c["metadata"]["namespace"] for c in dashboards} == {namespace}


def _build_tag(command: str) -> str:
    argv = shlex.split(command)
    assert argv[:3] == ["docker", "buildx", "build"] and argv[argv.index("-f") + 1] == "docker/Dockerfile"
    assert (REPO / "docker" / "Dockerfile").exists() and argv[-1] == "."
    return argv[argv.index("-t") + 1]


def test_helm_quick_start_is_two_commands_to_agent_dashboards_and_alerts():
    build, install = _block("quickstart-helm")
    tag = _build_tag(build)
    argv = shlex.split(install)
    assert argv[:4] == ["helm", "install", "noisyneighbor", "deploy/helm/noisyneighbor"]
    res = subprocess.run([helm(), "template", *argv[2:]], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    namespace = argv[argv.index("--namespace") + 1]
    repository, _, version = tag.rpartition(":")
    _check_complete(docs, namespace, f"{repository}:{version}")


def test_kustomize_quick_start_is_two_commands_to_agent_dashboards_and_alerts():
    build, apply = _block("quickstart-kustomize")
    tag = _build_tag(build)
    argv = shlex.split(apply)
    assert argv[:3] == ["kubectl", "apply", "-k"]
    kubectl = require_tool("kubectl")
    res = subprocess.run([kubectl, "kustomize", argv[3]], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    _check_complete(docs, "noisyneighbor", tag)
