# SPDX-License-Identifier: Apache-2.0
"""Mitigation the incident engine's own rule (its decisions for the ranked culprits) does not reach.

:class:`MitigationPlanner` is an ``on_incident`` hook of the detector's engine (no change to the
engine): on every tick of an open incident it may add decisions, through the same sink (the
actuator manager: limits, journal, verify/revert), and it writes what it concluded into the
incident's evidence, so the incident says why something was or was not done.

- **softirq from a pod's traffic**: per-pod packet rates of each pod's *own* network namespace
  (``/proc/<pid>/net/dev`` of one of its tasks; host-network pods are skipped, their counters are the
  node's). A BE pod carrying most of the packets is quota-suppressed (it sends less); anything else
  is advice only (IRQ/RPS placement), never a change to node IRQ settings.
- **RT tasks on the victim's CPUs** (softirq starvation: a SCHED_FIFO/RR task keeps ksoftirqd and the
  victim off the CPU): BE pods with a real-time task allowed on the victim's CPUs are ranked by their
  RT tasks' CPU time and moved off those CPUs (cpuset; a cfs quota does not bound RT tasks). A non-BE
  pod with RT tasks is named in the incident, never touched.
- **reclaim**: global (direct) reclaim with a BE pod that grew most (the engine's culprit) -> that pod's
  memory is capped near its usage (``memory_suppress``; the engine itself evicts when
  ``evict_enabled``); memcg reclaim at the victim's own limit -> advice only, no neighbour is blamed.
- **neighbor_cpu escalation** (per BE culprit): the engine's first step is a cpuset off the victim's CPUs
  where the node has CPUs enough beyond them, else a cfs quota. When the manager reverts a step because
  the victim did not improve (its mean wait, what every neighbour step is meant to lower), or the step
  helped while the victim kept breaching for as many ticks as it was verified over, the next step of
  :data:`LADDER` is taken at the next tick: a cpuset off the victim's CPUs (even below the policy's CPU
  floor), a cfs quota down to the culprit's CPU request (koordinator batch-cpu included) if it runs above
  it, then, with ``evict_enabled``, eviction (Eviction API, PDBs respected by the evict actuator). A step
  that helped stays in place under the next. Each step is said in the incident and the audit log. The
  ladder belongs to the (victim, culprit) pair, not to one incident: an incident that closes while the
  culprit still runs (on 6.1 the waking victim preempts a hog, so it stops breaching for a few ticks) and
  opens again continues where it stopped, for ``DID_NOT_HELP_MEMORY_S`` after the last one closed; a step
  judged "did not help" is not taken again in that time (the manager refuses it, TRIED_BEFORE). The
  victim's CPUs are those its busy tasks may run on: on cgroup v2 the detector's are the cgroup's whole
  effective cpuset, which a pinned victim does not narrow, and with them no cpuset step was ever taken.
- **notes from the manager**: a reverted or refused action (e.g. the burst loop's "steadily above its
  limit") is copied into its incident's evidence.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from actuators.base import ActionOutcome, ActionRecord, ActionState
from actuators.cgroupfile import CgroupFileError, CgroupFiles
from detector.causes import Mitigation, neighbor_cpu, reclaim, softirq, spec
from detector.causes.softirq import softirq_traffic_decision, traffic_share
from detector.decisions import (
    DID_NOT_HELP_MEMORY_S,
    ActionKind,
    Cause,
    Decision,
    DecisionSink,
    EvictAmount,
    PodTraffic,
    SuppressAmount,
    Target,
)
from detector.model import Culprit, Evidence, Incident
from detector.pods import PodInfo
from detector.policy import ActuatorPolicy
from probes.cgroupfiles import (
    CPU_MAX,
    PID_NET_DEV,
    PID_NS_NET,
    PID_STAT,
    PID_STATUS,
    SYS_CPU_ONLINE,
    CgroupFileParseError,
    format_cpu_list,
)
from probes.cpuacct import read_cgroup_cpu
from probes.host import HostPaths

log = logging.getLogger("noisyneighbor.mitigate")


SCHED_FIFO, SCHED_RR = 1, 2


def task_sched(proc: Path, pid: int) -> tuple[int, float, set[int]] | None:
    """(scheduling policy, CPU seconds, allowed CPUs) of a task; None when it is gone or its files are
    not what the kernel writes (probes.cgroupfiles: PID_STAT, PID_STATUS and their one parser each)."""
    try:
        stat = PID_STAT.read(HostPaths(proc=proc), pid=pid)
        status = PID_STATUS.read(HostPaths(proc=proc), pid=pid)
    except (OSError, CgroupFileParseError):
        return None
    return stat.policy, stat.cpu_s, set(status.cpus_allowed)


def requests_from(pods: Callable[[], Iterable[PodInfo]]) -> Callable[[Target], float | None]:
    """``request_of`` for the planner from a pod source: a target's CPU request (cpu + koordinator
    batch-cpu, PodInfo.cpu_request_cores) by pod uid; None when unknown or zero."""

    def request_of(target: Target) -> float | None:
        if not target.pod_uid:
            return None
        for p in pods():
            if p.uid == target.pod_uid:
                return p.cpu_request_cores or None
        return None

    return request_of


RT_RESCAN_S = 5.0  # an open softirq incident's RT ranking is read again at most this often
BUSY_TASK_SHARE = 0.05  # a victim task with this share of its tasks' CPU time says where the victim runs


class NetnsTrafficSampler:
    """Packets/s and CPU of each candidate pod, between two calls of :meth:`sample`."""

    def __init__(self, files: CgroupFiles, clock: Callable[[], float] = time.monotonic,
                 min_interval_s: float = 0.5) -> None:
        self.files = files
        self._clock = clock
        self.min_interval_s = min_interval_s
        self._prev: dict[str, tuple[float, int, int]] = {}  # cgroup -> (t, packets, usage ns)
        self._last: tuple[float, list[PodTraffic]] | None = None

    def _host_netns(self) -> int | None:
        try:
            return os.stat(PID_NS_NET.at(self.files.paths, pid=1)).st_ino
        except OSError:
            return None

    def _one(self, cgroup: str) -> tuple[int | None, int, bool] | None:
        """(netns packets or None, usage ns, host network) of a pod cgroup; None when it is gone."""
        try:
            tree = self.files.descendants(CPU_MAX, cgroup)
            pids = [p for cg in tree for p in self.files.read_procs(cg)]
        except (CgroupFileError, OSError):
            return None
        st = read_cgroup_cpu(self.files.layout, "/" + cgroup)
        usage = st.usage_ns if st is not None else 0
        host = self._host_netns()
        for pid in pids:
            try:
                ino = os.stat(PID_NS_NET.at(self.files.paths, pid=pid)).st_ino
                packets = PID_NET_DEV.read(self.files.paths, pid=pid)
            except OSError:
                continue  # exited: try the next task
            return packets, usage, host is not None and ino == host
        return None, usage, False

    def sample(self, targets: Iterable[Target]) -> list[PodTraffic]:
        """Rates since the previous call; calls closer than ``min_interval_s`` (several incidents in
        one tick) get the previous answer instead of a rate over a few milliseconds."""
        now = self._clock()
        if self._last is not None and now - self._last[0] < self.min_interval_s:
            return list(self._last[1])
        out: list[PodTraffic] = []
        for t in targets:
            cg = t.cgroup.strip("/")
            got = self._one(cg)
            if got is None:
                self._prev.pop(cg, None)
                continue
            packets, usage, host = got
            prev = self._prev.get(cg)
            if packets is not None:
                self._prev[cg] = (now, packets, usage)
            if prev is None or packets is None or now <= prev[0]:
                continue
            dt = now - prev[0]
            out.append(PodTraffic(t, max(0, packets - prev[1]) / dt, max(0, usage - prev[2]) / 1e9 / dt, host))
        self._last = (now, out)
        return out


class LadderStep(StrEnum):
    """The neighbour ladder's steps on one BE culprit, each taken once per incident."""

    QUOTA = "quota"  # cfs quota (the engine's on a small node; the planner's: down to its request)
    CPUSET = "cpuset"  # off the CPUs the victim runs on
    EVICT = "evict"  # Eviction API, with evict_enabled


# After the step before it: isolation first, then a quota to the request, then eviction. Whichever the
# engine took first (a cpuset where the node has CPUs to spare beyond the victim's, a quota where it has
# not) is skipped.
LADDER = (LadderStep.CPUSET, LadderStep.QUOTA, LadderStep.EVICT)
LADDER_CODES = frozenset({neighbor_cpu.CPUSET_AWAY, neighbor_cpu.QUOTA_TO_REQUEST, neighbor_cpu.EVICT})


def ladder_step(decision: Decision) -> LadderStep | None:
    """Which rung a decision is (None: not a neighbour step: a burst, a memory cap)."""
    if decision.kind == ActionKind.EVICT:
        return LadderStep.EVICT
    if decision.kind == ActionKind.SUPPRESS and isinstance(decision.amount, SuppressAmount):
        return LadderStep.CPUSET if decision.amount.policy == "cpuset" else LadderStep.QUOTA
    return None


@dataclass
class _Rung:
    """One BE culprit's ladder for one victim, across that victim's incidents (module doc)."""

    target: Target
    victim: str  # the victim's cgroup, without slashes around it
    incident_id: str | None  # the victim's incident it serves now (or served last)
    closed_at: float | None = None  # when that incident closed, while no other is open
    tried: list[LadderStep] = field(default_factory=list)
    pending: bool = False  # a step was applied and its verdict is not in yet
    not_before: float = 0.0
    # Breach ticks of the incident since its last step was verified (None: it was not): a step that helped
    # while the victim keeps breaching is followed by the next one, on top of it.
    breaches_since_verified: int | None = None
    last: LadderStep | None = None
    done: bool = False


class MitigationPlanner:
    """``on_incident`` hook: extra decisions per cause, and the incident's notes (see the module doc)."""

    def __init__(
        self,
        sink: DecisionSink,
        candidates: Callable[[], Iterable[Target]],
        sampler: NetnsTrafficSampler | None = None,
        policy: ActuatorPolicy | None = None,
        *,
        request_of: Callable[[Target], float | None] = lambda target: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.candidates = candidates
        self.sampler = sampler
        self.policy = policy or ActuatorPolicy()
        self.request_of = request_of
        self._clock = clock
        self._acted: set[str] = set()
        self._notes: dict[str, dict[str, str]] = {}  # incident -> note key -> text, in the order said
        self._ladder: dict[tuple[str, str], _Rung] = {}  # (victim cgroup, culprit cgroup) -> its ladder
        self._rt_scans: dict[str, tuple[float, Target | None, float]] = {}  # incident -> (when, top BE, share)

    def note(self, incident_id: str | None, text: str, key: str | None = None) -> None:
        """Add a note to an incident; a note with the same ``key`` (an outcome code, say) replaces the
        earlier one (a retried step's refusals are one line, the latest, not one per tick)."""
        if incident_id is None:
            return
        notes = self._notes.setdefault(incident_id, {})
        if key is None:
            notes.setdefault(text, text)
            return
        notes.pop(key, None)
        notes[key] = text

    def notes(self, incident_id: str) -> list[str]:
        return list(self._notes.get(incident_id, {}).values())

    def note_record(self, record: ActionRecord) -> None:
        """Manager hook: a reverted or refused action is said in its incident; a suppress that did not
        help moves its incident's escalation ladder one rung on. Keyed on the record's state and outcome
        and the decision's code, never on their wording."""
        d = record.decision
        if record.state in (ActionState.REVERTED, ActionState.REFUSED) and record.detail:
            self.note(d.incident_id, f"{d.kind} {d.target.display} {record.state}: {record.detail}",
                      key=f"record:{d.kind}:{d.target.cgroup}:{record.state}")
        if d.incident_id is None or (d.target.qos or "").upper() != "BE":
            return
        if record.state == ActionState.REFUSED and d.code == softirq.OWN_TRAFFIC:
            self._acted.discard(d.incident_id)  # e.g. the RT isolation of the same pod is still verified: retry
        step = ladder_step(d)
        if step is None or d.victim is None:
            return
        key = (d.victim.cgroup.strip("/"), d.target.cgroup.strip("/"))
        rung = self._ladder.get(key)
        if record.state == ActionState.APPLIED:
            rung = self._ladder.setdefault(key, _Rung(d.target, key[0], d.incident_id))
            rung.incident_id = d.incident_id
            if step not in rung.tried:
                rung.tried.append(step)
            rung.pending, rung.last, rung.breaches_since_verified = True, step, None
        elif rung is None:
            return
        elif record.state == ActionState.VERIFIED:
            rung.pending, rung.breaches_since_verified = False, 0
        elif record.state == ActionState.REVERTED and record.outcome == ActionOutcome.DID_NOT_HELP:
            # The next step at the next tick: the manager lets this victim's next, different step through
            # its block on the target (it blocks the same step only).
            rung.pending, rung.breaches_since_verified, rung.not_before = False, None, self._clock()
        elif record.state == ActionState.REFUSED and record.outcome == ActionOutcome.WAIT:
            if d.code in LADDER_CODES:  # ours: the same step again once the limit passes, not the next one
                if step in rung.tried:
                    rung.tried.remove(step)
                rung.pending = False
                rung.not_before = self._clock() + max(1.0, record.effect.get("retry_in_s", 1.0))
        elif record.state == ActionState.REFUSED and record.outcome in (ActionOutcome.TRIED_BEFORE,
                                                                       ActionOutcome.IN_PLACE):
            # The victim's next incident asked for a step its ladder has taken: judged already, or in place.
            if step not in rung.tried:
                rung.tried.append(step)
            if d.code in LADDER_CODES:
                rung.pending, rung.not_before = False, self._clock()
        elif record.state in (ActionState.REFUSED, ActionState.FAILED) and d.code in LADDER_CODES:
            if step not in rung.tried:
                rung.tried.append(step)
            rung.pending, rung.breaches_since_verified, rung.not_before = False, None, self._clock()

    def __call__(self, inc: Incident, what: str) -> None:
        try:
            step = spec(inc.cause).mitigation if inc.open else None
            if step == Mitigation.TRAFFIC_AND_RT:
                self._softirq(inc)
            elif step == Mitigation.MEMORY_GROWER:
                self._reclaim(inc)
            if inc.open:
                blamed = {c.target.cgroup for c in inc.culprits}
                for rung in self._rungs_of(inc):
                    if rung.incident_id != inc.incident_id and rung.target.cgroup not in blamed:
                        continue  # the victim's next incident continues a culprit's ladder only if it blames it
                    if rung.incident_id != inc.incident_id:
                        self.note(inc.incident_id, neighbor_cpu.SPEC.say(
                            neighbor_cpu.LADDER_CONTINUED, culprit=rung.target.display, victim=inc.victim.display,
                            incident=rung.incident_id or "-", tried=", ".join(rung.tried) or "nothing",
                            memory_s=DID_NOT_HELP_MEMORY_S), key=f"{neighbor_cpu.LADDER_CONTINUED}:{rung.target.cgroup}")
                        rung.incident_id = inc.incident_id
                    rung.closed_at = None
                    self._escalate(inc, rung, what)
        except Exception:  # a hook must never stop detection
            log.exception("mitigation planner failed on %s", inc.incident_id)
        self._annotate(inc)
        if what == "closed":
            self._acted.discard(inc.incident_id)
            self._acted.discard(f"rt:{inc.incident_id}")
            self._notes.pop(inc.incident_id, None)
            now = self._clock()
            for rung in self._rungs_of(inc):
                rung.closed_at = now  # kept: the victim's next incident with this culprit continues it
            self._rt_scans.pop(inc.incident_id, None)
        self._forget_old_ladders()

    def _rungs_of(self, inc: Incident) -> list[_Rung]:
        victim = inc.victim.cgroup.strip("/")
        return [r for r in self._ladder.values() if r.victim == victim]

    def _forget_old_ladders(self) -> None:
        """A ladder whose victim has had no incident for DID_NOT_HELP_MEMORY_S starts over: the manager
        no longer refuses the steps it judged by then."""
        now = self._clock()
        for key in [k for k, r in self._ladder.items()
                    if r.closed_at is not None and not r.pending and now - r.closed_at >= DID_NOT_HELP_MEMORY_S]:
            del self._ladder[key]

    def _reclaim(self, inc: Incident) -> None:
        key = f"mem:{inc.incident_id}"
        if key in self._acted:
            return
        step = reclaim.memory_step(inc, self.policy.evict_enabled)
        if step.final:
            self._acted.add(key)
        if step.note is not None:
            self.note(inc.incident_id, step.note, key=None if step.final else step.code)
        if step.decision is not None:
            self._submit(inc, step.decision)

    def _escalate(self, inc: Incident, rung: _Rung, what: str) -> None:
        """The culprit's next step when its last one did not help (reverted), or helped while the victim
        kept breaching for as many ticks as the step was verified over (neighbor_cpu: verified on the mean
        wait, which a quota lowers with the p99 still high)."""
        if rung.done or rung.pending:
            return
        say = neighbor_cpu.SPEC.say
        if rung.breaches_since_verified is not None:
            if inc.cause != Cause.NEIGHBOR_CPU:
                return  # a verified step of another cause (the sender's quota): the victim is judged on it
            if what == "updated":
                rung.breaches_since_verified += 1
            needed = max(1, self.policy.verify_intervals)
            if rung.breaches_since_verified < needed:
                return
            rung.breaches_since_verified = None
            self.note(inc.incident_id, say(neighbor_cpu.HELPED_NOT_ENOUGH, step=rung.last or "the step",
                                           culprit=rung.target.display, victim=inc.victim.display, ticks=needed))
        elif self._clock() < rung.not_before:
            return
        decision = self._next_step(inc, rung)
        if decision is not None:
            rung.pending = True
            self._submit(inc, decision)

    def _next_step(self, inc: Incident, rung: _Rung) -> Decision | None:
        """The first untried rung that applies (LADDER), with its note; None when none is left."""
        target = rung.target
        say = neighbor_cpu.SPEC.say
        cpu = next((c.cpu_cores for c in inc.culprits if c.target.cgroup == target.cgroup), 0.0)
        signal = spec(inc.cause).verify_signal(inc)
        for step in LADDER:
            if step in rung.tried:
                continue
            rung.tried.append(step)
            if step == LadderStep.CPUSET:
                if inc.cause != Cause.NEIGHBOR_CPU:
                    continue  # softirq: the work lands where the packets are steered, not where the sender runs
                online = self.online_cpus()
                victim_cpus = self.victim_cpus(inc)
                others = tuple(c for c in online if c not in victim_cpus)
                if not victim_cpus or not others:
                    self.note(inc.incident_id, say(neighbor_cpu.NO_OTHER_CPUS, culprit=target.display,
                                                   victim=inc.victim.display, victim_cpus=victim_cpus or online))
                    continue
                reason = say(neighbor_cpu.CPUSET_AWAY, culprit=target.display, victim=inc.victim.display,
                             victim_cpus=format_cpu_list(victim_cpus), cpus=format_cpu_list(others))
                self.note(inc.incident_id, reason)
                return Decision(ActionKind.SUPPRESS, target, SuppressAmount("cpuset", cpus=others, floor_cpus=1),
                                reason, incident_id=inc.incident_id, victim=inc.victim, victim_signal=signal,
                                code=neighbor_cpu.CPUSET_AWAY)
            if step == LadderStep.QUOTA:
                request = self.request_of(target)
                if not (request and cpu > request * 1.1):
                    continue
                said = {"culprit": target.display, "cpu": cpu, "request": request}
                self.note(inc.incident_id, say(neighbor_cpu.QUOTA_TO_REQUEST_NOTE, **said))
                return Decision(
                    ActionKind.SUPPRESS, target, SuppressAmount("cfs_quota", cpu_cores=max(0.1, request)),
                    say(neighbor_cpu.QUOTA_TO_REQUEST, **said), incident_id=inc.incident_id, victim=inc.victim,
                    victim_signal=signal, code=neighbor_cpu.QUOTA_TO_REQUEST)
            if step == LadderStep.EVICT:
                rung.done = True
                if not self.policy.evict_enabled:
                    self.note(inc.incident_id, say(neighbor_cpu.EVICT_DISABLED, culprit=target.display))
                    return None
                return Decision(
                    ActionKind.EVICT, target, EvictAmount(reason="interference", release_cpu_cores=cpu),
                    say(neighbor_cpu.EVICT, culprit=target.display, victim=inc.victim.display),
                    incident_id=inc.incident_id, victim=inc.victim, victim_signal=signal, code=neighbor_cpu.EVICT)
        rung.done = True
        return None

    def _submit(self, inc: Incident, decision: Decision) -> None:
        inc.actions.append(f"{decision.kind}:{decision.target.display}")
        self.sink.submit(inc.for_verification(decision))

    def _pids(self, target: Target) -> list[int]:
        assert self.sampler is not None
        files = self.sampler.files
        try:
            return [p for cg in files.descendants(CPU_MAX, target.cgroup.strip("/"))
                    for p in files.read_procs(cg)]
        except (CgroupFileError, OSError):
            return []

    def _rt(self, inc: Incident, candidates: list[Target], act: bool = True) -> bool:
        """Rank pods with RT tasks allowed on the victim's CPUs (every tick: the top BE one is put first in
        the incident's culprits, as the engine's who-ran-instead ranking can miss it); with ``act``, move it
        off those CPUs. True if a decision was submitted."""
        proc = getattr(self.sampler, "proc", None)
        if proc is None or getattr(self.sampler, "files", None) is None:
            return False  # a sampler without a host view (tests' fakes): no RT ranking
        scanned = self._rt_scans.get(inc.incident_id)
        if not act and scanned is not None and self._clock() - scanned[0] < RT_RESCAN_S:
            # Between scans the last ranking is put back (the engine re-ranks every tick): the scan
            # reads every candidate pod's tasks, a cost in pods, not in what happened.
            if scanned[1] is not None:
                self._rank_first(inc, scanned[1], scanned[2])
            return False
        self._rt_scans[inc.incident_id] = (self._clock(), None, 0.0)
        victim_cpus: set[int] = set()
        for pid in self._pids(inc.victim):
            got = task_sched(proc, pid)
            if got is not None:
                victim_cpus |= got[2]
        if not victim_cpus:
            return False
        ranked: list[tuple[float, Target]] = []
        for t in candidates:
            if t.cgroup.strip("/") == inc.victim.cgroup.strip("/"):
                continue
            rt_s = 0.0
            for pid in self._pids(t):
                got = task_sched(proc, pid)
                if got is not None and got[0] in (SCHED_FIFO, SCHED_RR) and got[2] & victim_cpus:
                    rt_s += got[1] + 1e-3
            if rt_s > 0:
                ranked.append((rt_s, t))
        if not ranked:
            return False
        ranked.sort(key=lambda x: -x[0])
        say = softirq.SPEC.say
        ranking = ", ".join(say(softirq.RT_TASK, pod=t.display, qos=t.qos or "?", cpu_s=s) for s, t in ranked)
        self.note(inc.incident_id, say(softirq.RT_TASKS, cpus=sorted(victim_cpus), ranking=ranking),
                  key=f"{softirq.RT_TASKS}:{sorted(victim_cpus)}")
        top = next((t for _, t in ranked if (t.qos or "").upper() == "BE"), None)
        if top is None:
            self.note(inc.incident_id, say(softirq.RT_NOT_BE))
            return False
        total = sum(x for x, _ in ranked)
        share = next(x for x, t in ranked if t is top) / total
        self._rt_scans[inc.incident_id] = (self._clock(), top, share)
        self._rank_first(inc, top, share)
        if not act:
            return False
        others = tuple(c for c in self.online_cpus() if c not in victim_cpus)
        if not others:
            return False
        self._submit(inc, Decision(
            ActionKind.SUPPRESS, top, SuppressAmount("cpuset", cpus=others),
            say(softirq.RT_MOVE, pod=top.display, victim=inc.victim.display, cpus=",".join(map(str, others))),
            incident_id=inc.incident_id, victim=inc.victim, victim_signal=softirq.SPEC.verify_signal(inc),
            code=softirq.RT_MOVE))
        return True

    @staticmethod
    def _rank_first(inc: Incident, target: Target, share: float, kernel_work: str = "") -> None:
        """Put ``target`` first in the incident's culprits, keeping what the engine knew of it. With
        ``kernel_work`` (the cause's, e.g. "ksoftirqd") a culprit the engine had no cost for is costed
        by the victim's waits without that work (Incident.kernel_work_cost): a sender whose packets
        ksoftirqd processes never runs on the victim's CPU, its kernel work does."""
        if inc.culprits and inc.culprits[0].target.cgroup == target.cgroup:
            return
        old = next((c for c in inc.culprits if c.target.cgroup == target.cgroup), None)
        rest = [c for c in inc.culprits if c.target.cgroup != target.cgroup]
        score = round(max([1.0, *(c.score for c in rest)]), 4)
        first = (replace(old, target=target, score=score, attribution=round(share, 4)) if old is not None
                 else Culprit(target, score, attribution=round(share, 4)))
        cost = inc.kernel_work_cost
        if kernel_work and cost is not None and first.runq_p99_without_ns is None:
            first = replace(first, victim_runq_p99_ns=round(cost.p99_ns), runq_p99_without_ns=round(cost.p99_without_ns),
                            victim_wait_ms_per_s=round(cost.wait_ms_per_s, 3),
                            wait_ms_per_s_without=round(cost.wait_ms_per_s_without, 3), without_kernel_work=kernel_work)
        inc.culprits = [first, *rest]

    def victim_cpus(self, inc: Incident) -> list[int]:
        """The CPUs the victim runs on: those the detector saw it use (``inc.victim_cpus``: per-CPU usage on
        v1; on v2 the cgroup's whole effective cpuset, which a victim pinned inside it does not narrow),
        narrowed to the CPUs its busy tasks may run on (their allowed CPUs; a task with under
        ``BUSY_TASK_SHARE`` of the victim's CPU time, a pause process, does not widen them)."""
        seen = set(inc.victim_cpus)
        proc = getattr(self.sampler, "proc", None)
        allowed: set[int] = set()
        if proc is not None and getattr(self.sampler, "files", None) is not None:
            tasks = [got for pid in self._pids(inc.victim) if (got := task_sched(proc, pid)) is not None]
            total = sum(cpu_s for _, cpu_s, _ in tasks)
            for _, cpu_s, cpus in tasks:
                if total <= 0 or cpu_s >= BUSY_TASK_SHARE * total:
                    allowed |= cpus
        return sorted((seen & allowed) or allowed or seen)

    def online_cpus(self) -> list[int]:
        files = getattr(self.sampler, "files", None)
        paths = files.paths if files is not None else HostPaths()
        try:
            return sorted(SYS_CPU_ONLINE.read(paths))
        except (OSError, CgroupFileParseError):
            return []

    def _softirq(self, inc: Incident) -> None:
        if self.sampler is None:
            return
        candidates = list(self.candidates())
        if inc.victim.cgroup.strip("/") in {t.cgroup.strip("/") for t in candidates}:
            first = f"rt:{inc.incident_id}" not in self._acted
            self._acted.add(f"rt:{inc.incident_id}")  # one RT move per incident, whatever came of it
            if self._rt(inc, candidates, act=first):
                return
        if inc.victim.cgroup.strip("/") not in {t.cgroup.strip("/") for t in candidates}:
            return  # a victim that is not a known pod: nothing here to weigh its traffic against
        if inc.incident_id in self._acted:
            return  # acted (or refused) once: no more sampling of every pod's traffic for it
        traffic = self.sampler.sample(candidates)
        if not traffic:
            return
        decision, why = softirq_traffic_decision(inc.victim, inc.incident_id, traffic,
                                                 victim_signal=softirq.SPEC.verify_signal(inc))
        self.note(inc.incident_id, why)
        if decision is None:
            return
        # The sender is the culprit, though it never ran on the victim's CPUs: its packets' kernel work did.
        self._rank_first(inc, decision.target, traffic_share(inc.victim, traffic, decision.target),
                         softirq.SPEC.kernel_work)
        if not self.policy.suppress_enabled:
            return
        self._acted.add(inc.incident_id)
        self._submit(inc, decision)

    def _annotate(self, inc: Incident) -> None:
        notes = self.notes(inc.incident_id)
        if not notes and not any(e.signal == "mitigation" for e in inc.evidence):
            return
        inc.evidence[:] = [e for e in inc.evidence if e.signal != "mitigation"]
        inc.evidence.extend(Evidence("mitigation", 0.0, 0.0, note=text) for text in notes)
