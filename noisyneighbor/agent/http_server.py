"""The agent's HTTP endpoints on one small threaded server: ``/metrics``, ``/healthz``, ``/readyz``, and the
read-only views `kubectl noisyneighbor` reads (``/top``, ``/diagnose``: noisyneighbor/agent/client_views.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

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


def metrics_body(exporter: Exporter | None, registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """(body, content type) of a /metrics scrape: the exporter's series and the registry's."""
    encoder, content_type = choose_encoder(accept)
    if exporter is None:
        return encoder(registry), content_type
    if content_type.startswith("text/plain"):
        return render_text(exporter) + encoder(registry), content_type
    both = CollectorRegistry(auto_describe=False)
    both.register(exporter)
    both.register(_RegistryCollector(registry))
    return encoder(both), content_type


def _handler_for(agent: Any) -> type[BaseHTTPRequestHandler]:
    """The request handler class bound to one agent: /metrics, /healthz, /readyz, /top, /diagnose."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
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


def start_http_server(agent: Any, host: str, port: int) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Serve ``agent.metrics()`` and ``agent.health()`` on host:port in a daemon thread."""
    Handler = _handler_for(agent)
    server_class = _DualStackServer if ":" in host else ThreadingHTTPServer
    try:
        server = server_class((host, port), Handler)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="agent-http", daemon=True)
    thread.start()
    return server, thread
