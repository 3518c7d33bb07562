# SPDX-License-Identifier: Apache-2.0
"""What every pod source shares: the :class:`PodSource` interface, its :class:`SourceStatus`, and the
last-good-list bookkeeping (:class:`_CachingSource`) that keeps pods resolvable through a stale source."""

from __future__ import annotations

import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from detector.pods.model import (
    PodInfo,
)

log = logging.getLogger("noisyneighbor.pods")



@dataclass(frozen=True, slots=True)
class SourceStatus:
    source: str  # "kubelet", "apiserver", "standalone"
    ok: bool
    reason: str = ""  # one line; empty when ok
    pods: int = 0

    @property
    def stale(self) -> bool:
        return not self.ok

    def __str__(self) -> str:
        return f"{self.source}: ok ({self.pods} pods)" if self.ok else f"{self.source}: stale: {self.reason}"


class PodSource(Protocol):
    name: str

    def pods(self) -> list[PodInfo]:
        """The last good list (never raises)."""

    def get(self, uid: str) -> PodInfo | None:
        """A pod by uid, also one that vanished less than the grace period ago."""

    @property
    def status(self) -> SourceStatus: ...

    def close(self) -> None: ...


class _CachingSource:
    """Last-good-list bookkeeping shared by every source."""

    name = "pods"

    def __init__(self, vanish_grace_seconds: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.vanish_grace_seconds = vanish_grace_seconds
        self._clock = clock
        self._lock = threading.RLock()
        self._pods: dict[str, PodInfo] = {}
        self._gone: dict[str, tuple[PodInfo, float]] = {}
        self._ok = False
        self._reason = "no pod list yet"
        # The list ``pods`` handed out, kept until the pods change (None: made again on the next call): the
        # same object tick after tick lets a reader (the detector's workload index, every tick) tell by
        # identity that nothing changed instead of walking every pod. Readers do not modify it.
        self._listed: list[PodInfo] | None = None

    def pods(self) -> list[PodInfo]:
        with self._lock:
            if self._listed is None:
                self._listed = list(self._pods.values())
            return self._listed

    def get(self, uid: str) -> PodInfo | None:
        # Without the lock first: the exporter asks for every pod's record on each scrape, and _pods is
        # only replaced whole or set one key at a time (a dict lookup is atomic under the GIL).
        pod = self._pods.get(uid)
        if pod is not None:
            return pod
        with self._lock:
            pod = self._pods.get(uid)
            if pod is not None:
                return pod
            gone = self._gone.get(uid)
            if gone is not None and self._clock() - gone[1] <= self.vanish_grace_seconds:
                return gone[0]
            return None

    @property
    def status(self) -> SourceStatus:
        with self._lock:
            return SourceStatus(self.name, self._ok, "" if self._ok else self._reason, len(self._pods))

    def close(self) -> None:
        return None

    # -- for subclasses ---------------------------------------------------------------------
    def _replace_all(self, pods: Iterable[PodInfo]) -> None:
        with self._lock:
            # A pod whose record is equal to the one held keeps that object: readers that keep what they
            # built from a record for as long as it is the same object (the exporter's series labels)
            # then rebuild only for pods that changed, not for all of them after every poll.
            # One walk of the listed pods; what is left of the held ones after it is gone.
            held = self._pods
            vanished = dict(held)
            new = {}
            for p in pods:
                old = held.get(p.uid)
                new[p.uid] = old if old is not None and old == p else p
                vanished.pop(p.uid, None)
                self._gone.pop(p.uid, None)
            now = self._clock()
            for uid, old in vanished.items():
                self._gone[uid] = (old, now)
            if list(new) != list(held) or any(held[uid] is not p for uid, p in new.items()):
                self._listed = None  # another pod, record or order: a new list
            self._pods = new
            self._succeeded()

    def _upsert(self, pod: PodInfo) -> None:
        with self._lock:
            self._pods[pod.uid] = pod
            self._gone.pop(pod.uid, None)
            self._listed = None

    def _remove(self, uid: str) -> None:
        with self._lock:
            old = self._pods.pop(uid, None)
            if old is not None:
                self._gone[uid] = (old, self._clock())
                self._listed = None

    def _succeeded(self) -> None:
        now = self._clock()
        self._ok, self._reason = True, ""
        self._gone = {u: g for u, g in self._gone.items() if now - g[1] <= self.vanish_grace_seconds}

    def _failed(self, reason: str) -> None:
        with self._lock:
            reason = " ".join(reason.split())  # one line, whatever the exception text was
            if self._ok or reason != self._reason:
                log.warning("%s pod source stale: %s", self.name, reason)
            self._ok, self._reason = False, reason


def _describe_error(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        inner = e.reason
        if isinstance(inner, ssl.SSLCertVerificationError):
            return f"TLS verification failed: {inner.verify_message}"
        if isinstance(inner, OSError) and inner.strerror:
            return inner.strerror.lower()
        return str(inner)
    if isinstance(e, ConnectionError | TimeoutError | OSError):
        return (e.strerror or type(e).__name__).lower() if isinstance(e, OSError) and e.strerror else type(e).__name__
    return f"{type(e).__name__}: {e}"

