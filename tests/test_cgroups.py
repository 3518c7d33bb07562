# SPDX-License-Identifier: Apache-2.0
"""detector.cgroups: path parsing, id <-> path resolution on fake hosts and on this kernel."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from detector import cgroups as cgroups_mod
from detector.cgroups import CgroupIdentity, CgroupInfo, CgroupResolver, parse_cgroup_path
from probes.cgroupfs import discover
from probes.host import HostPaths

UID = "5dbe5657-826e-43bf-a3e6-b69f854fd160"
UID_ = UID.replace("-", "_")
STATIC_UID = "6a9a4c3b2f0e8d7c1b5a4e3d2c1b0a9f"  # static pods: config hash, no dashes
CID = "3f1c2b4a5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708"
assert len(CID) == 64
CID2 = "a" * 64
SHORT = f"pod/{UID[:8]}/{CID[:12]}"


def ident(path: str, kind: str, **kw: str | None) -> CgroupIdentity:
    return CgroupIdentity(path=path, kind=kind, **kw)  # type: ignore[arg-type]


def k8s(path: str, qos: str, runtime: str | None, display: str = SHORT, cid: str = CID) -> CgroupIdentity:
    return ident(path, "container", pod_uid=UID, container_id=cid, runtime=runtime, qos=qos,
                 display=display)


SD_BE = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
SD_BU = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
SD_GU = f"/kubepods.slice/kubepods-pod{UID_}.slice"
KIND = (
    "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
    f"kubelet-kubepods-besteffort-pod{UID_}.slice"
)

PARSE_CASES: list[tuple[str, CgroupIdentity]] = [
    # systemd driver, every QoS class and runtime
    (f"{SD_BE}/cri-containerd-{CID}.scope", k8s(f"{SD_BE}/cri-containerd-{CID}.scope", "besteffort",
                                                "containerd")),
    (f"{SD_BU}/cri-containerd-{CID}.scope", k8s(f"{SD_BU}/cri-containerd-{CID}.scope", "burstable",
                                                "containerd")),
    (f"{SD_GU}/cri-containerd-{CID}.scope", k8s(f"{SD_GU}/cri-containerd-{CID}.scope", "guaranteed",
                                                "containerd")),
    (f"{SD_BU}/crio-{CID}.scope", k8s(f"{SD_BU}/crio-{CID}.scope", "burstable", "crio")),
    (f"{SD_GU}/docker-{CID}.scope", k8s(f"{SD_GU}/docker-{CID}.scope", "guaranteed", "docker")),
    (f"{SD_BU}/crio-conmon-{CID}.scope",
     ident(f"{SD_BU}/crio-conmon-{CID}.scope", "other", pod_uid=UID, runtime="crio", qos="burstable",
           display=f"pod/{UID[:8]}/crio-conmon-{CID[:12]}")),
    (SD_BE, ident(SD_BE, "pod", pod_uid=UID, qos="besteffort", display=f"pod/{UID[:8]}")),
    (SD_GU, ident(SD_GU, "pod", pod_uid=UID, qos="guaranteed", display=f"pod/{UID[:8]}")),
    ("/kubepods.slice/kubepods-burstable.slice",
     ident("/kubepods.slice/kubepods-burstable.slice", "qos", qos="burstable", display="kubepods/burstable")),
    ("/kubepods.slice", ident("/kubepods.slice", "kubepods", display="kubepods")),
    # a container's own sub-cgroups are charged to the container
    (f"{SD_BU}/cri-containerd-{CID}.scope/init.scope",
     k8s(f"{SD_BU}/cri-containerd-{CID}.scope/init.scope", "burstable", "containerd",
         display=f"{SHORT}/init.scope")),
    # cgroupfs driver
    (f"/kubepods/besteffort/pod{UID}/{CID}", k8s(f"/kubepods/besteffort/pod{UID}/{CID}", "besteffort", None)),
    (f"/kubepods/burstable/pod{UID}/{CID}", k8s(f"/kubepods/burstable/pod{UID}/{CID}", "burstable", None)),
    (f"/kubepods/pod{UID}/{CID}", k8s(f"/kubepods/pod{UID}/{CID}", "guaranteed", None)),
    (f"/kubepods/burstable/pod{UID}/crio-{CID}",
     k8s(f"/kubepods/burstable/pod{UID}/crio-{CID}", "burstable", "crio")),
    (f"/kubepods/burstable/pod{UID}",
     ident(f"/kubepods/burstable/pod{UID}", "pod", pod_uid=UID, qos="burstable", display=f"pod/{UID[:8]}")),
    (f"/kubepods/pod{STATIC_UID}",
     ident(f"/kubepods/pod{STATIC_UID}", "pod", pod_uid=STATIC_UID, qos="guaranteed",
           display=f"pod/{STATIC_UID[:8]}")),
    ("/kubepods/besteffort", ident("/kubepods/besteffort", "qos", qos="besteffort",
                                   display="kubepods/besteffort")),
    ("/kubepods", ident("/kubepods", "kubepods", display="kubepods")),
    ("/kubepods/burstable/not-a-pod", ident("/kubepods/burstable/not-a-pod", "other", qos="burstable",
                                            display="/kubepods/burstable/not-a-pod")),
    (f"/kubepods/pod{UID}/sandbox-helper",
     ident(f"/kubepods/pod{UID}/sandbox-helper", "other", pod_uid=UID, qos="guaranteed",
           display=f"pod/{UID[:8]}/sandbox-helper")),
    # kubepods nested under a prefix: kubelet in its own slice (kind), inside a docker scope as seen
    # from the host, and below a service with the cgroupfs driver
    (f"{KIND}/cri-containerd-{CID}.scope", k8s(f"{KIND}/cri-containerd-{CID}.scope", "besteffort",
                                              "containerd")),
    (f"/system.slice/docker-{CID2}.scope{KIND}/cri-containerd-{CID}.scope",
     k8s(f"/system.slice/docker-{CID2}.scope{KIND}/cri-containerd-{CID}.scope", "besteffort", "containerd")),
    (f"/system.slice/containerd.service/kubepods/burstable/pod{UID}/{CID}",
     k8s(f"/system.slice/containerd.service/kubepods/burstable/pod{UID}/{CID}", "burstable", None)),
    ("/kubelet.slice/kubelet-kubepods.slice",
     ident("/kubelet.slice/kubelet-kubepods.slice", "kubepods", display="kubepods")),
    # not Kubernetes
    (f"/system.slice/docker-{CID}.scope",
     ident(f"/system.slice/docker-{CID}.scope", "docker", container_id=CID, runtime="docker",
           display=f"/system.slice/docker-{CID}.scope")),
    (f"/docker/{CID}", ident(f"/docker/{CID}", "docker", container_id=CID, runtime="docker",
                             display=f"/docker/{CID}")),
    ("/system.slice/containerd.service",
     ident("/system.slice/containerd.service", "system", display="/system.slice/containerd.service")),
    ("/system.slice/sshd.service", ident("/system.slice/sshd.service", "system",
                                         display="/system.slice/sshd.service")),
    ("/init.scope", ident("/init.scope", "system", display="/init.scope")),
    ("/user.slice/user-0.slice/session-1.scope",
     ident("/user.slice/user-0.slice/session-1.scope", "user",
           display="/user.slice/user-0.slice/session-1.scope")),
    ("/", ident("/", "root", display="/")),
    ("", ident("/", "root", display="/")),
    ("/docker", ident("/docker", "other", display="/docker")),
    ("/process_api/0820c38f", ident("/process_api/0820c38f", "other", display="/process_api/0820c38f")),
    # not quite a container id: 63 hex digits
    (f"/kubepods/pod{UID}/{CID[:63]}",
     ident(f"/kubepods/pod{UID}/{CID[:63]}", "other", pod_uid=UID, qos="guaranteed",
           display=f"pod/{UID[:8]}/{CID[:63]}")),
    # path normalisation: no leading slash, trailing and doubled slashes
    (f"kubepods//pod{UID}/{CID}/", k8s(f"/kubepods/pod{UID}/{CID}", "guaranteed", None)),
]


def _case_id(path: str) -> str:
    for long, short in ((CID2, "<cid2>"), (CID, "<cid>"), (UID_, "<uid_>"), (UID, "<uid>")):
        path = path.replace(long, short)
    return path or "<empty>"


@pytest.mark.parametrize(("path", "expected"), PARSE_CASES, ids=[_case_id(p) for p, _ in PARSE_CASES])
def test_parse_cgroup_path(path: str, expected: CgroupIdentity) -> None:
    assert parse_cgroup_path(path) == expected


# --------------------------------------------------------------------------------------------
# Fake hosts
# --------------------------------------------------------------------------------------------

POD_CONTAINER = f"{SD_BU}/cri-containerd-{CID}.scope"
TREE = ["/kubepods.slice", "/kubepods.slice/kubepods-burstable.slice", SD_BU, POD_CONTAINER,
        "/system.slice", "/system.slice/sshd.service"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _mkdirs(base: Path, paths: list[str]) -> None:
    for p in paths:
        (base / p.lstrip("/")).mkdir(parents=True, exist_ok=True)


@pytest.fixture
def v2_host(tmp_path: Path) -> tuple[HostPaths, Path]:
    paths = HostPaths.under(tmp_path)
    root = paths.cgroup_root
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    _mkdirs(root, TREE)
    (root / "cgroup.procs").write_text("")  # files are not cgroups
    return paths, root


@pytest.fixture
def hybrid_host(tmp_path: Path) -> tuple[HostPaths, Path]:
    paths = HostPaths.under(tmp_path)
    root = paths.cgroup_root
    for d in ("cpu", "memory"):
        _mkdirs(root / d, TREE)
    (root / "unified").mkdir(parents=True)
    (root / "unified/cgroup.controllers").write_text("")
    _mkdirs(root / "unified", ["/system.slice"])
    return paths, root


def test_v2_host_ids_are_inodes(v2_host: tuple[HostPaths, Path]) -> None:
    paths, root = v2_host
    r = CgroupResolver(paths)
    assert r.layout.mode == "v2"
    for p in ["/", *TREE]:
        d = root / p.lstrip("/")
        ino = os.stat(d).st_ino
        info = r.resolve(ino)
        assert info is not None, p
        assert (info.path, info.id, info.fs_path, info.hierarchy_version) == (p, ino, d, 2)
        assert r.id_of(p) == ino
    info = r.resolve(os.stat(root / POD_CONTAINER.lstrip("/")).st_ino)
    assert isinstance(info, CgroupInfo) and isinstance(info, CgroupIdentity)
    assert (info.kind, info.pod_uid, info.container_id, info.qos) == ("container", UID, CID, "burstable")
    assert [i.path for i in r.all()] == sorted(["/", *TREE])


def test_hybrid_host_indexes_each_hierarchy_separately(hybrid_host: tuple[HostPaths, Path]) -> None:
    paths, root = hybrid_host
    r = CgroupResolver(paths)
    assert r.layout.mode == "hybrid"
    cpu, memory, unified = r.layout.cpu, r.layout.v1["memory"], r.layout.v2
    assert cpu is not None and unified is not None
    assert (cpu.version, cpu.mount) == (1, root / "cpu")
    cpu_ino = os.stat(root / "cpu" / POD_CONTAINER.lstrip("/")).st_ino
    mem_ino = os.stat(root / "memory" / POD_CONTAINER.lstrip("/")).st_ino

    info = r.resolve(cpu_ino)  # default hierarchy: cpu
    assert info is not None
    assert (info.path, info.hierarchy_version, info.fs_path.parent.parent.parent.parent.name) == (
        POD_CONTAINER, 1, "cpu")
    assert r.id_of(POD_CONTAINER) == cpu_ino
    assert r.id_of(POD_CONTAINER, memory) == mem_ino
    m = r.resolve(mem_ino, memory)
    assert m is not None and m.path == POD_CONTAINER and m.fs_path == root / "memory" / POD_CONTAINER[1:]
    # An id from the memory hierarchy means nothing in the cpu hierarchy.
    assert r.resolve(mem_ino) is None
    u = r.resolve(os.stat(root / "unified/system.slice").st_ino, unified)
    assert u is not None and (u.path, u.kind, u.hierarchy_version) == ("/system.slice", "system", 2)
    assert [i.path for i in r.all(unified)] == ["/", "/system.slice"]


def test_invalidate_picks_up_new_and_removed(v2_host: tuple[HostPaths, Path]) -> None:
    paths, root = v2_host
    clock = FakeClock()
    r = CgroupResolver(paths, rescan_interval=3600, clock=clock)
    assert len(r.all()) == len(TREE) + 1
    new = root / "system.slice/new.service"
    new.mkdir()
    new_ino = os.stat(new).st_ino
    assert r.resolve(new_ino) is None  # within the interval: no rescan
    r.invalidate()
    info = r.resolve(new_ino)
    assert info is not None and info.path == "/system.slice/new.service"

    new.rmdir()
    assert r.resolve(new_ino) is not None  # still cached: ids are never reused, stale is harmless
    r.invalidate()
    assert r.resolve(new_ino) is None
    assert "/system.slice/new.service" not in {i.path for i in r.all()}


def test_rescan_after_interval_picks_up_new_and_removed(v2_host: tuple[HostPaths, Path]) -> None:
    paths, root = v2_host
    clock = FakeClock()
    r = CgroupResolver(paths, rescan_interval=1.0, clock=clock)
    sshd = root / "system.slice/sshd.service"
    sshd_ino = os.stat(sshd).st_ino
    assert r.resolve(sshd_ino) is not None
    new = root / "system.slice/new.service"
    new.mkdir()
    new_ino = os.stat(new).st_ino
    clock.now += 0.5
    assert r.resolve(new_ino) is None
    clock.now += 0.6
    assert r.resolve(new_ino) is not None  # interval passed: the miss triggered a rescan

    sshd.rmdir()
    clock.now += 1.1
    assert r.resolve(10**12) is None  # any miss after the interval rescans...
    assert r.resolve(sshd_ino) is None  # ...and the removed cgroup is gone from the index
    assert r.id_of("/system.slice/sshd.service") is None


def _count_walks(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The hierarchies CgroupResolver walks from now on, one entry a walk."""
    walks: list[Path] = []
    real_walk = CgroupResolver._walk

    def counting_walk(self: CgroupResolver, h, known):  # type: ignore[no-untyped-def]
        walks.append(h.mount)
        return real_walk(self, h, known)

    monkeypatch.setattr(CgroupResolver, "_walk", counting_walk)
    return walks


def test_rescans_are_rate_limited(v2_host: tuple[HostPaths, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    paths, root = v2_host
    walks = _count_walks(monkeypatch)
    clock = FakeClock()
    r = CgroupResolver(paths, rescan_interval=1.0, clock=clock)
    unknown = range(10**9, 10**9 + 500)

    assert all(r.resolve(i) is None for i in unknown)
    assert len(walks) == 1  # the first lookup builds the index; the flood adds no walks

    clock.now += 1.5
    assert all(r.resolve(i) is None for i in unknown)
    assert len(walks) == 2  # one rescan for the whole flood, then the ids are known to be dead

    clock.now += 1.5
    assert all(r.resolve(i) is None for i in unknown)
    assert len(walks) == 2  # negative cache: dead ids do not walk again, however much time passes

    (root / "system.slice/late.service").mkdir()
    late = os.stat(root / "system.slice/late.service").st_ino
    assert r.resolve(late) is not None  # a new id after the interval rescans (and clears negatives)
    assert len(walks) == 3
    assert r.resolve(late) is not None and len(walks) == 3  # hits never walk

    clock.now += 1.5
    assert r.resolve(10**9) is None  # negatives were cleared by that rescan: this one walks
    assert len(walks) == 4

    r.invalidate()
    r.resolve(late)
    assert len(walks) == 5  # invalidate() forces a walk regardless of the interval


def test_id_of_edge_cases(v2_host: tuple[HostPaths, Path], tmp_path: Path) -> None:
    paths, root = v2_host
    clock = FakeClock()
    r = CgroupResolver(paths, rescan_interval=3600, clock=clock)
    assert r.id_of("/does/not/exist") is None
    assert r.id_of("/cgroup.procs") is None  # a file, not a cgroup
    assert r.id_of("/system.slice/../..") is None  # never outside the hierarchy
    (root / "system.slice/link").symlink_to(root / "kubepods.slice")
    assert r.id_of("/system.slice/link") is None
    assert r.id_of("system.slice/sshd.service/") == os.stat(root / "system.slice/sshd.service").st_ino

    r.all()  # build the index, then create a cgroup the index cannot know about
    (root / "system.slice/fresh.service").mkdir()
    ino = r.id_of("/system.slice/fresh.service")
    assert ino == os.stat(root / "system.slice/fresh.service").st_ino
    info = r.resolve(ino)  # no rescan allowed (interval 1 h): id_of fed the index
    assert info is not None and info.path == "/system.slice/fresh.service"


def test_walk_follows_no_symlinks_and_survives_vanishing_dirs(
    v2_host: tuple[HostPaths, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, root = v2_host
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (root / "system.slice/escape").symlink_to(outside)
    (root / "system.slice/loop").symlink_to(root)  # would never end if followed
    doomed = root / "kubepods.slice/kubepods-burstable.slice"
    nodev = root / "system.slice/sshd.service"
    real_scandir = os.scandir

    def flaky_scandir(p):  # type: ignore[no-untyped-def]
        if isinstance(p, int):  # shutil.rmtree lists by fd
            return real_scandir(p)
        if Path(p) == doomed:
            shutil.rmtree(p)  # removed between being listed and being read, like a deleted pod
        if Path(p) == nodev:
            raise OSError(errno.ENODEV, "No such device", os.fspath(p))
        return real_scandir(p)

    monkeypatch.setattr(cgroups_mod.os, "scandir", flaky_scandir)
    r = CgroupResolver(paths)
    found = {i.path for i in r.all()}
    monkeypatch.undo()
    # The vanished directory itself was listed before it went; nothing below it can be.
    assert found == {"/", "/kubepods.slice", "/kubepods.slice/kubepods-burstable.slice", "/system.slice",
                     "/system.slice/sshd.service"}
    assert r.resolve(os.stat(outside).st_ino) is None


def test_walk_large_tree(tmp_path: Path) -> None:
    """~2,000 cgroups, laid out like a busy node: every one indexed under its own inode."""
    paths = HostPaths.under(tmp_path)
    root = paths.cgroup_root
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    expected: dict[str, str] = {"/": "root", "/kubepods.slice": "kubepods"}
    for qos in ("besteffort", "burstable"):
        qdir = f"/kubepods.slice/kubepods-{qos}.slice"
        expected[qdir] = "qos"
        for n in range(200):
            uid = f"{n:08x}-0000-4000-8000-{qos[:4].encode().hex():0>12}"
            pod = f"{qdir}/kubepods-{qos}-pod{uid.replace('-', '_')}.slice"
            expected[pod] = "pod"
            for c in range(4):
                expected[f"{pod}/cri-containerd-{n:04x}{c:02x}{qos[:4].encode().hex()}{'0' * 50}.scope"] = (
                    "container")
    expected["/system.slice"] = "system"
    for s in range(50):
        expected[f"/system.slice/svc{s}.service"] = "system"
    for p in expected:
        (root / p.lstrip("/")).mkdir(exist_ok=True)
    assert len(expected) > 2000

    r = CgroupResolver(paths)
    infos = r.all()
    assert {i.path: i.kind for i in infos} == expected
    assert len({i.id for i in infos}) == len(infos)
    for i in infos:
        assert i.id == os.stat(root / i.path.lstrip("/")).st_ino
        assert r.resolve(i.id) is i
    pods = {i.pod_uid for i in infos if i.kind == "container"}
    assert len(pods) == 400


# --------------------------------------------------------------------------------------------
# This kernel
# --------------------------------------------------------------------------------------------


@pytest.mark.vm
@pytest.mark.root
def test_real_cgroup_id_is_inode_and_resolves(make_cgroup) -> None:  # type: ignore[no-untyped-def]
    layout = discover()
    assert layout.cpu is not None
    cg = make_cgroup("a", ("cpu",))
    d = cg.path("cpu")
    rel = "/" + d.relative_to(layout.cpu.mount).as_posix()
    ino = os.stat(d).st_ino

    r = CgroupResolver()
    assert r.id_of(rel) == ino
    info = CgroupResolver().resolve(ino)  # a fresh resolver: found by walking, not via id_of
    assert info is not None
    assert (info.path, info.fs_path, info.hierarchy_version) == (rel, d, layout.cpu.version)
    root = r.resolve(os.stat(layout.cpu.mount).st_ino)
    assert root is not None and root.kind == "root" and root.path == "/"

    assert r.resolve(ino) is not None
    cg.remove()
    r.invalidate()
    assert r.resolve(ino) is None
    assert r.id_of(rel) is None
    assert rel not in {i.path for i in r.all()}


@pytest.mark.vm
@pytest.mark.root
def test_real_v2_tree_has_its_own_ids(make_cgroup) -> None:  # type: ignore[no-untyped-def]
    layout = discover()
    if layout.v2 is None or layout.v2 == layout.cpu:
        pytest.skip("no separate v2 hierarchy on this host")
    cg = make_cgroup("u", ("unified",))
    d = cg.path("unified")
    rel = "/" + d.relative_to(layout.v2.mount).as_posix()
    ino = os.stat(d).st_ino
    r = CgroupResolver()
    info = r.resolve(ino, layout.v2)
    assert info is not None and (info.path, info.hierarchy_version) == (rel, 2)
    assert r.id_of(rel, layout.v2) == ino


def test_parsed_paths_of_removed_cgroups_are_not_kept(v2_host: tuple[HostPaths, Path]) -> None:
    """Paths stay parsed while their cgroups are there; a removed one's entry goes after the next walks
    (pod churn grew a fixed 4,096-entry cache by ~2 MiB of removed pods' paths)."""
    from detector import cgroups

    paths, root = v2_host
    r = CgroupResolver(paths)
    gone = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podgone_1.slice"
    (root / gone.lstrip("/")).mkdir(parents=True)
    r.all(max_age=0.0)
    cache = cgroups._IDENTITIES
    assert gone in cache.current and all(p in cache.current for p in TREE)
    (root / gone.lstrip("/")).rmdir()
    for _ in range(2):  # two walks: a generation without it, then it is dropped
        r.all(max_age=0.0)
    assert gone not in cache.current and gone not in cache.previous
    assert all(p in cache.current for p in TREE)  # the live ones are carried over by the walk
    assert parse_cgroup_path(gone).path == gone  # and a path asked again is simply parsed again


@pytest.mark.root
def test_a_cgroup_newer_than_the_walk_is_named_at_once_by_its_handle(make_cgroup, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A pod that starts between walks was unknown until the next one (5 s in the agent): an incident
    opened meanwhile blamed nobody for its wait (issue 39's soak, 4 of 13 episodes). Its id opens its
    directory by handle (open_by_handle_at), so it is named in one system call and no walk; a removed
    cgroup's id is known dead the same way. Ground truth: the directory's inode is the id BPF reports."""
    layout = discover()
    assert layout.cpu is not None
    walks = _count_walks(monkeypatch)
    r = CgroupResolver(rescan_interval=3600.0)
    root = r.resolve(os.stat(layout.cpu.mount).st_ino)
    assert root is not None and root.path == "/" and len(walks) == 1
    cg = make_cgroup("late", ("cpu",))  # made after the walk
    d = cg.path("cpu")
    rel = "/" + d.relative_to(layout.cpu.mount).as_posix()
    ino = os.stat(d).st_ino
    info = r.resolve(ino)
    assert info is not None and (info.path, info.fs_path, info.id) == (rel, d, ino)
    assert len(walks) == 1, "named by its handle, not by another walk"
    assert r.id_of(rel) == ino
    cg.remove()
    gone = ino + (1 << 40)  # an id no cgroup has: a later generation of the same inode number
    assert r.resolve(gone) is None and len(walks) == 1
    assert gone in r._indexes[layout.cpu.mount].negatives
