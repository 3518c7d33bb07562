# SPDX-License-Identifier: Apache-2.0
"""The agent's endpoints answer only callers the apiserver vouches for (TokenReview + SubjectAccessReview).

The agent's real HTTP server (http_server.start_http_server) with its real authorizer asks FakeKube, a real
HTTPS apiserver double, over TLS with the agent's own token: no token -> 401, a token the apiserver does
not know -> 401, a known user without the grant -> 403, with it -> 200; /healthz and /readyz stay open.
The last test runs the real `noisyneighbor agent` process with ``--auth kubernetes``.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from noisyneighbor.agent.auth import AuthConfig, RequestAuthorizer
from noisyneighbor.agent.http_server import start_http_server
from testkit.exporter_support import AgentProcess, write_config
from testkit.fakekube import FakeKube

AGENT_TOKEN = "agent-sa-token"
VIEWER, STRANGER = "viewer-token", "stranger-token"


@dataclass
class _StubAgent:
    """What the handler reads of an agent for /metrics and /healthz (the views are off: top/detector None)."""

    interval_s: float = 1.0
    top: object = None
    detector: object = None

    def metrics(self, accept: str = "") -> tuple[bytes, str]:
        return b"noisyneighbor_up 1\n", "text/plain; version=0.0.4"

    def health(self) -> dict:
        return {"live": True, "ready": True}


def _get(url: str, token: str | None = None) -> tuple[int, bytes, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


@pytest.fixture
def kube(tmp_path: Path):
    with FakeKube(token=AGENT_TOKEN, tls=True) as k:
        k.add_user(VIEWER, "system:serviceaccount:noisyneighbor:noisyneighbor-viewer")
        k.add_user(STRANGER, "system:serviceaccount:default:default")
        for path in ("/top", "/diagnose", "/metrics"):
            k.grant("system:serviceaccount:noisyneighbor:noisyneighbor-viewer", path)
        yield k


def _auth_config(kube: FakeKube, tmp_path: Path, **kw) -> AuthConfig:
    token_file = tmp_path / "sa-token"
    token_file.write_text(AGENT_TOKEN + "\n")
    return AuthConfig(apiserver=kube.url, ca_file=kube.ca_file, token_file=str(token_file), **kw)


@pytest.fixture
def server(kube: FakeKube, tmp_path: Path):
    authorizer = RequestAuthorizer(_auth_config(kube, tmp_path, protect_metrics=True))
    srv, _ = start_http_server(_StubAgent(), "127.0.0.1", 0, authorizer)
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", authorizer
    finally:
        srv.shutdown()
        srv.server_close()


def test_no_token_401_unknown_token_401_no_grant_403_grant_passes(kube: FakeKube, server):
    base, _ = server
    code, body, headers = _get(f"{base}/metrics")
    assert code == 401 and headers.get("WWW-Authenticate", "").startswith("Bearer"), (code, body)
    assert _get(f"{base}/metrics", "not-a-token")[0] == 401
    code, body, _ = _get(f"{base}/metrics", STRANGER)
    assert code == 403 and b"system:serviceaccount:default:default may not get /metrics" in body, body
    code, body, _ = _get(f"{base}/metrics", VIEWER)
    assert code == 200 and body == b"noisyneighbor_up 1\n"
    # The reviews carried what kube-rbac-proxy sends: the token, then the user and a non-resource get.
    kinds = [kind for kind, _ in kube.reviews]
    assert kinds.count("TokenReview") == 3 and kinds.count("SubjectAccessReview") == 2, kinds
    sar = [spec for kind, spec in kube.reviews if kind == "SubjectAccessReview"][-1]
    assert sar["user"] == "system:serviceaccount:noisyneighbor:noisyneighbor-viewer"
    assert sar["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
    assert "system:authenticated" in sar["groups"] and sar["uid"]
    # Every review went out with the agent's own token (FakeKube answers 401 to anything else).
    assert all(r.headers["Authorization"] == f"Bearer {AGENT_TOKEN}" for r in kube.requests_to("/apis/"))


def test_the_grant_is_per_path(kube: FakeKube, server):
    base, _ = server
    kube.add_user("metrics-only", "system:serviceaccount:monitoring:prometheus")
    kube.grant("system:serviceaccount:monitoring:prometheus", "/metrics")
    assert _get(f"{base}/metrics", "metrics-only")[0] == 200
    assert _get(f"{base}/top", "metrics-only")[0] == 403
    assert _get(f"{base}/diagnose?window=60", "metrics-only")[0] == 403


def test_healthz_and_readyz_stay_open(kube: FakeKube, server):
    base, _ = server
    for path in ("/healthz", "/readyz"):
        code, body, _ = _get(base + path)
        assert code == 200 and json.loads(body)["live"] is True
    assert not kube.reviews  # the kubelet's probes cost the apiserver nothing


def test_verdicts_are_cached_per_token_and_path(kube: FakeKube, server):
    base, authorizer = server
    for _ in range(5):
        assert _get(f"{base}/metrics", VIEWER)[0] == 200
        assert _get(f"{base}/metrics", STRANGER)[0] == 403
    assert authorizer.reviews == 4, authorizer.reviews  # one TokenReview + one SAR per token, then the cache
    assert _get(f"{base}/top", VIEWER)[0] != 401  # another path is asked again
    assert authorizer.reviews == 6


def test_a_revoked_grant_is_denied_once_the_cache_expires(kube: FakeKube, tmp_path: Path):
    now = [1000.0]
    authorizer = RequestAuthorizer(_auth_config(kube, tmp_path, protect_metrics=True), clock=lambda: now[0])
    assert authorizer.authorize(f"Bearer {VIEWER}", "/top").code == 200
    kube.grants.clear()
    now[0] += 30
    assert authorizer.authorize(f"Bearer {VIEWER}", "/top").code == 200  # within cache_seconds (60)
    now[0] += 31
    assert authorizer.authorize(f"Bearer {VIEWER}", "/top").code == 403


def test_metrics_stay_open_unless_protected(kube: FakeKube, tmp_path: Path):
    authorizer = RequestAuthorizer(_auth_config(kube, tmp_path))
    srv, _ = start_http_server(_StubAgent(), "127.0.0.1", 0, authorizer)
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        assert _get(f"{base}/metrics")[0] == 200
        assert _get(f"{base}/top")[0] == 401
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_unreachable_apiserver_fails_closed_and_is_asked_again(kube: FakeKube, server):
    base, _ = server
    kube.go_down()
    code, body, _ = _get(f"{base}/metrics", VIEWER)
    assert code == 503 and body.startswith(b"cannot verify the token with the apiserver: tokenreviews:"), body
    kube.come_up()
    assert _get(f"{base}/metrics", VIEWER)[0] == 200  # the failure was not cached


def test_bad_authorization_headers_are_401_not_500(server):
    base, _ = server
    for header in ("Basic dXNlcjpwYXNz", "Bearer", "Bearer   ", "token abc"):
        request = urllib.request.Request(f"{base}/top", headers={"Authorization": header})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=10)
        assert e.value.code == 401, header


def test_dual_stack_listen_answers_ipv4_and_ipv6():
    srv, _ = start_http_server(_StubAgent(), "::", 0)
    try:
        port = srv.server_address[1]
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        if socket.has_ipv6 and _ipv6_loopback():
            assert _get(f"http://[::1]:{port}/healthz")[0] == 200
    finally:
        srv.shutdown()
        srv.server_close()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_agent_refuses_to_start_with_auth_but_no_apiserver(tmp_path: Path):
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "noisyneighbor.cli", "agent", "--auth", "kubernetes",
                          "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1], env=env)
    assert out.returncode == 2, out
    assert out.stderr.strip().startswith("noisyneighbor: endpoint auth needs the apiserver"), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.root
def test_the_real_agent_with_auth_kubernetes(kube: FakeKube, tmp_path: Path):
    """`noisyneighbor agent --auth kubernetes --auth-metrics`: /readyz open, /top and /metrics only with the grant."""
    token_file = tmp_path / "sa-token"
    token_file.write_text(AGENT_TOKEN)
    config = write_config(tmp_path / "config.yaml", {"kubernetes": {"pod_source": "standalone"}})
    agent = AgentProcess(config, tmp_path, "--interval", "0.5", "--probes", "runqlat", "--auth", "kubernetes",
                         "--auth-metrics", "--auth-apiserver", kube.url, "--auth-ca-file", str(kube.ca_file),
                         "--auth-token-file", str(token_file))
    try:
        agent.wait_ready()
        base = f"http://{agent.target}"
        assert _get(f"{base}/top?format=json")[0] == 401
        assert _get(f"{base}/metrics")[0] == 401
        assert _get(f"{base}/top?format=json", STRANGER)[0] == 403
        code, body, _ = _get(f"{base}/top?format=json", VIEWER)
        assert code == 200 and "cgroups" in json.loads(body), body[:300]
        code, body, _ = _get(f"{base}/metrics", VIEWER)
        assert code == 200 and b"noisyneighbor_" in body
    finally:
        agent.terminate()
