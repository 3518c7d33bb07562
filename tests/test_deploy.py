"""deploy/: every kustomize rendering validates against a current API schema and says what the agent needs.

Each overlay (and the base) is rendered by a real kustomize (`kubectl kustomize`); the core kinds are
validated by kubernetes-validate against the newest Kubernetes schema it ships, in strict mode
(unknown fields are errors). kubernetes-validate has no schemas for CRDs (ServiceMonitor,
PrometheusRule), so those are checked here against the fields we use, and the rule groups by promtool
in tests/test_dashboards.py.
"""

from __future__ import annotations

import argparse
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

from tests.conftest import require_tool

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in the dev extra: pip install -e '.[dev]'"
)

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
BASE = DEPLOY / "base"
OVERLAYS = sorted(p.parent.relative_to(DEPLOY).as_posix() for p in DEPLOY.glob("overlays/*/kustomization.yaml"))
RENDERINGS = [".", "base", *OVERLAYS]
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
# API groups of the kinds the base may hold: core, RBAC, apps. Anything else needs a CRD or an operator.
BUILTIN_GROUPS = {"v1", "rbac.authorization.k8s.io/v1", "apps/v1"}


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = require_tool("kubectl")
    res = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d is not None]


@functools.cache
def _rendered(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(kustomize(DEPLOY / name))


def rendered(name: str = "base") -> list[dict[str, Any]]:
    return copy.deepcopy(list(_rendered(name)))


def all_docs() -> list[dict[str, Any]]:
    return rendered("base")


def the(kind: str, name: str = "base") -> dict[str, Any]:
    found = [d for d in rendered(name) if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in {name}, found {len(found)}"
    return found[0]


def agent_container(name: str = "base") -> dict[str, Any]:
    containers = the("DaemonSet", name)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["agent"]
    return containers[0]


def configmap_name() -> str:
    return the("ConfigMap")["metadata"]["name"]


def k8s_version() -> str:
    return kubernetes_validate.latest_version()


# ---- schema validation -------------------------------------------------------------------------------

CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("name", RENDERINGS)
def test_rendering_validates_against_current_kubernetes(name: str) -> None:
    docs = rendered(name)
    assert docs, f"{name} renders nothing"
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue  # no CRD schemas in kubernetes-validate: see the structure tests below
        kubernetes_validate.validate(doc, k8s_version(), strict=True)


def test_base_holds_no_operator_resource() -> None:
    """`kubectl apply -k deploy/` must work on a cluster without the Prometheus Operator's CRDs."""
    for name in (".", "base"):
        kinds = {(d["apiVersion"], d["kind"]) for d in rendered(name)}
        assert {v for v, _ in kinds} <= BUILTIN_GROUPS, kinds
        assert {k for _, k in kinds} == {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                         "ConfigMap", "DaemonSet", "Service"}


def test_overlays_add_the_monitoring_components() -> None:
    kinds = {name: sorted(d["kind"] for d in rendered(name) if d["kind"] not in
                          {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "DaemonSet"})
             for name in OVERLAYS}
    assert kinds == {
        "overlays/kube-prometheus-stack": ["ConfigMap", "ConfigMap", "ConfigMap", "ConfigMap", "PrometheusRule",
                                           "ServiceMonitor"],
        "overlays/no-resctrl": ["ConfigMap"],
        "overlays/prometheus-operator": ["ConfigMap", "PrometheusRule", "ServiceMonitor"],
    }


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
    # Issue 17's acceptance: validated against Kubernetes 1.33 or newer (the oldest release still
    # supported upstream when it was written); an older kubernetes-validate would pass stale schemas.
    assert (major, minor) >= (1, 33), f"kubernetes-validate only knows up to {k8s_version()}: upgrade it"


DURATION = re.compile(r"^(\d+(ms|s|m|h))+$")
ENDPOINT_FIELDS = {"port", "path", "scheme", "interval", "scrapeTimeout", "honorLabels", "relabelings",
                   "metricRelabelings", "targetPort", "bearerTokenSecret", "tlsConfig"}


@pytest.mark.parametrize("overlay", ["overlays/prometheus-operator", "overlays/kube-prometheus-stack"])
def test_servicemonitor_structure(overlay: str) -> None:
    """ServiceMonitor (monitoring.coreos.com/v1) against the CRD's fields we use; kubernetes-validate has no CRDs."""
    sm = the("ServiceMonitor", overlay)
    svc = the("Service", overlay)
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


def test_kube_prometheus_stack_overlay_sets_the_release_label() -> None:
    """kube-prometheus-stack's Prometheus selects ServiceMonitors and PrometheusRules by `release`."""
    for kind in ("ServiceMonitor", "PrometheusRule"):
        labels = the(kind, "overlays/kube-prometheus-stack")["metadata"]["labels"]
        assert labels["release"] == "kube-prometheus-stack" and labels["app.kubernetes.io/name"] == "noisyneighbor"
        assert "release" not in the(kind, "overlays/prometheus-operator")["metadata"]["labels"]


def test_prometheusrule_is_the_alerts_file_in_the_agent_namespace() -> None:
    rule = the("PrometheusRule", "overlays/prometheus-operator")
    source = yaml.safe_load((REPO / "dashboards" / "alerts.yaml").read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and set(rule) == {"apiVersion", "kind", "metadata", "spec"}
    assert rule["metadata"]["namespace"] == the("Namespace")["metadata"]["name"]
    assert rule["spec"] == source["spec"]
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            assert set(r) <= {"alert", "expr", "for", "labels", "annotations", "record"}, r


def test_grafana_dashboard_configmaps_carry_every_dashboard_for_the_sidecar() -> None:
    maps = [d for d in rendered("overlays/kube-prometheus-stack")
            if d["kind"] == "ConfigMap" and d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    sources = {p.name: p.read_text() for p in (REPO / "dashboards").glob("*.json")}
    assert sources, "no dashboards in dashboards/"
    data = {k: v for cm in maps for k, v in cm["data"].items()}
    assert data == sources
    for cm in maps:
        assert cm["metadata"]["namespace"] == "noisyneighbor"
        assert not re.search(r"-[a-z0-9]{10}$", cm["metadata"]["name"]), "hash suffix: stale copies would duplicate"
        for text in cm["data"].values():
            assert json.loads(text)["uid"]
    # kubectl apply keeps the whole object in an annotation limited to 256 KiB; ConfigMaps to 1 MiB.
    assert max(len(json.dumps(cm)) for cm in maps) < 200_000


def test_generated_component_files_are_in_sync() -> None:
    r = _generate("--check")
    assert r.returncode == 0, r.stderr


def test_generate_check_names_a_stale_copy(tmp_path: Path) -> None:
    tree = tmp_path / "repo"
    shutil.copytree(DEPLOY, tree / "deploy")
    shutil.copytree(REPO / "dashboards", tree / "dashboards")
    (tree / "dashboards" / "alerts.yaml").write_text((tree / "dashboards" / "alerts.yaml").read_text() + "# changed\n")
    script = tree / "deploy" / "generate.py"
    stale = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=60)
    assert stale.returncode == 1 and "components/prometheusrule/alerts.yaml" in stale.stderr, stale.stderr
    assert len(stale.stderr.strip().splitlines()) == 1
    assert subprocess.run([sys.executable, str(script)], timeout=60).returncode == 0
    assert subprocess.run([sys.executable, str(script), "--check"], timeout=60).returncode == 0


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
        # The kubelet's GET /pods: nodes/proxy, or nodes/pods on kubelets with fine-grained authorization.
        ("", "nodes/proxy"): {"get"},
        ("", "nodes/pods"): {"get"},
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
    # Each one's use is in the comment in daemonset.yaml and checked by tests/test_capabilities.py.
    assert set(sc["capabilities"]["add"]) == {"BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE"}
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
    host_ip = next(e for e in c["env"] if e["name"] == "HOST_IP")
    assert host_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
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

def test_no_resctrl_overlay_removes_only_the_resctrl_mount() -> None:
    base, overlay = the("DaemonSet"), the("DaemonSet", "overlays/no-resctrl")
    base_pod, pod = base["spec"]["template"]["spec"], overlay["spec"]["template"]["spec"]
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert {m["mountPath"] for m in base_pod["containers"][0]["volumeMounts"]} - mounts == {"/host/sys/fs/resctrl"}
    assert {v["name"] for v in base_pod["volumes"]} - {v["name"] for v in pod["volumes"]} == {"host-resctrl"}
    base_pod["containers"][0]["volumeMounts"] = pod["containers"][0]["volumeMounts"]
    base_pod["volumes"] = pod["volumes"]
    assert base == overlay


# ---- the ConfigMap and deploy/base/config.yaml --------------------------------------------------------------

def _generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DEPLOY / "generate.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_configmap_holds_the_config_verbatim_under_a_content_hash() -> None:
    cm = the("ConfigMap")
    assert cm["data"] == {"config.yaml": (BASE / "config.yaml").read_text()}
    assert re.fullmatch(r"noisyneighbor-config-[a-z0-9]{10}", cm["metadata"]["name"]), cm["metadata"]["name"]
    assert cm["metadata"]["namespace"] == "noisyneighbor"


def test_a_config_change_rolls_the_daemonset(tmp_path: Path) -> None:
    """The DaemonSet's pod template names the hashed ConfigMap, so a new config is a new template."""
    tree = tmp_path / "deploy"
    shutil.copytree(DEPLOY, tree)
    before = kustomize(tree / "base")
    config = tree / "base" / "config.yaml"
    config.write_text(config.read_text().replace("runq_p99_ms: 5.0", "runq_p99_ms: 4.0"))
    after = kustomize(tree / "base")

    def pod_template_and_cm(docs: list[dict[str, Any]]) -> tuple[dict, str]:
        ds = next(d for d in docs if d["kind"] == "DaemonSet")
        cm = next(d for d in docs if d["kind"] == "ConfigMap")
        volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
        assert volume["configMap"]["name"] == cm["metadata"]["name"]
        return ds["spec"]["template"], cm["metadata"]["name"]

    (t_before, cm_before), (t_after, cm_after) = pod_template_and_cm(before), pod_template_and_cm(after)
    assert cm_before != cm_after and t_before != t_after
