# SPDX-License-Identifier: Apache-2.0
"""`noisyneighbor top` end to end: real probes, a fake pod laid out like the kubelet's systemd driver, and
workloads in test cgroups for each view (memcg reclaim, loopback connects, a CPU-throttled spinner)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest
from rich.console import Console

from noisyneighbor.sections import (
    VIEWS,
    Context,
    DeadCgroups,
    OffSource,
    PsiSection,
    TableSource,
    sort_table_rows,
    table_section,
)
from noisyneighbor.top import Frame, frame_record, unavailable
from noisyneighbor.views import render_frame
from probes import runqlat
from probes.cgroupfs import discover
from probes.engine import OBJECT_DIR, ProbeError, ProbeStatus
from probes.hist import HIST_SLOTS, LatencyHistogram
from probes.host import HostPaths
from probes.reclaim import ReclaimSnapshot, ReclaimStats
from probes.runqlat import RunqSnapshot
from probes.softirq import SoftirqStall
from testkit.tools import require_tool
from tests.conftest import read_terminal

CLI = [sys.executable, "-m", "noisyneighbor.cli"]


def _hist(count: int, slot: int, sum_ns: int, max_ns: int) -> LatencyHistogram:
    slots = [0] * HIST_SLOTS
    slots[slot] = count
    return LatencyHistogram(tuple(slots), sum_ns, count, max_ns)


class _FakeResolver:
    def resolve(self, cgroup_id, hierarchy=None):
        return None


def _runq_section(before: RunqSnapshot, after: RunqSnapshot) -> dict:
    return table_section(runqlat.PLUGIN, before, after, _FakeResolver(), extras=runqlat.top_cpus(None, None))  # type: ignore[arg-type]


def test_interval_rows_from_two_snapshots():
    before = RunqSnapshot(10.0, {7: _hist(10, 5, 200_000, 30_000)}, [LatencyHistogram.empty()], {})
    after = RunqSnapshot(12.0, {7: _hist(30, 5, 800_000, 30_000), 8: _hist(4, 11, 4_000_000, 1_500_000)},
                         [_hist(34, 5, 1, 1)], {"key_map_full": 2})
    interval = _runq_section(before, after)
    rows = {r["cgroup_id"]: r for r in interval["cgroups"]}
    assert rows[7]["events"] == 20 and rows[7]["events_per_s"] == pytest.approx(10.0)
    assert rows[7]["wait_ms_per_s"] == pytest.approx(0.3)
    assert 16 <= rows[7]["p99_us"] <= 32  # slot 5 is [16, 32) µs
    assert not rows[7]["max_exact"]  # the all-time max did not grow: only the slot bound is known
    assert rows[8]["max_exact"] and rows[8]["max_us"] == pytest.approx(1500)
    assert rows[8]["name"] == "cgroup:8 (gone)"
    assert [r["cgroup_id"] for r in sort_table_rows(interval["cgroups"], runqlat.TOP_TABLE, "wait")] == [8, 7]
    assert interval["drops"] == {"key_map_full": 2}


@pytest.mark.root
def test_top_names_the_pod_and_measures_its_wait(make_cgroup):
    stress = require_tool("stress-ng")
    pod_uid = str(uuid.uuid4())
    container = uuid.uuid4().hex + uuid.uuid4().hex
    pod = make_cgroup(
        "kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{pod_uid.replace('-', '_')}.slice/cri-containerd-{container}.scope"
    )
    cpu = str(os.cpu_count() - 1)
    hog = subprocess.Popen(["taskset", "-c", cpu, stress, "--cpu", "3", "-t", "20", "--quiet"], preexec_fn=pod.preexec)
    try:
        out = subprocess.run(
            [*CLI, "top", "--once", "--json", "--interval", "1.5", "--sort", "p99"],
            capture_output=True, text=True, timeout=60, check=True,
        )
    finally:
        hog.kill()
        hog.wait()
    record = json.loads(out.stdout)
    assert record["type"] == "interval"
    rows = [r for r in record["cgroups"] if r["pod_uid"] == pod_uid]
    assert rows, f"pod {pod_uid} not in {[r['cgroup'] for r in record['cgroups']]}"
    row = rows[0]
    assert row["container_id"] == container and row["qos"] == "besteffort" and row["kind"] == "container"
    # Three hogs on one CPU: each waits about 2/3 of the time.
    assert row["wait_ms_per_s"] > 500
    assert row["events"] > 10
    assert {c["cpu"] for c in record["cpus"]} == set(range(os.cpu_count()))


@pytest.mark.root
def test_cgroup_filter_and_plain_output(make_cgroup):
    cg = make_cgroup("filtered")
    spin = "import time\nt = time.time() + 8\nwhile time.time() < t: pass"
    busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", spin], preexec_fn=cg.preexec)
    try:
        path = "/" + str(cg.path("cpu").relative_to("/sys/fs/cgroup/cpu"))
        out = subprocess.run([*CLI, "top", "--once", "--json", "--cgroup", path, "--interval", "1"],
                             capture_output=True, text=True, timeout=60, check=True)
        plain = subprocess.run([*CLI, "top", "--count", "1", "--interval", "0.5"],
                               capture_output=True, text=True, timeout=60, check=True)
    finally:
        busy.kill()
        busy.wait()
    rows = json.loads(out.stdout)["cgroups"]
    assert rows and all(r["cgroup"] == path or r["cgroup"].startswith(path + "/") for r in rows)
    assert "CGROUP / POD" in plain.stdout and "runqlat: on" in plain.stdout
    assert "\x1b[" not in plain.stdout  # piped: no terminal escapes


@pytest.mark.root
def test_json_lines_start_with_a_status_record():
    proc = subprocess.Popen([*CLI, "top", "--json", "--interval", "0.5", "--count", "2"],
                            stdout=subprocess.PIPE, text=True)
    lines = [json.loads(line) for line in proc.stdout]
    assert proc.wait(timeout=30) == 0
    assert lines[0]["type"] == "status" and lines[0]["probes"]["runqlat"]["state"] == "on"
    assert [r["type"] for r in lines[1:]] == ["interval", "interval"]


def test_missing_bpf_objects_is_one_line_and_exit_1(tmp_path):
    env = dict(os.environ, NN_BPF_OBJECT_DIR=str(tmp_path))
    out = subprocess.run([*CLI, "top", "--once"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0 and "runqlat: off" in out.stderr and "Traceback" not in out.stderr


def test_bad_arguments_are_rejected_without_traceback():
    out = subprocess.run([*CLI, "top", "--interval", "-1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "must be > 0" in out.stderr and "Traceback" not in out.stderr


# -- every view ------------------------------------------------------------------------------------

ALL_SOURCES = {"runqlat", "softirq", "reclaim", "tcpconnect", "psi"}


def _top(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "top", *args], capture_output=True, text=True, timeout=60, check=check,
                          env=dict(os.environ, COLUMNS="200", **(env or {})))


SECTION_TYPES = {"softirq": dict, "reclaim": dict, "tcp": dict, "psi": PsiSection}


def _render(record: dict, view: str) -> str:
    """A JSON section rebuilt into its dataclass and rendered as the plain table would be."""
    section = SECTION_TYPES[view](**record[view])
    statuses = {name: ProbeStatus(**status) for name, status in record["probes"].items()}
    out = io.StringIO()
    Console(file=out, width=160).print(render_frame(record["ts"], {view: section}, [view], statuses))
    return out.getvalue()


def _path_in(cg, controller: str) -> str:
    """The cgroup's path as the resolver reports it: relative to the hierarchy holding `controller`."""
    hierarchy = discover().hierarchy_for(controller)
    assert hierarchy is not None
    return "/" + str(cg.path(controller).relative_to(hierarchy.mount))


class _Info:
    def __init__(self, path: str) -> None:
        self.path = self.display = path
        self.kind, self.pod_uid, self.container_id, self.qos = "other", None, None, None


class _NamingResolver:
    """Resolves the ids in `alive` to /cg/<id>; records which hierarchy each lookup asked for."""

    def __init__(self, alive: set[int]) -> None:
        self.alive, self.hierarchies = alive, set()

    def resolve(self, cgroup_id, hierarchy=None):
        self.hierarchies.add(hierarchy)
        return _Info(f"/cg/{cgroup_id}") if cgroup_id in self.alive else None

    def id_of(self, path, hierarchy=None):
        cgroup_id = int(path.rsplit("/", 1)[1])
        return cgroup_id if cgroup_id in self.alive else None


def test_dead_cgroups_are_forgotten_after_idle_intervals():
    forgotten: list[int] = []
    dead = DeadCgroups(lambda ids: forgotten.extend(ids) or len(ids), _NamingResolver({1}), "h", after=2)
    assert dead.update({1: 5, 2: 5, 3: 1}, {1: 5, 2: 5, 3: 2}) == []  # idle once; 3 active
    assert dead.update({1: 5, 2: 5, 3: 2}, {1: 5, 2: 5, 3: 2}) == [2]  # 1 resolves (alive), 3 idle once only
    assert forgotten == [2] and 2 not in dead.quiet_since


def _reclaim_snap(t: float, counts: dict[int, int]) -> ReclaimSnapshot:
    return ReclaimSnapshot(
        t, {(cg, "memcg"): ReclaimStats(_hist(n, 10, n * 600_000, 700_000), n * 32, 0) for cg, n in counts.items()},
        {"direct": ReclaimStats.empty()}, {"key_map_full": 0},
    )


class _FakeReclaimProbe:
    hierarchy = "memory-hierarchy"

    def __init__(self, snaps: list[ReclaimSnapshot]) -> None:
        self.status = ProbeStatus("reclaim", "on")
        self.snaps, self.forgotten = iter(snaps), []

    def snapshot(self) -> ReclaimSnapshot:
        return next(self.snaps)

    def forget(self, ids: list[int]) -> int:
        self.forgotten.extend(ids)
        return len(ids)


def test_reclaim_rows_are_named_in_the_memory_hierarchy_and_dead_ids_forgotten(tmp_path):
    resolver = _NamingResolver({5})
    probe = _FakeReclaimProbe([_reclaim_snap(float(t), {5: 1 + (t == 1), 9: 2}) for t in range(6)])
    source = TableSource(probe, Context(HostPaths.under(tmp_path), None, resolver))  # type: ignore[arg-type]
    source.start()
    first = source.collect({})
    assert [(r["cgroup"], r["kind"], r["cgroup_kind"], r["count"], r["pages"]) for r in first["rows"]] == [
        ("/cg/5", "memcg", "other", 1, 32)
    ]
    assert first["allocstall"] is None  # no /proc/vmstat under tmp_path: unknown, not 0
    for _ in range(4):
        assert source.collect({})["rows"] == []
    assert resolver.hierarchies == {"memory-hierarchy"}
    assert probe.forgotten == [9]  # idle and gone; 5 is idle but still exists


def test_record_and_plain_render_with_a_probe_off():
    before = RunqSnapshot(10.0, {7: _hist(10, 5, 200_000, 30_000)}, [LatencyHistogram.empty()], {})
    after = RunqSnapshot(11.0, {7: _hist(30, 5, 800_000, 30_000), 8: _hist(4, 11, 4_000_000, 1_500_000)},
                         [_hist(34, 5, 1, 1)], {})
    off = OffSource("softirq", ProbeError("softirq: off: BPF object /x/softirq.bpf.o missing"))
    statuses = {"runqlat": ProbeStatus("runqlat", "on", attach_mode="tp_btf"), "softirq": off.status}
    frame = Frame("2026-01-01T00:00:00+00:00", {"runq": _runq_section(before, after)})
    record = frame_record(frame, "wait", limit=1)
    assert [r["cgroup_id"] for r in record["cgroups"]] == [8] and "softirq" not in record
    assert off.status.reason == "BPF object /x/softirq.bpf.o missing"
    assert unavailable("softirq", [off]) == "softirq: off: BPF object /x/softirq.bpf.o missing"
    running = OffSource("runqlat", "unused")
    running.status = statuses["runqlat"]
    assert unavailable("all", [off, running]) is None and unavailable("runq", [off, running]) is None
    assert unavailable("all", [off]) is not None  # nothing at all could start
    out = io.StringIO()
    Console(file=out, width=120).print(render_frame(frame.ts, frame.sections, VIEWS, statuses))
    text = out.getvalue()
    assert "CGROUP / POD" in text and "softirq: off: BPF object /x/softirq.bpf.o missing" in text


def test_softirq_footer_names_the_worst_stall():
    stall = SoftirqStall(ts_ns=1, cpu=1, vector="NET_RX", delay_ns=12_500_000, runtime_ns=300_000, in_ksoftirqd=True,
                         raise_seen=True, raise_pid=10, raise_tgid=10, raise_comm="iperf3", raise_cgroup_id=7,
                         entry_pid=20, entry_tgid=20, entry_comm="ksoftirqd/1", entry_cgroup_id=1)
    section = {"interval_s": 1.0, "rows": [], "stalls": 1, "stall_threshold_ms": 10.0,
               "worst_stalls": [{**asdict(stall), "raise_cgroup": "pod/abc", "entry_cgroup": "/"}], "drops": {}}
    out = io.StringIO()
    statuses = {"softirq": ProbeStatus("softirq", "on")}
    Console(file=out, width=300).print(render_frame("ts", {"softirq": section}, ["softirq"], statuses))
    assert ("stall events (≥10ms delay or run): 1 — worst: NET_RX cpu1 delay 12.5ms run 300µs, raised under iperf3 "
            "in pod/abc, ran in ksoftirqd (ksoftirqd/1)") in out.getvalue()


@pytest.mark.root
def test_view_all_once_json_has_every_section_with_the_right_types():
    record = json.loads(_top("--view", "all", "--once", "--json", "--interval", "1").stdout)
    assert record["type"] == "interval" and set(record["probes"]) == ALL_SOURCES
    assert {p["state"] for p in record["probes"].values()} <= {"on", "degraded"}
    # runq keeps its top-level keys
    assert isinstance(record["cgroups"], list) and isinstance(record["drops"], dict)
    assert {c["cpu"] for c in record["cpus"]} == set(range(os.cpu_count()))

    softirq = record["softirq"]
    assert isinstance(softirq["stalls"], int) and isinstance(softirq["worst_stalls"], list)
    assert softirq["rows"], "no softirq ran in a second (timers and RCU always do)"
    for row in softirq["rows"]:
        assert isinstance(row["cpu"], int) and isinstance(row["vector"], str)
        for key in ("entries_per_s", "delay_p99_us", "delay_max_us", "runtime_p99_us", "runtime_max_us",
                    "runtime_ms_per_s"):
            assert isinstance(row[key], int | float) and row[key] >= 0
    runtimes = [r["runtime_ms_per_s"] for r in softirq["rows"]]
    assert runtimes == sorted(runtimes, reverse=True)

    reclaim = record["reclaim"]
    assert isinstance(reclaim["rows"], list) and isinstance(reclaim["node"], dict)
    assert isinstance(reclaim["allocstall"], int)
    tcp = record["tcp"]
    assert isinstance(tcp["rows"], list) and isinstance(tcp["drops"], dict)
    psi = record["psi"]
    assert set(psi["node"]) == {"cpu", "memory", "io", "irq"} and isinstance(psi["cgroup_psi_scope"], str)
    assert isinstance(psi["cgroups"], list)
    assert softirq["rows"][0]["vector"] in _render(record, "softirq")
    for view, header in (("reclaim", "MEMORY CGROUP / POD"), ("tcp", "TOP DESTINATIONS"), ("psi", "NODE PSI")):
        assert header in _render(record, view)


def _fs_type(path: Path) -> str:
    """Filesystem type of the mount holding `path` (the longest mount point prefix)."""
    best, fstype, real = "", "", str(path.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        mnt, typ = line.split()[1:3]
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, typ
    return fstype


RECLAIM_WORKLOAD = r"""
import os, sys
path = sys.argv[1]
chunk = b"\xa5" * (1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
for i in range(128):
    os.write(fd, chunk)
    if i % 8 == 7:
        os.fdatasync(fd)  # never pile dirty pages up against the limit
os.close(fd)
print("ready", flush=True)
buf = bytearray(1 << 20)
while True:
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
"""


@pytest.mark.root
def test_reclaim_view_names_the_memory_cgroup(make_cgroup, tmp_path):
    if _fs_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("tmp_path is on tmpfs: page cache there is not reclaimable without swap")
    mem = make_cgroup("mem", ("memory",))
    hierarchy = discover().hierarchy_for("memory")
    assert hierarchy is not None
    mem.write("memory", "memory.limit_in_bytes" if hierarchy.version == 1 else "memory.max", str(32 << 20))
    big = tmp_path / "big"
    work = subprocess.Popen([sys.executable, "-c", RECLAIM_WORKLOAD, str(big)], stdout=subprocess.PIPE, text=True,
                            preexec_fn=mem.preexec)
    try:
        assert work.stdout is not None and work.stdout.readline() == "ready\n"
        record = json.loads(_top("--view", "reclaim", "--once", "--json", "--interval", "1").stdout)
    finally:
        work.kill()
        work.wait()
        big.unlink(missing_ok=True)
    assert set(record) >= {"reclaim", "probes"} and "softirq" not in record and "cgroups" not in record
    path = _path_in(mem, "memory")
    rows = [r for r in record["reclaim"]["rows"] if r["cgroup"] == path and r["kind"] == "memcg"]
    assert rows, f"{path} not in {[(r['cgroup'], r['kind']) for r in record['reclaim']['rows']]}"
    assert rows[0]["name"] == path and rows[0]["count"] > 0 and rows[0]["pages"] > 0 and rows[0]["stall_ms_per_s"] > 0
    # Rendered with our rows only: the name column gets what the other columns leave of the width, and
    # other cgroups reclaiming on a shared node (wider QOS, kind or numbers) would leave it less.
    ours = {**record, "reclaim": {**record["reclaim"], "rows": rows}}
    assert f"{path} " in _render(ours, "reclaim")


TCP_CLIENT = r"""
import socket, sys, time
port, closed = int(sys.argv[1]), int(sys.argv[2])
end = time.monotonic() + 20
while time.monotonic() < end:
    socket.create_connection(("127.0.0.1", port)).close()
    try:
        socket.create_connection(("127.0.0.1", closed)).close()
    except ConnectionRefusedError:
        pass
    time.sleep(0.005)
"""


@pytest.mark.root
def test_tcp_view_counts_loopback_connects_of_a_test_cgroup(make_cgroup):
    cg = make_cgroup("tcp")
    with socket.socket() as listener, socket.socket() as closed:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.settimeout(0.1)
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connects to it are refused (RST)
        port, closed_port = listener.getsockname()[1], closed.getsockname()[1]
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    listener.accept()[0].close()

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        client = subprocess.Popen([sys.executable, "-c", TCP_CLIENT, str(port), str(closed_port)],
                                  preexec_fn=cg.preexec)
        try:
            record = json.loads(_top("--view", "tcp", "--once", "--json", "--interval", "1").stdout)
        finally:
            client.kill()
            client.wait()
            stop.set()
            acceptor.join()
    path = _path_in(cg, "cpu")
    rows = [r for r in record["tcp"]["rows"] if r["cgroup"] == path]
    assert len(rows) == 1, f"{path} not in {[r['cgroup'] for r in record['tcp']['rows']]}"
    row = rows[0]
    assert row["netns"] == os.stat("/proc/self/ns/net").st_ino
    assert row["successes"] > 10 and row["failures"] > 10 and row["refused"] == row["failures"]
    assert row["connects_per_s"] > 10 and 0 < row["latency_p50_ms"] <= row["latency_max_ms"]
    assert f"127.0.0.1:{port}" in {d["dest"] for d in row["top_destinations"]}
    assert f"127.0.0.1:{port} (" in _render(record, "tcp")


SPIN = "import time\nt = time.time() + 20\nwhile time.time() < t: pass"


@pytest.mark.root
def test_psi_view_node_pressure_and_a_self_throttled_cgroup(make_cgroup):
    layout = discover()
    if layout.v1:
        cg = make_cgroup("thr", ("cpu", "cpuacct"))
        cg.write("cpu", "cpu.cfs_period_us", "100000")
        cg.write("cpu", "cpu.cfs_quota_us", "20000")
    else:
        cg = make_cgroup("thr", ("cpu",))
        cg.write("cpu", "cpu.max", "20000 100000")
    spin = subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=cg.preexec)
    try:
        record = json.loads(_top("--view", "psi", "--once", "--json", "--interval", "1").stdout)
    finally:
        spin.kill()
        spin.wait()
    psi = record["psi"]
    for resource in ("cpu", "memory", "io"):
        node = psi["node"][resource]
        assert node["available"] is True
        for key in ("some_pct", "full_pct", "some_avg10", "full_avg10"):
            assert isinstance(node[key], int | float) and node[key] >= 0, (resource, key, node)
    if not Path("/proc/pressure/irq").exists():
        assert psi["node"]["irq"]["available"] is False and "irq" in psi["node"]["irq"]["reason"]
        assert "no irq pressure" in record["probes"]["psi"]["reason"]
    if layout.mode == "hybrid":
        assert psi["cgroup_psi_scope"].startswith("unified tree only")

    path = _path_in(cg, "cpu")
    rows = [r for r in psi["cgroups"] if r["cgroup"] == path]
    assert rows, f"{path} not in {[r['cgroup'] for r in psi['cgroups']]}"
    row = rows[0]
    assert row["quota_cores"] == pytest.approx(0.2)
    assert 0.1 < row["cores"] < 0.3 and row["throttled_pct"] > 50 and row["throttled_ms_per_s"] > 0
    if layout.mode == "hybrid":  # a v1-only cgroup has no twin in the unified tree: no PSI for it
        assert row["psi"] is None and row["psi_cgroup"] is None
    assert psi["cgroups"][0]["cgroup"] == path  # the most throttled first
    text = _render(record, "psi")
    assert "NODE PSI" in text and "THROTTLED▼" in text and "   0.20 " in text  # the quota, in cores


@pytest.mark.root
def test_a_probe_that_cannot_load_does_not_stop_the_others(tmp_path):
    shutil.copy(Path(os.environ.get("NN_BPF_OBJECT_DIR", OBJECT_DIR)) / "runqlat.bpf.o", tmp_path)
    env = {"NN_BPF_OBJECT_DIR": str(tmp_path)}
    lines = [json.loads(line) for line in
             _top("--view", "all", "--json", "--count", "1", "--interval", "0.5", env=env).stdout.splitlines()]
    status, interval = lines
    assert status["type"] == "status" and set(status["probes"]) == ALL_SOURCES
    assert status["probes"]["runqlat"]["state"] == "on" and status["probes"]["psi"]["state"] in ("on", "degraded")
    for name in ("softirq", "reclaim", "tcpconnect"):
        probe = status["probes"][name]
        assert probe["state"] == "off"
        assert probe["reason"] == f"BPF object {tmp_path}/{name}.bpf.o missing (build it with `make bpf`)"
    assert interval["type"] == "interval" and "cgroups" in interval and "psi" in interval
    assert not {"softirq", "reclaim", "tcp"} & set(interval)

    plain = _top("--view", "all", "--once", "--interval", "0.5", env=env).stdout
    assert "CGROUP / POD" in plain and "NODE PSI" in plain
    assert f"softirq: off: BPF object {tmp_path}/softirq.bpf.o missing" in plain

    alone = _top("--view", "softirq", "--once", env=env, check=False)
    assert alone.returncode == 1 and alone.stderr.count("\n") == 1 and "softirq: off" in alone.stderr


def test_idle_views_say_nothing_happened_instead_of_an_empty_table():
    statuses = {"reclaim": ProbeStatus("reclaim", "on", attach_mode="tp_btf"),
                "tcpconnect": ProbeStatus("tcpconnect", "on", attach_mode="tp_btf")}
    sections = {"reclaim": {"interval_s": 1.0, "rows": [], "node": {}, "allocstall": 0, "allocstall_per_s": 0.0, "drops": {}},
                "tcp": {"interval_s": 1.0, "rows": [], "drops": {}}}
    out = io.StringIO()
    Console(file=out, width=160).print(render_frame("2026-01-01T00:00:00+00:00", sections, ["reclaim", "tcp"], statuses))
    text = out.getvalue()
    assert "nothing this interval: no memory reclaim in any cgroup" in text
    assert "nothing this interval: no TCP connect" in text


@pytest.mark.root
def test_live_top_uses_the_alternate_screen_and_draws_before_the_first_interval():
    """On a terminal: the alternate screen (the prompt comes back untouched) and a first screen with
    the probes' states before any interval is measured."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([*CLI, "top", "--count", "1", "--interval", "1"], stdin=follower, stdout=follower,
                            stderr=subprocess.PIPE, env=dict(os.environ, COLUMNS="160", LINES="50", TERM="xterm"))
    os.close(follower)
    screen = read_terminal(leader)
    os.close(leader)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    text = screen.decode(errors="replace")
    assert "\x1b[?1049h" in text and "\x1b[?1049l" in text  # entered and left the alternate screen
    first = text.index("measuring the first interval")
    assert "CGROUP / POD" in text[first:], "no interval frame after the first screen"
    assert "CGROUP / POD" not in text[:first]


@pytest.mark.root
def test_live_top_draws_its_first_interval_long_before_a_slow_interval_ends():
    """Issue 17: the first numbers came a whole interval after start (~2 s at the default of the time).
    With --interval 6, the first interval frame must follow the first screen well inside 6 s: top
    measures a short first interval (rates are per second whatever the span)."""
    import pty
    import time

    interval_s = 6.0
    leader, follower = pty.openpty()
    proc = subprocess.Popen([*CLI, "top", "--count", "1", "--interval", str(interval_s)], stdin=follower,
                            stdout=follower, stderr=subprocess.PIPE,
                            env=dict(os.environ, COLUMNS="160", LINES="50", TERM="xterm"))
    os.close(follower)
    screen, first_screen_at, frame_at = b"", None, None
    deadline = time.monotonic() + 120
    while frame_at is None and time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: top closed the terminal
            break
        if not chunk:
            break
        screen += chunk
        now = time.monotonic()
        if first_screen_at is None and b"measuring the first interval" in screen:
            first_screen_at = now
        if first_screen_at is not None and b"CGROUP / POD" in screen.split(b"measuring the first interval", 1)[1]:
            frame_at = now
    read_terminal(leader, timeout=30)  # drain until top exits, so it never blocks on a full pty
    os.close(leader)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert first_screen_at is not None and frame_at is not None, screen.decode(errors="replace")[-2000:]
    assert frame_at - first_screen_at < interval_s / 2, frame_at - first_screen_at


class _CountingDict(dict):
    """Counts walks over its entries (items / iteration)."""

    walks = 0

    def items(self):
        _CountingDict.walks += 1
        return super().items()

    def __iter__(self):
        _CountingDict.walks += 1
        return super().__iter__()


def test_dead_cgroups_work_follows_what_changed_not_the_map_size():
    """With the changed ids given (the collector has them), an update never walks the map: a node with
    1,000 idle cgroups in it costs the checks that fall due, one per id per 10 x `after` intervals."""
    resolver = _NamingResolver(set(range(1000)) - {7})
    forgotten: list[int] = []
    dead = DeadCgroups(lambda ids: forgotten.extend(ids) or len(ids), resolver, "h", after=2)
    counts = _CountingDict({cg: 1 for cg in range(1000)})
    dead.update({}, counts, changed=list(counts))  # first sight of all of them
    _CountingDict.walks = 0
    calls = []
    original = resolver.resolve
    resolver.resolve = lambda cg, h=None: calls.append(cg) or original(cg, h)
    assert dead.update(counts, counts, changed=[]) == []
    assert dead.update(counts, counts, changed=[]) == [7]  # idle twice, and gone
    assert len(calls) == 1000  # each checked once when its check fell due
    calls.clear()
    for _ in range(19):  # no check falls due before 10 x after intervals later
        assert dead.update(counts, counts, changed=[5]) == []
    assert calls == [] and _CountingDict.walks == 0 and forgotten == [7]
    assert dead.update(counts, counts, changed=[]) == [] and len(calls) == 998  # the re-check; 5 moved


def test_dead_cgroups_checked_twice_in_one_interval_are_forgotten_once():
    """An id whose 10 x `after` re-check falls in the same interval as the check after it went quiet
    again was due twice there; gone by then, it must be forgotten once, not raise (seen as a failed
    agent tick, KeyError, in the churn bench)."""
    resolver = _NamingResolver({1})
    forgotten: list[int] = []
    dead = DeadCgroups(lambda ids: forgotten.extend(ids) or len(ids), resolver, "h", after=2)
    counts = {1: 1}
    dead.update({}, counts, changed=[1])  # interval 1: seen; checked at 3, re-checked at 23
    for _interval in range(2, 21):
        assert dead.update(counts, counts, changed=[]) == []
    counts = {1: 2}
    assert dead.update({1: 1}, counts, changed=[1]) == []  # interval 21: moved; checked at 23 as well
    resolver.alive.clear()  # the cgroup is removed
    assert dead.update(counts, counts, changed=[]) == []  # 22
    assert dead.update(counts, counts, changed=[]) == [1]  # 23: due twice, forgotten once
    assert forgotten == [1]
