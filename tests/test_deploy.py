"""deploy/: the Kubernetes manifests validate against a current API schema and say what the agent needs.

Core kinds are validated by kubernetes-validate against the newest Kubernetes schema it ships, in strict
mode (unknown fields are errors). kubernetes-validate has no schemas for CRDs (ServiceMonitor) or for
kustomize's Kustomization, so those are checked here against the fields we use.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in the dev extra: pip install -e '.[dev]'"
)

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
NOT_MANIFESTS = {"config.yaml", "kustomization.yaml"}
AGENT_LABELS = {"app.kubernetes.io/name": "noisyneighbor", "app.kubernetes.io/component": "agent"}
METRICS_PORT = 9717
EXPECTED_ARGS = [
    "agent",
    "--config", "/etc/noisyneighbor/config.yaml",
    "--node-name", "$(NODE_NAME)",
    "--host-root", "/host",
    "--listen", f"0.0.0.0:{METRICS_PORT}",
    "--dry-run",
    "--journal-dir", "/var/lib/noisyneighbor/journal",
]


def manifest_files() -> list[Path]:
    return sorted(p for p in DEPLOY.glob("*.yaml") if p.name not in NOT_MANIFESTS)


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def all_docs() -> list[dict[str, Any]]:
    return [d for p in manifest_files() for d in load_docs(p)]


def the(kind: str) -> dict[str, Any]:
    found = [d for d in all_docs() if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def agent_container() -> dict[str, Any]:
    containers = the("DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["agent"]
    return containers[0]


def configmap_name() -> str:
    """The ConfigMap's name: from configmap.yaml, or what deploy/generate.py will write there."""
    if (DEPLOY / "configmap.yaml").exists():
        return the("ConfigMap")["metadata"]["name"]
    spec = importlib.util.spec_from_file_location("nn_deploy_generate", DEPLOY / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.ConfigMapSpec().name


def k8s_version() -> str:
    return kubernetes_validate.latest_version()


# ---- schema validation -------------------------------------------------------------------------------

CRD_KINDS = {"ServiceMonitor"}


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_validates_against_current_kubernetes(path: Path) -> None:
    docs = load_docs(path)
    assert docs, f"{path.name} is empty"
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue  # no CRD schemas in kubernetes-validate: see test_servicemonitor_structure
        kubernetes_validate.validate(doc, k8s_version(), strict=True)


def test_validator_rejects_a_broken_daemonset() -> None:
    """The validation above can fail: a misspelt field and a wrong type are both errors."""
    ds = the("DaemonSet")
    misspelt = copy.deepcopy(ds)
    misspelt["spec"]["template"]["spec"]["hostPid"] = misspelt["spec"]["template"]["spec"].pop("hostPID")
    wrong_type = copy.deepcopy(ds)
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "9717"
    for bad in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, k8s_version(), strict=True)


def test_schema_version_is_current() -> None:
    major, minor = (int(x) for x in k8s_version().split(".")[:2])
    assert (major, minor) >= (1, 31), f"kubernetes-validate only knows up to {k8s_version()}: upgrade it"


DURATION = re.compile(r"^(\d+(ms|s|m|h))+$")
ENDPOINT_FIELDS = {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "relabelings",
                   "metricRelabelings", "targetPort", "bearerTokenSecret", "tlsConfig"}


def test_servicemonitor_structure() -> None:
    """ServiceMonitor (monitoring.coreos.com/v1) against the CRD's fields we use; kubernetes-validate has no CRDs."""
    sm = the("ServiceMonitor")
    svc = the("Service")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm) == {"apiVersion", "kind", "metadata", "spec"}
    assert sm["metadata"]["namespace"] == svc["metadata"]["namespace"]
    spec = sm["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
    assert spec["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert spec["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    port_names = {p["name"] for p in svc["spec"]["ports"]}
    assert spec["endpoints"], "no endpoints"
    for ep in spec["endpoints"]:
        assert set(ep) <= ENDPOINT_FIELDS, f"unknown endpoint fields {set(ep) - ENDPOINT_FIELDS}"
        assert ep["port"] in port_names
        assert ep["path"] == "/metrics"
        assert ep["scheme"] in {"http", "https"}
        assert isinstance(ep.get("honorLabels", False), bool)
        for key in ("interval", "scrapeTimeout"):
            assert DURATION.match(ep[key]), f"{key}={ep[key]!r} is not a Prometheus duration"


# ---- what the agent needs ------------------------------------------------------------------------------

def test_rbac_grants_exactly_what_the_agent_uses() -> None:
    role = the("ClusterRole")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == {
        ("", "pods"): {"get", "list", "watch"},
        ("", "pods/eviction"): {"create"},
        ("", "events"): {"create", "patch"},
        ("", "nodes"): {"get"},
    }
    binding = the("ClusterRoleBinding")
    sa = the("ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    assert the("DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_daemonset_security_context() -> None:
    pod = the("DaemonSet")["spec"]["template"]["spec"]
    sc = agent_container()["securityContext"]
    assert sc["privileged"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    # SYS_PTRACE: opening /proc/<pid>/ns/net of another uid's process (see the comment in daemonset.yaml).
    assert set(sc["capabilities"]["add"]) == {"BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE", "SYS_RESOURCE"}
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in pod["tolerations"]
    ns = the("Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_daemonset_host_mounts() -> None:
    pod = the("DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in agent_container()["volumeMounts"]}
    # mountPath -> (host path, read-only)
    want = {
        "/host/proc": ("/proc", True),
        "/host/sys/fs/cgroup": ("/sys/fs/cgroup", False),
        "/host/sys/kernel/btf": ("/sys/kernel/btf", True),
        "/host/sys/kernel/tracing": ("/sys/kernel/tracing", True),
        "/host/sys/fs/resctrl": ("/sys/fs/resctrl", False),
        "/var/lib/noisyneighbor": ("/var/lib/noisyneighbor", False),
    }
    for mount_path, (host_path, read_only) in want.items():
        m = mounts[mount_path]
        assert volumes[m["name"]]["hostPath"]["path"] == host_path
        assert m.get("readOnly", False) is read_only, mount_path
        # Bidirectional would need a privileged container.
        assert m.get("mountPropagation", "None") in {"None", "HostToContainer"}
    host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
    assert host_paths == {hp for hp, _ in want.values()}, "a hostPath nobody asked for"
    config = mounts["/etc/noisyneighbor"]
    assert volumes[config["name"]]["configMap"]["name"] == configmap_name()
    assert config["readOnly"] is True
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]  # read-only root: scratch space


def test_container_args_match_the_agent_flags() -> None:
    c = agent_container()
    assert "command" not in c, "the image's ENTRYPOINT (noisyneighbor) must stay"
    assert c["args"] == EXPECTED_ARGS
    node_env = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    journal = c["args"][c["args"].index("--journal-dir") + 1]
    assert any(journal.startswith(m["mountPath"] + "/") for m in c["volumeMounts"]), "journal not on a volume"


def test_container_args_parse_with_the_real_cli() -> None:
    from noisyneighbor.cli import build_parser

    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if "agent" not in subcommands:
        pytest.skip("noisyneighbor.cli has no 'agent' subcommand yet: the arguments are checked by name only")
    args = [a.replace("$(NODE_NAME)", "node-1") for a in agent_container()["args"]]
    parsed = parser.parse_args(args)
    assert parsed.command == "agent"


def test_ports_probes_and_resources() -> None:
    c = agent_container()
    assert c["ports"] == [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"},
                              "limits": {"cpu": "500m", "memory": "384Mi"}}
    svc = the("Service")
    assert svc["spec"]["selector"].items() <= the("DaemonSet")["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["port"] == METRICS_PORT and svc["spec"]["ports"][0]["targetPort"] == "metrics"


def test_namespaces_are_consistent() -> None:
    ns = the("Namespace")["metadata"]["name"]
    for doc in all_docs():
        if doc["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
            assert doc["metadata"]["namespace"] == ns, f"{doc['kind']} not in {ns}"


# ---- kustomize ---------------------------------------------------------------------------------------------

def test_kustomization_lists_every_manifest() -> None:
    """kustomize's own schema is not in kubernetes-validate: check the fields and the file list here."""
    k = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    assert set(k) <= {"apiVersion", "kind", "resources", "images", "namespace", "labels", "patches"}
    # configmap.yaml may not be generated yet (deploy/config.yaml pending): it is listed all the same.
    assert sorted(k["resources"]) == sorted({p.name for p in manifest_files()} | {"configmap.yaml"})
    image = agent_container()["image"].split(":")[0]
    assert [i["name"] for i in k["images"]] == [image]


def test_no_resctrl_overlay_removes_only_the_resctrl_mount() -> None:
    overlay = DEPLOY / "overlays" / "no-resctrl"
    k = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert k["resources"] == ["../../"]
    patch = yaml.safe_load((overlay / k["patches"][0]["path"]).read_text())
    ds = the("DaemonSet")
    assert (patch["kind"], patch["metadata"]) == (ds["kind"], ds["metadata"] | {"labels": None}) or (
        patch["metadata"]["name"] == ds["metadata"]["name"]
        and patch["metadata"]["namespace"] == ds["metadata"]["namespace"]
    )
    spec = patch["spec"]["template"]["spec"]
    deleted_mounts = [m["mountPath"] for m in spec["containers"][0]["volumeMounts"] if m.get("$patch") == "delete"]
    deleted_volumes = [v["name"] for v in spec["volumes"] if v.get("$patch") == "delete"]
    pod = ds["spec"]["template"]["spec"]
    by_path = {m["mountPath"]: m["name"] for m in agent_container()["volumeMounts"]}
    assert deleted_mounts == ["/host/sys/fs/resctrl"]
    assert deleted_volumes == [by_path["/host/sys/fs/resctrl"]]
    assert deleted_volumes[0] in {v["name"] for v in pod["volumes"]}
    assert spec["containers"][0]["name"] == agent_container()["name"]


# ---- the ConfigMap and deploy/config.yaml --------------------------------------------------------------------

def _generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DEPLOY / "generate.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_configmap_in_sync_with_config() -> None:
    config = DEPLOY / "config.yaml"
    if not config.exists():
        pytest.skip("deploy/config.yaml does not exist yet (written by the config work): nothing to compare")
    r = _generate("--check")
    assert r.returncode == 0, r.stderr
    cm = the("ConfigMap")
    assert cm["data"] == {"config.yaml": config.read_text()}


def test_generate_round_trips_odd_config_text(tmp_path: Path) -> None:
    """Whatever the config looks like (comments, indentation, blank lines, no final newline), it goes in verbatim."""
    texts = ["# c\nkey: 1\n", "  indented: true\n", "no_newline: 1", "a: 1\n\n\n", "x: 'sp  '   \n",
             "k: |\n  multi\n\n  line\n", "\n\nlead: 1\n"]
    for i, text in enumerate(texts):
        config, out = tmp_path / f"c{i}.yaml", tmp_path / f"cm{i}.yaml"
        config.write_text(text)
        r = _generate("--config", str(config), "--out", str(out))
        assert r.returncode == 0, r.stderr
        cm = yaml.safe_load(out.read_text())
        assert cm["data"]["config.yaml"] == text
        kubernetes_validate.validate(cm, k8s_version(), strict=True)
        assert _generate("--config", str(config), "--out", str(out), "--check").returncode == 0
        config.write_text("changed: 1\n")
        stale = _generate("--config", str(config), "--out", str(out), "--check")
        assert stale.returncode == 1 and "out of date" in stale.stderr


def test_generate_bad_input_is_a_one_line_error(tmp_path: Path) -> None:
    out = tmp_path / "cm.yaml"
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1\n")
    for config in (bad, tmp_path / "missing.yaml"):
        r = _generate("--config", str(config), "--out", str(out))
        assert r.returncode == 2
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        assert not out.exists(), "a half-written ConfigMap"
