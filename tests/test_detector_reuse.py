# SPDX-License-Identifier: Apache-2.0
"""What the detector keeps between ticks gives the answers it would give made afresh.

Issue 39: the detector's work per tick follows what changed. The incident engine's quiet pass walks only
the unsettled victims (detector/victims.py) while the workload list is the same object, and the workload
index answers container and root lookups from a cache dropped with the pod records. Each is checked here
against the same work done in full on the same inputs, tick by tick: a long seeded sequence of ticks in
which victims breach, clear, go quiet, leave and come back, and the workload list changes or stays.
"""

from __future__ import annotations

import dataclasses
import random

from detector.batch import BatchMeter, PodUse, Reservation, ResourceTerms, measure_snapshot, resource_terms
from detector.decisions import LoggingSink, Target
from detector.incidents import IncidentEngine
from detector.pods.model import ContainerInfo, PodInfo
from detector.pods.source import _CachingSource
from detector.policy import Policy, SloThresholds
from detector.signals import IDLE, NodeSignals, WorkloadSignals
from detector.victims import Victims
from detector.workloads import Workload, WorkloadIndex
from probes.cpuacct import CgroupCpuStat
from probes.host import HostPaths
from probes.memstat import MemStat
from probes.snapshot import CpuTimes, NodeSnapshot

BE = Workload("pod:be", Target("/kubepods/besteffort/podbe", "be", "default", "batch", "BE"))
VICTIMS = [Workload(f"pod:ls{i}", Target(f"/kubepods/burstable/podls{i}", f"ls{i}", "default", f"web{i}", "LS"))
           for i in range(24)]


class EveryVictim(Victims):
    """The quiet pass as it was: every victim without a row, every tick."""

    def quiet(self, rows, listed):
        self._walked_for = None  # never the list of the last walk
        return super().quiet(rows, listed)


def _row(w: Workload, breach: bool) -> WorkloadSignals:
    wait_ms = 300.0 if breach else 1.0
    ran = {BE.key: 0.8 * wait_ms * 1e6, IDLE: 0.05 * wait_ms * 1e6} if breach else {}
    return WorkloadSignals.of(w, 1.0, runq_count=200, runq_wait_ms_per_s=wait_ms,
                              runq_p99_ns=20e6 if breach else 100_000.0, cpu_cores=0.3, throttled_ratio=0.0,
                              throttled_ms_per_s=0.0, who_ran_instead_available=True, cpu_weights={1: 1.0},
                              ran_instead_ns=ran)


def _ticks(seed: int, n: int) -> list[NodeSignals]:
    """Ticks as the builder makes them (rows only for workloads that moved; ``present`` the same object
    until the list changes; a tick with no list; a row of a workload the list lacks joins the list, a new
    object, as ``SignalBuilder._present_with`` does)."""
    rnd = random.Random(seed)
    alive = set(range(len(VICTIMS)))
    present = frozenset([BE.key, *(VICTIMS[i].key for i in alive)])
    ticks = []
    for t in range(n):
        if rnd.random() < 0.08:  # a pod leaves or comes back: a new list
            alive ^= {rnd.randrange(len(VICTIMS))}
            present = frozenset([BE.key, *(VICTIMS[i].key for i in alive)])
        moved = [i for i in alive if rnd.random() < 0.25]
        breaching = {i for i in moved if i % 3 == 0 and (t // 7) % 2 == 0}
        rows = {VICTIMS[i].key: _row(VICTIMS[i], i in breaching) for i in moved}
        rows[BE.key] = WorkloadSignals.of(BE, 1.0, cpu_cores=1.0)
        listed: frozenset[str] | None = present
        if rnd.random() < 0.03:
            listed = None  # every row is the list (a collector that names no changes)
        elif rnd.random() < 0.03 and len(alive) < len(VICTIMS):
            stray = VICTIMS[next(i for i in range(len(VICTIMS)) if i not in alive)]
            rows[stray.key] = _row(stray, False)  # a row the list did not name: the builder lists it too
            present = listed = present | {stray.key}
        ticks.append(NodeSignals(1.0, rows, node_cpu_busy=1.0, present=listed))
    return ticks


def _engine(book: Victims) -> tuple[IncidentEngine, list[tuple[str, str]]]:
    policy = Policy(slo=dataclasses.replace(SloThresholds(), breach_seconds=2.0, clear_windows=3))
    clock = iter(range(100_000))
    e = IncidentEngine(policy, sink=LoggingSink(), clock=lambda: float(next(clock)))
    e.victim_book = book
    e.victims = book.states
    heard: list[tuple[str, str]] = []
    e.on_incident.append(lambda inc, what: heard.append((inc.victim.cgroup, what)))
    return e, heard


def _state(e: IncidentEngine) -> list[tuple]:
    return [(k, s.breach_ticks, s.clear_ticks, None if s.incident is None else (s.incident.cause, s.incident.started_at))
            for k, s in e.victims.items()]


def test_quiet_pass_over_unsettled_victims_is_the_pass_over_every_victim():
    for seed in range(4):
        ticks = _ticks(seed, 400)
        kept, kept_heard = _engine(Victims())
        full, full_heard = _engine(EveryVictim())
        opened = 0
        for n, signals in enumerate(ticks):
            a = kept.step(signals, ts=float(n))
            b = full.step(signals, ts=float(n))
            where = f"seed {seed}, tick {n}"
            assert [(i.victim.cgroup, i.started_at, i.ended_at) for i in a] == \
                   [(i.victim.cgroup, i.started_at, i.ended_at) for i in b], where
            assert _state(kept) == _state(full), where
            assert [(i.victim.cgroup, i.started_at) for i in kept.open_incidents] == \
                   [(i.victim.cgroup, i.started_at) for i in full.open_incidents], where
            opened += len(full.open_incidents)
        assert kept_heard == full_heard
        # The sequence exercises what the reuse skips: incidents open, close, and victims leave with them.
        assert opened > 0 and len(full.closed) > 0
        assert any("victim gone" in (ev.note or "") for inc in full.closed for ev in inc.evidence), seed


def _pod(uid: str, containers: dict[str, tuple[str, float | None]]) -> PodInfo:
    return PodInfo(uid, "default", f"web-{uid}", "LS", containers=tuple(
        ContainerInfo(name, cid, cpu_limit_cores=limit) for cid, (name, limit) in containers.items()))


def test_cached_container_and_root_lookups_are_a_fresh_index_answers():
    a, b, pause = "a" * 64, "b" * 64, "c" * 64
    paths = ["/kubepods/burstable/pod11aa-01", f"/kubepods/burstable/pod11aa-01/{a}", f"/kubepods/burstable/pod11aa-01/{b}",
             f"/kubepods/burstable/pod11aa-01/{pause}", "/system.slice/sshd.service", "/",
             f"/kubepods/burstable/pod22bb-02/{a}"]
    versions = [
        [_pod("11aa-01", {a: ("main", 0.5)})],
        [_pod("11aa-01", {a: ("main", 0.5), b: ("side", None)})],  # a container added: pause no longer unnamed
        [_pod("11aa-01", {a: ("main", 1.0), b: ("side", None)})],  # the same uids and names: a new record only
        [_pod("11aa-01", {a: ("main", 1.0), b: ("side", None)}), _pod("22bb-02", {a: ("other", None)})],
        [],
    ]
    listed: list[PodInfo] = []
    cached = WorkloadIndex(lambda: listed)
    answers = []
    for pods in versions:
        listed = pods
        cached.refresh()
        fresh = WorkloadIndex(lambda pods=pods: pods)
        fresh.refresh()
        for _ in range(2):  # the second pass answers from the cache
            for path in paths:
                assert cached.container_of(path) == fresh.container_of(path), (path, pods)
                assert cached.is_workload_root(path) == fresh.is_workload_root(path), (path, pods)
        answers.append(cached.container_of(paths[1]))
    # (the sequence moves the answers the cache holds: a limit changed under the same pod list)
    assert answers[:3] == [("main", 0.5), ("main", 0.5), ("main", 1.0)]


def test_index_over_a_source_that_keeps_its_list_answers_as_a_fresh_index():
    """A pod source hands out the same list until its pods change (so the index's per-tick refresh is one
    identity check); every change (a poll with a new or changed pod, one added or removed) is a new list."""
    src = _CachingSource()
    index = WorkloadIndex(src.pods)
    paths = [f"/kubepods/burstable/pod{u}" for u in ("11aa-01", "22bb-02", "33cc-03")]
    a, b = _pod("11aa-01", {"a" * 64: ("main", 0.5)}), _pod("22bb-02", {"b" * 64: ("main", None)})
    steps = [
        lambda: src._replace_all([a, b]),
        lambda: src._replace_all([a, b]),  # the same pods again: the same list
        lambda: src._replace_all([b, a]),  # in another order: a new one, in that order
        lambda: src._replace_all([a, dataclasses.replace(b, qos_class="BE")]),  # a class changed
        lambda: src._upsert(_pod("33cc-03", {})),
        lambda: src._remove("11aa-01"),
        lambda: src._replace_all([a]),
    ]
    same = []
    for step in steps:
        before = src.pods()
        step()
        same.append(src.pods() is before)
        index.refresh()
        fresh = WorkloadIndex(lambda: list(src._pods.values()))
        fresh.refresh()
        for path in paths:
            assert index.workload_of(path) == fresh.workload_of(path), (path, len(same))
        assert sorted(p.uid for p in index.pods) == sorted(src._pods)
        assert [p.uid for p in src.pods()] == list(src._pods)
    assert same == [False, True, False, False, False, False, False]


def _old_terms(total, threshold, node_used, pods, resource, anno, kubelet):
    """The terms as they were summed over PodUse objects, the reference for the column sums."""
    cpu = resource == "cpu"
    prod = [p for p in pods if p.prod]

    def used(p):
        return p.cpu_used if cpu else p.memory_used

    def request(p):
        return p.cpu_request if cpu else p.memory_request

    return ResourceTerms(total, total * (100.0 - threshold) / 100.0, node_used, sum(used(p) for p in pods),
                         anno.cpu_cores if cpu else anno.memory_bytes,
                         kubelet.cpu_cores if cpu else kubelet.memory_bytes, sum(used(p) for p in prod),
                         sum(request(p) for p in prod), sum(max(request(p), used(p)) for p in prod))


def _mem(usage: int, file: int | None) -> MemStat:
    return MemStat(2, usage, None, None, file, None, None, None, None)


def test_batch_meter_that_keeps_idle_pods_terms_measures_what_a_fresh_one_does(monkeypatch):
    """The meter keeps each pod's seconds and terms while its cgroup's readings are the same objects (idle
    pods keep theirs); a meter that makes them afresh every measure gives the same result, float for float,
    through pods that move, go quiet, lose a reading, change their requests, and a listing that changes
    (some listings name a pod and its container: two paths of one workload, the later one's readings count)."""
    monkeypatch.setattr("detector.batch.read_node_memory", lambda paths: None)  # not this host's, moving
    rnd = random.Random(7)
    uids = [f"{i:04x}-aa" for i in range(40)]
    paths = {u: f"/kubepods/{'besteffort' if i % 3 == 0 else 'burstable'}/pod{u}" for i, u in enumerate(uids)}
    for i, u in enumerate(uids[:8]):  # a container listed with its pod: two listed paths of one workload
        paths[f"{u}/main"] = f"{paths[u]}/{i:064x}"

    def record(i: int, u: str, cpu: float) -> PodInfo:
        return PodInfo(u, "default", f"p{i}", "BE" if i % 3 == 0 else "LS", containers=(
            ContainerInfo("main", f"{i:064x}", cpu_request_cores=cpu, memory_request_bytes=(i % 5) * 2**28),))

    records = [record(i, u, 0.1 * (i % 4)) for i, u in enumerate(uids)]
    index = WorkloadIndex(lambda: records)
    kept = BatchMeter(min_window_s=3.0, anno=Reservation(0.5, 2**30, "test"))
    fresh = BatchMeter(min_window_s=3.0, anno=Reservation(0.5, 2**30, "test"))
    listed = [paths[u] for u in uids[:30]]
    cpu = {p: _cpu_stat(0) for p in paths.values()}
    mem = {p: _mem(2**28, 2**26) for p in paths.values()}
    busy, results, reused = 0.0, 0, 0
    for t in range(300):
        if rnd.random() < 0.05:  # pods come and go: a new listing
            listed = rnd.sample(sorted(paths.values()), rnd.randrange(10, 40))
        if rnd.random() < 0.05:  # a record replaced (its requests changed): a new pod list
            i = rnd.randrange(len(records))
            records = [*records[:i], record(i, uids[i], rnd.choice([0.0, 0.25, 2.0])), *records[i + 1:]]
        for p in paths.values():
            roll = rnd.random()
            if roll < 0.2:
                cpu[p] = _cpu_stat(cpu[p].usage_ns + rnd.randrange(10**9) if p in cpu else rnd.randrange(10**9))
            elif roll < 0.23:
                cpu.pop(p, None)
            if rnd.random() < 0.15:
                mem[p] = _mem(rnd.randrange(2**30), rnd.choice([None, rnd.randrange(2**29)]))
        busy += rnd.random() * 2
        index.refresh()
        snap = NodeSnapshot(monotonic_s=float(t), wall_s=float(t), node_cpu=_cpu_times(busy),
                            node_cpu_per_cpu={0: _cpu_times(0), 1: _cpu_times(0)}, cgroup_cpu=dict(cpu),
                            cgroup_mem=dict(mem))
        before = kept._uses
        a = measure_snapshot(kept, snap, index, listed, HostPaths())
        reused += before is not None and kept._uses is before
        fresh._uses = None  # every pod's seconds and terms made again
        b = measure_snapshot(fresh, snap, index, listed, HostPaths())
        assert a == b, t
        results += a is not None
    assert results > 50 and reused > 20
    # The column sums are the sums over PodUse objects, float for float.
    for _ in range(50):
        pods = [PodUse(rnd.random() < 0.6, rnd.random() * 3, float(rnd.randrange(2**31)), rnd.choice([0.0, 0.5, 1.3]),
                       float(rnd.randrange(2**30))) for _ in range(rnd.randrange(0, 60))]
        for resource in ("cpu", "memory"):
            args = (64.0, 60.0, rnd.random() * 40, pods, resource, Reservation(1.0, 2.0), Reservation(0.5, 3.0))
            cpu = resource == "cpu"
            columns = ([p.prod for p in pods], [p.cpu_used if cpu else p.memory_used for p in pods],
                       [p.cpu_request if cpu else p.memory_request for p in pods])
            anno, kubelet = args[5], args[6]
            assert resource_terms(*args[:3], *columns, anno.cpu_cores if cpu else anno.memory_bytes,
                                  kubelet.cpu_cores if cpu else kubelet.memory_bytes) == _old_terms(*args)


def _cpu_stat(usage_ns: int) -> CgroupCpuStat:
    return CgroupCpuStat(2, usage_ns, None, None, 0, 0, 0, None, None, None, None)


def _cpu_times(busy_s: float) -> CpuTimes:
    return CpuTimes(int(busy_s * 1e9), 0, 0, 10**12, 0, 0, 0, 0)
