"""`noisyneighbor top` end to end: real probe, a fake pod laid out like the kubelet's systemd driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from noisyneighbor.top import build_interval, sort_rows
from probes.hist import HIST_SLOTS, LatencyHistogram
from probes.runqlat import RunqSnapshot
from tests.conftest import require_tool

CLI = [sys.executable, "-m", "noisyneighbor.cli"]


def _hist(count: int, slot: int, sum_ns: int, max_ns: int) -> LatencyHistogram:
    slots = [0] * HIST_SLOTS
    slots[slot] = count
    return LatencyHistogram(tuple(slots), sum_ns, count, max_ns)


class _FakeResolver:
    def resolve(self, cgroup_id, hierarchy=None):
        return None


def test_interval_rows_from_two_snapshots():
    before = RunqSnapshot(10.0, {7: _hist(10, 5, 200_000, 30_000)}, [LatencyHistogram.empty()], {})
    after = RunqSnapshot(12.0, {7: _hist(30, 5, 800_000, 30_000), 8: _hist(4, 11, 4_000_000, 1_500_000)},
                         [_hist(34, 5, 1, 1)], {"key_map_full": 2})
    interval = build_interval(before, after, _FakeResolver())
    rows = {r.cgroup_id: r for r in interval.cgroups}
    assert rows[7].events == 20 and rows[7].events_per_s == pytest.approx(10.0)
    assert rows[7].wait_ms_per_s == pytest.approx(0.3)
    assert 16 <= rows[7].p99_us <= 32  # slot 5 is [16, 32) µs
    assert not rows[7].max_exact  # the all-time max did not grow: only the slot bound is known
    assert rows[8].max_exact and rows[8].max_us == pytest.approx(1500)
    assert rows[8].name == "cgroup:8 (gone)"
    assert [r.cgroup_id for r in sort_rows(interval.cgroups, "wait")] == [8, 7]
    assert interval.drops == {"key_map_full": 2}


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
