# SPDX-License-Identifier: Apache-2.0
"""List + watch ``/api/v1/pods`` of one node through the apiserver, as a pod source."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from detector.pods.model import (
    PodParseError,
    pod_from_dict,
    pods_from_list,
)
from detector.pods.source import _CachingSource

log = logging.getLogger("noisyneighbor.pods")


class ApiserverPodSource(_CachingSource):
    """List + watch the pods of one node through the apiserver, in a background thread.

    The watch resumes from the last resourceVersion it saw; an expired version (410, as an ERROR
    event or an HTTP status) or a broken stream makes it relist. Relists use backoff on failure.
    """

    name = "apiserver"

    def __init__(
        self,
        api_client: Any,
        node_name: str,
        *,
        watch_timeout_seconds: int = 300,
        request_timeout: float = 10.0,
        max_backoff: float = 10.0,
        vanish_grace_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(vanish_grace_seconds, clock)
        if not node_name:
            raise ValueError("ApiserverPodSource needs a node name (policy kubernetes.node_name or NODE_NAME)")
        from kubernetes import client

        self.api = client.CoreV1Api(api_client)
        self.node_name = node_name
        self.watch_timeout_seconds = watch_timeout_seconds
        self.request_timeout = request_timeout
        self.max_backoff = max_backoff
        self.relists = 0
        self._rv: str | None = None
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()  # set after the first good list

    @classmethod
    def in_cluster(cls, node_name: str, **kwargs: Any) -> ApiserverPodSource:
        from kubernetes import client, config

        config.load_incluster_config()
        return cls(client.ApiClient(), node_name, **kwargs)

    def start(self) -> ApiserverPodSource:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="apiserver-pods", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            # Closing the response does not wake a thread blocked reading it; shutting the socket does.
            sock = _socket_of(resp)
            with contextlib.suppress(Exception):
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
                resp.close()
        if self._thread is not None:
            self._thread.join(timeout=self.request_timeout + 2)

    @property
    def _selector(self) -> str:
        return f"spec.nodeName={self.node_name}"

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            if self._rv is None:
                if not self._list():
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                backoff = 0.5
            self._watch()

    def _list(self) -> bool:
        try:
            resp = self.api.list_pod_for_all_namespaces(
                field_selector=self._selector, _preload_content=False, _request_timeout=self.request_timeout,
            )
            doc = json.loads(resp.data)
            pods = pods_from_list(doc)
            rv = (doc.get("metadata") or {}).get("resourceVersion")
        except Exception as e:  # kubernetes ApiException, urllib3 errors, JSON errors
            self._failed(f"apiserver list failed: {_describe_api_error(e)}")
            return False
        self.relists += 1
        self._rv = str(rv) if rv else None
        self._replace_all(pods)
        self.synced.set()
        return self._rv is not None

    def _watch(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        try:
            resp = self.api.list_pod_for_all_namespaces(
                field_selector=self._selector, watch=True, resource_version=self._rv, allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_seconds, _preload_content=False,
                _request_timeout=(self.request_timeout, self.watch_timeout_seconds + self.request_timeout),
            )
        except Exception as e:
            if getattr(e, "status", None) == 410:
                self._rv = None  # expired: relist
                return
            self._failed(f"apiserver watch failed: {_describe_api_error(e)}")
            self._rv = None
            self._stop.wait(0.5)
            return
        self._resp = resp
        try:
            if self._stop.is_set():  # close() ran while the request was in flight: it saw no response
                return
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    return
                if not line:
                    continue
                if not self._apply(line):
                    self._rv = None  # relist
                    return
        except Exception as e:
            if not self._stop.is_set():
                self._failed(f"apiserver watch broke: {_describe_api_error(e)}")
                self._rv = None
        finally:
            self._resp = None
            with contextlib.suppress(Exception):
                resp.release_conn()

    def _apply(self, line: str | bytes) -> bool:
        """One watch event; False when the watch must relist."""
        try:
            event = json.loads(line)
            kind, obj = event["type"], event["object"]
        except (ValueError, KeyError, TypeError) as e:
            self._failed(f"apiserver watch sent a malformed event: {type(e).__name__}")
            return False
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, Mapping) else None
            if code != 410:
                self._failed(f"apiserver watch error {code}: {obj.get('message') if isinstance(obj, Mapping) else obj}")
            return False  # 410 Expired (normal after compaction) or any other error: relist
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None  # metadata may be anything
        if kind == "BOOKMARK":
            self._rv = str(rv) if rv else self._rv
            return True
        try:
            pod = pod_from_dict(obj)
        except PodParseError as e:
            log.warning("apiserver watch: skipping %s event: %s", kind, e)
            return True
        if kind == "DELETED":
            self._remove(pod.uid)
        elif kind in ("ADDED", "MODIFIED"):
            self._upsert(pod)
        if rv:
            self._rv = str(rv)
        with self._lock:
            self._succeeded()
        return True


def _socket_of(resp: Any) -> socket.socket | None:
    """The socket a urllib3 response reads from (the connection may already have handed it over)."""
    conn = getattr(resp, "connection", None) or getattr(resp, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is None:
        raw = getattr(getattr(getattr(resp, "_fp", None), "fp", None), "raw", None)
        sock = getattr(raw, "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _describe_api_error(e: BaseException) -> str:
    status = getattr(e, "status", None)
    if isinstance(status, int) and status:
        reason = getattr(e, "reason", "") or ""
        return f"HTTP {status} {reason}".strip()
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{type(e).__name__}: {text}"[:200]

