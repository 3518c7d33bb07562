# SPDX-License-Identifier: Apache-2.0
"""Incidents as Kubernetes Events on the victim pod, so ``kubectl describe pod`` shows them.

One Event per (incident, victim pod), named ``<pod>.nn<hash of the incident id>`` like the kubelet's
``<pod>.<hex>`` names. Posting the same incident again bumps ``count`` and ``lastTimestamp`` on that
Event (the aggregation client-go's recorder does) instead of making a new object; repeats closer
together than ``min_update_interval`` seconds are counted locally and sent with the next update, so
a long incident costs the apiserver one PATCH per interval, not one per detector tick.

Nothing here raises into the detector: an unreachable apiserver, a 403 or a malformed answer is
logged on one line and ``post`` returns False.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from detector.model import Incident

log = logging.getLogger("noisyneighbor.events")

REASON_DETECTED = "InterferenceDetected"
REASON_RESOLVED = "InterferenceResolved"
COMPONENT = "noisyneighbor"
_MAX_MESSAGE = 1024  # events.k8s.io caps note at 1 KiB; keep core/v1 events the same


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_name(pod: str, incident_id: str) -> str:
    digest = hashlib.sha1(incident_id.encode(), usedforsecurity=False).hexdigest()[:12]
    return f"{pod[:240]}.nn{digest}"


def incident_message(incident: Incident) -> str:
    """One line: cause, the signal that broke its SLO, the top culprit and the confidence."""
    parts = [f"{incident.cause}: {incident.signal} over SLO"]
    ev = next((e for e in incident.evidence if e.signal == incident.signal), None)
    if ev is not None:
        bound = f" > {ev.threshold:g}" if ev.threshold is not None else ""
        parts[0] = f"{incident.cause}: {incident.signal}={ev.value:g}{bound} over {ev.window_s:g}s"
    if incident.culprits:
        top = incident.culprits[0]
        culprit = f"top culprit {top.target.display} (score {top.score:.2f}"
        if top.who_ran_instead_share:
            culprit += f", ran {top.who_ran_instead_share:.0%} of the victim's wait"
        if top.cpu_cores:
            culprit += f", {top.cpu_cores:.2f} cores"
        parts.append(culprit + ")")
        if len(incident.culprits) > 1:
            parts.append(f"{len(incident.culprits) - 1} more")
    else:
        parts.append("no culprit identified")
    parts.append(f"confidence {incident.confidence:.2f}")
    if not incident.open:
        parts.insert(0, "resolved")
    msg = "; ".join(parts) + f" [incident {incident.incident_id}]"
    msg = " ".join(msg.split())
    return msg if len(msg) <= _MAX_MESSAGE else msg[: _MAX_MESSAGE - 3] + "..."


@dataclass
class _Posted:
    namespace: str
    name: str
    count: int  # what the apiserver has
    pending: int  # repeats not yet sent
    last_sent: float
    resolved: bool = False


class IncidentEventPoster:
    """Posts incidents as core/v1 Events through the kubernetes client."""

    def __init__(
        self,
        api_client: Any,
        *,
        node_name: str | None = None,
        min_update_interval: float = 10.0,
        request_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
        max_tracked: int = 4096,
    ) -> None:
        self._api_client = api_client
        self.node_name = node_name
        self.min_update_interval = min_update_interval
        self.request_timeout = request_timeout
        self._clock = clock
        self._max_tracked = max_tracked
        self._posted: dict[tuple[str, str], _Posted] = {}
        self.failures = 0

    @functools.cached_property
    def api(self) -> Any:
        """CoreV1Api, built at the first Event: the generated client costs ~19 MiB of RSS, which a
        node without incidents never needs to pay."""
        from kubernetes import client

        return client.CoreV1Api(self._api_client)

    def post(self, incident: Incident) -> bool:
        """Create or update the Event for this incident; False (logged) when not posted. Never raises."""
        victim = incident.victim
        if not victim.pod or not victim.namespace:
            log.debug("incident %s: victim %s is not a pod, no Event", incident.incident_id, victim.display)
            return False
        key = (incident.incident_id, f"{victim.namespace}/{victim.pod}")
        now = self._clock()
        try:
            posted = self._posted.get(key)
            if posted is None:
                return self._create(key, incident, now)
            resolved_now = not incident.open and not posted.resolved
            posted.pending += 1
            if not resolved_now and now - posted.last_sent < self.min_update_interval:
                return True  # aggregated; sent with the next update
            return self._update(posted, incident, now)
        except Exception as e:  # the apiserver must never take the detector down
            self.failures += 1
            log.warning("cannot post Event for incident %s on %s/%s: %s", incident.incident_id, victim.namespace,
                        victim.pod, _one_line(e))
            return False

    def _body(self, incident: Incident, name: str, now: float, count: int) -> dict[str, Any]:
        v = incident.victim
        involved: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "namespace": v.namespace, "name": v.pod}
        if v.pod_uid:
            involved["uid"] = v.pod_uid
        source: dict[str, Any] = {"component": COMPONENT}
        if self.node_name:
            source["host"] = self.node_name
        return {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": v.namespace, "labels": {"app.kubernetes.io/name": COMPONENT}},
            "involvedObject": involved,
            "reason": REASON_DETECTED if incident.open else REASON_RESOLVED,
            "message": incident_message(incident),
            "type": "Warning" if incident.open else "Normal",
            "count": count,
            "firstTimestamp": _iso(incident.started_at or now),
            "lastTimestamp": _iso(now),
            "source": source,
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node_name or "",
        }

    def _create(self, key: tuple[str, str], incident: Incident, now: float) -> bool:
        from kubernetes.client.exceptions import ApiException

        v = incident.victim
        name = event_name(v.pod or "", incident.incident_id)
        try:
            self.api.create_namespaced_event(v.namespace, self._body(incident, name, now, 1),
                                             _request_timeout=self.request_timeout)
            count = 1
        except ApiException as e:
            if e.status != 409:
                raise
            # Posted before (by a previous run of the agent): continue its count.
            existing = self.api.read_namespaced_event(name, v.namespace, _request_timeout=self.request_timeout)
            count = (existing.count or 1) + 1
            self.api.patch_namespaced_event(name, v.namespace, self._patch(incident, now, count),
                                            _request_timeout=self.request_timeout)
        if len(self._posted) >= self._max_tracked:
            self._posted.pop(next(iter(self._posted)))  # oldest first: dicts keep insertion order
        self._posted[key] = _Posted(v.namespace or "", name, count, 0, now, resolved=not incident.open)
        return True

    def _patch(self, incident: Incident, now: float, count: int) -> dict[str, Any]:
        return {
            "count": count, "lastTimestamp": _iso(now), "message": incident_message(incident),
            "reason": REASON_DETECTED if incident.open else REASON_RESOLVED,
            "type": "Warning" if incident.open else "Normal",
        }

    def _update(self, posted: _Posted, incident: Incident, now: float) -> bool:
        count = posted.count + posted.pending
        self.api.patch_namespaced_event(posted.name, posted.namespace, self._patch(incident, now, count),
                                        _request_timeout=self.request_timeout)
        posted.count, posted.pending, posted.last_sent = count, 0, now
        posted.resolved = not incident.open
        return True

    def flush(self) -> None:
        """Send counts still held back by ``min_update_interval`` (e.g. at shutdown)."""
        for posted in self._posted.values():
            if posted.pending:
                try:
                    count = posted.count + posted.pending
                    self.api.patch_namespaced_event(posted.name, posted.namespace,
                                                    {"count": count, "lastTimestamp": _iso(self._clock())},
                                                    _request_timeout=self.request_timeout)
                    posted.count, posted.pending = count, 0
                except Exception as e:
                    self.failures += 1
                    log.warning("cannot update Event %s/%s: %s", posted.namespace, posted.name, _one_line(e))


def _one_line(e: BaseException) -> str:
    status = getattr(e, "status", None)
    if isinstance(status, int) and status:
        return f"HTTP {status} {getattr(e, 'reason', '') or ''}".strip()
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"[:200]
