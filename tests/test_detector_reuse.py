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

from detector.decisions import LoggingSink, Target
from detector.incidents import IncidentEngine
from detector.pods.model import ContainerInfo, PodInfo
from detector.pods.source import _CachingSource
from detector.policy import Policy, SloThresholds
from detector.signals import IDLE, NodeSignals, WorkloadSignals
from detector.victims import Victims
from detector.workloads import Workload, WorkloadIndex

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
    assert same == [False, True, False, False, False, False]
