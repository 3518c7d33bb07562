"""Pod metadata for the detector: who a cgroup belongs to, its QoS class, requests, priority, owner.

Sources, behind one small interface (:class:`PodSource`): ``pods()`` returns the last good list and
never raises; ``status`` says ``ok`` or stale with a one-line reason.

- :class:`KubeletPodSource`: the kubelet's ``GET /pods`` (HTTPS 10250 with the service-account
  token and a CA, or the plain read-only port), polled.
- :class:`ApiserverPodSource`: list + watch ``/api/v1/pods`` filtered by ``spec.nodeName`` through
  the kubernetes client, in a background thread; relists when the watch expires (410) or breaks.
- :class:`StandalonePodSource`: no Kubernetes. Entities are cgroups named by path (systemd units,
  docker/containerd scopes), classed LS/BE by the policy's ``ls_cgroups``/``be_cgroups`` globs.

Failure handling is the same everywhere: a kubelet restart (refused/reset), malformed JSON, an
error status or an empty list right after a non-empty one keep the last good data and mark the
source stale; pods that vanish stay resolvable for ``vanish_grace_seconds``, because the samples of
the window being evaluated were taken while they still ran.

:class:`PodIndex` maps a cgroup path to its :class:`PodInfo` (through
``detector.cgroups.parse_cgroup_path``) and builds the :class:`~detector.decisions.Target` for it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from detector.cgroups import parse_cgroup_path
from detector.decisions import Target
from detector.policy import Policy
from detector.quantity import parse_quantity
from probes.cgroupfs import CgroupLayout, discover
from probes.host import HostPaths

log = logging.getLogger("noisyneighbor.pods")

QOS_LABEL = "koordinator.sh/qosClass"
EVICTION_PRIORITY_ANNOTATION = "koordinator.sh/eviction-priority"
BATCH_CPU = "kubernetes.io/batch-cpu"  # milli-cores, as an integer quantity
BATCH_MEMORY = "kubernetes.io/batch-memory"
KOORD_QOS_CLASSES = ("SYSTEM", "LSE", "LSR", "LS", "BE")
_K8S_QOS_TO_KOORD = {"Guaranteed": "LS", "Burstable": "LS", "BestEffort": "BE"}
_PATH_QOS_TO_KOORD = {"guaranteed": "LS", "burstable": "LS", "besteffort": "BE"}


class PodParseError(ValueError):
    """A pod object that is not a pod (missing uid/name); one line."""


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    name: str
    container_id: str | None = None  # the runtime's id without the "containerd://" prefix
    runtime: str | None = None  # containerd, cri-o, docker
    cpu_request_cores: float | None = None
    cpu_limit_cores: float | None = None
    memory_request_bytes: int | None = None
    memory_limit_bytes: int | None = None
    # Koordinator BE pods request these extended resources instead of cpu/memory.
    batch_cpu_request_milli: int | None = None
    batch_cpu_limit_milli: int | None = None
    batch_memory_request_bytes: int | None = None
    batch_memory_limit_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    qos_class: str | None  # koordinator: SYSTEM, LSE, LSR, LS, BE (None: unclassed standalone entity)
    k8s_qos: str | None = None  # Guaranteed, Burstable, BestEffort
    priority: int | None = None
    owner_kind: str | None = None
    owner_name: str | None = None
    phase: str | None = None
    deletion_timestamp: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    containers: tuple[ContainerInfo, ...] = ()
    node_name: str | None = None
    start_time: float | None = None  # epoch seconds
    cgroup_path: str | None = None  # standalone entities only: the cgroup that is the entity

    @property
    def terminating(self) -> bool:
        return self.deletion_timestamp is not None

    @property
    def display(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def eviction_priority(self) -> int | None:
        """``koordinator.sh/eviction-priority``: lower is evicted first; None when absent or bad."""
        raw = self.annotations.get(EVICTION_PRIORITY_ANNOTATION)
        try:
            return int(raw) if raw is not None else None
        except ValueError:
            return None

    def _sum(self, attr: str) -> float | None:
        values = [getattr(c, attr) for c in self.containers if getattr(c, attr) is not None]
        return sum(values) if values else None

    @property
    def cpu_request_cores(self) -> float:
        """cpu requests plus batch-cpu requests, in cores (0 when none)."""
        cpu = self._sum("cpu_request_cores") or 0.0
        batch = self._sum("batch_cpu_request_milli") or 0
        return cpu + batch / 1000.0

    @property
    def cpu_limit_cores(self) -> float | None:
        """None when some container has no cpu (or batch-cpu) limit: the pod is unlimited."""
        total = 0.0
        for c in self.containers:
            if c.cpu_limit_cores is not None:
                total += c.cpu_limit_cores
            elif c.batch_cpu_limit_milli is not None:
                total += c.batch_cpu_limit_milli / 1000.0
            else:
                return None
        return total if self.containers else None

    @property
    def memory_request_bytes(self) -> int:
        return int((self._sum("memory_request_bytes") or 0) + (self._sum("batch_memory_request_bytes") or 0))

    def container(self, container_id: str) -> ContainerInfo | None:
        return next((c for c in self.containers if c.container_id == container_id), None)


def _quantity(raw: Any) -> Decimal | None:
    """A Kubernetes quantity ("500m", "1Gi", "2", "1e3") or None when absent or not a quantity."""
    if raw is None:
        return None
    try:
        return parse_quantity(raw)
    except ValueError:
        return None


def _as_float(q: Decimal | None) -> float | None:
    return float(q) if q is not None else None


def _as_int(q: Decimal | None) -> int | None:
    return int(q) if q is not None else None


def _parse_time(raw: Any) -> float | None:
    if not isinstance(raw, str):
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def koord_qos_class(labels: Mapping[str, str], k8s_qos: str | None) -> str:
    """Koordinator's class: the ``koordinator.sh/qosClass`` label, else mapped from the k8s QoS."""
    label = labels.get(QOS_LABEL)
    if label in KOORD_QOS_CLASSES:
        return label
    return _K8S_QOS_TO_KOORD.get(k8s_qos or "", "LS")


def _k8s_qos_from_spec(containers: list[Any]) -> str:
    """What the apiserver computes into status.qosClass, for objects that do not carry it."""
    guaranteed, any_set = True, False
    for c in containers:
        res = (c.get("resources") or {}) if isinstance(c, Mapping) else {}
        req, lim = dict(res.get("requests") or {}), dict(res.get("limits") or {})
        for k, v in lim.items():
            req.setdefault(k, v)
        any_set = any_set or bool(req or lim)
        for r in ("cpu", "memory"):
            if r not in lim or _quantity(lim.get(r)) != _quantity(req.get(r)):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def pod_from_dict(obj: Any) -> PodInfo:
    """A :class:`PodInfo` from a v1 Pod as JSON (camelCase); raises :class:`PodParseError`."""
    try:
        return _pod_from_dict(obj)
    except PodParseError:
        raise
    except (TypeError, AttributeError, ValueError, ArithmeticError) as e:
        # A field of the wrong type deep inside (labels as a list, ownerReferences as a bool...):
        # the pod is skipped with one line, the rest of the list and the tick go on.
        raise PodParseError(f"malformed pod: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def _pod_from_dict(obj: Any) -> PodInfo:
    if not isinstance(obj, Mapping):
        raise PodParseError(f"pod is not an object but {type(obj).__name__}")
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("uid") or not meta.get("name"):
        raise PodParseError("pod without metadata.uid or metadata.name")
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    spec_containers = [c for c in (spec.get("containers") or []) if isinstance(c, Mapping)]
    k8s_qos = status.get("qosClass") or _k8s_qos_from_spec(spec_containers)
    ids: dict[str, tuple[str | None, str | None]] = {}
    for cs in status.get("containerStatuses") or []:
        if isinstance(cs, Mapping) and cs.get("name"):
            runtime, _, cid = str(cs.get("containerID") or "").partition("://")
            ids[str(cs["name"])] = (cid or None, runtime or None)
    containers = []
    for c in spec_containers:
        res = c.get("resources") or {}
        req, lim = dict(res.get("requests") or {}), dict(res.get("limits") or {})
        for k, v in lim.items():
            req.setdefault(k, v)  # the apiserver defaults requests to limits
        cid, runtime = ids.get(str(c.get("name")), (None, None))
        containers.append(ContainerInfo(
            name=str(c.get("name")), container_id=cid, runtime=runtime,
            cpu_request_cores=_as_float(_quantity(req.get("cpu"))),
            cpu_limit_cores=_as_float(_quantity(lim.get("cpu"))),
            memory_request_bytes=_as_int(_quantity(req.get("memory"))),
            memory_limit_bytes=_as_int(_quantity(lim.get("memory"))),
            batch_cpu_request_milli=_as_int(_quantity(req.get(BATCH_CPU))),
            batch_cpu_limit_milli=_as_int(_quantity(lim.get(BATCH_CPU))),
            batch_memory_request_bytes=_as_int(_quantity(req.get(BATCH_MEMORY))),
            batch_memory_limit_bytes=_as_int(_quantity(lim.get(BATCH_MEMORY))),
        ))
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, Mapping)]
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    priority = spec.get("priority")
    return PodInfo(
        uid=str(meta["uid"]), namespace=str(meta.get("namespace") or ""), name=str(meta["name"]),
        qos_class=koord_qos_class(labels, k8s_qos), k8s_qos=k8s_qos,
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else None,
        owner_kind=owner.get("kind") if owner else None, owner_name=owner.get("name") if owner else None,
        phase=status.get("phase"), deletion_timestamp=meta.get("deletionTimestamp"),
        labels=labels, annotations=annotations, containers=tuple(containers),
        node_name=spec.get("nodeName"), start_time=_parse_time(status.get("startTime")),
    )


def pods_from_list(obj: Any) -> list[PodInfo]:
    """Pods from a v1 PodList; items that are not pods are skipped (logged), the rest kept."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("items", []), list):
        raise PodParseError("response is not a PodList")
    out = []
    for item in obj.get("items") or []:
        try:
            out.append(pod_from_dict(item))
        except PodParseError as e:
            log.warning("skipping a pod in the list: %s", e)
    return out


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceStatus:
    source: str  # "kubelet", "apiserver", "standalone"
    ok: bool
    reason: str = ""  # one line; empty when ok
    last_success: float | None = None  # time.time() of the last good list
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
        self._last_success: float | None = None

    def pods(self) -> list[PodInfo]:
        with self._lock:
            return list(self._pods.values())

    def get(self, uid: str) -> PodInfo | None:
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
            return SourceStatus(self.name, self._ok, "" if self._ok else self._reason, self._last_success, len(self._pods))

    def close(self) -> None:
        return None

    # -- for subclasses ---------------------------------------------------------------------
    def _replace_all(self, pods: Iterable[PodInfo]) -> None:
        with self._lock:
            new = {p.uid: p for p in pods}
            now = self._clock()
            for uid, old in self._pods.items():
                if uid not in new:
                    self._gone[uid] = (old, now)
            for uid in new:
                self._gone.pop(uid, None)
            self._pods = new
            self._succeeded()

    def _upsert(self, pod: PodInfo) -> None:
        with self._lock:
            self._pods[pod.uid] = pod
            self._gone.pop(pod.uid, None)

    def _remove(self, uid: str) -> None:
        with self._lock:
            old = self._pods.pop(uid, None)
            if old is not None:
                self._gone[uid] = (old, self._clock())

    def _succeeded(self) -> None:
        now = self._clock()
        self._ok, self._reason, self._last_success = True, "", now
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


# -- standalone ------------------------------------------------------------------------------

_UNIT_RE = re.compile(r"^[^/]+\.(service|scope)$")
_SKIP_DIRS = {"init.scope"}


class StandalonePodSource(_CachingSource):
    """No Kubernetes: the cgroups that are workloads become entities.

    An entity is a systemd service or scope (``system.slice/nginx.service``), a docker or
    containerd container (``docker-<id>.scope``, ``/docker/<id>``), or any cgroup matching one of the
    ``ls_cgroups``/``be_cgroups`` globs (fnmatch on the path without leading slash). Matching a BE
    glob makes it BE, an LS glob LS (BE wins when both match), neither leaves it unclassed (None).
    The uid is ``cgroup:<path>``, the namespace empty, the name the last path component.
    """

    name = "standalone"

    def __init__(
        self,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        *,
        ls_cgroups: Iterable[str] = (),
        be_cgroups: Iterable[str] = (),
        max_depth: int = 6,
        refresh_interval: float = 5.0,
        vanish_grace_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(vanish_grace_seconds, clock)
        self.paths = paths or HostPaths()
        self.layout = layout
        self.ls_cgroups = tuple(g.strip("/") for g in ls_cgroups)
        self.be_cgroups = tuple(g.strip("/") for g in be_cgroups)
        self.max_depth = max_depth
        self.refresh_interval = refresh_interval
        self._last_attempt: float | None = None

    @classmethod
    def from_policy(cls, policy: Policy, paths: HostPaths | None = None, **kwargs: Any) -> StandalonePodSource:
        return cls(paths, ls_cgroups=policy.ls_cgroups, be_cgroups=policy.be_cgroups, **kwargs)

    def classify(self, cgroup_path: str) -> str | None:
        """LS/BE by the globs, or None."""
        p = cgroup_path.strip("/")
        if any(fnmatch.fnmatchcase(p, g) for g in self.be_cgroups):
            return "BE"
        if any(fnmatch.fnmatchcase(p, g) for g in self.ls_cgroups):
            return "LS"
        return None

    def pods(self) -> list[PodInfo]:
        last = self._last_attempt
        if last is None or self._clock() - last >= self.refresh_interval:
            self.refresh()
        return super().pods()

    def refresh(self) -> bool:
        self._last_attempt = self._clock()
        try:
            layout = self.layout or discover(self.paths)
            h = layout.cpu
            if h is None:
                self._failed("no cpu cgroup hierarchy found")
                return False
            entities = [self._entity(p) for p in self._walk(h.mount)]
        except OSError as e:
            self._failed(f"cannot walk cgroups: {_describe_error(e)}")
            return False
        self._replace_all(entities)
        return True

    def _walk(self, mount: Path) -> list[str]:
        found: list[str] = []
        stack: list[tuple[Path, str, int]] = [(mount, "", 0)]
        while stack:
            fs_dir, rel, depth = stack.pop()
            try:
                with os.scandir(fs_dir) as it:
                    children = [e.name for e in it if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue  # vanished while walking
            for child in children:
                path = f"{rel}/{child}".lstrip("/")
                if child in _SKIP_DIRS:
                    continue
                if self._is_entity(path):
                    found.append(path)
                    continue  # a unit's sub-cgroups belong to it
                if depth + 1 < self.max_depth:
                    stack.append((fs_dir / child, path, depth + 1))
        return sorted(found)

    def _is_entity(self, path: str) -> bool:
        if self.classify(path) is not None:
            return True
        ident = parse_cgroup_path(path)
        if ident.kind in ("docker", "container"):
            return True
        name = path.rsplit("/", 1)[-1]
        return bool(_UNIT_RE.match(name)) and ident.kind in ("system", "user", "other")

    def _entity(self, path: str) -> PodInfo:
        ident = parse_cgroup_path(path)
        container = ()
        if ident.container_id:
            container = (ContainerInfo(name=path.rsplit("/", 1)[-1], container_id=ident.container_id, runtime=ident.runtime),)
        return PodInfo(
            uid=f"cgroup:{path}", namespace="", name=path.rsplit("/", 1)[-1], qos_class=self.classify(path),
            containers=container, cgroup_path=path, phase="Running",
        )


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


def make_pod_source(policy: Policy, paths: HostPaths | None = None,
                    environ: Mapping[str, str] | None = None) -> _CachingSource:
    """The source the policy asks for; ``auto``: kubelet if it answers, else apiserver in a cluster,
    else standalone. Never raises on an unreachable kubelet: that is a stale status, not an error.
    ``auto`` logs one line saying which source it chose and why (the others' reasons included), so
    a silent fallback from the kubelet to the apiserver shows in the agent's log."""
    env = os.environ if environ is None else environ
    mode = policy.pod_source
    if mode == "standalone":
        return StandalonePodSource.from_policy(policy, paths)
    if mode == "kubelet":
        return KubeletPodSource.from_policy(policy, env)
    in_cluster = bool(env.get("KUBERNETES_SERVICE_HOST"))
    node = policy.node_name or env.get("NODE_NAME")
    if mode == "apiserver":
        if not node:
            raise ValueError("pod_source apiserver needs kubernetes.node_name (or the NODE_NAME environment variable)")
        return ApiserverPodSource.in_cluster(node).start()
    why_not_kubelet = _try_kubelet(policy, env)
    if isinstance(why_not_kubelet, KubeletPodSource):
        kubelet = why_not_kubelet
        log.info("pod source auto: chose kubelet %s (it answered with %d pods)", kubelet.url, len(kubelet.pods()))
        return kubelet
    if in_cluster and node:
        log.warning("pod source auto: chose apiserver (pods of node %s): kubelet not usable: %s", node, why_not_kubelet)
        return ApiserverPodSource.in_cluster(node).start()
    why_not_apiserver = "not in a cluster (no KUBERNETES_SERVICE_HOST)" if not in_cluster else \
        "no node name (kubernetes.node_name or NODE_NAME)"
    log.info("pod source auto: chose standalone (cgroup globs): kubelet not usable: %s; apiserver: %s",
             why_not_kubelet, why_not_apiserver)
    return StandalonePodSource.from_policy(policy, paths)


def _try_kubelet(policy: Policy, env: Mapping[str, str]) -> KubeletPodSource | str:
    """The kubelet source when it answers now, else the one-line reason it is not usable."""
    if not policy.kubelet_read_only_port and not (policy.kubelet_token_file and Path(policy.kubelet_token_file).exists()):
        return f"no token file {policy.kubelet_token_file} and no read-only port"
    try:
        kubelet = KubeletPodSource.from_policy(policy, env)
    except ValueError as e:
        return str(e)
    if kubelet.refresh():
        return kubelet
    reason = kubelet.status.reason
    kubelet.close()
    return reason


# --------------------------------------------------------------------------------------------
# Index
# --------------------------------------------------------------------------------------------


class PodIndex:
    """cgroup path -> PodInfo and Target, over a source (or a fixed list of pods)."""

    def __init__(self, source: PodSource | Iterable[PodInfo]) -> None:
        if isinstance(source, _CachingSource) or hasattr(source, "get"):
            self._source: Any = source
        else:
            fixed = _CachingSource()
            fixed._replace_all(source)  # type: ignore[arg-type]
            self._source = fixed
        self._standalone: list[tuple[str, PodInfo]] = []
        self._standalone_key: int | None = None

    def pod_for_cgroup(self, cgroup_path: str) -> PodInfo | None:
        ident = parse_cgroup_path(cgroup_path)
        if ident.pod_uid is not None:
            return self._source.get(ident.pod_uid)
        path = ident.path.strip("/")
        for prefix, pod in self._standalone_entities():
            if path == prefix or path.startswith(prefix + "/"):
                return pod
        return None

    def _standalone_entities(self) -> list[tuple[str, PodInfo]]:
        pods = [p for p in self._source.pods() if p.cgroup_path]
        key = hash(tuple(p.uid for p in pods))
        if key != self._standalone_key:
            # Longest prefix first so a nested entity wins over its parent.
            self._standalone = sorted(((p.cgroup_path or "", p) for p in pods), key=lambda t: -len(t[0]))
            self._standalone_key = key
        return self._standalone

    def target_for(self, cgroup_path: str) -> Target:
        """The Target for a cgroup: pod name and koordinator class when known, else from the path."""
        ident = parse_cgroup_path(cgroup_path)
        cgroup = ident.path.strip("/")
        pod = self.pod_for_cgroup(cgroup_path)
        if pod is not None:
            return Target(cgroup=cgroup, pod_uid=None if pod.cgroup_path else pod.uid,
                          namespace=pod.namespace or None, pod=pod.name, qos=pod.qos_class)
        qos = _PATH_QOS_TO_KOORD.get(ident.qos or "")
        if qos is None and isinstance(self._source, StandalonePodSource):
            qos = self._source.classify(cgroup)
        return Target(cgroup=cgroup, pod_uid=ident.pod_uid, qos=qos)
