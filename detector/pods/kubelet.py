# SPDX-License-Identifier: Apache-2.0
"""The kubelet's ``GET /pods`` as a pod source (HTTPS 10250 with a token and CA, or the read-only port), polled."""

from __future__ import annotations

import json
import os
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from detector.pods.model import (
    PodInfo,
    PodParseError,
    pods_from_list,
)
from detector.pods.source import _CachingSource, _describe_error
from detector.policy import Policy


class KubeletPodSource(_CachingSource):
    """The kubelet's ``/pods``, polled at most every ``refresh_interval`` seconds.

    ``pods()`` refreshes inline when the list is older than ``refresh_interval``, unless
    :meth:`start` runs the polling in a background thread (then ``pods()`` never blocks).
    The token file is re-read on every request: projected service-account tokens rotate.
    An empty list right after a non-empty one is believed only after ``empty_confirmations``
    refreshes in a row: a restarting kubelet serves an empty list until it has synced.
    """

    name = "kubelet"

    def __init__(
        self,
        url: str = "https://127.0.0.1:10250",
        *,
        token_file: str | None = None,
        ca_file: str | None = None,
        insecure_skip_verify: bool = False,
        timeout: float = 2.0,
        refresh_interval: float = 5.0,
        empty_confirmations: int = 3,
        vanish_grace_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(vanish_grace_seconds, clock)
        self.url = url.rstrip("/") + "/pods"
        self.token_file = token_file
        self.timeout = timeout
        self.refresh_interval = refresh_interval
        self.empty_confirmations = empty_confirmations
        self._empty_seen = 0
        self._last_body: bytes | None = None  # the last body parsed into the current list
        self._last_attempt: float | None = None
        self._ssl: ssl.SSLContext | None = None
        self._ssl_error: str | None = None
        if self.url.startswith("https:"):
            try:
                self._ssl = ssl.create_default_context(cafile=ca_file if ca_file and not insecure_skip_verify else None)
            except (OSError, ssl.SSLError) as e:
                self._ssl_error = f"cannot load CA file {ca_file}: {_describe_error(e)}"
                self._ssl = ssl.create_default_context()
            if insecure_skip_verify:
                self._ssl.check_hostname = False
                self._ssl.verify_mode = ssl.CERT_NONE
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @classmethod
    def from_policy(cls, policy: Policy, environ: Mapping[str, str] | None = None, **kwargs: Any) -> KubeletPodSource:
        """Raises ValueError (one line) when the URL names an environment variable that is not set."""
        url = expand_kubelet_url(policy.kubelet_url, os.environ if environ is None else environ)
        if policy.kubelet_read_only_port:
            host = urllib.parse.urlsplit(url).hostname or "127.0.0.1"
            return cls(f"http://{_url_host(host)}:{policy.kubelet_read_only_port}", **kwargs)
        return cls(
            url, token_file=policy.kubelet_token_file, ca_file=policy.kubelet_ca_file,
            insecure_skip_verify=policy.kubelet_insecure_skip_verify, **kwargs,
        )

    def pods(self) -> list[PodInfo]:
        if self._thread is None:
            last = self._last_attempt
            if last is None or self._clock() - last >= self.refresh_interval:
                self.refresh()
        return super().pods()

    def start(self) -> KubeletPodSource:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kubelet-pods", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.refresh_interval)

    def refresh(self) -> bool:
        """One ``GET /pods``; True when it gave a new good list. Never raises."""
        self._last_attempt = self._clock()
        try:
            body = self._fetch()
        except Exception as e:  # any failure leaves the last good list in place
            self._failed(f"kubelet {self.url} unreachable: {_describe_error(e)}")
            return False
        if body == self._last_body and self._ok:
            # The kubelet serves the same bytes while nothing about its pods changed: parsing them
            # again (the agent's largest cost between pod changes) would give the same list.
            with self._lock:
                self._succeeded()
            return True
        try:
            doc = json.loads(body)
            pods = pods_from_list(doc)
        except (ValueError, PodParseError) as e:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            self._failed(f"kubelet {self.url} returned malformed JSON: {msg}")
            return False
        with self._lock:
            if not pods and self._pods:
                self._empty_seen += 1
                if self._empty_seen < self.empty_confirmations:
                    self._failed(
                        f"kubelet returned an empty pod list ({self._empty_seen}/{self.empty_confirmations}); "
                        f"keeping the last {len(self._pods)} pods"
                    )
                    return False
            self._empty_seen = 0
            self._replace_all(pods)
            self._last_body = body
        return True

    def _fetch(self) -> bytes:
        headers = {"Accept": "application/json"}
        if self.token_file and self.url.startswith("https:"):
            token = Path(self.token_file).read_text(encoding="utf-8").strip()
            headers["Authorization"] = f"Bearer {token}"
        if self._ssl_error:
            raise OSError(self._ssl_error)
        req = urllib.request.Request(self.url, headers=headers)
        with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
            return resp.read()


_ENV_REF = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


def expand_kubelet_url(url: str, environ: Mapping[str, str]) -> str:
    """``https://${HOST_IP:-127.0.0.1}:10250`` -> the node's address from the environment.

    In a pod, 127.0.0.1 is the pod's own loopback, not the node's: the DaemonSet puts the node IP in
    ``HOST_IP`` (downward API ``status.hostIP``) and the URL names it. An IPv6 address gets the
    brackets a URL needs. ``${NAME}`` without a default and unset is a ValueError (one line)."""

    def value(m: re.Match[str]) -> str:
        name, default = m.group("name"), m.group("default")
        got = environ.get(name) or default
        if got is None:
            raise ValueError(f"kubelet_url {url}: environment variable {name} is not set "
                             "(the DaemonSet sets HOST_IP from status.hostIP)")
        return _url_host(got)

    return _ENV_REF.sub(value, url)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
