# SPDX-License-Identifier: Apache-2.0
"""Issue 19: BE suppress as an in-place pod resize on the local API server fake's real REST path, with the
journal's semantics (journaled, reverted when the victim did not improve, restored on shutdown and
after a crash) and its refusals (non-BE, no CPU limit: the QoS class is immutable)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from actuators.base import ActionState
from actuators.journal import Journal
from actuators.manager import ActuatorManager
from actuators.resize import ResizeIO, ResizeSuppressActuator, resize_path
from detector.decisions import ActionKind, Decision, SuppressAmount, Target
from detector.policy import ActuatorPolicy
from testkit.fakekube import FakeKube, make_pod

UID = "2f0c3c1e-0000-4000-8000-000000000001"


@pytest.fixture
def kube():
    with FakeKube(node_name="node-1") as k:
        k.add_pod(make_pod("batch", uid=UID, qos_class="BE", containers=[
            {"name": "a", "requests": {"cpu": "100m"}, "limits": {"cpu": "1"}},
            {"name": "b", "requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}]))
        k.add_pod(make_pod("besteffort", uid=UID.replace("1", "2"), qos_class="BE"))
        k.add_pod(make_pod("web", uid=UID.replace("1", "3"), qos_class="LS", limits={"cpu": "2"}))
        yield k


def _limits(kube: FakeKube, name: str) -> dict[str, str | None]:
    pod = kube.get_pod("default", name)
    return {c["name"]: (c["resources"].get("limits") or {}).get("cpu") for c in pod["spec"]["containers"]}


def _decision(name: str, qos: str = "BE", cores: float = 0.3) -> Decision:
    return Decision(ActionKind.SUPPRESS, Target(f"/kubepods/{name}", pod_uid=UID, namespace="default", pod=name, qos=qos),
                    SuppressAmount("cfs_quota", cpu_cores=cores), "culprit", incident_id="inc-1",
                    victim=Target("/kubepods/web", qos="LS"), victim_signal="runq_p99_ns")


def _manager(kube: FakeKube, tmp_path: Path, mode: str = "resize-only") -> tuple[ActuatorManager, Journal, ResizeIO]:
    io = ResizeIO(kube.api_client())
    journal = Journal(tmp_path / "j", read=io.read, write=io.write)
    manager = ActuatorManager([ResizeSuppressActuator(journal, io, mode=mode)], journal,
                              ActuatorPolicy(dry_run=False, verify_intervals=2), registry=CollectorRegistry())
    return manager, journal, io


def test_resize_applied_on_the_rest_path_and_restored_on_shutdown(kube: FakeKube, tmp_path: Path) -> None:
    manager, journal, _ = _manager(kube, tmp_path)
    manager.submit(_decision("batch"))
    rec = manager.records[-1]
    assert rec.state == ActionState.APPLIED, rec.detail
    assert _limits(kube, "batch") == {"a": "200m", "b": "100m"}  # 1.5 cores -> 0.3, in proportion
    patches = kube.requests_to("/api/v1/namespaces/default/pods/batch/resize", "PATCH")
    assert len(patches) == 2 and patches[0].body["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "200m"
    assert resize_path("default", "batch", "a") in journal.owned()
    manager.close()
    assert _limits(kube, "batch") == {"a": "1", "b": "500m"} and not journal.owned()


def test_resize_reverted_when_the_victim_did_not_improve(kube: FakeKube, tmp_path: Path) -> None:
    manager, journal, _ = _manager(kube, tmp_path)
    key = "/kubepods/web:runq_p99_ns"
    manager.observe({key: 5e6}, 0.0)
    manager.observe({key: 5e6}, 1.0)
    manager.submit(_decision("batch"))
    manager.observe({key: 5e6}, 2.0)
    manager.observe({key: 5e6}, 3.0)
    rec = manager.records[-1]
    assert rec.state == ActionState.REVERTED and rec.detail.startswith("did not help")
    assert _limits(kube, "batch") == {"a": "1", "b": "500m"} and not journal.owned()


def test_resize_after_a_crash_is_restored_by_reconcile(kube: FakeKube, tmp_path: Path) -> None:
    manager, _, io = _manager(kube, tmp_path)
    manager.submit(_decision("batch"))
    assert _limits(kube, "batch")["a"] == "200m"
    # no close(): the process died; the next start reconciles from the journal directory
    journal2 = Journal(tmp_path / "j", read=io.read, write=io.write)
    ActuatorManager([ResizeSuppressActuator(journal2, io)], journal2, ActuatorPolicy(dry_run=False),
                    registry=CollectorRegistry())
    assert _limits(kube, "batch") == {"a": "1", "b": "500m"} and not journal2.owned()


def test_resize_refusals_leave_pods_unchanged(kube: FakeKube, tmp_path: Path) -> None:
    manager, journal, _ = _manager(kube, tmp_path)
    manager.submit(_decision("web", qos="LS"))  # never a non-BE pod
    assert manager.records[-1].state == ActionState.REFUSED
    manager.submit(_decision("besteffort"))  # no limit to lower: QoS class is immutable
    assert manager.records[-1].state == ActionState.REFUSED and "no CPU limit" in manager.records[-1].detail
    manager.submit(_decision("batch", cores=5.0))  # would not lower anything
    assert manager.records[-1].state == ActionState.REFUSED
    assert not kube.requests_to("/api/v1/namespaces/default/pods/", "PATCH") and not journal.owned()
    assert _limits(kube, "web") == {"main": "2"} and _limits(kube, "besteffort") == {"main": None}


def test_fake_apiserver_refuses_a_resize_that_adds_a_limit(kube: FakeKube) -> None:
    io = ResizeIO(kube.api_client())
    from actuators.cgroupfile import CgroupWriteError

    with pytest.raises(CgroupWriteError, match="422"):
        io.write(resize_path("default", "besteffort", "main"), "100m")
    assert _limits(kube, "besteffort") == {"main": None}


def test_cgroup_mode_and_fallback(kube: FakeKube, tmp_path: Path) -> None:
    """mode=cgroup never calls the API; mode=resize falls back to the cgroup actuator for a pod without limits."""
    from actuators.base import FileWrite, Plan

    class FakeCgroupSuppress:
        kind = ActionKind.SUPPRESS

        def __init__(self) -> None:
            self.applied: list[Plan] = []

        def plan(self, decision: Decision) -> Plan:
            return Plan(decision, "suppress via cgroup", (FileWrite("/nonexistent", "max", "30000"),))

        def apply(self, plan: Plan) -> None:
            self.applied.append(plan)

        def revert(self, plan: Plan) -> None:
            self.applied.remove(plan)

    io = ResizeIO(kube.api_client())
    journal = Journal(tmp_path / "j", read=io.read, write=io.write)
    fallback = FakeCgroupSuppress()
    act = ResizeSuppressActuator(journal, io, fallback=fallback, mode="resize")
    plan = act.plan(_decision("besteffort"))
    assert plan.details["via"] == "cgroup" and "no CPU limit" in plan.summary
    act.apply(plan)
    assert fallback.applied and not kube.requests_to("/api/v1/namespaces/default/pods/", "PATCH")
    act.revert(plan)
    assert not fallback.applied
    plan = ResizeSuppressActuator(journal, io, fallback=fallback, mode="cgroup").plan(_decision("batch"))
    assert plan.details["via"] == "cgroup"


def test_the_agents_policy_chooses_resize_and_its_one_journal_reaches_the_apiserver(kube: FakeKube, tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """``cpuSuppressVia`` in the config picks the suppress actuator the agent builds; the agent's one
    journal (files and resize entries) sends resize entries to the apiserver and files to disk, and a
    config without apiserver access falls back (resize) or turns CPU suppress off (resize-only)."""
    from actuators.resize import PREFIX
    from actuators.suppress import SuppressActuator
    from detector.policy import load_policy
    from noisyneighbor.agent import wiring

    config = tmp_path / "config.yaml"
    config.write_text("resource-threshold-config:\n  cpuSuppressVia: resize\n")
    policy = load_policy(config)
    assert policy.resource_threshold.cpu_suppress_via == "resize"
    monkeypatch.setattr(wiring, "_in_cluster_client", lambda: kube.api_client())
    resize = wiring.resize_io(policy)
    assert resize is not None

    class FileIO:
        def read(self, path: str) -> str:
            return Path(path).read_text()

        def write(self, path: str, value: str) -> None:
            Path(path).write_text(value)

    io = wiring.JournalIO(FileIO(), resize)
    journal = Journal(tmp_path / "j", read=io.read, write=io.write)
    act = wiring.suppress_actuator(policy, files=None, journal=journal, resize=resize)
    assert isinstance(act, ResizeSuppressActuator) and act.mode == "resize"
    manager = ActuatorManager([act], journal, ActuatorPolicy(dry_run=False, verify_intervals=2),
                              registry=CollectorRegistry())
    manager.submit(_decision("batch"))
    assert manager.records[-1].state == ActionState.APPLIED, manager.records[-1].detail
    assert _limits(kube, "batch") == {"a": "200m", "b": "100m"}
    assert all(path.startswith(PREFIX) for path in journal.owned())
    plain = tmp_path / "cpu.max"
    plain.write_text("max 100000")
    assert io.read(str(plain)) == "max 100000"  # files still go to disk
    manager.close()
    assert _limits(kube, "batch") == {"a": "1", "b": "500m"}

    # No apiserver access: "resize" keeps the cgroup suppress, "resize-only" has none (said in the log).
    monkeypatch.setattr(wiring, "_in_cluster_client", lambda: None)
    assert wiring.resize_io(policy) is None
    assert isinstance(wiring.suppress_actuator(policy, files=None, journal=journal, resize=None), SuppressActuator)
    config.write_text("resource-threshold-config:\n  cpuSuppressVia: resize-only\n")
    assert wiring.suppress_actuator(load_policy(config), files=None, journal=journal, resize=None) is None
    config.write_text("resource-threshold-config:\n  cpuSuppressVia: sideways\n")
    with pytest.raises(Exception, match="sideways"):
        load_policy(config)
    with pytest.raises(Exception, match="apiserver access"):
        wiring.JournalIO(FileIO(), None).read(PREFIX + "default/batch/a/cpu-limit")
