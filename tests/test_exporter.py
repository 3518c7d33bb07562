# SPDX-License-Identifier: Apache-2.0
"""The exporter on real probes: every number a scrape shows is checked against the probe snapshot it
came from and, where the kernel keeps the same count, against the kernel file read around it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from actuators.base import ActionRecord, ActionState
from detector.decisions import ActionKind, Cause, Decision, SuppressAmount, Target
from detector.model import Culprit, Incident
from noisyneighbor import exporter as ex
from noisyneighbor.exporter import Exporter, histogram_buckets
from probes import reclaim, runqlat, softirq, tcpconnect
from probes.cgroupfs import discover
from probes.hist import HIST_SLOTS, LatencyHistogram
from probes.snapshot import NodeSnapshot
from testkit.exporter_support import CONTROLLERS, ProbeSet, Scraper, pod_cgroup_name, rel_path, samples
from testkit.procfiles import read_proc_softirqs
from testkit.tools import require_tool
from tests.ground_truth import softirq_in_flight, softirq_missed_allowance

# Needs CPU every 5 ms (1.5 ms of work): a sleeper alone would be favoured by wakeup preemption and
# show no wait next to hogs (see shared/reference/detection.md).
WORKER = r"""
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t = time.perf_counter()
    while time.perf_counter() - t < 0.0015:
        pass
    time.sleep(0.005)
"""
# Connects `ok` times to a listening port and `refused` times to a closed one; prints what it did.
CONNECTOR = r"""
import socket, sys
port, closed, ok, refused = map(int, sys.argv[1:5])
done = fails = 0
for _ in range(ok):
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        done += 1
for _ in range(refused):
    try:
        socket.create_connection(("127.0.0.1", closed), timeout=5).close()
    except ConnectionRefusedError:
        fails += 1
print(done, fails, flush=True)
"""
# Page cache through a memory-limited cgroup: clean pages are reclaimed at the limit (fdatasync keeps
# dirty pages from piling up against it).
PAGE_CACHE = r"""
import os, sys
path, size = sys.argv[1], int(sys.argv[2])
chunk = b"\xa5" * (1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
for i in range(size >> 20):
    os.write(fd, chunk)
    if i % 8 == 7:
        os.fdatasync(fd)
os.close(fd)
os.unlink(path)
"""

CPU = str((os.cpu_count() or 1) - 1)


def _promtool_check(text: str) -> str:
    promtool = require_tool("promtool")
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    return (res.stdout + res.stderr).strip() if res.returncode else ""


def _read_psi_total(path: Path, kind: str = "some") -> float:
    for line in path.read_text().splitlines():
        if line.startswith(kind):
            return int(line.rsplit("total=", 1)[1]) / 1e6
    raise AssertionError(f"no {kind} line in {path}")


@pytest.fixture(scope="module")
def probes():
    if os.geteuid() != 0:
        pytest.skip("needs root: loads BPF programs")
    ps = ProbeSet()
    yield ps
    ps.close()


@pytest.fixture
def scraper():
    s = Scraper(exporter_kwargs={"node": "test-node"})
    yield s
    s.close()


def _pod(make_cgroup, scraper: Scraper, qos: str, name: str):
    cg_name, uid = pod_cgroup_name(qos)
    cg = make_cgroup(cg_name, CONTROLLERS)
    scraper.labeler.pods[uid] = ("nn-test", name)
    return cg


def _series(scrape: dict, name: str, **labels: str) -> float:
    found = samples(scrape, name, **labels)
    assert len(found) == 1, f"{name}{labels}: {len(found)} series: {sorted(map(sorted, found))[:5]}"
    return next(iter(found.values()))


@pytest.mark.root
def test_scrape_matches_probes_and_kernel_files(probes, scraper, make_cgroup):
    stress = require_tool("stress-ng")
    victim = _pod(make_cgroup, scraper, "guaranteed", "victim")
    hog = _pod(make_cgroup, scraper, "besteffort", "hog")
    hog.write("cpu", "cpu.shares", "2")
    procs = [
        subprocess.Popen(["taskset", "-c", CPU, stress, "--cpu", "2", "--cpu-method", "int64", "-t", "20", "--quiet"],
                         preexec_fn=hog.preexec),
        subprocess.Popen(["taskset", "-c", CPU, sys.executable, "-c", WORKER, "20"], preexec_fn=victim.preexec),
    ]
    try:
        time.sleep(0.5)
        layout = probes.layout
        cpu_h = layout.hierarchy_for("cpu")
        victim_cpu_path = rel_path(victim, "cpu", cpu_h)
        softirq_proc0 = sum(read_proc_softirqs().values())
        first = probes.snapshot([victim, hog])
        softirq_proc1 = sum(read_proc_softirqs().values())
        scraper.exporter.update(first)
        scrape1 = scraper.scrape()
        time.sleep(1.5)
        usage_before = int((victim.path("cpuacct") / "cpuacct.usage").read_text())
        psi_before = _read_psi_total(Path("/proc/pressure/cpu"))
        cg_psi_file = victim.path("unified") / "cpu.pressure"
        cg_psi_before = _read_psi_total(cg_psi_file)
        softirq_proc2 = sum(read_proc_softirqs().values())
        snap = probes.snapshot([victim, hog])
        softirq_proc3 = sum(read_proc_softirqs().values())
        usage_after = int((victim.path("cpuacct") / "cpuacct.usage").read_text())
        psi_after = _read_psi_total(Path("/proc/pressure/cpu"))
        cg_psi_after = _read_psi_total(cg_psi_file)
        scraper.exporter.update(snap)
        text = scraper.scrape_text()
        scrape = scraper.scrape()
    finally:
        for p in procs:
            p.kill()
            p.wait()

    # Runqueue histogram of the victim: exactly the probe's numbers, as a cumulative histogram.
    victim_id = os.stat(victim.path("cpu")).st_ino
    hist = snap.probe("runqlat").per_cgroup[victim_id]
    assert hist.count > 50, "the victim barely ran: the test proves nothing"
    labels = {"cgroup": victim_cpu_path, "pod": "victim", "namespace": "nn-test", "qos": "LS", "node": "test-node"}
    assert _series(scrape, runqlat.RUNQ_LATENCY + "_count", **labels) == hist.count
    assert _series(scrape, runqlat.RUNQ_LATENCY + "_sum", **labels) == hist.sum_ns / 1e9
    buckets = samples(scrape, runqlat.RUNQ_LATENCY + "_bucket", **labels)
    # The default range: from le 128 µs (waits below share it) to le 8.39 s, then +Inf.
    top, bottom = scraper.exporter.top_slot, scraper.exporter.bottom_slot
    assert len(buckets) == top - bottom + 2 and float(ex.BUCKET_LES[top]) <= 10.0 < float(ex.BUCKET_LES[top + 1])
    assert float(ex.BUCKET_LES[bottom]) == 128e-6
    assert not samples(scrape, runqlat.RUNQ_LATENCY + "_bucket", le=ex.BUCKET_LES[bottom - 1], **labels)
    cumulative = sum(hist.slots[:bottom])
    for slot, n in enumerate(hist.slots[bottom : top + 1], start=bottom):
        cumulative += n
        le = ex.BUCKET_LES[slot]
        assert _series(scrape, runqlat.RUNQ_LATENCY + "_bucket", le=le, **labels) == min(cumulative, hist.count)
    assert float(ex.BUCKET_LES[10]) == 1024e-6  # slot 10 holds [512, 1024) µs
    # The hog is BestEffort -> Koordinator class BE.
    hog_count = _series(scrape, runqlat.RUNQ_LATENCY + "_count", pod="hog", qos="BE")
    assert hog_count == snap.probe("runqlat").per_cgroup[os.stat(hog.path("cpu")).st_ino].count

    # The node's runqueue histogram: every CPU's, summed (per CPU with per_cpu_series).
    assert _series(scrape, runqlat.CPU_RUNQ_LATENCY + "_count") == sum(h.count for h in snap.probe("runqlat").per_cpu)

    # cgroup CPU usage against cpuacct.usage read around the snapshot.
    usage = _series(scrape, ex.CGROUP_CPU_USAGE, **labels)
    assert usage == snap.cgroup_cpu[victim_cpu_path].usage_ns / 1e9
    assert usage_before / 1e9 <= usage <= usage_after / 1e9
    # No quota on the victim: no CFS bandwidth counters (they would read 0 for ever).
    assert snap.cgroup_cpu[victim_cpu_path].quota_cores is None
    assert not samples(scrape, ex.CGROUP_CPU_PERIODS, **labels)

    # PSI counters against the pressure files read around the snapshot.
    node_psi = _series(scrape, ex.PSI_STALL, resource="cpu", kind="some")
    assert psi_before <= node_psi <= psi_after
    assert not samples(scrape, ex.PSI_AVG) and not samples(scrape, ex.CGROUP_PSI_AVG)  # opt-in (rate of totals)
    v2_path = rel_path(victim, "unified", probes.layout.v2)
    cg_psi = _series(scrape, ex.CGROUP_PSI_STALL, cgroup=v2_path, resource="cpu", kind="some", pod="victim")
    assert cg_psi_before <= cg_psi <= cg_psi_after
    assert cg_psi > 0, "the victim waited behind the hogs: its v2 cgroup must show cpu pressure"

    # Softirq entries. The exporter's counters are the probe's, exactly.
    def entries(s: dict) -> float:
        return sum(samples(s, softirq.SOFTIRQ_ENTRIES).values())

    assert entries(scrape1) == sum(first.probe("softirq").entries().values())
    assert entries(scrape) == sum(snap.probe("softirq").entries().values())
    # Against /proc/softirqs: reads were proc0, snapshot 1, proc1 ... proc2, snapshot 2, proc3, each
    # counter once per read. Every run the probe counted between its snapshots happened between
    # proc0 and proc3, but for one per CPU entered (kernel count bumped) before proc0 and traced
    # after snapshot 1; every run between proc1 and proc2 is in the probe's increase, but for one
    # per CPU traced after snapshot 2 and for the share the probe misses (tests/ground_truth.py).
    grew = entries(scrape) - entries(scrape1)
    in_flight = softirq_in_flight(os.cpu_count() or 1)
    inner = softirq_proc2 - softirq_proc1
    assert grew <= softirq_proc3 - softirq_proc0 + in_flight
    assert grew >= inner - in_flight - softirq_missed_allowance(inner), (grew, inner)
    # Node level by default: one series per vector, the sum over CPUs (per CPU with per_cpu_series).
    timer = [s for (_, vector), s in snap.probe("softirq").stats.items() if vector == "TIMER"]
    assert _series(scrape, softirq.SOFTIRQ_RUNTIME + "_count", vector="TIMER") == sum(s.runtime.count for s in timer)
    assert _series(scrape, softirq.SOFTIRQ_DELAY + "_sum", vector="TIMER") == \
        pytest.approx(sum(s.delay.sum_ns for s in timer) / 1e9)
    assert not any("cpu" in dict(labels) for name, labels in scrape if name.startswith(softirq.SOFTIRQ_RUNTIME))

    # Agent health.
    for name in ("runqlat", "softirq", "reclaim", "tcpconnect"):
        state = snap.probe_status[name].state
        assert _series(scrape, ex.PROBE_STATE, probe=name, state=state) == 1
        assert len(samples(scrape, ex.PROBE_STATE, probe=name)) == 1  # one series per probe: its state
        assert _series(scrape, ex.PROBE_UP, probe=name) == (0.0 if state == "off" else 1.0)
        assert samples(scrape, ex.PROBE_DROPS, probe=name), f"no drop counters for {name}"
    programs = {p.name for p in snap.bpf_programs}
    assert programs and all(samples(scrape, ex.BPF_RUNS, program=p) for p in programs)

    problems = _promtool_check(text)
    assert not problems, f"promtool check metrics:\n{problems}"


@pytest.mark.root
def test_connect_histogram_and_outcomes(probes, scraper, make_cgroup):
    client = _pod(make_cgroup, scraper, "burstable", "client")
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: connects are refused
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CONNECTOR, str(listener.getsockname()[1]), str(closed_port), "40", "5"],
            preexec_fn=client.preexec, capture_output=True, text=True, timeout=60, check=True,
        )
    finally:
        listener.close()
    done, refused = map(int, proc.stdout.split())
    assert (done, refused) == (40, 5)
    snap = probes.snapshot([client])
    scraper.exporter.update(snap)
    scrape = scraper.scrape()
    client_id = os.stat(client.path("cpu")).st_ino
    mine = [s for (cg, _), s in snap.probe("tcpconnect").per_key.items() if cg == client_id]
    labels = {"pod": "client", "cgroup": rel_path(client, "cpu", probes.layout.hierarchy_for("cpu"))}
    # Ground truth is the client's own count; the histogram holds successful connects only.
    assert _series(scrape, tcpconnect.CONNECT_LATENCY + "_count", **labels) == done == sum(s.latency.count for s in mine)
    assert _series(scrape, tcpconnect.CONNECT_LATENCY + "_sum", **labels) == sum(s.latency.sum_ns for s in mine) / 1e9
    assert _series(scrape, tcpconnect.CONNECT_SUCCESSES, **labels) == done
    assert _series(scrape, tcpconnect.CONNECT_FAILURES, **labels) == refused
    assert _series(scrape, tcpconnect.CONNECT_ERRORS, reason="refused", **labels) == refused
    assert _series(scrape, tcpconnect.CONNECT_SYN_RETRANSMITS, **labels) == 0


@pytest.mark.root
def test_reclaim_histogram_per_memory_cgroup(probes, scraper, make_cgroup, tmp_path):
    limited = _pod(make_cgroup, scraper, "besteffort", "filler")
    limit, size = 32 << 20, 160 << 20
    mem_h = probes.layout.hierarchy_for("memory")
    limited.write("memory", "memory.limit_in_bytes" if mem_h.version == 1 else "memory.max", str(limit))
    subprocess.run([sys.executable, "-c", PAGE_CACHE, str(tmp_path / "fill"), str(size)],
                   preexec_fn=limited.preexec, check=True, timeout=120)
    snap = probes.snapshot([limited])
    scraper.exporter.update(snap)
    scrape = scraper.scrape()
    stats = snap.probe("reclaim").cgroup(os.stat(limited.path("memory")).st_ino, "memcg")
    labels = {"pod": "filler", "cgroup": rel_path(limited, "memory", mem_h), "kind": "memcg"}
    assert stats.count > 10, "the writer never hit its limit: the test proves nothing"
    assert _series(scrape, reclaim.RECLAIM_LATENCY + "_count", **labels) == stats.count
    assert _series(scrape, reclaim.RECLAIM_LATENCY + "_sum", **labels) == stats.latency.sum_ns / 1e9
    pages = _series(scrape, reclaim.RECLAIM_PAGES, **labels)
    assert pages == stats.nr_reclaimed
    # Kernel side: everything above the limit had to be reclaimed (the file was written through it).
    page = os.sysconf("SC_PAGE_SIZE")
    assert pages * page >= (size - limit) * 0.5
    # Memory gauges come from the same cgroup's files.
    assert _series(scrape, ex.CGROUP_MEMORY_LIMIT, pod="filler") == limit
    node = _series(scrape, reclaim.NODE_RECLAIM_LATENCY + "_count", kind="memcg")
    assert node == snap.probe("reclaim").node["memcg"].count >= stats.count


@pytest.mark.root
def test_removed_cgroup_series_disappear(probes, scraper, make_cgroup):
    gone = _pod(make_cgroup, scraper, "burstable", "shortlived")
    subprocess.run(["taskset", "-c", CPU, sys.executable, "-c", WORKER, "0.3"], preexec_fn=gone.preexec, check=True)
    scraper.exporter.update(probes.snapshot([gone]))
    assert samples(scraper.scrape(), runqlat.RUNQ_LATENCY + "_count", pod="shortlived")
    assert samples(scraper.scrape(), ex.CGROUP_CPU_USAGE, pod="shortlived")
    gone_id = os.stat(gone.path("cpu")).st_ino
    gone.remove()
    snap = probes.snapshot([])
    # The BPF map still holds the removed cgroup (forgetting it is the agent's job): the exporter must
    # drop it by itself.
    assert gone_id in snap.probe("runqlat").per_cgroup
    scraper.exporter.update(snap)
    scrape = scraper.scrape()
    assert not [k for k in scrape if ("pod", "shortlived") in k[1]]
    assert _series(scrape, ex.EXPORTER_CGROUPS, state="unresolved") >= 1


@pytest.mark.root
def test_cap_folds_the_rest_into_overflow(probes, make_cgroup):
    scraper = Scraper(exporter_kwargs={"max_cgroups": 2})
    try:
        cgs = [_pod(make_cgroup, scraper, "burstable", f"p{i}") for i in range(4)]
        for cg in cgs:
            subprocess.run([sys.executable, "-c", WORKER, "0.1"], preexec_fn=cg.preexec, check=True)
        snap = probes.snapshot(cgs)
        # The runqueue map holds every cgroup on the machine, and other cgroups come and go (other
        # test runs, the system) while this test resolves them: resolve each id just before and just
        # after the exporter does. Ids resolved the same both times are exact; the others bound it.
        labeler, h = scraper.exporter.labeler, scraper.exporter.cpu_hierarchy

        def resolve() -> dict[int, str | None]:
            return {i: getattr(labeler.target_for_id(i, h), "cgroup", None) for i in snap.probe("runqlat").per_cgroup}

        before = resolve()
        scraper.exporter.update(snap)
        scrape = scraper.scrape()
        after = resolve()
        stable = {i for i in before if before[i] == after[i]}
        changed = set(before) - stable
        counts = samples(scrape, runqlat.RUNQ_LATENCY + "_count")
        cgroups = {dict(k)["cgroup"] for k in counts}
        assert ex.OVERFLOW_CGROUP in cgroups and len(cgroups) == 3
        # Nothing is lost: the overflow holds the sum of every resolvable cgroup not shown on its own.
        count_of = {i: hist.count for i, hist in snap.probe("runqlat").per_cgroup.items()}
        resolvable = sum(count_of[i] for i in stable if before[i] is not None)
        assert resolvable <= sum(counts.values()) <= resolvable + sum(count_of[i] for i in changed)
        files = set(snap.cgroup_cpu) | set(snap.cgroup_mem) | set(snap.cgroup_psi)
        exact = {before[i] for i in stable if before[i] is not None} | files
        either = exact | {p for i in changed for p in (before[i], after[i]) if p is not None}
        overflow = _series(scrape, ex.EXPORTER_CGROUPS, state="overflow")
        assert len(exact) - 2 <= overflow <= len(either) - 2, (overflow, len(exact), len(either))
        # The same two keep their series at the next update.
        scraper.exporter.update(probes.snapshot(cgs))
        again = {dict(k)["cgroup"] for k in samples(scraper.scrape(), runqlat.RUNQ_LATENCY + "_count")}
        assert again == cgroups
        problems = _promtool_check(scraper.scrape_text())
        assert not problems, problems
    finally:
        scraper.close()


# -- no kernel needed --------------------------------------------------------------------------------


def _exporter(**kw) -> tuple[Exporter, CollectorRegistry]:
    registry = CollectorRegistry()
    return Exporter(registry, node="n1", layout=discover(), **kw), registry


def _scrape(registry: CollectorRegistry) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}


def test_buckets_are_cumulative_and_clipped_to_count():
    slots = [0] * HIST_SLOTS
    slots[0], slots[3], slots[5] = 2, 3, 4  # <1 µs, [4, 8) µs, [16, 32) µs
    buckets = histogram_buckets(LatencyHistogram(tuple(slots), 12345, 8, 20000))
    values = dict(buckets)
    assert values["1e-06"] == 2 and values["8e-06"] == 5 and values["3.2e-05"] == 8  # 9 clipped to count 8
    assert values["+Inf"] == 8 and list(values)[-1] == "+Inf" and len(buckets) == HIST_SLOTS + 1
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)


def test_incidents_and_actions():
    exp, registry = _exporter()
    victim = Target("/kubepods.slice/kubepods-podA.slice", "a", "shop", "web", "LS")
    hog = Target("/kubepods.slice/kubepods-besteffort.slice/x", "b", "batch", "crunch", "BE")
    inc = Incident("i1", victim, Cause.NEIGHBOR_CPU, started_at=1.0, confidence=0.9, signal="runq_p99_ns",
                   culprits=[Culprit(hog, 0.7)])
    snap = NodeSnapshot(monotonic_s=1.0, wall_s=100.0)
    decision = Decision(ActionKind.SUPPRESS, hog.__class__("/kubepods.slice/kubepods-besteffort.slice"),
                        SuppressAmount("cfs_quota", cpu_cores=1.5), "test")
    rec = ActionRecord("a1", None, decision, ActionState.APPLIED)
    exp.update(snap, [inc], [rec])
    exp.update(snap, [inc], [rec])  # the same incident and state again: counted once
    s = _scrape(registry)
    vl = {("victim_pod", "web"), ("victim_namespace", "shop"), ("victim_qos", "LS"), ("cause", "neighbor_cpu")}
    assert [v for (n, k), v in s.items() if n == ex.INCIDENTS_OPEN and vl <= k] == [1.0]
    assert [v for (n, k), v in s.items() if n == ex.INCIDENTS and ("cause", "neighbor_cpu") in k] == [1.0]
    assert [v for (n, k), v in s.items() if n == ex.CULPRIT_SCORE and ("culprit_pod", "crunch") in k] == [0.7]
    assert [v for (n, k), v in s.items() if n == ex.ACTIONS and {("kind", "suppress"), ("state", "applied")} <= k] == [1]
    assert [v for (n, k), v in s.items() if n == ex.ACTION_SUPPRESS_CORES] == [1.5]
    # Ended incident and reverted action: open gauges go, counters stay.
    inc.ended_at = 5.0
    rec.state = ActionState.REVERTED
    exp.update(snap, [inc], [rec])
    s = _scrape(registry)
    assert not [n for (n, _) in s if n in (ex.INCIDENTS_OPEN, ex.CULPRIT_SCORE, ex.ACTION_ACTIVE, ex.ACTION_SUPPRESS_CORES)]
    assert [v for (n, k), v in s.items() if n == ex.ACTIONS and ("state", "reverted") in k] == [1.0]
    assert [v for (n, k), v in s.items() if n == ex.INCIDENTS] == [1.0]


class _BrokenLabeler:
    def target_for_id(self, cgroup_id, hierarchy):
        raise RuntimeError("boom")

    def target_for_path(self, cgroup_path):
        raise RuntimeError("boom")


def test_bad_input_degrades_without_traceback():
    with pytest.raises(ValueError, match="max_cgroups"):
        _exporter(max_cgroups=0)
    registry = CollectorRegistry()
    exp = Exporter(registry, _BrokenLabeler(), node="n1", layout=discover())
    from probes.cpuacct import CgroupCpuStat

    stat = CgroupCpuStat(1, 10**9, None, None, 0, 0, 0, None, None, None, None)
    exp.update(NodeSnapshot(monotonic_s=0.0, wall_s=0.0, cgroup_cpu={"/a": stat}))
    s = _scrape(registry)
    assert s[(ex.EXPORTER_CGROUPS, frozenset({("node", "n1"), ("state", "unresolved")}))] == 1
    assert not [n for (n, _) in s if n == ex.CGROUP_CPU_USAGE]
    assert s[(ex.EXPORTER_LAST_UPDATE, frozenset({("node", "n1")}))] == 0


def test_metric_names_have_units_and_one_definition():
    for d in ex.METRICS.values():
        assert d.name.startswith("noisyneighbor_")
        assert (d.type == "counter") == d.name.endswith("_total"), d.name
        if d.type == "histogram":
            assert d.name.endswith("_seconds")
    assert len(ex.METRICS) == len(ex._DEFS)


@pytest.mark.root
def test_direct_text_rendering_equals_prometheus_client(probes, scraper, make_cgroup):
    """The agent serves render_text() (generate_latest validates every label of every sample, the
    largest part of a scrape's cost): it must say exactly what generate_latest says, sample for sample."""
    from prometheus_client.parser import text_string_to_metric_families

    pod = _pod(make_cgroup, scraper, "burstable", 'we"ird\\name')
    subprocess.run(["taskset", "-c", CPU, sys.executable, "-c", WORKER, "0.2"], preexec_fn=pod.preexec, check=True)
    victim = Target("/kubepods.slice/kubepods-podA.slice", "a", "shop", "web", "LS")
    inc = Incident("i1", victim, Cause.NEIGHBOR_CPU, started_at=1.0, confidence=0.9, signal="runq_p99_ns",
                   culprits=[Culprit(Target("/x", "b", "batch", "crunch", "BE"), 0.7)])
    scraper.exporter.update(probes.snapshot([pod]), [inc])

    def parsed(text: str) -> dict:
        families = list(text_string_to_metric_families(text))
        return {(f.name, f.type, f.documentation): sorted((s.name, sorted(s.labels.items()), s.value) for s in f.samples)
                for f in families}

    ours = parsed(ex.render_text(scraper.exporter).decode())
    theirs = parsed(generate_latest(scraper.registry).decode())
    assert ours == theirs
    assert any(name == runqlat.RUNQ_LATENCY for name, _, _ in ours)  # per-cgroup histograms were in it


def test_extra_node_series_and_short_histograms_are_settings():
    """PSI averages and /proc/stat per CPU (node_exporter has both) only when asked; the bucket range is set."""
    from probes.psi import NodePsi, PsiLine, PsiReading
    from probes.snapshot import CpuTimes

    line = PsiLine(1.5, 2.5, 3.5, 1_000_000)
    snap = NodeSnapshot(monotonic_s=1.0, wall_s=100.0, node_psi=NodePsi({"cpu": PsiReading("cpu", line, None)}, {}),
                        node_cpu_per_cpu={0: CpuTimes(*(i * 10_000_000 for i in range(8)))})
    lean, lean_registry = _exporter()
    full, full_registry = _exporter(extra_node_series=True, max_bucket_seconds=1.0)
    for exp in (lean, full):
        exp.update(snap)
    lean_scrape, full_scrape = _scrape(lean_registry), _scrape(full_registry)
    assert any(name == ex.PSI_STALL for name, _ in lean_scrape)  # totals always
    assert not any(name in (ex.PSI_AVG, ex.NODE_CPU) for name, _ in lean_scrape)
    assert full_scrape[(ex.PSI_AVG, frozenset({("node", "n1"), ("resource", "cpu"), ("kind", "some"),
                                               ("window", "10")}))] == 0.015
    assert full_scrape[(ex.NODE_CPU, frozenset({("node", "n1"), ("cpu", "0"), ("mode", "nice")}))] == 0.01
    assert float(ex.BUCKET_LES[full.top_slot]) <= 1.0 < float(ex.BUCKET_LES[full.top_slot + 1])
    hist = LatencyHistogram(tuple([1] * HIST_SLOTS), 10, HIST_SLOTS, 5)
    assert len(histogram_buckets(hist, full.top_slot)) == full.top_slot + 2
    assert histogram_buckets(hist, full.top_slot)[-1] == ("+Inf", float(HIST_SLOTS))
    # The low end: slots below the first bucket are counted in it (buckets are cumulative).
    low, _ = _exporter(min_bucket_seconds=1e-3)
    assert float(ex.BUCKET_LES[low.bottom_slot]) == 1024e-6
    buckets = histogram_buckets(hist, low.top_slot, low.bottom_slot)
    assert buckets[0] == (ex.BUCKET_LES[low.bottom_slot], float(low.bottom_slot + 1))
    assert len(buckets) == low.top_slot - low.bottom_slot + 2 and buckets[-1] == ("+Inf", float(HIST_SLOTS))


def test_unchanged_histograms_are_not_rendered_again(monkeypatch) -> None:
    """A scrape renders only the histograms that changed since the last one (the probes hand the same
    objects again for what did not change); the text is the same either way."""
    from probes.runqlat import RunqSnapshot

    h0, h1 = (LatencyHistogram(tuple([i + 1] * HIST_SLOTS), 1000 * (i + 1), HIST_SLOTS * (i + 1), 5) for i in range(2))

    def snap(per_cpu: list) -> NodeSnapshot:
        return NodeSnapshot(monotonic_s=1.0, wall_s=100.0,
                            plugins={"runqlat": RunqSnapshot(1.0, {}, per_cpu, {}, {}, {}, 0, False)})

    exporter, _ = _exporter(per_cpu_series=True)
    rendered: list[LatencyHistogram] = []
    real = ex._hist_numbers  # a histogram's bucket text is made there
    monkeypatch.setattr(ex, "_hist_numbers", lambda hist, *a: (rendered.append(hist), real(hist, *a))[1])
    exporter.update(snap([h0, h1]))
    first = ex.render_text(exporter)
    assert rendered == [h0, h1]
    exporter.update(snap([h0, h1]))  # a new tick, nothing moved
    rendered.clear()
    assert ex.render_text(exporter) == first and rendered == []
    h1_moved = LatencyHistogram(tuple([3] * HIST_SLOTS), 3000, 3 * HIST_SLOTS, 5)
    exporter.update(snap([h0, h1_moved]))
    rendered.clear()
    text = ex.render_text(exporter).decode()
    assert rendered == [h1_moved] and f"{runqlat.CPU_RUNQ_LATENCY}_count" in text
    kept = [slot for slot in exporter.node_text.lines if slot[0] == runqlat.CPU_RUNQ_LATENCY]
    assert len(kept) == 2  # only this scrape's histograms are kept


def test_a_cgroups_unchanged_lines_are_reused_and_changed_ones_rendered() -> None:
    """A cgroup's counter and gauge lines are made again only when their values changed since the last
    scrape; the text says the new value at once, and a cgroup gone from the tick leaves no line."""
    from probes.cpuacct import CgroupCpuStat

    path = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234abcd_0000.slice"

    def tick(usage_ns: int, quota_us: int | None) -> NodeSnapshot:
        cpu = CgroupCpuStat(1, usage_ns, None, None, 10, 1, 5_000_000, None, None, quota_us, 100_000)
        return NodeSnapshot(monotonic_s=1.0, wall_s=100.0, cgroup_cpu={path: cpu})

    def line(text: str, metric: str) -> str:
        return next(row for row in text.splitlines() if row.startswith(metric + "{"))

    exporter, registry = _exporter()
    exporter.update(tick(2_000_000_000, 50_000))
    first = ex.render_text(exporter).decode()
    assert line(first, ex.CGROUP_CPU_USAGE).endswith(" 2.0") and line(first, ex.CGROUP_CPU_QUOTA).endswith(" 0.5")
    kept = next(iter(exporter.cgroup_text.values())).lines[ex.CGROUP_CPU_USAGE][1]
    exporter.update(tick(2_000_000_000, 50_000))  # a new tick, nothing moved: the same text object
    assert ex.render_text(exporter).decode() == first
    assert next(iter(exporter.cgroup_text.values())).lines[ex.CGROUP_CPU_USAGE][1] is kept
    exporter.update(tick(3_500_000_000, None))  # it ran, and its quota went
    text = ex.render_text(exporter).decode()
    assert line(text, ex.CGROUP_CPU_USAGE).endswith(" 3.5") and ex.CGROUP_CPU_QUOTA not in text
    # what prometheus_client's own rendering of the same tick says
    assert [v for (name, _), v in _scrape(registry).items() if name == ex.CGROUP_CPU_USAGE] == [3.5]
    exporter.update(NodeSnapshot(monotonic_s=2.0, wall_s=101.0))  # the cgroup is gone
    assert ex.CGROUP_CPU_USAGE not in ex.render_text(exporter).decode()
    assert not [t for t in exporter.cgroup_text.values() if ex.CGROUP_CPU_USAGE in t.lines]


def _capped(exporter: Exporter, keys: list) -> tuple[list, float]:
    """One scrape's cap over ``keys`` (each with one counter of 1): the cgroups kept, in order, and the
    overflow's sum."""
    raw = {}
    for key in keys:
        raw[key] = ex._SeriesData()
        raw[key].add_counter(ex.CGROUP_CPU_USAGE, (), 1.0)
    kept, _ = exporter._apply_cap(raw)
    overflow = kept.pop(ex.OVERFLOW_KEY)
    return list(kept), overflow.counters[ex.CGROUP_CPU_USAGE][()]


def test_the_cap_keeps_its_choice_and_replaces_a_gone_cgroup_like_a_fresh_sort():
    """The cap's order is reused while the cgroups and the exported ones stay the same; when one goes, the
    choice is what sorting anew gives (pods first, then by path), and the overflow sums the rest."""
    keys = [ex.SeriesKey(pod=f"p{i}", pod_uid=f"u{i}", cgroup=f"/kubepods/pod{i}") for i in (5, 3, 8, 1, 6)]
    keys.append(ex.SeriesKey(cgroup="/system.slice/a.service"))
    capped, _ = _exporter(max_cgroups=3)
    first, rest = _capped(capped, keys)
    assert sorted(k.pod for k in first) == ["p1", "p3", "p5"] and rest == 3.0
    for _ in range(3):  # a steady node: the same cgroups, the same three
        again, rest = _capped(capped, list(reversed(keys)))
        assert set(again) == set(first) and rest == 3.0
    gone = next(k for k in first if k.pod == "p3")
    after, rest = _capped(capped, [k for k in keys if k != gone])
    fresh, _ = _exporter(max_cgroups=3)
    fresh._exported = set(first)  # what the capped exporter had exported before the change
    assert after == _capped(fresh, [k for k in keys if k != gone])[0]
    assert sorted(k.pod for k in after) == ["p1", "p5", "p6"] and rest == 2.0


def test_histogram_text_from_integers_is_floatToGoString_of_the_buckets() -> None:
    """The scrape writes a histogram's bucket counts from its integers (n.0 below a million): the same
    text as floatToGoString of histogram_buckets' floats, at every magnitude (1e+06 and up go through
    floatToGoString) and with the buckets clipped to a count that lags its slots."""
    import random

    from prometheus_client.utils import floatToGoString

    rng = random.Random(39)
    top, bottom = ex.top_slot_for(ex.DEFAULT_MAX_BUCKET_SECONDS), ex.bottom_slot_for(ex.DEFAULT_MIN_BUCKET_SECONDS)
    for _ in range(3000):
        magnitude = rng.choice((1, 10, 999_999, 10**6, 10**7, 10**15, 2**64))
        slots = tuple(rng.randrange(magnitude) for _ in range(HIST_SLOTS))
        count = max(sum(slots) - rng.choice((0, 0, 1, 5)), 0)  # a slot ahead of the count: clipped
        hist = LatencyHistogram(slots, rng.randrange(10**15), count, 0)
        for t, b in ((top, bottom), (HIST_SLOTS - 1, 0)):
            tails = tuple(f'{le}"}} {floatToGoString(n)}\n'.encode() for le, n in histogram_buckets(hist, t, b))
            expected = (tails, floatToGoString(hist.count).encode(), floatToGoString(hist.sum_ns / 1e9).encode())
            assert ex._hist_numbers(hist, t, b) == expected


class _PathsLabeler:
    """Labels cgroup ids through a fixed id -> path table (pod names with every character the text format
    escapes); paths as the default labeler does, from the path alone."""

    def __init__(self, paths: dict[int, str]) -> None:
        self.paths = paths

    def target_for_id(self, cgroup_id: int, hierarchy: object) -> Target | None:
        path = self.paths.get(cgroup_id)
        return None if path is None else self.target_for_path(path)

    def target_for_path(self, cgroup_path: str) -> Target | None:
        from detector.cgroups import parse_cgroup_path

        ident = parse_cgroup_path(cgroup_path)
        pod = f'web"\\\n{ident.pod_uid}' if ident.pod_uid else None
        return Target(cgroup=ident.path, pod_uid=ident.pod_uid, pod=pod, namespace="shop" if pod else None,
                      qos=ex.KOORD_CLASS_OF_K8S_QOS.get(ident.qos or ""))


def test_a_scrape_is_byte_for_byte_what_an_exporter_without_a_past_renders() -> None:
    """What the scrape keeps from the last one (each cgroup's label text, lines of unchanged values, numbers
    of unchanged histograms) never shows: over random ticks (cgroups coming and going, over the cap, values
    moving or not, histograms handed again or new, quotas and limits coming and going), every body is the
    one an exporter that never scraped before renders from the same tick, byte for byte."""
    import random

    from probes.cpuacct import CgroupCpuStat
    from probes.memstat import MemStat
    from probes.runqlat import RunqSnapshot

    rng = random.Random(39)
    paths = {i: f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{i // 2:04x}_0000.slice"
             + (f"/cri-containerd-{i:064x}.scope" if i % 2 else "") for i in range(2, 62)}
    kw = {"node": 'n"1', "layout": discover(), "max_cgroups": 40, "per_cpu_series": True}
    kept = Exporter(None, _PathsLabeler(paths), **kw)
    hists: dict[int, LatencyHistogram] = {}
    cpus: dict[str, CgroupCpuStat] = {}
    mems: dict[str, MemStat] = {}
    per_cpu = [LatencyHistogram(tuple([1] * HIST_SLOTS), 1, HIST_SLOTS, 0)] * 2

    def hist() -> LatencyHistogram:
        slots = tuple(rng.choice((0, 1, 7, 10**6, 2**40)) for _ in range(HIST_SLOTS))
        return LatencyHistogram(slots, rng.randrange(10**13), max(sum(slots) - rng.choice((0, 1)), 0), 0)

    for _ in range(40):
        alive = rng.sample(sorted(paths), rng.randrange(1, len(paths)))
        hists = {i: hists[i] if i in hists and rng.random() < 0.6 else hist() for i in alive}
        per_cpu = [h if rng.random() < 0.5 else hist() for h in per_cpu]
        for i in alive:
            path, before = paths[i], cpus.get(paths[i])
            usage = before.usage_ns + rng.choice((0, 0, 1, 10**7)) if before else rng.randrange(10**12)
            quota = rng.choice((None, 50_000)) if before is None or rng.random() < 0.2 else before.quota_us
            cpus[path] = CgroupCpuStat(1, usage, None, None, 3, 1, 10**6, None, None, quota, 100_000)
            mems[path] = MemStat(1, rng.choice((4096, 10**9)), rng.choice((None, 2**30)), 0, 0, 0, 0, 0, 0)
        gone = set(cpus) - {paths[i] for i in alive}
        for path in gone:
            cpus.pop(path), mems.pop(path)
        runq = RunqSnapshot(1.0, dict(hists), list(per_cpu), {}, {}, {}, 0, False)
        snap = NodeSnapshot(monotonic_s=1.0, wall_s=100.0, cgroup_cpu=dict(cpus), cgroup_mem=dict(mems),
                            plugins={"runqlat": runq})
        fresh = Exporter(None, _PathsLabeler(paths), **kw)
        fresh._exported = set(kept._exported)  # the cap keeps what was exported: the same past for both
        kept.update(snap)
        fresh.update(snap)
        assert ex.render_text(kept, b"# tail\n") == ex.render_text(fresh, b"# tail\n")
