# SPDX-License-Identifier: Apache-2.0
"""BE CPU suppress through the Kubernetes in-place pod resize (``pods/{name}/resize``), not a cgroup write.

A cgroup write under a pod is the kubelet's to overwrite (koordlet issue #1734): at its next sync it
puts the pod's own limits back. Where the apiserver offers in-place resize, lowering the pod's CPU
*limit* through the API changes what the kubelet itself enforces. Chosen by ``mode``:

- ``cgroup``: never resize (every decision goes to the cgroup suppress actuator, ``fallback``);
- ``resize``: resize when every container of the pod has a CPU limit, else the cgroup path;
- ``resize-only``: resize or refuse.

Same semantics as the file actuators: each container's limit is a journal entry (path
``k8s-resize://<namespace>/<pod>/<container>/cpu-limit``, read and written through the API by
:class:`ResizeIO`, which the journal gets as its ``read``/``write``), journaled before the first
PATCH, reverted by the manager when the victim did not improve, restored on shutdown and after a
crash (``Journal.reconcile``). A resize never adds or drops a limit (the QoS class is immutable): a
pod without CPU limits cannot be capped this way and the plan says so. Only cfs-quota suppress has a
resize form; cpuset decisions always go to the cgroup actuator.
"""

from __future__ import annotations

from collections.abc import Callable

from actuators.base import Actuator, FileWrite, Plan, Refused
from actuators.cgroupfile import CgroupVanished, CgroupWriteError, read_file, write_file
from actuators.journal import Journal, JournaledFileActuator
from detector.decisions import ActionKind, Decision, SuppressAmount

PREFIX = "k8s-resize://"
MIN_MILLI = 10
MODES = ("cgroup", "resize", "resize-only")


def cpu_milli(q: str) -> int:
    q = q.strip()
    if q.endswith("m"):
        return int(float(q[:-1]))
    return round(float(q) * 1000)


def resize_path(namespace: str, pod: str, container: str) -> str:
    return f"{PREFIX}{namespace}/{pod}/{container}/cpu-limit"


def _parse(path: str) -> tuple[str, str, str]:
    ns, pod, container, _ = path[len(PREFIX):].split("/", 3)
    return ns, pod, container


class ResizeIO:
    """Journal I/O: ``k8s-resize://`` paths through the API server, anything else as a file."""

    def __init__(self, api_client: object, timeout_s: float = 10.0, *,
                 inner_read: Callable[[str], str] | None = None,
                 inner_write: Callable[[str, str], None] | None = None) -> None:
        """``inner_read``/``inner_write``: the I/O for every other path (the agent's resctrl-aware file I/O),
        so one journal keeps cgroup, resctrl and resize entries."""
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.timeout_s = timeout_s
        self._inner_read = inner_read or read_file
        self._inner_write = inner_write or write_file

    def pod(self, namespace: str, name: str) -> dict:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.api_client.sanitize_for_serialization(
                self.core.read_namespaced_pod(name, namespace, _request_timeout=self.timeout_s))
        except ApiException as e:
            if e.status == 404:
                raise CgroupVanished(f"pod {namespace}/{name} is gone") from None
            raise CgroupWriteError(f"reading pod {namespace}/{name}: {e.status} {e.reason}") from None

    def read(self, path: str | object) -> str:
        path = str(path)
        if not path.startswith(PREFIX):
            return self._inner_read(path)
        ns, name, container = _parse(path)
        for c in self.pod(ns, name)["spec"]["containers"]:
            if c["name"] == container:
                return str(((c.get("resources") or {}).get("limits") or {}).get("cpu", ""))
        raise CgroupVanished(f"container {container} of {ns}/{name} is gone")

    def write(self, path: str | object, value: str) -> None:
        path = str(path)
        if not path.startswith(PREFIX):
            self._inner_write(path, value)
            return
        from kubernetes.client.exceptions import ApiException

        ns, name, container = _parse(path)
        body = {"spec": {"containers": [{"name": container, "resources": {"limits": {"cpu": value}}}]}}
        try:
            self.core.patch_namespaced_pod_resize(name, ns, body, _request_timeout=self.timeout_s)
        except ApiException as e:
            if e.status == 404:
                raise CgroupVanished(f"pod {ns}/{name} is gone") from None
            message = " ".join(str(e.body or e.reason).split())[:200]
            raise CgroupWriteError(f"resize of {ns}/{name}/{container} to cpu {value}: {e.status} {message}") from None


class ResizeSuppressActuator(JournaledFileActuator):
    kind = ActionKind.SUPPRESS

    def __init__(self, journal: Journal, io: ResizeIO, fallback: Actuator | None = None, mode: str = "resize",
                 namespace_of: Callable[[Decision], str | None] | None = None) -> None:
        super().__init__(journal)
        if mode not in MODES:
            raise ValueError(f"resize mode {mode!r}: one of {', '.join(MODES)}")
        self.io = io
        self.fallback = fallback
        self.mode = mode
        self.namespace_of = namespace_of or (lambda d: d.target.namespace)

    def plan(self, decision: Decision) -> Plan:
        try:
            return self._plan_resize(decision)
        except Refused as e:
            if self.mode == "resize-only" or self.fallback is None:
                raise
            plan = self.fallback.plan(decision)
            return Plan(plan.decision, f"{plan.summary} (cgroup path: {e})", plan.writes, plan.calls, plan.reversible,
                        {**plan.details, "via": "cgroup"})

    def _plan_resize(self, decision: Decision) -> Plan:
        amount = decision.amount
        if self.mode == "cgroup":
            raise Refused("resize is off by policy")
        if not isinstance(amount, SuppressAmount) or amount.policy not in ("cfs_quota", "cfsQuota"):
            raise Refused("only a cfs-quota suppress has a resize form")
        if amount.cpu_cores is None:
            raise Refused("suppress needs cpu_cores")
        if (decision.target.qos or "").upper() != "BE":
            raise Refused(f"resize only touches BE pods; {decision.target.display} is {decision.target.qos}")
        ns, name = self.namespace_of(decision), decision.target.pod
        if not ns or not name:
            raise Refused(f"{decision.target.display} is not a known pod (no namespace/name)")
        pod = self.io.pod(ns, name)
        containers = pod["spec"]["containers"]
        limits: dict[str, int] = {}
        for c in containers:
            cpu = ((c.get("resources") or {}).get("limits") or {}).get("cpu")
            if cpu is None:
                raise Refused(f"container {c['name']} of {ns}/{name} has no CPU limit: a resize cannot add one "
                              f"(the pod's QoS class is immutable)")
            limits[c["name"]] = cpu_milli(str(cpu))
        total = sum(limits.values())
        wanted = max(MIN_MILLI * len(limits), int(amount.cpu_cores * 1000))
        if wanted >= total:
            raise Refused(f"{ns}/{name} is limited to {total}m already (<= {wanted}m)")
        writes = []
        for cname, milli in limits.items():
            new = max(MIN_MILLI, milli * wanted // total)
            path = resize_path(ns, name, cname)
            writes.append(FileWrite(path, self.io.read(path), f"{new}m"))
        return Plan(decision, f"suppress {decision.target.display}: resize CPU limit {total}m -> "
                              f"{sum(cpu_milli(w.new) for w in writes)}m ({len(writes)} container(s))",
                    tuple(writes), details={"policy": "resize", "cpu_cores": wanted / 1000.0, "via": "resize"})

    def apply(self, plan: Plan) -> None:
        if plan.details.get("via") == "cgroup" and self.fallback is not None:
            self.fallback.apply(plan)
        else:
            super().apply(plan)

    def revert(self, plan: Plan) -> None:
        if plan.details.get("via") == "cgroup" and self.fallback is not None:
            self.fallback.revert(plan)
        else:
            super().revert(plan)
