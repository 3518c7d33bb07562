# SPDX-License-Identifier: Apache-2.0
"""Pod sources against FakeKube over real HTTP/TLS, the PodIndex, and the standalone source on a temp tree."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from detector.pods import (
    ApiserverPodSource,
    KubeletPodSource,
    PodIndex,
    StandalonePodSource,
    pod_from_dict,
)
from probes.cgroupfs import CgroupLayout, Hierarchy
from probes.host import HostPaths
from testkit.fakekube import FakeKube, container_id_for, make_pod

UID_A = "5dbe5657-826e-43bf-a3e6-b69f854fd160"
UID_B = "0a1b2c3d-0000-4000-8000-00000000000b"
UID_C = "0a1b2c3d-0000-4000-8000-00000000000c"


def _wait(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    p = tmp_path / "token"
    p.write_text("s3cret\n")
    return str(p)


def _kubelet(kube: FakeKube, token_file: str | None, **kw) -> KubeletPodSource:
    return KubeletPodSource(kube.url, token_file=token_file, ca_file=kube.ca_file, refresh_interval=0, **kw)


# -- parsing ----------------------------------------------------------------------------------


def test_pod_from_dict_fields_and_qos_mapping():
    be = pod_from_dict(make_pod(
        "spark-1", "batch", UID_A, qos_class="BE", priority=5000, owner=("Job", "spark"),
        requests={"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "1Gi"},
        limits={"kubernetes.io/batch-cpu": "4000", "kubernetes.io/batch-memory": "2Gi"},
        annotations={"koordinator.sh/eviction-priority": "3"},
    ))
    assert (be.uid, be.namespace, be.name, be.qos_class, be.priority) == (UID_A, "batch", "spark-1", "BE", 5000)
    assert (be.owner_kind, be.owner_name, be.phase, be.terminating) == ("Job", "spark", "Running", False)
    assert be.eviction_priority == 3
    c = be.containers[0]
    assert c.container_id == container_id_for(UID_A, "main") and c.runtime == "containerd"
    assert (c.batch_cpu_request_milli, c.batch_cpu_limit_milli) == (2000, 4000)
    assert (c.batch_memory_request_bytes, c.batch_memory_limit_bytes) == (2**30, 2**31)
    assert be.cpu_request_cores == pytest.approx(2.0) and be.cpu_limit_cores == pytest.approx(4.0)
    assert be.start_time is not None and abs(be.start_time - time.time()) < 120

    guaranteed = pod_from_dict(make_pod("db", uid=UID_B, limits={"cpu": "500m", "memory": "256Mi"}))
    assert (guaranteed.k8s_qos, guaranteed.qos_class) == ("Guaranteed", "LS")
    assert guaranteed.containers[0].cpu_request_cores == pytest.approx(0.5)  # defaulted from the limit
    assert guaranteed.memory_request_bytes == 256 * 2**20
    burstable = pod_from_dict(make_pod("web", uid=UID_C, requests={"cpu": "100m"}))
    assert (burstable.k8s_qos, burstable.qos_class, burstable.cpu_limit_cores) == ("Burstable", "LS", None)
    besteffort = pod_from_dict(make_pod("tmp", uid="u-4"))
    assert (besteffort.k8s_qos, besteffort.qos_class) == ("BestEffort", "BE")
    lsr = pod_from_dict(make_pod("lsr", uid="u-5", qos_class="LSR", limits={"cpu": "2", "memory": "1Gi"}))
    assert lsr.qos_class == "LSR"
    # A label value koordinator does not know falls back to the Kubernetes mapping.
    odd = pod_from_dict(make_pod("odd", uid="u-6", qos_class="GOLD"))
    assert odd.qos_class == "BE"


# -- kubelet ----------------------------------------------------------------------------------


def test_kubelet_tls_token_auth(token_file: str):
    with FakeKube(token="s3cret", tls=True) as kube:
        kube.add_pod(make_pod("a", uid=UID_A, qos_class="LS", requests={"cpu": "1"}))
        src = _kubelet(kube, token_file)
        pods = src.pods()
        assert [p.uid for p in pods] == [UID_A]
        assert src.status.ok and src.status.pods == 1
        req = kube.requests_to("/pods")[-1]
        assert req.headers["Authorization"] == "Bearer s3cret"

        # A wrong token: 401 from the server, last good list kept, one-line stale reason.
        Path(token_file).write_text("wrong")
        assert src.refresh() is False
        assert [p.uid for p in src.pods()] == [UID_A]
        assert src.status.stale and "HTTP 401" in src.status.reason and "\n" not in src.status.reason

        # The token file is re-read: rotating it back recovers.
        Path(token_file).write_text("s3cret")
        assert src.refresh() is True and src.status.ok


def test_kubelet_poll_keeps_the_record_of_an_unchanged_pod(token_file: str):
    """A poll that finds a pod as it was keeps its record object (the exporter keeps a pod's series labels
    for as long as its record is the same object); a pod whose labels changed gets a new one."""
    with FakeKube(token="s3cret", tls=True) as kube:
        kube.add_pod(make_pod("a", uid=UID_A, qos_class="LS", requests={"cpu": "1"}))
        kube.add_pod(make_pod("b", uid=UID_B, qos_class="BE"))
        src = _kubelet(kube, token_file)
        assert len(src.pods()) == 2
        a, b = src.get(UID_A), src.get(UID_B)
        assert a is not None and b is not None
        kube.remove_pod("default", "b")
        kube.add_pod(make_pod("b", uid=UID_B, qos_class="BE", labels={"team": "x"}))
        assert src.refresh() is True
        assert src.get(UID_A) is a
        assert src.get(UID_B) is not b and src.get(UID_B).labels["team"] == "x"


def test_kubelet_tls_refuses_untrusted_cert(token_file: str):
    with FakeKube(token="s3cret", tls=True) as kube:
        kube.add_pod(make_pod("a", uid=UID_A))
        src = KubeletPodSource(kube.url, token_file=token_file, ca_file=None, refresh_interval=0)
        assert src.pods() == []
        assert src.status.stale and "TLS verification failed" in src.status.reason
        assert kube.requests_to("/pods") == []  # the token never went to an unverified server
        insecure = KubeletPodSource(kube.url, token_file=token_file, insecure_skip_verify=True, refresh_interval=0)
        assert [p.uid for p in insecure.pods()] == [UID_A]


def test_kubelet_read_only_port_plain_http():
    with FakeKube() as kube:
        kube.add_pod(make_pod("a", uid=UID_A))
        src = KubeletPodSource(kube.url, refresh_interval=0)
        assert [p.name for p in src.pods()] == ["a"]
        assert "Authorization" not in kube.requests_to("/pods")[-1].headers


def test_kubelet_restart_mid_run_keeps_last_good(token_file: str):
    with FakeKube(token="s3cret", tls=True) as kube:
        kube.add_pod(make_pod("a", uid=UID_A))
        kube.add_pod(make_pod("b", uid=UID_B))
        src = _kubelet(kube, token_file)
        assert len(src.pods()) == 2

        kube.fail("close", times=1)  # the connection dies with no response
        assert len(src.pods()) == 2
        assert src.status.stale and "unreachable" in src.status.reason

        kube.go_down()  # connection refused
        assert len(src.pods()) == 2
        assert src.status.stale and "refused" in src.status.reason.lower()

        kube.come_up()
        kube.remove_pod("default", "b")
        assert [p.uid for p in src.pods()] == [UID_A]
        assert src.status.ok


def test_kubelet_malformed_json_and_500(token_file: str):
    with FakeKube(token="s3cret", tls=True) as kube:
        kube.add_pod(make_pod("a", uid=UID_A))
        src = _kubelet(kube, token_file)
        assert len(src.pods()) == 1
        kube.fail("malformed", times=1)
        assert len(src.pods()) == 1
        assert src.status.stale and "malformed JSON" in src.status.reason
        kube.fail("500", times=1)
        assert len(src.pods()) == 1
        assert src.status.stale and "HTTP 500" in src.status.reason
        assert len(src.pods()) == 1 and src.status.ok


def test_kubelet_empty_list_believed_only_after_confirmations(token_file: str):
    with FakeKube(token="s3cret", tls=True) as kube:
        kube.add_pod(make_pod("a", uid=UID_A))
        src = _kubelet(kube, token_file, empty_confirmations=3)
        assert len(src.pods()) == 1
        kube.fail("empty", times=1)  # a restarting kubelet briefly reports nothing
        assert len(src.pods()) == 1
        assert src.status.stale and "empty pod list" in src.status.reason
        assert len(src.pods()) == 1 and src.status.ok  # back to normal: the streak resets

        kube.remove_pod("default", "a")  # really empty now
        assert len(src.pods()) == 1 and src.status.stale
        assert len(src.pods()) == 1 and src.status.stale
        assert src.pods() == [] and src.status.ok


def test_kubelet_vanished_pod_still_resolvable_within_grace(token_file: str):
    now = [1000.0]
    with FakeKube(token="s3cret", tls=True) as kube:
        kube.add_pod(make_pod("a", uid=UID_A, qos_class="BE"))
        kube.add_pod(make_pod("b", uid=UID_B))
        src = _kubelet(kube, token_file, vanish_grace_seconds=30, clock=lambda: now[0])
        index = PodIndex(src)
        src.refresh()
        kube.remove_pod("default", "a")
        src.refresh()
        assert [p.uid for p in src.pods()] == [UID_B]
        cg = f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_A.replace('-', '_')}.slice"
        assert index.target_for(cg).pod == "a"  # samples from this window still attribute
        now[0] += 31
        src.refresh()
        assert index.pod_for_cgroup(cg) is None
        t = index.target_for(cg)
        assert (t.pod, t.pod_uid, t.qos) == (None, UID_A, "BE")  # still classed from the path


def test_kubelet_background_thread(token_file: str):
    with FakeKube(token="s3cret", tls=True) as kube:
        kube.add_pod(make_pod("a", uid=UID_A))
        src = KubeletPodSource(kube.url, token_file=token_file, ca_file=kube.ca_file, refresh_interval=0.05).start()
        try:
            assert _wait(lambda: len(src.pods()) == 1)
            kube.add_pod(make_pod("b", uid=UID_B))
            assert _wait(lambda: len(src.pods()) == 2)
        finally:
            src.close()


# -- apiserver --------------------------------------------------------------------------------


def test_apiserver_list_watch_add_modify_delete_and_410_relist():
    with FakeKube(token="tok", tls=True, eviction_delete_delay=0.1) as kube:
        kube.add_pod(make_pod("a", uid=UID_A))
        kube.add_pod(make_pod("other-node", uid="u-x", node_name="node-2"))
        src = ApiserverPodSource(kube.api_client(), "node-1", watch_timeout_seconds=30).start()
        try:
            assert src.synced.wait(10)
            assert [p.uid for p in src.pods()] == [UID_A]
            lists = kube.requests_to("/api/v1/pods")
            assert lists[0].query["fieldSelector"] == ["spec.nodeName=node-1"]

            kube.add_pod(make_pod("b", uid=UID_B, qos_class="BE"))
            assert _wait(lambda: src.get(UID_B) is not None)
            kube.modify_pod("default", "b", {"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}})
            assert _wait(lambda: src.get(UID_B) is not None and src.get(UID_B).terminating)
            kube.remove_pod("default", "a")
            assert _wait(lambda: [p.uid for p in src.pods()] == [UID_B])
            assert src.get(UID_A) is not None  # vanished, within grace

            relists = src.relists
            kube.expire_watches()  # 410 Expired on the open watch -> relist
            kube.add_pod(make_pod("c", uid=UID_C))
            assert _wait(lambda: src.relists > relists)
            assert _wait(lambda: {p.uid for p in src.pods()} == {UID_B, UID_C})
            assert src.status.ok
            # The relist was a plain list (no watch=true) after the 410.
            assert any("watch" not in r.query for r in kube.requests_to("/api/v1/pods")[1:])
        finally:
            src.close()


def test_apiserver_unreachable_then_recovers():
    with FakeKube(token="tok") as kube:
        kube.add_pod(make_pod("a", uid=UID_A))
        kube.fail("500", times=2, path="/api/v1/pods")
        src = ApiserverPodSource(kube.api_client(), "node-1", max_backoff=0.2).start()
        try:
            assert _wait(lambda: src.status.stale and "HTTP 500" in src.status.reason)
            assert src.pods() == []
            assert src.synced.wait(10)
            assert [p.uid for p in src.pods()] == [UID_A] and src.status.ok
        finally:
            src.close()


def test_apiserver_needs_node_name():
    with pytest.raises(ValueError, match="needs a node name"):
        ApiserverPodSource(None, "")


# -- standalone and index ---------------------------------------------------------------------


def _fake_cpu_tree(root: Path, dirs: list[str]) -> tuple[HostPaths, CgroupLayout]:
    mount = root / "sys/fs/cgroup/cpu"
    for d in dirs:
        (mount / d).mkdir(parents=True, exist_ok=True)
    h = Hierarchy(1, mount, frozenset({"cpu", "cpuacct"}))
    layout = CgroupLayout(v2=None, v1={"cpu": h, "cpuacct": h})
    return HostPaths.under(root), layout


def test_standalone_entities_and_classes(tmp_path: Path):
    cid = "a" * 64
    paths, layout = _fake_cpu_tree(tmp_path, [
        "system.slice/nginx.service", "system.slice/cron.service", f"system.slice/docker-{cid}.scope",
        "batch.slice/job1", "batch.slice/job2/sub", "user.slice/user-0.slice/session-1.scope", "init.scope",
    ])
    src = StandalonePodSource(paths, layout, ls_cgroups=["system.slice/nginx.service"], be_cgroups=["batch.slice/*"],
                              refresh_interval=0)
    by_path = {p.cgroup_path: p for p in src.pods()}
    assert set(by_path) == {
        "system.slice/nginx.service", "system.slice/cron.service", f"system.slice/docker-{cid}.scope",
        "batch.slice/job1", "batch.slice/job2", "user.slice/user-0.slice/session-1.scope",
    }
    assert by_path["system.slice/nginx.service"].qos_class == "LS"
    assert by_path["batch.slice/job1"].qos_class == "BE"
    assert by_path["system.slice/cron.service"].qos_class is None
    assert by_path[f"system.slice/docker-{cid}.scope"].containers[0].container_id == cid
    index = PodIndex(src)
    t = index.target_for("/batch.slice/job2/sub")
    assert (t.cgroup, t.pod, t.qos, t.pod_uid) == ("batch.slice/job2/sub", "job2", "BE", None)
    assert index.target_for("system.slice/unknown").qos is None
    assert src.status.ok


def test_standalone_without_cpu_hierarchy_is_stale_not_error(tmp_path: Path):
    src = StandalonePodSource(HostPaths.under(tmp_path), CgroupLayout(v2=None), refresh_interval=0)
    assert src.pods() == [] and src.status.stale and "no cpu cgroup hierarchy" in src.status.reason


def test_index_maps_nested_kubepods_paths_to_pods():
    pods = [pod_from_dict(make_pod("web", "shop", UID_A, qos_class="LSR", limits={"cpu": "1", "memory": "1Gi"}))]
    index = PodIndex(pods)
    cid = container_id_for(UID_A, "main")
    for path in (
        f"kubepods.slice/kubepods-pod{UID_A.replace('-', '_')}.slice/cri-containerd-{cid}.scope",
        f"nn-test-123/x/kubepods/pod{UID_A}/{cid}",  # nested under a test prefix, cgroupfs driver
    ):
        pod = index.pod_for_cgroup(path)
        assert pod is not None and pod.name == "web" and pod.container(cid) is not None
        t = index.target_for("/" + path)
        assert (t.namespace, t.pod, t.pod_uid, t.qos, t.cgroup) == ("shop", "web", UID_A, "LSR", path)
        assert t.display == "shop/web"
    t = index.target_for("kubepods/besteffort/pod00000000-0000-0000-0000-000000000000")
    assert (t.pod, t.qos) == (None, "BE")
    assert index.target_for("system.slice/sshd.service").qos is None


# -- reaching the node's kubelet from a pod, and what `auto` says it chose ---------------------------


def test_kubelet_url_takes_the_node_ip_from_the_environment():
    from detector.pods import expand_kubelet_url
    from detector.policy import Policy

    default = Policy().kubelet_url
    assert expand_kubelet_url(default, {"HOST_IP": "10.1.2.3"}) == "https://10.1.2.3:10250"
    assert expand_kubelet_url(default, {"HOST_IP": "fd00::7"}) == "https://[fd00::7]:10250"
    assert expand_kubelet_url(default, {}) == "https://127.0.0.1:10250"  # outside a pod: the node's loopback
    with pytest.raises(ValueError, match="HOST_IP is not set") as e:
        expand_kubelet_url("https://${HOST_IP}:10250", {})
    assert "\n" not in str(e.value)


def _auto_policy(kube: FakeKube, token_file: str, **kw):
    from detector.policy import Policy

    return Policy(pod_source="auto", kubelet_url=f"https://${{HOST_IP}}:{kube.port}", kubelet_token_file=token_file,
                  kubelet_ca_file=kube.ca_file, **kw)


def test_auto_reaches_the_kubelet_at_host_ip_and_says_so_once(token_file: str, caplog):
    from detector.pods import make_pod_source

    with FakeKube(token="s3cret", tls=True) as kube:
        kube.add_pod(make_pod("a", uid=UID_A))
        caplog.set_level("INFO", logger="noisyneighbor.pods")
        src = make_pod_source(_auto_policy(kube, token_file, pod_vanish_grace_seconds=7.0),
                              environ={"HOST_IP": "127.0.0.1"})
        try:
            assert isinstance(src, KubeletPodSource) and [p.uid for p in src.pods()] == [UID_A]
            assert kube.requests_to("/pods")[-1].headers["Authorization"] == "Bearer s3cret"
            assert src.vanish_grace_seconds == 7.0  # kubernetes.vanish_grace_seconds
        finally:
            src.close()
    lines = [r.getMessage() for r in caplog.records if "pod source auto" in r.getMessage()]
    assert lines == [f"pod source auto: chose kubelet https://127.0.0.1:{kube.port}/pods (it answered with 1 pods)"]


def test_auto_in_a_cluster_watches_the_apiserver_and_never_asks_the_kubelet(token_file: str, caplog, monkeypatch):
    """The default pod source in a pod is the apiserver watch (pods list/watch, the base's only pod grant):
    the kubelet's /pods needs nodes/pods (or nodes/proxy on older kubelets) and is opt-in, so `auto` does
    not even try it there, although it would answer."""
    from detector.pods import make_pod_source
    from detector.pods.apiserver import ApiserverPodSource

    with FakeKube(token="s3cret", tls=True) as kube:
        kube.add_pod(make_pod("a", uid=UID_A))
        monkeypatch.setattr(ApiserverPodSource, "in_cluster",
                            classmethod(lambda cls, node, **kw: cls(kube.api_client(token="s3cret"), node, **kw)))
        caplog.set_level("INFO", logger="noisyneighbor.pods")
        src = make_pod_source(_auto_policy(kube, token_file, pod_vanish_grace_seconds=7.0), environ={
            "HOST_IP": "127.0.0.1", "KUBERNETES_SERVICE_HOST": "10.96.0.1", "NODE_NAME": kube.node_name})
        try:
            assert isinstance(src, ApiserverPodSource) and src.vanish_grace_seconds == 7.0
            assert src.synced.wait(10) and [p.uid for p in src.pods()] == [UID_A]
            assert kube.requests_to("/pods") == []  # the kubelet's path: never asked
            [listing, *_] = kube.requests_to("/api/v1/pods")
            assert listing.query["fieldSelector"] == [f"spec.nodeName={kube.node_name}"]
        finally:
            src.close()
    lines = [r.getMessage() for r in caplog.records if "pod source auto" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("pod source auto: chose apiserver"), lines


def test_auto_says_why_it_did_not_use_the_kubelet(token_file: str, caplog):
    """A kubelet whose serving cert the configured CA does not sign: the token is never sent, and the one
    line names the TLS failure (not in a cluster here, so standalone is what is left)."""
    from detector.pods import make_pod_source

    with FakeKube(token="s3cret", tls=True) as kube:
        caplog.set_level("INFO", logger="noisyneighbor.pods")
        policy = dataclasses.replace(_auto_policy(kube, token_file), kubelet_ca_file=None)  # system CAs only
        src = make_pod_source(policy, environ={"HOST_IP": "127.0.0.1"})
        try:
            assert isinstance(src, StandalonePodSource)
            assert kube.requests_to("/pods") == []
        finally:
            src.close()
        lines = [r.getMessage() for r in caplog.records if "pod source auto" in r.getMessage()]
        assert len(lines) == 1, lines
        assert lines[0].startswith("pod source auto: chose standalone") and "TLS verification failed" in lines[0]
        assert "not in a cluster" in lines[0]

        # HOST_IP missing where the URL needs it: said in the same one line, not a traceback.
        caplog.clear()
        src = make_pod_source(_auto_policy(kube, token_file), environ={})
        src.close()
        lines = [r.getMessage() for r in caplog.records if "pod source auto" in r.getMessage()]
        assert len(lines) == 1 and "HOST_IP is not set" in lines[0], lines


def test_kubelet_same_body_is_not_parsed_again(monkeypatch):
    """An unchanged /pods body keeps the parsed list (parsing it every 5 s was the idle agent's largest
    cost), and a changed body is parsed: the new pod shows up at the next refresh."""
    import detector.pods.kubelet as pods_module  # where the kubelet source calls the parser

    parsed = []
    real = pods_module.pods_from_list
    monkeypatch.setattr(pods_module, "pods_from_list", lambda doc: parsed.append(1) or real(doc))
    with FakeKube() as kube:
        kube.add_pod(make_pod("a", uid=UID_A))
        src = KubeletPodSource(kube.url, refresh_interval=0)
        assert src.refresh() and src.refresh() and src.refresh()
        assert len(parsed) == 1 and [p.name for p in src.pods()] == ["a"] and src.status.ok
        kube.add_pod(make_pod("b", uid=UID_B))
        assert src.refresh()
        assert len(parsed) == 2 and sorted(p.name for p in src.pods()) == ["a", "b"]
