# SPDX-License-Identifier: Apache-2.0
"""Pod records (:class:`PodInfo`, :class:`ContainerInfo`) and their parsing from v1 Pod objects and PodLists,
with the koordinator QoS class each pod maps to."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from detector.quantity import parse_quantity

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

