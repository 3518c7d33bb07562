# SPDX-License-Identifier: Apache-2.0
"""FakeKube: a real HTTP(S) server on 127.0.0.1 that speaks the kubelet and apiserver REST paths we use.

It is a test double for the network boundary only: clients talk real HTTP (or TLS with a self-signed
certificate made by the ``openssl`` CLI), so the code under test runs its real client, auth header,
TLS verification, JSON parsing and error handling. Every request is recorded.

Quick use::

    from testkit.fakekube import FakeKube, make_pod

    with FakeKube(token="s3cret", tls=True, node_name="node-1") as kube:
        kube.add_pod(make_pod("web-0", uid="1111...", qos_class="LS", requests={"cpu": "1", "memory": "1Gi"}))
        kube.url                  # "https://127.0.0.1:<port>"
        kube.ca_file              # the self-signed cert to trust (None without tls)
        kube.api_client()         # a kubernetes.client.ApiClient pointed at it, token and CA set
        kube.requests             # [RecordedRequest(method, path, query, headers, body), ...]

Paths served (all need ``Authorization: Bearer <token>`` when ``token`` is set, else 401):

- kubelet ``GET /pods``: a v1 PodList of the pods on ``node_name``.
- apiserver ``GET /api/v1/pods`` (``fieldSelector=spec.nodeName=<node>`` honoured), with
  ``watch=true``: a chunked stream of ``{"type": ADDED|MODIFIED|DELETED|ERROR, "object": ...}`` lines
  starting after ``resourceVersion``; a version older than the retained history gets an ERROR 410
  event ("Expired"). The stream ends after ``timeoutSeconds`` or when :meth:`close_watches` is called.
- Discovery (``GET /api``, ``/apis``, ``/api/v1``), enough for kubectl.
- ``GET /api/v1/namespaces/{ns}/pods`` (``fieldSelector=spec.nodeName=`` and equality
  ``labelSelector`` honoured), ``GET /api/v1/namespaces/{ns}/pods/{name}``, ``GET /api/v1/nodes/{name}``.
- ``GET|POST /api/v1/namespaces/{ns}/pods/{name}/exec`` over a WebSocket (``v5``/``v4.channel.k8s.io``,
  what kubectl speaks): the answer comes from :attr:`exec_handler` ``(namespace, pod, container,
  command) -> (stdout, stderr, exit_code)``, sent as channel 1/2 frames and a channel 3 Status, as
  the kubelet's stream does. ``kube.execs`` lists (namespace, pod, container, command, query).
- ``GET /api/v1/namespaces/{ns}/pods/{name}:{port}/proxy/{path}`` (the apiserver's pod proxy): forwarded
  to :attr:`pod_proxy` ``[(namespace, name)]``, a ``http://host:port`` base URL (a real server the test
  runs in the pod's stead), query string included; its status, body and content type come back.
  ``kube.proxied`` lists (namespace, name, port, path with query). A pod without an entry: 503.
- ``POST /api/v1/namespaces/{ns}/pods/{name}/eviction`` (policy/v1 Eviction). By default 201, then
  the pod gets a ``deletionTimestamp`` (a MODIFIED event) and is deleted ``eviction_delete_delay``
  seconds later (a DELETED event). :meth:`set_eviction_response` makes a pod answer 429 (PDB-style
  Status), 500, or 404; unknown pods always get 404. ``kube.evictions`` lists (ns, name, body, code).
- ``POST /apis/authentication.k8s.io/v1/tokenreviews`` (TokenReview: ``authenticated`` with the user of
  :meth:`add_user`'s token, else false) and ``POST /apis/authorization.k8s.io/v1/subjectaccessreviews``
  (non-resource ``get`` of a path: ``allowed`` when :meth:`grant` gave it to the user or one of its groups).
  ``kube.reviews`` lists (kind, spec). ``POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token``
  (TokenRequest, what `kubectl create token` sends) mints a token those reviews accept as that service
  account (403 with ``token_requests_allowed = False``). The pod proxy drops the caller's ``Authorization`` header, as the
  real apiserver's authentication filter does after it authenticated the caller.
- ``POST /api/v1/namespaces/{ns}/events`` (core/v1 Event; 409 if the name exists),
  ``PATCH /api/v1/namespaces/{ns}/events/{name}`` (merge patch), ``GET`` of one event or the list.
  ``kube.events`` is the stored list.

Changing state: :meth:`add_pod`, :meth:`modify_pod`, :meth:`remove_pod` (each also emits a watch event
and bumps the resourceVersion), :meth:`compact` (forget watch history: older versions get 410),
:meth:`expire_watches` (send 410 to open watches). Breaking it: :meth:`fail` with mode
``"malformed"`` (truncated JSON), ``"500"``, ``"close"`` (socket closed with no response, as when
the kubelet restarts mid-request) or ``"empty"`` (an empty PodList), for the next ``times`` requests
(or until :meth:`heal`) whose path starts with ``path``; :meth:`go_down` / :meth:`come_up` stop and
restart the listener on the same port (connection refused in between).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import json
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def container_id_for(pod_uid: str, container: str) -> str:
    """The deterministic 64-hex container id FakeKube pods carry (so tests can build cgroup paths)."""
    return hashlib.sha256(f"{pod_uid}/{container}".encode()).hexdigest()


def _quantity_value(q: str | None) -> float | None:
    """Minimal Kubernetes quantity parser for the QoS computation (only compares values)."""
    if q is None:
        return None
    q = str(q)
    suffixes = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    for s, mult in sorted(suffixes.items(), key=lambda kv: -len(kv[0])):
        if q.endswith(s):
            return float(q[: -len(s)]) * mult
    return float(q)


def make_pod(
    name: str,
    namespace: str = "default",
    uid: str | None = None,
    *,
    qos_class: str | None = None,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    priority: int | None = None,
    owner: tuple[str, str] | None = ("ReplicaSet", None),  # type: ignore[assignment]
    node_name: str = "node-1",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
    runtime: str = "containerd",
) -> dict[str, Any]:
    """A v1 Pod dict as the apiserver/kubelet would return it.

    ``qos_class`` sets the ``koordinator.sh/qosClass`` label (SYSTEM/LSE/LSR/LS/BE). ``requests`` and
    ``limits`` apply to a single container named ``main``; ``containers`` gives several, each
    ``{"name": ..., "requests": {...}, "limits": {...}}``. As the apiserver does, missing requests
    default to the limits, and ``status.qosClass`` (Guaranteed/Burstable/BestEffort) is computed.
    ``owner`` is (kind, name); the default is a ReplicaSet named ``<name>-rs``; None for no owner.
    Container ids are ``container_id_for(uid, container_name)`` with ``runtime://`` prefixed.
    """
    uid = uid or str(uuid.uuid4())
    if containers is None:
        containers = [{"name": "main", "requests": requests or {}, "limits": limits or {}}]
    spec_containers = []
    statuses = []
    all_guaranteed = True
    any_resources = False
    for c in containers:
        lim = dict(c.get("limits") or {})
        req = dict(c.get("requests") or {})
        for k, v in lim.items():
            req.setdefault(k, v)
        resources: dict[str, Any] = {}
        if req:
            resources["requests"] = req
        if lim:
            resources["limits"] = lim
        any_resources = any_resources or bool(req or lim)
        for res in ("cpu", "memory"):
            if res not in lim or _quantity_value(lim.get(res)) != _quantity_value(req.get(res)):
                all_guaranteed = False
        spec_containers.append({"name": c["name"], "image": c.get("image", "busybox"), "resources": resources})
        statuses.append({
            "name": c["name"],
            "containerID": f"{runtime}://{container_id_for(uid, c['name'])}",
            "ready": phase == "Running",
            "restartCount": 0,
            "image": c.get("image", "busybox"),
            "imageID": "",
            "state": {"running": {"startedAt": _now_iso()}} if phase == "Running" else {"waiting": {}},
        })
    k8s_qos = "BestEffort" if not any_resources else ("Guaranteed" if all_guaranteed else "Burstable")
    all_labels = dict(labels or {})
    if qos_class is not None:
        all_labels["koordinator.sh/qosClass"] = qos_class
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": "0",
        "creationTimestamp": _now_iso(),
        "labels": all_labels,
        "annotations": dict(annotations or {}),
    }
    if owner is not None:
        kind, owner_name = owner
        metadata["ownerReferences"] = [{
            "apiVersion": "apps/v1", "kind": kind, "name": owner_name or f"{name}-rs",
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{owner_name or name}")), "controller": True,
        }]
    spec: dict[str, Any] = {"nodeName": node_name, "containers": spec_containers}
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase, "qosClass": k8s_qos, "startTime": _now_iso(), "containerStatuses": statuses},
    }


class Headers(dict[str, str]):
    """Header names are case-insensitive (clients differ: urllib sends Authorization, urllib3 authorization)."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__((k.lower(), v) for k, v in items)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: Headers
    body: Any = None  # parsed JSON when the body was JSON, else the raw text
    at: float = field(default_factory=time.time)


@dataclass
class _Failure:
    mode: str
    times: int | None
    path: str


def _status(code: int, reason: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code, **extra}


def make_self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A cert for 127.0.0.1/localhost and its key, made by the openssl CLI; returns (cert, key)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


class FakeKube:
    """See the module docstring. Thread-safe; use as a context manager (or start()/stop())."""

    def __init__(
        self,
        *,
        token: str | None = None,
        tls: bool = False,
        node_name: str = "node-1",
        node_labels: dict[str, str] | None = None,
        eviction_delete_delay: float = 0.5,
        history_limit: int = 1000,
    ) -> None:
        self.token = token
        self.tls = tls
        self.node_name = node_name
        self.node_labels = dict(node_labels or {"kubernetes.io/hostname": node_name})
        self.eviction_delete_delay = eviction_delete_delay
        self.history_limit = history_limit
        self.requests: list[RecordedRequest] = []
        self.events: list[dict[str, Any]] = []
        self.evictions: list[tuple[str, str, Any, int]] = []
        self.resizes: list[tuple[str, str, Any]] = []  # (namespace, name, patch body) of pods/resize PATCHes
        self.execs: list[tuple[str, str, str, list[str], dict[str, list[str]]]] = []
        self.exec_handler: Callable[[str, str, str, list[str]], tuple[bytes, bytes, int]] = \
            lambda ns, pod, container, command: (b"", b"", 0)
        self.pod_proxy: dict[tuple[str, str], str] = {}  # (namespace, pod) -> base URL its proxy reaches
        self.proxied: list[tuple[str, str, str, str]] = []
        self.users: dict[str, dict[str, Any]] = {}  # bearer token -> TokenReview user (add_user)
        self.grants: set[tuple[str, str]] = set()  # (user name or "group:<name>", non-resource path) (grant)
        self.reviews: list[tuple[str, dict[str, Any]]] = []  # (TokenReview|SubjectAccessReview, spec)
        # TokenRequest (`kubectl create token SA`): a fresh token TokenReview then accepts as the service
        # account; False answers 403, as for a user without `create serviceaccounts/token`.
        self.token_requests_allowed = True
        self.token_requests: list[tuple[str, str]] = []  # (namespace, service account)
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._eviction_responses: dict[tuple[str, str], tuple[int, str | None]] = {}
        self._failures: list[_Failure] = []
        self._rv = 100
        self._history: list[tuple[int, str, dict[str, Any]]] = []  # (rv, type, pod snapshot)
        self._oldest_rv = self._rv  # watches from before this get 410
        self._watch_generation = 0  # bumped by close_watches()/expire_watches()
        self._expire_generation = -1
        self._cond = threading.Condition()
        self._connections: set[socket.socket] = set()
        self._timers: list[threading.Timer] = []
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.ca_file: str | None = None
        self._ssl: ssl.SSLContext | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> FakeKube:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FakeKube:
        if self.tls and self._ssl is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="fakekube-")
            cert, key = make_self_signed_cert(Path(self._tmp.name))
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self._ssl = ctx
            self.ca_file = str(cert)
        self.come_up()
        return self

    def stop(self) -> None:
        self.go_down()
        for t in self._timers:
            t.cancel()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def go_down(self) -> None:
        """Stop listening and cut every open connection (as a kubelet restart does)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._cond:
            conns = list(self._connections)
            self._watch_generation += 1
            self._cond.notify_all()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def come_up(self) -> None:
        """Listen again, on the same port as before (a new random one the first time)."""
        if self._server is not None:
            return
        handler = _make_handler(self)
        server = _QuietServer(("127.0.0.1", self.port), handler, bind_and_activate=False)
        server.daemon_threads = True
        server.allow_reuse_address = True
        server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.server_bind()
        server.server_activate()
        if self._ssl is not None:
            # Handshake lazily in the handler thread, so a stuck client cannot block accept().
            server.socket = self._ssl.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def api_client(self, token: str | None = None) -> Any:
        """A kubernetes.client.ApiClient for this server (token defaults to the configured one)."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        tok = token if token is not None else self.token
        if tok is not None:
            cfg.api_key = {"authorization": tok}
            cfg.api_key_prefix = {"authorization": "Bearer"}
        if self.tls:
            cfg.ssl_ca_cert = self.ca_file
            cfg.verify_ssl = True
        cfg.retries = False
        return client.ApiClient(cfg)

    # -- state --------------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def pods(self) -> list[dict[str, Any]]:
        with self._cond:
            return [copy.deepcopy(p) for p in self._pods.values()]

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._cond:
            p = self._pods.get((namespace, name))
            return copy.deepcopy(p) if p else None

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        with self._cond:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            pod = copy.deepcopy(pod)
            self._pods[key] = pod
            self._emit("ADDED", pod)
            return copy.deepcopy(pod)

    def modify_pod(self, namespace: str, name: str, change: dict[str, Any] | Any) -> dict[str, Any]:
        """Apply ``change``: a dict deep-merged into the pod, or a function mutating the pod dict."""
        with self._cond:
            pod = self._pods[(namespace, name)]
            if callable(change):
                change(pod)
            else:
                _merge(pod, change)
            self._emit("MODIFIED", pod)
            return copy.deepcopy(pod)

    def remove_pod(self, namespace: str, name: str) -> bool:
        with self._cond:
            pod = self._pods.pop((namespace, name), None)
            if pod is None:
                return False
            self._emit("DELETED", pod)
            return True

    def _emit(self, kind: str, pod: dict[str, Any]) -> None:
        self._rv += 1
        pod["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append((self._rv, kind, copy.deepcopy(pod)))
        if len(self._history) > self.history_limit:
            dropped = self._history[: -self.history_limit]
            del self._history[: -self.history_limit]
            self._oldest_rv = dropped[-1][0]
        self._cond.notify_all()

    def compact(self) -> None:
        """Forget the watch history: a watch from any version before now gets 410 Expired."""
        with self._cond:
            self._history.clear()
            self._oldest_rv = self._rv

    def expire_watches(self) -> None:
        """Send ERROR 410 to every open watch (and compact), as an apiserver does after compaction."""
        with self._cond:
            self.compact()
            self._watch_generation += 1
            self._expire_generation = self._watch_generation
            self._cond.notify_all()

    def close_watches(self) -> None:
        """End every open watch stream cleanly (as a watch timeout does)."""
        with self._cond:
            self._watch_generation += 1
            self._cond.notify_all()

    def set_eviction_response(self, namespace: str, name: str, code: int, message: str | None = None) -> None:
        """How evicting this pod answers: 201 (default), 429 (PDB), 404, 500."""
        with self._cond:
            self._eviction_responses[(namespace, name)] = (code, message)

    def add_user(self, token: str, username: str, groups: tuple[str, ...] = ("system:authenticated",)) -> None:
        """A token TokenReview accepts, as ``username`` in ``groups``."""
        with self._cond:
            self.users[token] = {"username": username, "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, username)),
                                 "groups": list(groups)}

    def grant(self, subject: str, path: str) -> None:
        """``get`` on the non-resource URL ``path`` for a user name or ``group:<name>`` (a ClusterRole's
        nonResourceURLs rule, bound)."""
        with self._cond:
            self.grants.add((subject, path))

    def _token_review(self, body: Any) -> tuple[int, dict[str, Any]]:
        spec = (body or {}).get("spec") or {} if isinstance(body, dict) else {}
        with self._cond:
            self.reviews.append(("TokenReview", copy.deepcopy(spec)))
            user = self.users.get(str(spec.get("token", "")))
        status: dict[str, Any] = {"authenticated": user is not None}
        if user is not None:
            status["user"] = copy.deepcopy(user)
        else:
            status["error"] = "invalid bearer token"
        return 201, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec, "status": status}

    def _token_request(self, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        with self._cond:
            self.token_requests.append((namespace, name))
        if not self.token_requests_allowed:
            return 403, _status(403, "Forbidden", f'serviceaccounts "{name}" is forbidden: cannot create '
                                                  f'resource "serviceaccounts/token" in namespace "{namespace}"')
        token = f"sa-{uuid.uuid4().hex}"
        self.add_user(token, f"system:serviceaccount:{namespace}:{name}",
                      ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))
        return 201, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                     "metadata": {"name": name, "namespace": namespace},
                     "spec": {"audiences": [], "expirationSeconds": 600},
                     "status": {"token": token, "expirationTimestamp": _now_iso()}}

    def _access_review(self, body: Any) -> tuple[int, dict[str, Any]]:
        spec = (body or {}).get("spec") or {} if isinstance(body, dict) else {}
        attrs = spec.get("nonResourceAttributes") or {}
        subjects = {str(spec.get("user", ""))} | {f"group:{g}" for g in spec.get("groups") or []}
        with self._cond:
            self.reviews.append(("SubjectAccessReview", copy.deepcopy(spec)))
            allowed = attrs.get("verb") == "get" and any((s, attrs.get("path")) in self.grants for s in subjects)
        status = {"allowed": allowed, "reason": "granted" if allowed else ""}
        return 201, {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec,
                     "status": status}

    def fail(self, mode: str, times: int | None = None, path: str = "/") -> None:
        """Break responses: mode in malformed, 500, close, empty; ``times`` None = until heal()."""
        if mode not in ("malformed", "500", "close", "empty"):
            raise ValueError(f"unknown failure mode {mode!r}")
        with self._cond:
            self._failures.append(_Failure(mode, times, path))

    def heal(self) -> None:
        with self._cond:
            self._failures.clear()

    def requests_to(self, path_prefix: str, method: str | None = None) -> list[RecordedRequest]:
        with self._cond:
            return [r for r in self.requests if r.path.startswith(path_prefix) and (method is None or r.method == method)]

    def _take_failure(self, path: str) -> str | None:
        with self._cond:
            for f in self._failures:
                if path.startswith(f.path):
                    if f.times is not None:
                        f.times -= 1
                        if f.times <= 0:
                            self._failures.remove(f)
                    return f.mode
            return None

    def _node_pods(self, node: str | None) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self._pods.values() if node is None or p["spec"].get("nodeName") == node]

    def _pod_list(self, node: str | None) -> dict[str, Any]:
        with self._cond:
            return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._rv)},
                    "items": self._node_pods(node)}

    def _evict(self, namespace: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        with self._cond:
            pod = self._pods.get((namespace, name))
            code, message = self._eviction_responses.get((namespace, name), (201, None))
            if pod is None:
                code, message = 404, None
            self.evictions.append((namespace, name, body, code))
            if code == 404:
                return 404, _status(404, "NotFound", message or f'pods "{name}" not found',
                                    details={"name": name, "kind": "pods"})
            if code == 429:
                msg = message or "Cannot evict pod as it would violate the pod's disruption budget."
                return 429, _status(429, "TooManyRequests", msg, details={"causes": [
                    {"reason": "DisruptionBudget",
                     "message": f"The disruption budget {name}-pdb needs 1 healthy pods and has 1 currently"}]})
            if code >= 300:
                return code, _status(code, "InternalError", message or "internal error")
            if pod is not None and not pod["metadata"].get("deletionTimestamp"):
                pod["metadata"]["deletionTimestamp"] = _now_iso()
                pod["metadata"]["deletionGracePeriodSeconds"] = 30
                self._emit("MODIFIED", pod)
                timer = threading.Timer(self.eviction_delete_delay, self.remove_pod, (namespace, name))
                timer.daemon = True
                self._timers.append(timer)
                timer.start()
            return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _resize(self, namespace: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        """PATCH pods/{name}/resize (in-place pod resize, strategic merge on containers by name).

        As the apiserver: only the values of resources a container already has may change (adding or
        dropping a request/limit would change the pod's QoS class, which is immutable: 422).
        """
        with self._cond:
            pod = self._pods.get((namespace, name))
            if pod is None:
                return 404, _status(404, "NotFound", f'pods "{name}" not found')
            self.resizes.append((namespace, name, copy.deepcopy(body)))
            new = copy.deepcopy(pod)
            by_name = {c["name"]: c for c in new["spec"]["containers"]}
            for pc in ((body or {}).get("spec") or {}).get("containers") or []:
                c = by_name.get(pc.get("name"))
                if c is None:
                    return 422, _status(422, "Invalid", f'container "{pc.get("name")}" not found')
                for kind, values in (pc.get("resources") or {}).items():
                    have = (c.get("resources") or {}).get(kind) or {}
                    for res, value in (values or {}).items():
                        if res not in have or value is None:
                            return 422, _status(422, "Invalid", "Pod QoS is immutable: resize may only change "
                                                                 f"existing {kind} ({res} on {c['name']})")
                        have[res] = value
            self._pods[(namespace, name)] = new
            self._emit("MODIFIED", new)
            return 200, copy.deepcopy(new)

    def _store_event(self, namespace: str, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or body.get("kind", "Event") != "Event":
            return 400, _status(400, "BadRequest", "body is not an Event")
        with self._cond:
            meta = body.setdefault("metadata", {})
            meta.setdefault("namespace", namespace)
            if meta.get("namespace") != namespace:
                return 400, _status(400, "BadRequest", "the namespace of the object does not match the URL")
            if not meta.get("name"):
                if not meta.get("generateName"):
                    return 422, _status(422, "Invalid", "metadata.name: Required value: name or generateName is required")
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if any(e["metadata"]["name"] == meta["name"] and e["metadata"]["namespace"] == namespace for e in self.events):
                return 409, _status(409, "AlreadyExists", f'events "{meta["name"]}" already exists')
            if not body.get("involvedObject"):
                return 422, _status(422, "Invalid", "involvedObject: Required value")
            self._rv += 1
            meta["uid"] = str(uuid.uuid4())
            meta["resourceVersion"] = str(self._rv)
            meta["creationTimestamp"] = _now_iso()
            body.setdefault("apiVersion", "v1")
            body["kind"] = "Event"
            self.events.append(body)
            return 201, copy.deepcopy(body)

    def _patch_event(self, namespace: str, name: str, patch: Any) -> tuple[int, dict[str, Any]]:
        with self._cond:
            for e in self.events:
                if e["metadata"]["name"] == name and e["metadata"]["namespace"] == namespace:
                    if not isinstance(patch, dict):
                        return 400, _status(400, "BadRequest", "patch is not a JSON object")
                    _merge(e, patch)
                    self._rv += 1
                    e["metadata"]["resourceVersion"] = str(self._rv)
                    return 200, copy.deepcopy(e)
            return 404, _status(404, "NotFound", f'events "{name}" not found')


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients resetting connections (and go_down() cutting them) is what tests do on purpose.
        return


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386): nested dicts merge, null deletes, anything else replaces."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


def _make_handler(kube: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive and chunked watch streams, like the real servers

        def setup(self) -> None:
            super().setup()
            with kube._cond:
                kube._connections.add(self.connection)

        def finish(self) -> None:
            with contextlib.suppress(OSError):
                super().finish()
            with kube._cond:
                kube._connections.discard(self.connection)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read kube.requests
            return

        # -- plumbing ---------------------------------------------------------------------
        def _read_body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not raw:
                return None
            text = raw.decode("utf-8", "replace")
            try:
                return json.loads(text)
            except ValueError:
                return text

        def _send_json(self, code: int, obj: Any) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, method: str) -> None:
            split = urlsplit(self.path)
            path, query = split.path, parse_qs(split.query)
            body = self._read_body() if method in ("POST", "PATCH", "PUT") else None
            with kube._cond:
                kube.requests.append(RecordedRequest(method, path, query, Headers(self.headers.items()), body))
            if kube.token is not None and self.headers.get("Authorization") != f"Bearer {kube.token}":
                self._send_json(401, _status(401, "Unauthorized", "Unauthorized"))
                return
            failure = kube._take_failure(path)
            if failure == "close":
                # No response at all: the client sees a reset/empty reply, like a restarting kubelet.
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if failure == "500":
                self._send_json(500, _status(500, "InternalError", "injected failure"))
                return
            if failure == "malformed":
                data = b'{"kind": "PodList", "items": [{"metadata": {"name": '
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self._route(method, path, query, body, failure)

        def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any, failure: str | None) -> None:
            parts = [p for p in path.split("/") if p]
            if method == "GET" and parts == ["pods"]:
                listing = kube._pod_list(kube.node_name)
                if failure == "empty":
                    listing["items"] = []
                self._send_json(200, listing)
                return
            # Discovery, as kubectl asks it before any request (unaggregated JSON: kubectl falls back to it).
            if method == "GET" and parts == ["api"]:
                self._send_json(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{kube.port}"}]})
                return
            if method == "GET" and parts == ["apis"]:
                self._send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
                return
            if method == "GET" and parts == ["api", "v1"]:
                self._send_json(200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                    {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "shortNames": ["po"],
                     "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
                    {"name": "pods/exec", "singularName": "", "namespaced": True, "kind": "PodExecOptions",
                     "verbs": ["create", "get"]},
                    {"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy",
                     "version": "v1", "kind": "Eviction", "verbs": ["create"]},
                    {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node",
                     "verbs": ["get", "list", "watch"]},
                    {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event",
                     "verbs": ["create", "get", "list", "patch"]},
                ]})
                return
            if method == "GET" and parts == ["api", "v1", "pods"]:
                node = _node_from_selector(query)
                if query.get("watch", ["false"])[0] in ("true", "1"):
                    self._watch(node, query)
                    return
                listing = kube._pod_list(node)
                if failure == "empty":
                    listing["items"] = []
                self._send_json(200, listing)
                return
            if len(parts) == 4 and parts[:3] == ["api", "v1", "nodes"] and method == "GET":
                if parts[3] != kube.node_name:
                    self._send_json(404, _status(404, "NotFound", f'nodes "{parts[3]}" not found'))
                    return
                node_uid = str(uuid.uuid5(uuid.NAMESPACE_DNS, kube.node_name))
                self._send_json(200, {"kind": "Node", "apiVersion": "v1",
                                      "metadata": {"name": kube.node_name, "labels": kube.node_labels, "uid": node_uid},
                                      "status": {"capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"}}})
                return
            if method == "POST" and parts == ["apis", "authentication.k8s.io", "v1", "tokenreviews"]:
                self._send_json(*kube._token_review(body))
                return
            if method == "POST" and parts == ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"]:
                self._send_json(*kube._access_review(body))
                return
            if len(parts) >= 5 and parts[:3] == ["api", "v1", "namespaces"]:
                ns = parts[3]
                rest = parts[4:]
                if rest == ["pods"] and method == "GET":
                    listing = kube._pod_list(_node_from_selector(query))
                    wanted = _labels_from_selector(query)
                    listing["items"] = [p for p in listing["items"] if p["metadata"]["namespace"] == ns
                                        and wanted.items() <= (p["metadata"].get("labels") or {}).items()]
                    self._send_json(200, listing)
                    return
                if rest[0] == "serviceaccounts" and len(rest) == 3 and rest[2] == "token" and method == "POST":
                    self._send_json(*kube._token_request(ns, rest[1]))
                    return
                if rest[0] == "pods" and len(rest) >= 3 and rest[2] == "proxy" and method == "GET":
                    self._proxy(ns, rest[1], "/".join(rest[3:]))
                    return
                if rest[0] == "pods" and len(rest) == 3 and rest[2] == "exec" and method in ("GET", "POST"):
                    self._exec(ns, rest[1], query)
                    return
                if rest[0] == "pods" and len(rest) == 2 and method == "GET":
                    pod = kube.get_pod(ns, rest[1])
                    if pod is None:
                        self._send_json(404, _status(404, "NotFound", f'pods "{rest[1]}" not found'))
                    else:
                        self._send_json(200, pod)
                    return
                if rest[0] == "pods" and len(rest) == 3 and rest[2] == "eviction" and method == "POST":
                    code, obj = kube._evict(ns, rest[1], body)
                    self._send_json(code, obj)
                    return
                if rest[0] == "pods" and len(rest) == 3 and rest[2] == "resize" and method == "PATCH":
                    code, obj = kube._resize(ns, rest[1], body)
                    self._send_json(code, obj)
                    return
                if rest[0] == "events" and len(rest) == 1 and method == "POST":
                    code, obj = kube._store_event(ns, body)
                    self._send_json(code, obj)
                    return
                if rest[0] == "events" and len(rest) == 1 and method == "GET":
                    with kube._cond:
                        items = [copy.deepcopy(e) for e in kube.events if e["metadata"]["namespace"] == ns]
                    self._send_json(200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items})
                    return
                if rest[0] == "events" and len(rest) == 2 and method == "GET":
                    with kube._cond:
                        found = [copy.deepcopy(e) for e in kube.events
                                 if e["metadata"]["namespace"] == ns and e["metadata"]["name"] == rest[1]]
                    if found:
                        self._send_json(200, found[0])
                    else:
                        self._send_json(404, _status(404, "NotFound", f'events "{rest[1]}" not found'))
                    return
                if rest[0] == "events" and len(rest) == 2 and method == "PATCH":
                    code, obj = kube._patch_event(ns, rest[1], body)
                    self._send_json(code, obj)
                    return
            self._send_json(404, _status(404, "NotFound", f"the server could not find the requested resource ({path})"))

        def _proxy(self, ns: str, name_port: str, rest: str) -> None:
            import urllib.error
            import urllib.request

            name, _, port = name_port.partition(":")
            query = urlsplit(self.path).query
            target = f"/{rest}" + (f"?{query}" if query else "")
            with kube._cond:
                kube.proxied.append((ns, name, port, target))
            base = kube.pod_proxy.get((ns, name))
            if base is None:
                self._send_json(503, _status(503, "ServiceUnavailable", f"no endpoint for pod {ns}/{name}"))
                return
            # Every header but Authorization goes on to the pod: the apiserver deletes that one once it has
            # authenticated the caller (k8s.io/apiserver's WithAuthentication), so no user token reaches a pod.
            forwarded = {k: v for k, v in self.headers.items()
                         if k.lower() not in ("authorization", "host", "content-length", "connection")}
            try:
                request = urllib.request.Request(base.rstrip("/") + target, headers=forwarded)
                with urllib.request.urlopen(request, timeout=30) as resp:
                    code, data, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "text/plain")
            except urllib.error.HTTPError as e:
                code, data, ctype = e.code, e.read(), e.headers.get("Content-Type", "text/plain")
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _exec(self, ns: str, name: str, query: dict[str, list[str]]) -> None:
            pod = kube.get_pod(ns, name)
            if pod is None:
                self._send_json(404, _status(404, "NotFound", f'pods "{name}" not found'))
                return
            offered = [p.strip() for p in (self.headers.get("Sec-WebSocket-Protocol") or "").split(",")]
            protocol = next((p for p in ("v5.channel.k8s.io", "v4.channel.k8s.io") if p in offered), None)
            key = self.headers.get("Sec-WebSocket-Key")
            if self.headers.get("Upgrade", "").lower() != "websocket" or key is None or protocol is None:
                self._send_json(400, _status(400, "BadRequest", "exec needs a websocket upgrade (v4/v5.channel.k8s.io)"))
                return
            container = query.get("container", [pod["spec"]["containers"][0]["name"]])[0]
            command = query.get("command", [])
            with kube._cond:
                kube.execs.append((ns, name, container, list(command), query))
            stdout, stderr, code = kube.exec_handler(ns, name, container, list(command))
            accept = base64.b64encode(hashlib.sha1((key + _WS_GUID).encode()).digest()).decode()
            self.send_response(101, "Switching Protocols")
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.send_header("Sec-WebSocket-Accept", accept)
            self.send_header("Sec-WebSocket-Protocol", protocol)
            self.end_headers()
            status = {"metadata": {}, "status": "Success"} if code == 0 else {
                "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                "message": f"command terminated with non-zero exit code: exit status {code}",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
            with contextlib.suppress(OSError):
                for channel, data in ((1, stdout), (2, stderr)):
                    for i in range(0, len(data), 32768):
                        self.wfile.write(_ws_frame(0x2, bytes([channel]) + data[i:i + 32768]))
                self.wfile.write(_ws_frame(0x2, b"\x03" + json.dumps(status).encode()))
                self.wfile.write(_ws_frame(0x8, (1000).to_bytes(2, "big")))
                self.wfile.flush()
            self.close_connection = True

        def _chunk(self, obj: Any) -> None:
            data = (json.dumps(obj) + "\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _watch(self, node: str | None, query: dict[str, list[str]]) -> None:
            try:
                since = int(query.get("resourceVersion", ["0"])[0] or 0)
            except ValueError:
                self._send_json(400, _status(400, "BadRequest", "invalid resourceVersion"))
                return
            timeout = float(query.get("timeoutSeconds", ["300"])[0])
            deadline = time.monotonic() + timeout
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with kube._cond:
                generation = kube._watch_generation
                expired = since != 0 and since < kube._oldest_rv
                # rv 0 means "from now" with the current state first, as the apiserver does.
                backlog = ([] if expired else
                           [("ADDED", p) for p in kube._node_pods(node)] if since == 0 else
                           [(t, p) for rv, t, p in kube._history if rv > since])
                last = kube._rv
            try:
                if expired:
                    msg = f"too old resource version: {since} ({kube._oldest_rv})"
                    self._chunk({"type": "ERROR", "object": _status(410, "Expired", msg)})
                    self._end_chunks()
                    return
                for kind, pod in backlog:
                    if node is None or pod["spec"].get("nodeName") == node:
                        self._chunk({"type": kind, "object": copy.deepcopy(pod)})
                while True:
                    with kube._cond:
                        while (kube._rv == last and kube._watch_generation == generation
                               and time.monotonic() < deadline):
                            kube._cond.wait(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
                        if kube._watch_generation != generation:
                            gone = kube._expire_generation == kube._watch_generation
                            new: list[tuple[str, dict[str, Any]]] = []
                        else:
                            gone = False
                            new = [(t, copy.deepcopy(p)) for rv, t, p in kube._history if rv > last]
                            last = kube._rv
                        ended = kube._watch_generation != generation or time.monotonic() >= deadline
                    for kind, pod in new:
                        if node is None or pod["spec"].get("nodeName") == node:
                            self._chunk({"type": kind, "object": pod})
                    if gone:
                        self._chunk({"type": "ERROR", "object": _status(410, "Expired", "too old resource version")})
                    if ended:
                        break
                self._end_chunks()
            except OSError:
                self.close_connection = True

        def _end_chunks(self) -> None:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            self._safe("GET")

        def do_POST(self) -> None:
            self._safe("POST")

        def do_PATCH(self) -> None:
            self._safe("PATCH")

        def do_PUT(self) -> None:
            self._safe("PUT")

        def do_DELETE(self) -> None:
            self._safe("DELETE")

        def _safe(self, method: str) -> None:
            try:
                self._handle(method)
            except (OSError, ssl.SSLError):
                self.close_connection = True

    return Handler


_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _ws_frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked server-to-client WebSocket frame (RFC 6455)."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + n.to_bytes(2, "big")
    else:
        head += bytes([127]) + n.to_bytes(8, "big")
    return head + payload


def _labels_from_selector(query: dict[str, list[str]]) -> dict[str, str]:
    """Equality terms of a labelSelector (``a=b,c==d``); set-based terms are not needed by callers."""
    out: dict[str, str] = {}
    for sel in query.get("labelSelector", []):
        for term in sel.split(","):
            key, _, value = term.partition("=")
            if key:
                out[key.strip()] = value.lstrip("=").strip()
    return out


def _node_from_selector(query: dict[str, list[str]]) -> str | None:
    for sel in query.get("fieldSelector", []):
        for term in sel.split(","):
            key, _, value = term.partition("=")
            if key == "spec.nodeName":
                return value.lstrip("=")
    return None
