# SPDX-License-Identifier: Apache-2.0
"""Who may read the agent's endpoints: callers the apiserver vouches for, as kube-rbac-proxy checks them.

A request carries a bearer token (``Authorization: Bearer <token>``, or through the apiserver's pod proxy,
which strips that header, ``X-Noisyneighbor-Authorization``). The agent asks the apiserver
who that is (a TokenReview) and whether they may ``get`` the endpoint's path as a non-resource URL
(a SubjectAccessReview: ``nonResourceAttributes: {path: /top, verb: get}``), the check the apiserver
itself makes for ``/metrics`` and the one kube-rbac-proxy makes by default. No token: 401; a token the
apiserver does not know: 401; known but not allowed: 403. The viewer ClusterRole of the manifests
grants ``get`` on the non-resource URLs ``/top``, ``/diagnose`` and ``/metrics``; Prometheus' own
ClusterRole in kube-prometheus-stack already has ``/metrics``.

Answers are cached per token and path for ``cache_seconds`` (allowed) or ``deny_cache_seconds`` (denied),
so a scrape every 15 s or a ``top`` every second costs the apiserver two small POSTs a minute, not
two per request. The cache holds sha256 digests of the tokens, never the tokens. An apiserver that
cannot be asked fails closed: 503 with one line, nothing cached, so the next request asks again.

The client is the standard library's (urllib): the generated Kubernetes client costs ~19 MiB of RSS
(see wiring._InClusterClient) and is not imported for this.
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
# Where a token arrives through the apiserver's pod proxy: the apiserver deletes ``Authorization`` once it has
# authenticated the caller, so `kubectl noisyneighbor` sends the agent's token in this header instead.
FORWARDED_TOKEN_HEADER = "X-Noisyneighbor-Authorization"
# Endpoints that stay open: the kubelet's probes carry no token.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# At most this many cached verdicts; the oldest go first (a scanner sending random tokens cannot grow it).
MAX_CACHED = 1024


class AuthSetupError(ValueError):
    """The auth settings cannot work here (no apiserver address, no token file); one line."""


@dataclass(frozen=True)
class AuthConfig:
    """Where the apiserver is and how the agent authenticates its own reviews.

    ``apiserver`` None: in-cluster (``KUBERNETES_SERVICE_HOST``/``_PORT``). The token file is re-read at
    each review: projected service-account tokens rotate (the kubelet rewrites the file hourly).
    """

    protect_metrics: bool = False  # /metrics too (else it stays open, like /healthz)
    apiserver: str | None = None
    ca_file: str | None = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
    token_file: str = f"{SERVICE_ACCOUNT_DIR}/token"
    cache_seconds: float = 60.0
    deny_cache_seconds: float = 10.0
    timeout_seconds: float = 5.0

    def apiserver_url(self) -> str:
        if self.apiserver:
            return self.apiserver.rstrip("/")
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise AuthSetupError("endpoint auth needs the apiserver: not in a cluster (no KUBERNETES_SERVICE_HOST) "
                                 "and no --auth-apiserver given")
        return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"

    def check(self) -> None:
        """Fail at start, not at the first request, when the settings cannot work."""
        self.apiserver_url()
        if not os.path.isfile(self.token_file):
            raise AuthSetupError(f"endpoint auth needs the agent's service-account token: {self.token_file} missing")
        if self.ca_file is not None and self.apiserver_url().startswith("https:") and not os.path.isfile(self.ca_file):
            raise AuthSetupError(f"endpoint auth: CA file {self.ca_file} missing")


@dataclass(frozen=True)
class Verdict:
    """What to answer: ``code`` 200 lets the request through; else the status and a one-line reason."""

    code: int
    reason: str
    user: str | None = None


class ApiserverUnavailable(Exception):
    """A review could not be made (network, TLS, a 5xx, a body that is not a review); one line."""


@dataclass
class RequestAuthorizer:
    """TokenReview + SubjectAccessReview per (token, path), cached briefly. Thread-safe (one per server)."""

    config: AuthConfig
    clock: Any = time.monotonic
    reviews: int = 0  # apiserver round trips made (tests read it to see the cache work)
    _cache: dict[tuple[str, str], tuple[float, Verdict]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ssl: ssl.SSLContext | None = None

    def needs_auth(self, path: str) -> bool:
        if path in OPEN_PATHS:
            return False
        return self.config.protect_metrics or path != "/metrics"

    def authorize(self, authorization: str | None, path: str) -> Verdict:
        token = _bearer(authorization)
        if token is None:
            return Verdict(401, "a bearer token is required (Authorization: Bearer <token>)")
        key = (hashlib.sha256(token.encode()).hexdigest(), path)
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
        try:
            verdict = self._review(token, path)
        except ApiserverUnavailable as e:
            return Verdict(503, f"cannot verify the token with the apiserver: {e}")
        ttl = self.config.cache_seconds if verdict.code == 200 else self.config.deny_cache_seconds
        with self._lock:
            if len(self._cache) >= MAX_CACHED:
                for old in sorted(self._cache, key=lambda k: self._cache[k][0])[: MAX_CACHED // 4]:
                    del self._cache[old]
            self._cache[key] = (now + ttl, verdict)
        return verdict

    def _review(self, token: str, path: str) -> Verdict:
        review = self._post(TOKEN_REVIEW_PATH, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Verdict(401, "the apiserver does not accept this token")
        user = status.get("user") or {}
        name = str(user.get("username", ""))
        spec: dict[str, Any] = {"user": name, "groups": user.get("groups") or [],
                                "nonResourceAttributes": {"path": path, "verb": "get"}}
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access = self._post(ACCESS_REVIEW_PATH, {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
        if (access.get("status") or {}).get("allowed"):
            return Verdict(200, "allowed", name)
        return Verdict(403, f"{name} may not get {path} (needs the noisyneighbor-viewer ClusterRole or "
                            f"nonResourceURLs {path} get)", name)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.reviews += 1
        try:
            own_token = open(self.config.token_file).read().strip()  # noqa: SIM115 - tiny file, re-read: it rotates
        except OSError as e:
            raise ApiserverUnavailable(f"cannot read {self.config.token_file}: {e.strerror}") from None
        url = self.config.apiserver_url() + path
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
            "Authorization": f"Bearer {own_token}", "Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_seconds, context=self._context()) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise ApiserverUnavailable(f"{path.rsplit('/', 1)[-1]}: HTTP {e.code}") from None
        except (OSError, ValueError) as e:
            raise ApiserverUnavailable(f"{path.rsplit('/', 1)[-1]}: {getattr(e, 'reason', None) or e}") from None
        if not isinstance(answer, dict):
            raise ApiserverUnavailable(f"{path.rsplit('/', 1)[-1]}: the answer is not an object")
        return answer

    def _context(self) -> ssl.SSLContext | None:
        if not self.config.apiserver_url().startswith("https:"):
            return None
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=self.config.ca_file)
        return self._ssl


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None
