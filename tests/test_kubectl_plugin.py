"""`kubectl noisyneighbor` against FakeKube through the real kubectl: pod lookup by node, the exec
requests it makes (command, container, stdin/tty), streamed output, exit codes and the HTML copy-back.

kubectl talks TLS with a token to the fake apiserver from a kubeconfig, and exec goes over the
WebSocket protocol kubectl speaks (v5.channel.k8s.io); the fake answers exec from a scripted handler.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import read_terminal, require_tool
from tests.fakekube import FakeKube, make_pod

REPO = Path(__file__).resolve().parent.parent
AGENT_LABELS = {"app.kubernetes.io/name": "noisyneighbor", "app.kubernetes.io/component": "agent"}
PLUGIN = Path(sys.executable).parent / "kubectl-noisyneighbor"


def _agent(name: str, node: str, phase: str = "Running") -> dict:
    return make_pod(name, "noisyneighbor", node_name=node, labels=dict(AGENT_LABELS), phase=phase, owner=None,
                    containers=[{"name": "agent"}])


@pytest.fixture
def cluster(tmp_path: Path):
    require_tool("kubectl")
    with FakeKube(token="s3cret", tls=True) as kube:
        kube.add_pod(_agent("noisyneighbor-aaaaa", "node-1"))
        kube.add_pod(_agent("noisyneighbor-bbbbb", "node-2"))
        kube.add_pod(_agent("noisyneighbor-ccccc", "node-3", phase="Pending"))
        kube.add_pod(make_pod("web-0", "shop", node_name="node-1"))  # not an agent: never chosen
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": kube.url, "certificate-authority": kube.ca_file}}],
            "users": [{"name": "u", "user": {"token": "s3cret"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
        }))
        yield kube, kubeconfig


def _plugin(kubeconfig: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PLUGIN), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_plugin_is_installed_where_kubectl_finds_it():
    kubectl = require_tool("kubectl")
    env = dict(os.environ, PATH=f"{PLUGIN.parent}:{os.environ['PATH']}")
    res = subprocess.run([kubectl, "plugin", "list"], capture_output=True, text=True, timeout=60, env=env)
    assert str(PLUGIN) in res.stdout, res.stdout + res.stderr


def test_top_runs_in_the_agent_pod_of_that_node_and_streams_its_output(cluster):
    kube, kubeconfig = cluster
    kube.exec_handler = lambda ns, pod, container, command: (b"runqlat: on\nCGROUP / POD\n", b"", 0)
    res = _plugin(kubeconfig, "top", "node-2", "--once", "--view", "runq")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "runqlat: on\nCGROUP / POD\n"
    [lookup] = [r for r in kube.requests if r.path == "/api/v1/namespaces/noisyneighbor/pods"]
    assert lookup.query["fieldSelector"] == ["spec.nodeName=node-2"]
    assert set(lookup.query["labelSelector"][0].split(",")) == {f"{k}={v}" for k, v in AGENT_LABELS.items()}
    [(ns, pod, container, command, query)] = kube.execs
    assert (ns, pod, container) == ("noisyneighbor", "noisyneighbor-bbbbb", "agent")
    assert command == ["noisyneighbor", "top", "--host-root", "/host", "--once", "--view", "runq"]
    # Piped here: no TTY and no stdin, so the remote top prints plain tables and needs no keys.
    assert query.get("tty", ["false"]) == ["false"] and query.get("stdin", ["false"]) == ["false"]
    assert query["stdout"] == ["true"] and query["stderr"] == ["true"]


def test_diagnose_passes_its_exit_code_and_copies_the_html_back(cluster, tmp_path: Path):
    kube, kubeconfig = cluster
    page = b"<!doctype html><html>" + b"x" * 100_000 + b"</html>"  # larger than one WebSocket frame

    def handler(ns, pod, container, command):
        if command[:2] == ["noisyneighbor", "diagnose"]:
            return b"INCIDENT nn-1 victim shop/web\n", b"", 3
        if command[0] == "cat":
            return page, b"", 0
        return b"", b"", 0

    kube.exec_handler = handler
    out = tmp_path / "report.html"
    res = _plugin(kubeconfig, "diagnose", "node-1", "--duration", "2m", "--fail-on-incident", "--html", str(out))
    assert res.returncode == 3, res.stderr
    assert res.stdout == "INCIDENT nn-1 victim shop/web\n"
    assert out.read_bytes() == page
    commands = [command for _, pod, _, command, _ in kube.execs]
    assert all(pod == "noisyneighbor-aaaaa" for _, pod, _, _, _ in kube.execs)
    diagnose, cat, rm = commands
    remote = diagnose[diagnose.index("--html") + 1]
    assert remote.startswith("/tmp/noisyneighbor-report-") and remote.endswith(".html")
    assert diagnose == ["noisyneighbor", "diagnose", "--host-root", "/host", "--config", "/etc/noisyneighbor/config.yaml",
                        "--html", remote, "--duration", "2m", "--fail-on-incident"]
    assert cat == ["cat", remote] and rm == ["rm", "-f", remote]


def test_no_running_agent_on_the_node_is_one_line_and_exit_1(cluster):
    kube, kubeconfig = cluster
    for node, why in (("node-3", "noisyneighbor-ccccc: Pending"), ("node-9", "")):
        res = _plugin(kubeconfig, "diagnose", node)
        assert res.returncode == 1, res
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and f"no running noisyneighbor agent pod on node {node}" in lines[0], res.stderr
        assert why in lines[0]
    assert kube.execs == []


def test_unreachable_cluster_is_one_line(tmp_path: Path):
    require_tool("kubectl")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    res = _plugin(kubeconfig, "top", "node-1")
    assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("kubectl noisyneighbor: cannot list pods:") and "Traceback" not in res.stderr


def test_top_on_a_terminal_asks_for_a_tty_and_stdin_and_passes_term(cluster):
    import pty

    kube, kubeconfig = cluster
    kube.exec_handler = lambda ns, pod, container, command: (b"LIVE VIEW\r\n", b"", 0)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([str(PLUGIN), "--kubeconfig", str(kubeconfig), "top", "node-1"], stdin=follower,
                            stdout=follower, stderr=subprocess.PIPE, env=dict(os.environ, TERM="xterm-256color"))
    os.close(follower)
    screen = read_terminal(leader)
    os.close(leader)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert b"LIVE VIEW" in screen
    [(_, pod, _, command, query)] = kube.execs
    assert pod == "noisyneighbor-aaaaa"
    assert command == ["env", "TERM=xterm-256color", "noisyneighbor", "top", "--host-root", "/host"]
    assert query["tty"] == ["true"] and query["stdin"] == ["true"]
