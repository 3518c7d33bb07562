# SPDX-License-Identifier: Apache-2.0
"""The agent's HTTP endpoints on one small threaded server: ``/metrics``, ``/healthz``, ``/readyz``, and the
read-only views `kubectl noisyneighbor` reads (``/top``, ``/diagnose``: noisyneighbor/agent/client_views.py).

With an :class:`~noisyneighbor.agent.auth.RequestAuthorizer`, ``/top`` and ``/diagnose`` (and ``/metrics``
when it protects them) answer only callers the apiserver vouches for; ``/healthz`` and ``/readyz`` stay open
for the kubelet. ``[::]`` listens on IPv6 and IPv4 (one dual-stack socket) and falls back to ``0.0.0.0``
on a node whose kernel has IPv6 off."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from noisyneighbor.agent.auth import FORWARDED_TOKEN_HEADER, RequestAuthorizer
from noisyneighbor.agent.client_views import BadRequest, diagnose_response
from noisyneighbor.agent.logs import _one_line
from noisyneighbor.exporter import Exporter, render_text

log = logging.getLogger("noisyneighbor.agent")


class _RegistryCollector:
    """A registry's families as one collector (to scrape two registries as one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Any]:
        return self.registry.collect()


class _DualStackServer(ThreadingHTTPServer):
    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        # IPv4 too, whatever net.ipv6.bindv6only says: '[::]' must also answer an IPv4-only cluster's probes.
        with contextlib.suppress(OSError):
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


# IPv6 is off on this node (ipv6.disable=1, or no IPv6 address to bind): '[::]' falls back to IPv4.
_NO_IPV6 = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT)


def metrics_body(exporter: Exporter | None, registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """(body, content type) of a /metrics scrape: the exporter's series and the registry's."""
    encoder, content_type = choose_encoder(accept)
    if exporter is None:
        return encoder(registry), content_type
    if content_type.startswith("text/plain"):
        return render_text(exporter, tail=encoder(registry)), content_type  # one buffer of the body
    both = CollectorRegistry(auto_describe=False)
    both.register(exporter)
    both.register(_RegistryCollector(registry))
    return encoder(both), content_type


def _handler_for(agent: Any, authorizer: RequestAuthorizer | None) -> type[BaseHTTPRequestHandler]:
    """The request handler class bound to one agent: /metrics, /healthz, /readyz, /top, /diagnose."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if authorizer is not None and authorizer.needs_auth(path) and not self._allowed(path):
                    return
                if path == "/metrics":
                    self._send(200, *agent.metrics(self.headers.get("Accept", "")))
                elif path in ("/healthz", "/readyz"):
                    health = agent.health()
                    ok = health["live"] if path == "/healthz" else health["ready"]
                    body = json.dumps(health, sort_keys=True).encode() + b"\n"
                    self._send(200 if ok else 503, body, "application/json")
                elif path == "/top" and getattr(agent, "top", None) is not None:
                    # The first request waits for the agent's next tick (an interval needs two readings).
                    self._view(lambda: agent.top.respond(self.path, wait_s=2 * agent.interval_s + 1))
                elif path == "/diagnose" and getattr(agent, "detector", None) is not None:
                    self._view(lambda: diagnose_response(agent, self.path))
                else:
                    self._send(404, b"not found: try /metrics, /healthz, /readyz, /top or /diagnose\n", "text/plain")
            except Exception as e:  # a scrape must never take the server down
                log.error("HTTP %s failed: %s", path, _one_line(e))
                with contextlib.suppress(Exception):
                    self._send(500, f"{_one_line(e)}\n".encode(), "text/plain")

        def _allowed(self, path: str) -> bool:
            assert authorizer is not None
            verdict = authorizer.authorize(
                self.headers.get("Authorization") or self.headers.get(FORWARDED_TOKEN_HEADER), path)
            if verdict.code == 200:
                return True
            if verdict.code == 503:
                log.warning("HTTP %s refused: %s", path, verdict.reason)
            body = f"{verdict.reason}\n".encode()
            self.send_response(verdict.code)
            if verdict.code == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="noisyneighbor"')
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return False

        def _view(self, respond: Callable[[], tuple[int, bytes, str]]) -> None:
            try:
                code, body, content_type = respond()
            except BadRequest as e:
                code, body, content_type = 400, f"{e}\n".encode(), "text/plain"
            self._send(code, body, content_type)
            del body  # the response is the largest block the view made: freed before the trim, not after
            # A view builds and frees a frame's worth of objects in this request thread's malloc arena: give
            # the free pages back after every view (a fraction of a millisecond; a client asks at most a
            # few times a second), so a client leaves no RSS behind in the agent. Rate-limited, the trim
            # after a client's last request was mostly skipped and its pages stayed until the next tick's.
            returner = getattr(agent, "_free_memory", None)
            if returner is not None:
                returner.maybe_trim(every_s=0.0)

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # scrapes are not worth a log line
            return None

    return Handler


def start_http_server(agent: Any, host: str, port: int,
                      authorizer: RequestAuthorizer | None = None) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Serve ``agent.metrics()`` and ``agent.health()`` on host:port in a daemon thread."""
    Handler = _handler_for(agent, authorizer)
    server_class = _DualStackServer if ":" in host else ThreadingHTTPServer
    try:
        try:
            server = server_class((host, port), Handler)
        except OSError as e:
            if host != "::" or e.errno not in _NO_IPV6:
                raise
            log.warning("IPv6 unavailable (%s): listening on 0.0.0.0:%d instead of [::]", e.strerror or e, port)
            host = "0.0.0.0"
            server = ThreadingHTTPServer((host, port), Handler)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="agent-http", daemon=True)
    thread.start()
    return server, thread
