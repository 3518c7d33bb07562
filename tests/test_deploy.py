# SPDX-License-Identifier: Apache-2.0
"""deploy/: every kustomize rendering validates against a current API schema and grants only what the code uses.

Each overlay, and the base with every combination of the agent's components (under a kustomization of
its own with `namespace: monitoring`, as a user installing into an existing namespace writes it), is
rendered by a real kustomize (`kubectl kustomize`); the core kinds are validated by kubernetes-validate
against the newest Kubernetes schema it ships, in strict mode (unknown fields are errors).
kubernetes-validate has no schemas for CRDs (ServiceMonitor, PrometheusRule), so those are checked
here against the fields we use, and the rule groups by promtool in tests/test_dashboards.py.

What a rendering may grant is derived from the shipped code, not listed by hand: the Kubernetes API
calls each module makes (the generated client's method names, and the kubelet paths it requests) give
the RBAC rules of the feature that module serves; tests/test_capabilities.py's NEEDED_FOR (each
capability with the privileged operation that breaks without it, run on this kernel) gives the
capabilities.
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import json
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.exporter_support import AgentProcess, write_config
from testkit.tools import require_tool
from tests.test_capabilities import NEEDED_FOR

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in the dev extra: pip install -e '.[dev]'"
)

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
BASE = DEPLOY / "base"
# The uninstall overlay turns the agents into cleanup pods: checked on its own (test_uninstall_overlay_...).
UNINSTALL = "overlays/uninstall"
OVERLAYS = sorted(p.parent.relative_to(DEPLOY).as_posix() for p in DEPLOY.glob("overlays/*/kustomization.yaml")
                  if p.parent.relative_to(DEPLOY).as_posix() != UNINSTALL)
RENDERINGS = [".", "base", *OVERLAYS]
COMPONENTS = sorted(p.parent.name for p in DEPLOY.glob("components/*/kustomization.yaml"))
# Components that only add monitoring objects (never touch the agent's objects): rendered all together
# with every combination of the others, and each on its own.
MONITORING_COMPONENTS = ("grafana-dashboards", "prometheusrule", "servicemonitor")
# Also only adds an object, so it is rendered like the monitoring ones (with every combination at once).
ADDING_COMPONENTS = (*MONITORING_COMPONENTS, "networkpolicy")
AGENT_COMPONENTS = tuple(c for c in COMPONENTS if c not in ADDING_COMPONENTS)
AGENT_LABELS = {"app.kubernetes.io/name": "noisyneighbor", "app.kubernetes.io/component": "agent"}
METRICS_PORT = 9717
EXPECTED_ARGS = [
    "agent",
    "--config", "/etc/noisyneighbor/config.yaml",
    "--node-name", "$(NODE_NAME)",
    "--host-root", "/host",
    "--listen", f"[::]:{METRICS_PORT}",
    "--dry-run",
    "--journal-dir", "/var/lib/noisyneighbor/journal",
    "--auth", "kubernetes", "--auth-metrics",
]
# The arguments a component appends to turn on the feature it grants for.
COMPONENT_ARGS = {"kubelet-pod-source": ["--pods", "kubelet"], "eviction": ["--evict"], "resctrl": ["--resctrl"]}
# API groups of the kinds the base may hold: core, RBAC, apps. Anything else needs a CRD or an operator.
BUILTIN_GROUPS = {"v1", "rbac.authorization.k8s.io/v1", "apps/v1"}
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
PORTABLE_NAMESPACE = "monitoring"


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


def the(kind: str, name: str = "base", docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    found = [d for d in (docs if docs is not None else rendered(name)) if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in {name}, found {len(found)}"
    return found[0]


def agent_container(name: str = "base", docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    containers = the("DaemonSet", name, docs)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["agent"]
    return containers[0]


def configmap_name() -> str:
    return the("ConfigMap")["metadata"]["name"]


def k8s_version() -> str:
    return kubernetes_validate.latest_version()


# ---- every combination of the components, in a namespace of the user's -----------------------------------

def _combos() -> list[tuple[str, ...]]:
    agent = [c for n in range(len(AGENT_COMPONENTS) + 1) for c in itertools.combinations(AGENT_COMPONENTS, n)]
    return [(*c, *ADDING_COMPONENTS) for c in agent] + [(), *((m,) for m in ADDING_COMPONENTS)]


def _combo_id(combo: tuple[str, ...]) -> str:
    return "+".join(combo) or "base"


@functools.cache
def _combo_renderings() -> dict[tuple[str, ...], tuple[dict[str, Any], ...]]:
    """Each combination as a user writes it: base + components, `namespace: monitoring`, from a copy of
    deploy/ (kustomize takes no absolute paths, and the tree must stay untouched)."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="nn-deploy-"))
    try:
        shutil.copytree(DEPLOY, tmp / "deploy")
        dirs = {}
        for i, combo in enumerate(_combos()):
            d = tmp / "combos" / str(i)
            d.mkdir(parents=True)
            (d / "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "namespace": PORTABLE_NAMESPACE, "resources": ["../../deploy/base"],
                "components": [f"../../deploy/components/{c}" for c in combo],
            }))
            dirs[combo] = d
        with ThreadPoolExecutor(max_workers=4) as pool:
            docs = dict(zip(dirs, pool.map(kustomize, dirs.values()), strict=True))
        return {combo: tuple(d) for combo, d in docs.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def combo_docs(combo: tuple[str, ...]) -> list[dict[str, Any]]:
    return copy.deepcopy(list(_combo_renderings()[combo]))


def all_renderings() -> list[tuple[str, list[dict[str, Any]], set[str]]]:
    """(name, documents, components in it) of every overlay and every combination."""
    out = []
    for name in RENDERINGS:
        kust = yaml.safe_load((DEPLOY / name / "kustomization.yaml").read_text())
        comps = {Path(c).name for c in kust.get("components", [])}
        out.append((name, rendered(name), comps))
    for combo in _combos():
        out.append((_combo_id(combo), combo_docs(combo), set(combo)))
    return out


def test_every_component_is_in_a_combination() -> None:
    assert set(AGENT_COMPONENTS) >= {"namespace", "kubelet-pod-source", "eviction", "resctrl", "openshift"}
    assert len(_combos()) == 2 ** len(AGENT_COMPONENTS) + 1 + len(ADDING_COMPONENTS)


# ---- schema validation -------------------------------------------------------------------------------

def test_every_rendering_validates_against_current_kubernetes() -> None:
    seen: set[str] = set()  # most objects are the same in many combinations: each is validated once
    for name, docs, _ in all_renderings():
        assert docs, f"{name} renders nothing"
        for doc in docs:
            if doc["kind"] in CRD_KINDS:
                continue  # no CRD schemas in kubernetes-validate: see the structure tests below
            key = json.dumps(doc, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            try:
                kubernetes_validate.validate(doc, k8s_version(), strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']}: {e}")


def test_base_holds_no_operator_resource() -> None:
    """`kubectl apply -k deploy/` must work on a cluster without the Prometheus Operator's CRDs."""
    for name in (".", "base"):
        kinds = {(d["apiVersion"], d["kind"]) for d in rendered(name)}
        assert {v for v, _ in kinds} <= BUILTIN_GROUPS, kinds
        want = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "ResourceQuota", "ConfigMap",
                "DaemonSet", "Service"}
        assert {k for _, k in kinds} == want | ({"Namespace"} if name == "." else set())


def test_overlays_add_the_monitoring_components() -> None:
    kinds = {name: sorted(d["kind"] for d in rendered(name) if d["kind"] not in
                          {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "Service",
                           "DaemonSet", "ResourceQuota"})
             for name in OVERLAYS}
    assert kinds == {
        "overlays/kube-prometheus-stack": ["ConfigMap", "ConfigMap", "ConfigMap", "ConfigMap", "ConfigMap", "PrometheusRule",
                                           "ServiceMonitor"],
        "overlays/prometheus-operator": ["ConfigMap", "PrometheusRule", "ServiceMonitor"],
    }


def test_monitoring_components_only_add_objects() -> None:
    """They never change the agent's objects, which is why the combinations carry them all at once."""
    base = {(d["kind"], d["metadata"]["name"]): d for d in combo_docs(())}
    for m in ADDING_COMPONENTS:
        docs = {(d["kind"], d["metadata"]["name"]): d for d in combo_docs((m,))}
        assert base.items() <= docs.items(), m
        assert all(d["kind"] in CRD_KINDS | {"ConfigMap", "NetworkPolicy"} for k, d in docs.items() if k not in base), m


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
                   "metricRelabelings", "targetPort", "bearerTokenSecret", "bearerTokenFile", "tlsConfig"}


def test_servicemonitor_structure() -> None:
    """ServiceMonitor (monitoring.coreos.com/v1) against the CRD's fields we use; kubernetes-validate has no CRDs.
    No namespaceSelector: the operator looks in the ServiceMonitor's own namespace, the agent's."""
    for name, docs, comps in all_renderings():
        if "servicemonitor" not in comps:
            continue
        sm, svc = the("ServiceMonitor", name, docs), the("Service", name, docs)
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(sm) == {"apiVersion", "kind", "metadata", "spec"}
        assert sm["metadata"]["namespace"] == svc["metadata"]["namespace"]
        spec = sm["spec"]
        assert set(spec) <= {"selector", "endpoints", "jobLabel"}, f"{name}: a namespaceSelector pins a namespace"
        assert spec["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        port_names = {p["name"] for p in svc["spec"]["ports"]}
        assert spec["endpoints"], "no endpoints"
        for ep in spec["endpoints"]:
            assert set(ep) <= ENDPOINT_FIELDS, f"unknown endpoint fields {set(ep) - ENDPOINT_FIELDS}"
            assert ep["port"] in port_names
            assert ep["path"] == "/metrics"
            assert ep["scheme"] in {"http", "https"}
            # the agent runs with --auth-metrics: a scrape without a token is 401
            assert ep["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token", name
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
    source = yaml.safe_load((REPO / "dashboards" / "alerts.yaml").read_text())
    for name, docs, comps in all_renderings():
        if "prometheusrule" not in comps:
            continue
        rule = the("PrometheusRule", name, docs)
        assert rule["apiVersion"] == "monitoring.coreos.com/v1" and set(rule) == {"apiVersion", "kind", "metadata", "spec"}
        assert rule["metadata"]["namespace"] == the("DaemonSet", name, docs)["metadata"]["namespace"]
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


# ---- RBAC: derived from the API calls of the shipped code ----------------------------------------------------

# The module that makes a feature's calls, and the component that enables it (None: the base).
API_CALLERS = {
    "detector/pods/apiserver.py": None,  # the default pod source: list + watch of the node's pods
    "detector/kube_events.py": None,  # an Event per incident and action
    "detector/pods/kubelet.py": "kubelet-pod-source",
    "actuators/evict.py": "eviction",
    "actuators/resize.py": "pod-resize",
}
SHIPPED_PACKAGES = ("detector", "actuators", "noisyneighbor", "probes")
# The generated Kubernetes client's methods, called on its API object (self.api / self.core, a CoreV1Api):
# verb_[namespaced_]resource[_subresource][_for_all_namespaces](
CLIENT_CALL = re.compile(
    r"\b(?:api|core|v1)\.(list|read|create|patch|replace|delete)_(namespaced_)?([a-z_]+?)(_for_all_namespaces)?\(")
CLIENT_VERBS = {"list": "list", "read": "get", "create": "create", "patch": "patch", "replace": "update",
                "delete": "delete"}
CLIENT_RESOURCES = {"pod": "pods", "event": "events", "node": "nodes", "pod_eviction": "pods/eviction",
                    "pod_resize": "pods/resize", "pod_status": "pods/status"}
# The kubelet's own paths and what its authorizer checks for them (fine-grained kubelet authorization,
# Kubernetes >= 1.32: /pods is nodes/pods; everything else on the kubelet is nodes/proxy).
KUBELET_PATH = re.compile(r'"(/pods|/exec|/attach|/run|/portForward|/containerLogs)"')
KUBELET_RESOURCES = {"/pods": "nodes/pods"}
# REST paths the code POSTs to without the generated client (noisyneighbor/agent/auth.py's reviews), as
# (group, resource): `create` in the base, where --auth kubernetes is on.
REVIEW_PATH = re.compile(r'"/apis/([a-z0-9.]+)/v1/(tokenreviews|subjectaccessreviews)"')
REVIEW_CALLERS = ("noisyneighbor/agent/auth.py",)
# Roles for the people and the plugin that read the agents, never bound to the agent's ServiceAccount.
VIEWER_ROLES = {"noisyneighbor-viewer", "noisyneighbor-client"}


def _client_calls(text: str) -> set[tuple[str, str]]:
    calls = set()
    for m in CLIENT_CALL.finditer(text):
        verb, resource = CLIENT_VERBS[m.group(1)], CLIENT_RESOURCES.get(m.group(3))
        assert resource is not None, f"a client call on {m.group(3)!r}: map it in CLIENT_RESOURCES"
        calls.add((resource, verb))
        if verb == "list" and "watch=True" in _arguments(text, m.end()):
            calls.add((resource, "watch"))
    return calls


def _arguments(text: str, start: int) -> str:
    """The text of a call's arguments, from after its "(" to the matching ")"."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return text[start:]


@functools.cache
def api_calls() -> dict[str | None, set[tuple[str, str]]]:
    """(resource, verb) per feature (None: the base), read from the code of API_CALLERS."""
    out: dict[str | None, set[tuple[str, str]]] = {}
    for path, feature in API_CALLERS.items():
        text = (REPO / path).read_text()
        calls = _client_calls(text) | {(KUBELET_RESOURCES.get(p, "nodes/proxy"), "get")
                                      for p in KUBELET_PATH.findall(text)}
        assert calls, f"{path} makes no API call any more: drop it from API_CALLERS (and its grant)"
        out.setdefault(feature, set()).update(calls)
    return out


def test_every_module_calling_the_api_is_accounted_for() -> None:
    """A new caller of the Kubernetes API must say which feature (and component) grants its calls."""
    callers = set()
    for package in SHIPPED_PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            if rel == "noisyneighbor/kubectl_plugin.py":  # the user's kubectl, with the user's credentials
                continue
            text = path.read_text()
            if ("kubernetes" in text and CLIENT_CALL.search(text)) or KUBELET_PATH.search(text):
                callers.add(rel)
    assert callers == set(API_CALLERS), callers ^ set(API_CALLERS)
    assert api_calls()[None] == {("pods", "list"), ("pods", "watch"), ("events", "create"), ("events", "get"),
                                 ("events", "patch")}


def review_calls() -> set[tuple[str, str]]:
    calls = {m for path in REVIEW_CALLERS for m in REVIEW_PATH.findall((REPO / path).read_text())}
    assert calls == {("authentication.k8s.io", "tokenreviews"), ("authorization.k8s.io", "subjectaccessreviews")}
    return calls


def granted_rules(docs: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """What the agent's roles grant (the viewer roles are for its readers: test_viewer_roles)."""
    granted: dict[tuple[str, str], set[str]] = {}
    for role in (d for d in docs if d["kind"] in ("ClusterRole", "Role")
                 and d["metadata"]["name"] not in VIEWER_ROLES):
        for rule in role["rules"]:
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule, role["metadata"]["name"]
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def test_rbac_grants_exactly_the_calls_of_the_enabled_features() -> None:
    for name, docs, comps in all_renderings():
        want: dict[tuple[str, str], set[str]] = {}
        for feature, calls in api_calls().items():
            if feature is None or feature in comps:
                for resource, verb in calls:
                    want.setdefault(("", resource), set()).add(verb)
        for group, resource in review_calls():
            want[(group, resource)] = {"create"}
        granted = granted_rules(docs)
        assert ("", "nodes/proxy") not in granted, f"{name}: nodes/proxy lets the token exec into any pod"
        assert not any("*" in r or "*" in str(v) for r, v in granted.items()), f"{name}: a wildcard grant"
        extra = {k: v - want.get(k, set()) for k, v in granted.items() if v - want.get(k, set())}
        assert not extra, f"{name}: grants no shipped code calls: {extra}"
        missing = {k: v - granted.get(k, set()) for k, v in want.items() if v - granted.get(k, set())}
        assert not missing, f"{name}: calls the code makes without a grant: {missing}"


def test_every_role_is_bound_to_the_agent_service_account() -> None:
    for name, docs, _ in all_renderings():
        sa = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "noisyneighbor")
        roles = {d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"} - VIEWER_ROLES
        bindings = [d for d in docs if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] not in VIEWER_ROLES]
        assert {b["roleRef"]["name"] for b in bindings} == roles, name
        for b in bindings:
            assert b["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io" and b["roleRef"]["kind"] == "ClusterRole"
            assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                      "namespace": sa["metadata"]["namespace"]}], name
        assert the("DaemonSet", name, docs)["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_viewer_roles_grant_reading_the_agent_and_nothing_else() -> None:
    """noisyneighbor-viewer: get on the agent's paths (the SubjectAccessReview auth.py makes), bound to the
    plugin's ServiceAccount only; noisyneighbor-client: what the plugin does with the user's credentials, in
    the agent's namespace, minting tokens of that one ServiceAccount."""
    from noisyneighbor.agent.auth import OPEN_PATHS

    for name, docs, _ in all_renderings():
        viewer = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "noisyneighbor-viewer")
        assert viewer["rules"] == [{"nonResourceURLs": ["/top", "/diagnose", "/metrics"], "verbs": ["get"]}], name
        assert not OPEN_PATHS & set(viewer["rules"][0]["nonResourceURLs"])
        binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding"
                       and d["roleRef"]["name"] == "noisyneighbor-viewer")
        sa = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "noisyneighbor-viewer")
        assert sa["automountServiceAccountToken"] is False
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "noisyneighbor-viewer",
                                        "namespace": sa["metadata"]["namespace"]}], name
        client = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "noisyneighbor-client")
        assert client["metadata"]["namespace"] == sa["metadata"]["namespace"]
        assert client["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["serviceaccounts/token"], "resourceNames": ["noisyneighbor-viewer"],
             "verbs": ["create"]}], name


# ---- the DaemonSet: capabilities, host paths, scheduling, arguments ---------------------------------------

def test_capabilities_are_those_the_code_needs() -> None:
    """Each capability is granted for a privileged operation tests/test_capabilities.py shows breaking
    without it; nothing is privileged."""
    for name, docs, comps in all_renderings():
        pod = the("DaemonSet", name, docs)["spec"]["template"]["spec"]
        sc = agent_container(name, docs)["securityContext"]
        assert sc["privileged"] is False and sc["readOnlyRootFilesystem"] is True, name
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert set(sc["capabilities"]["add"]) == set(NEEDED_FOR), f"{name}: {sc['capabilities']['add']}"
        assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False
        assert pod["hostPID"] is True
        assert not pod.get("hostNetwork") and not pod.get("hostIPC")
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        selinux = pod["securityContext"].get("seLinuxOptions")
        assert selinux == ({"type": "spc_t"} if "openshift" in comps else None), name
        assert "seLinuxOptions" not in sc


# mountPath -> (host path, read-only, hostPath type). Only paths every Linux node has get a type check.
HOST_MOUNTS = {
    "/host/proc": ("/proc", True, "Directory"),
    "/host/sys/fs/cgroup": ("/sys/fs/cgroup", False, "Directory"),
    "/host/sys/kernel": ("/sys/kernel", True, "Directory"),  # btf/ (optional: no check on it) and tracing/
    "/var/lib/noisyneighbor": ("/var/lib/noisyneighbor", False, "DirectoryOrCreate"),
}
RESCTRL_MOUNT = {"/host/sys/fs/resctrl": ("/sys/fs/resctrl", False, "Directory")}


def test_host_mounts_start_on_every_linux_node() -> None:
    """The base mounts only host paths every Linux node has: no resctrl (RDT-only), no BTF directory of
    its own (kernels without BTF); resctrl comes with its component."""
    for name, docs, comps in all_renderings():
        pod = the("DaemonSet", name, docs)["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in agent_container(name, docs)["volumeMounts"]}
        want = {**HOST_MOUNTS, **(RESCTRL_MOUNT if "resctrl" in comps else {})}
        got = {}
        for mount_path, m in mounts.items():
            hp = volumes[m["name"]].get("hostPath")
            if hp is not None:
                got[mount_path] = (hp["path"], m.get("readOnly", False), hp.get("type", ""))
                # Bidirectional would need a privileged container.
                assert m.get("mountPropagation", "None") in {"None", "HostToContainer"}
        assert got == want, name
        assert {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v} == {hp for hp, _, _ in want.values()}
        config = mounts["/etc/noisyneighbor"]
        cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("noisyneighbor-config"))
        assert volumes[config["name"]]["configMap"]["name"] == cm["metadata"]["name"]
        assert config["readOnly"] is True
        assert "emptyDir" in volumes[mounts["/tmp"]["name"]]  # read-only root: scratch space


def test_agent_finds_btf_and_tracefs_under_the_kernel_mount() -> None:
    """The one /sys/kernel mount holds what the probes read (probes.host.HostPaths under --host-root)."""
    from probes.host import HostPaths

    paths = HostPaths.under("/host")
    kernel = "/host/sys/kernel"
    for path in (paths.btf_vmlinux, paths.tracefs):
        assert str(path).startswith(kernel + "/"), path


def test_scheduled_on_linux_nodes_only_and_never_on_virtual_kubelets() -> None:
    for name, docs, _ in all_renderings():
        pod = the("DaemonSet", name, docs)["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}, name
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        # Every term (they are ORed) must exclude virtual-kubelet nodes.
        for term in terms:
            assert {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]} in term["matchExpressions"]
        assert {"operator": "Exists"} in pod["tolerations"]


def test_node_critical_priority_is_admitted_by_a_quota_in_the_agent_namespace() -> None:
    for name, docs, _ in all_renderings():
        ds = the("DaemonSet", name, docs)
        pod = ds["spec"]["template"]["spec"]
        if pod.get("priorityClassName") not in ("system-node-critical", "system-cluster-critical"):
            continue
        quotas = [d for d in docs if d["kind"] == "ResourceQuota"
                  and d["metadata"]["namespace"] == ds["metadata"]["namespace"]]
        admitting = [q for q in quotas for e in q["spec"]["scopeSelector"]["matchExpressions"]
                     if e["scopeName"] == "PriorityClass" and e["operator"] == "In"
                     and pod["priorityClassName"] in e["values"]]
        assert admitting, f"{name}: {pod['priorityClassName']} outside kube-system without an admitting quota"
        # It admits; it must not limit: no resource besides a pod count no cluster reaches.
        for q in admitting:
            assert set(q["spec"]["hard"]) == {"pods"} and int(q["spec"]["hard"]["pods"]) >= 5000


def test_container_args_turn_on_exactly_the_components_features() -> None:
    from noisyneighbor.cli import build_parser

    parser = build_parser()
    for name, docs, comps in all_renderings():
        c = agent_container(name, docs)
        assert "command" not in c, "the image's ENTRYPOINT (noisyneighbor) must stay"
        extra = [a for comp in COMPONENTS if comp in comps for a in COMPONENT_ARGS.get(comp, [])]
        assert c["args"][:len(EXPECTED_ARGS)] == EXPECTED_ARGS, name
        assert sorted(c["args"][len(EXPECTED_ARGS):]) == sorted(extra), name
        parsed = parser.parse_args([a.replace("$(NODE_NAME)", "node-1") for a in c["args"]])
        assert parsed.command == "agent"
        assert parsed.pods == ("kubelet" if "kubelet-pod-source" in comps else None)
        assert parsed.evict is ("eviction" in comps or None)
        assert parsed.resctrl is ("resctrl" in comps or None)


def test_args_reach_the_policy() -> None:
    """--evict / --resctrl / --pods become the policy the agent runs with (the base config says off / auto)."""
    from detector.policy import load_policy
    from noisyneighbor.agent.config import AgentConfig, policy_for

    base = load_policy(BASE / "config.yaml")
    assert base.pod_source == "auto" and not base.actuators.evict_enabled and not base.actuators.resctrl_enabled
    on = policy_for(AgentConfig(evict=True, resctrl=True, pod_source="kubelet"), base)
    assert on.actuators.evict_enabled and on.actuators.resctrl_enabled and on.pod_source == "kubelet"
    assert on.actuators.dry_run == base.actuators.dry_run


def test_container_env_ports_probes() -> None:
    c = agent_container()
    node_env = next(e for e in c["env"] if e["name"] == "NODE_NAME")
    assert node_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    host_ip = next(e for e in c["env"] if e["name"] == "HOST_IP")
    assert host_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    journal = c["args"][c["args"].index("--journal-dir") + 1]
    assert any(journal.startswith(m["mountPath"] + "/") for m in c["volumeMounts"]), "journal not on a volume"
    assert c["ports"] == [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    svc = the("Service")
    assert svc["spec"]["selector"].items() <= the("DaemonSet")["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"][0]["port"] == METRICS_PORT and svc["spec"]["ports"][0]["targetPort"] == "metrics"


# bench/agent_footprint.py, docs/benchmarks-history.md ("Agent footprint at node scale (issue 14)", round 5): steady RSS and
# its peak, MiB, by pods; the BPF maps (kernel memory charged to the container) on a 2-CPU and on a 64-CPU node.
FOOTPRINT_RSS_MIB = {0: (53.8, 59.8), 300: (82.3, 90.6), 1000: (142.6, 165.6)}
BPF_MAPS_MIB = {"2 CPUs": 42, "64 CPUs": 130}


def _mib(quantity: str) -> float:
    from detector.quantity import parse_quantity

    return parse_quantity(quantity) / 2**20


def test_resources_are_sized_from_the_measured_footprint() -> None:
    res = agent_container()["resources"]
    # The request holds a busy node's steady state (300 pods' peak RSS and a small node's maps): the
    # scheduler reserves what the agent really uses. The limit holds 1000 pods' peak and a large node's maps.
    assert _mib(res["requests"]["memory"]) >= FOOTPRINT_RSS_MIB[300][1] + BPF_MAPS_MIB["2 CPUs"]
    assert _mib(res["limits"]["memory"]) >= FOOTPRINT_RSS_MIB[1000][1] + BPF_MAPS_MIB["64 CPUs"]
    assert res["requests"]["cpu"] == "50m" and res["limits"]["cpu"] == "500m"


# ---- namespace portability -----------------------------------------------------------------------------------

def _namespace_strings(doc: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every (path, value) under a key that names a namespace (metadata.namespace, subjects, selectors)."""
    out: list[tuple[str, Any]] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in ("namespace", "namespaceSelector", "matchNames", "namespaces"):
                out.append((f"{path}.{k}", v))
            out.extend(_namespace_strings(v, f"{path}.{k}"))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.extend(_namespace_strings(v, f"{path}[{i}]"))
    return out


def test_every_combination_installs_into_the_users_namespace() -> None:
    """Under `namespace: monitoring` every namespaced object, binding subject and selector says
    monitoring: nothing keeps the default `noisyneighbor` (a ServiceMonitor pinned to it would never scrape)."""
    for combo in _combos():
        docs = combo_docs(combo)
        for doc in docs:
            name = f"{_combo_id(combo)}: {doc['kind']} {doc['metadata']['name']}"
            for where, value in _namespace_strings(doc):
                if where == ".metadata.namespace" or where.endswith("].namespace"):
                    assert value == PORTABLE_NAMESPACE, f"{name}: {where} = {value!r}"
                elif doc["kind"] == "NetworkPolicy" and where.startswith(".spec.ingress["):
                    continue  # the scrapers' namespace (Prometheus'), not the agent's: a documented patch point
                else:
                    pytest.fail(f"{name}: {where} = {value!r} pins a namespace")
            if doc["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
                assert doc["metadata"]["namespace"] == PORTABLE_NAMESPACE, name
        namespaces = [d for d in docs if d["kind"] == "Namespace"]
        assert len(namespaces) == ("namespace" in combo), _combo_id(combo)


def test_the_namespace_object_is_a_component() -> None:
    """In the base, a Namespace would be renamed by `namespace:` and deleted by `kubectl delete -k`."""
    assert not [d for d in rendered("base") if d["kind"] == "Namespace"]
    for name in (".", *OVERLAYS):
        ns = the("Namespace", name)
        assert ns["metadata"]["name"] == the("DaemonSet", name)["metadata"]["namespace"] == "noisyneighbor"
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
        for doc in rendered(name):
            if doc["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}:
                assert doc["metadata"]["namespace"] == "noisyneighbor", f"{name}: {doc['kind']}"


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


def test_container_args_parse_with_the_real_cli() -> None:
    from noisyneighbor.cli import build_parser

    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert "agent" in subcommands
    args = [a.replace("$(NODE_NAME)", "node-1") for a in agent_container()["args"]]
    assert parser.parse_args(args).command == "agent"


# ---- a node without BTF: the pod starts (no Directory check), the agent says why its probes are off ----------

@pytest.mark.root
def test_agent_on_a_node_without_btf_runs_and_says_why_in_readyz(tmp_path: Path) -> None:
    """What the DaemonSet's optional BTF means: the host root as mounted on such a node (/proc, cgroups,
    tracefs, no sys/kernel/btf), the agent runs, serves /metrics, and /readyz is 200 with a degraded status
    naming each probe off with the reason: Ready, so the node never holds a rollout. Readiness keys on the
    status code (no_btf), never on the text; noisyneighbor_agent_degraded{code="no_btf"} (what
    NoisyNeighborNodeWithoutBTF reads) is on /metrics."""
    root = tmp_path / "host"
    (root / "sys" / "fs").mkdir(parents=True)
    (root / "sys" / "kernel").mkdir()
    (root / "proc").symlink_to("/proc")
    (root / "sys" / "fs" / "cgroup").symlink_to("/sys/fs/cgroup")
    (root / "sys" / "kernel" / "tracing").symlink_to("/sys/kernel/tracing")
    config = write_config(tmp_path / "config.yaml", {"kubernetes": {"pod_source": "standalone"}})
    agent = AgentProcess(config, tmp_path, "--host-root", str(root), "--interval", "0.5")
    try:
        deadline = time.monotonic() + 60
        code, health = None, {}
        while not health.get("ticks") and time.monotonic() < deadline:
            assert agent.proc.poll() is None, agent.log_tail()
            time.sleep(0.3)
            try:
                code, body = agent.get("/readyz", timeout=2)
            except OSError:  # not listening yet
                continue
            health = json.loads(body)
        assert code == 200 and health["live"] and health["ready"], (code, health)
        assert health["degraded_code"] == "no_btf" and health["degraded"], health  # the code, and text for people
        bpf = {n: p for n, p in health["probes"].items() if n != "steal"}  # steal reads /proc/stat: no BTF needed
        assert bpf and all(p["state"] == "off" and p["code"] == "no_btf" and p["reason"] for p in bpf.values()), bpf
        assert health["probes"]["steal"]["state"] == "on" and health["probes"]["steal"]["code"] is None
        code, metrics = agent.get("/metrics")
        assert code == 200
        lines = metrics.decode().splitlines()
        off = [ln for ln in lines
               if ln.startswith("noisyneighbor_probe_state{") and 'state="off"' in ln and ln.endswith(" 1.0")]
        assert len(off) >= len(bpf), off
        degraded = [ln for ln in lines if ln.startswith("noisyneighbor_agent_degraded{")]
        assert len(degraded) == 1 and 'code="no_btf"' in degraded[0] and degraded[0].endswith(" 1.0"), degraded
    finally:
        assert agent.terminate() == 0, agent.log_tail()


# ---- uninstall: the agents become cleanup pods with the same credentials and mounts ---------------------------

def test_uninstall_overlay_restores_with_the_agents_credentials_then_purges() -> None:
    """deploy/overlays/uninstall: the same ServiceAccount and grants as the install (so resize restores still
    pass the apiserver), the same host mounts (the journal's paths), `noisyneighbor restore --purge` on the
    node's journal, Ready only after it succeeded."""
    import shlex

    from noisyneighbor.cli import build_parser

    base, docs = rendered("."), rendered(UNINSTALL)
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert {key(d): d for d in base if d["kind"] != "DaemonSet"} == {key(d): d for d in docs if d["kind"] != "DaemonSet"}
    for doc in docs:
        kubernetes_validate.validate(doc, k8s_version(), strict=True)
    agent_pod, pod = (the("DaemonSet", docs=d)["spec"]["template"]["spec"] for d in (base, docs))
    assert pod["serviceAccountName"] == agent_pod["serviceAccountName"]
    c, agent_c = pod["containers"][0], agent_pod["containers"][0]
    assert c["command"] == ["/bin/sh", "-c"] and len(c["args"]) == 1
    restore_cmd, *after = c["args"][0].split(" && ")
    assert after == ["touch /tmp/restored", "exec sleep infinity"], after
    assert c["readinessProbe"]["exec"]["command"] == ["test", "-f", "/tmp/restored"]
    assert "livenessProbe" not in c and "startupProbe" not in c
    argv = shlex.split(restore_cmd)
    assert argv[0] == "noisyneighbor"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "restore" and args.purge and args.host_root == "/host" and args.attempts * args.retry_interval >= 300
    # The journal the agent wrote (its hostPath + "journal") is where restore looks, through a mount of /var/lib.
    agent_journal = next(v for v in agent_pod["volumes"] if v["name"] == "journal")["hostPath"]["path"] + "/journal"
    mount = next(m for m in c["volumeMounts"] if m["name"] == "journal")
    host_dir = next(v for v in pod["volumes"] if v["name"] == "journal")["hostPath"]["path"]
    assert args.journal_dir.startswith(mount["mountPath"] + "/")
    assert host_dir + args.journal_dir[len(mount["mountPath"]):] == agent_journal
    # Every other mount is the agent's: the journal's cgroup paths resolve the same.
    others = lambda cont: [m for m in cont["volumeMounts"] if m["name"] != "journal"]  # noqa: E731
    assert others(c) == others(agent_c)
    assert [v for v in pod["volumes"] if v["name"] != "journal"] == [v for v in agent_pod["volumes"] if v["name"] != "journal"]
    assert c["securityContext"] == agent_c["securityContext"] and c["image"] == agent_c["image"]


# ---- AppArmor and the update strategy: said where they are set ---------------------------------------------

def test_apparmor_is_unconfined_with_the_reason_and_max_surge_0_is_explained():
    """Every rendering (base, overlays, uninstall) runs the agent with AppArmor Unconfined (Kubernetes >= 1.30
    field), and the manifest says why next to it: the runtime's default profile refuses the ptrace-read checks
    of other pods' processes. maxSurge is 0 with the reason (one journal per node) above it."""
    for name in (".", "base", "overlays/kube-prometheus-stack", UNINSTALL):
        pod = the("DaemonSet", name)["spec"]["template"]["spec"]
        assert pod["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert "container.apparmor.security.beta.kubernetes.io/agent" not in \
            (the("DaemonSet", name)["spec"]["template"]["metadata"].get("annotations") or {}), name
        rollout = the("DaemonSet", name)["spec"]["updateStrategy"]["rollingUpdate"]
        assert rollout["maxSurge"] == 0, name
    text = (BASE / "daemonset.yaml").read_text()
    apparmor = text[:text.index("type: Unconfined")].rsplit("seccompProfile", 1)[1]
    assert "ptrace" in apparmor and "/proc/<pid>/ns/net" in apparmor and "Localhost" in apparmor, apparmor
    surge = text[:text.index("maxSurge: 0")].rsplit("maxUnavailable", 1)[1]
    assert "journal" in surge and "one agent per node" in surge, surge
