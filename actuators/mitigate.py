# SPDX-License-Identifier: Apache-2.0
"""Mitigation the incident engine's own rule (its decisions for the ranked culprits) does not reach: the
generic planner that runs each cause's plan (``CauseSpec.plan``, ``CauseSpec.ladder``; the plans and
their words live in detector/causes/, this module holds none).

:class:`MitigationPlanner` is an ``on_incident`` hook of the detector's engine (no change to the
engine): on every tick of an open incident it runs the incident's cause's plan and every ladder
(neighbor_cpu's, per victim and culprit), submits the decisions they yield through the same sink (the
actuator manager: limits, journal, verify/revert), and writes their notes into the incident's evidence,
keyed by outcome code (detector/causes/plan.py: NoteKey), so the incident says why something was or was
not done. Every action's result (the manager's record) goes back to the ladders as a
:class:`~detector.causes.plan.StepOutcome`, keyed on the record's state and outcome and the decision's
code, never on words; a reverted or refused action is said in its incident.

:class:`HostView` is what plans read of the host (detector/causes/plan.py: PlanHost): each pod's
own-netns packet rate (:class:`NetnsTrafficSampler`), the pods' real-time tasks allowed on the victim's
CPUs, the CPUs the victim's busy tasks run on, and the online CPUs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from actuators.base import ActionOutcome, ActionRecord, ActionState
from actuators.cgroupfile import CgroupFileError, CgroupFiles
from detector.causes import CAUSES, spec
from detector.causes.plan import (
    Ladder,
    Note,
    NoteKey,
    PlanContext,
    PlanStep,
    RtTasks,
    StepKey,
    StepOutcome,
    StepResult,
    Submit,
)
from detector.decisions import Decision, DecisionSink, PodTraffic, Target
from detector.model import CLEAN, Culprit, Evidence, Incident
from detector.pods import PodInfo
from detector.policy import ActuatorPolicy
from probes.cgroupfiles import CPU_MAX, PID_NET_DEV, PID_NS_NET, PID_STAT, PID_STATUS, SYS_CPU_ONLINE, CgroupFileParseError
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
        self.proc = Path(files.paths.proc)
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


class HostView:
    """What plans read of the host (detector.causes.plan.PlanHost), through the traffic sampler's files:
    a sampler without a host view (tests' fakes) gives traffic only."""

    def __init__(self, sampler: NetnsTrafficSampler | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.sampler = sampler
        self._clock = clock
        self._rt_scans: dict[str, tuple[float, RtTasks]] = {}  # incident -> (when read, what was read)

    @property
    def proc(self) -> Path | None:
        files = getattr(self.sampler, "files", None)
        return getattr(self.sampler, "proc", None) if files is not None else None

    def sample_traffic(self, targets: Iterable[Target]) -> list[PodTraffic] | None:
        return self.sampler.sample(targets) if self.sampler is not None else None

    def pids(self, target: Target) -> list[int]:
        files = getattr(self.sampler, "files", None)
        if files is None:
            return []
        try:
            return [p for cg in files.descendants(CPU_MAX, target.cgroup.strip("/"))
                    for p in files.read_procs(cg)]
        except (CgroupFileError, OSError):
            return []

    def rt_tasks(self, inc: Incident, candidates: list[Target], fresh: bool) -> RtTasks | None:
        """Pods with RT tasks allowed on the victim's CPUs, by their RT tasks' CPU time. Read again at most
        every RT_RESCAN_S unless ``fresh``: the scan reads every candidate pod's tasks, a cost in pods,
        not in what happened."""
        proc = self.proc
        if proc is None:
            return None
        scanned = self._rt_scans.get(inc.incident_id)
        now = self._clock()
        if not fresh and scanned is not None and now - scanned[0] < RT_RESCAN_S:
            return scanned[1]
        victim_cpus: set[int] = set()
        for pid in self.pids(inc.victim):
            got = task_sched(proc, pid)
            if got is not None:
                victim_cpus |= got[2]
        ranked: list[tuple[float, Target]] = []
        for t in candidates if victim_cpus else []:
            if t.cgroup.strip("/") == inc.victim.cgroup.strip("/"):
                continue
            rt_s = 0.0
            for pid in self.pids(t):
                got = task_sched(proc, pid)
                if got is not None and got[0] in (SCHED_FIFO, SCHED_RR) and got[2] & victim_cpus:
                    rt_s += got[1] + 1e-3
            if rt_s > 0:
                ranked.append((rt_s, t))
        ranked.sort(key=lambda x: -x[0])
        self._rt_scans[inc.incident_id] = (now, RtTasks(frozenset(victim_cpus), tuple(ranked)))
        return self._rt_scans[inc.incident_id][1]

    def forget(self, incident_id: str) -> None:
        self._rt_scans.pop(incident_id, None)

    def victim_cpus(self, inc: Incident) -> list[int]:
        """The CPUs the victim runs on: those the detector saw it use (``inc.victim_cpus``: per-CPU usage on
        v1; on v2 the cgroup's whole effective cpuset, which a victim pinned inside it does not narrow),
        narrowed to the CPUs its busy tasks may run on (their allowed CPUs; a task with under
        ``BUSY_TASK_SHARE`` of the victim's CPU time, a pause process, does not widen them)."""
        seen = set(inc.victim_cpus)
        proc = self.proc
        allowed: set[int] = set()
        if proc is not None:
            tasks = [got for pid in self.pids(inc.victim) if (got := task_sched(proc, pid)) is not None]
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


# A reverted or refused action, or one applied on top of the target's step being verified and judged with
# it (ActionOutcome.JOINED), said in its incident (NoteKey subject: kind, target, state)
RECORD_NOTE = "mitigate.record"


def step_outcome(record: ActionRecord) -> StepOutcome:
    """An action record as a plan sees it: by its state and outcome code, never its words."""
    state, outcome = record.state, record.outcome
    if state == ActionState.APPLIED:
        return StepOutcome.APPLIED
    if state == ActionState.VERIFIED:
        return StepOutcome.VERIFIED
    if state == ActionState.REVERTED:
        return StepOutcome.DID_NOT_HELP if outcome == ActionOutcome.DID_NOT_HELP else StepOutcome.OTHER
    if state == ActionState.REFUSED and outcome == ActionOutcome.WAIT:
        return StepOutcome.WAIT
    if state == ActionState.REFUSED and outcome in (ActionOutcome.TRIED_BEFORE, ActionOutcome.IN_PLACE):
        return StepOutcome.JUDGED
    if state in (ActionState.REFUSED, ActionState.FAILED):
        return StepOutcome.REFUSED
    return StepOutcome.OTHER


class MitigationPlanner:
    """``on_incident`` hook: runs the causes' plans, submits what they decide, keeps the incident's notes."""

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
        self.host = HostView(sampler, clock)
        self._done: set[StepKey] = set()  # the plans' once-per-incident steps taken
        self._found: dict[StepKey, Culprit] = {}  # what those steps found, for the incident's later ticks
        self._notes: dict[str, dict[NoteKey, str]] = {}  # incident -> note key -> text, in the order said
        self.ladders: list[Ladder] = [s.ladder() for s in CAUSES if s.ladder is not None]
        # A refusal of these codes lets their plan take its once-per-incident step again.
        self._retry = {code: step for s in CAUSES for code, step in s.retry_when_refused.items()}

    # -- PlanHost: the host view, with the planner's request source (tests replace online_cpus) ---------
    def sample_traffic(self, targets: Iterable[Target]) -> list[PodTraffic] | None:
        return self.host.sample_traffic(targets)

    def rt_tasks(self, inc: Incident, candidates: list[Target], fresh: bool) -> RtTasks | None:
        return self.host.rt_tasks(inc, candidates, fresh)

    def victim_cpus(self, inc: Incident) -> list[int]:
        return self.host.victim_cpus(inc)

    def online_cpus(self) -> list[int]:
        return self.host.online_cpus()

    # -- notes --------------------------------------------------------------------------------------
    def note(self, incident_id: str | None, note: Note) -> None:
        """Add a note to an incident; a note with the same key (its outcome code and what it names)
        replaces the earlier one, at the end (a retried step's refusals are one line, the latest); the
        same key and words again change nothing."""
        if incident_id is None:
            return
        notes = self._notes.setdefault(incident_id, {})
        if notes.get(note.key) == note.text:
            return
        notes.pop(note.key, None)
        notes[note.key] = note.text

    def notes(self, incident_id: str) -> list[str]:
        return list(self._notes.get(incident_id, {}).values())

    def note_record(self, record: ActionRecord) -> None:
        """Manager hook: a reverted or refused action, or one that joined the step being verified, is said
        in its incident; its result goes to the ladders. Keyed on the record's state and outcome and the
        decision's code, never on their wording."""
        d = record.decision
        said = record.state in (ActionState.REVERTED, ActionState.REFUSED) or record.outcome == ActionOutcome.JOINED
        if said and record.detail:
            self.note(d.incident_id, Note(NoteKey(RECORD_NOTE, (str(d.kind), d.target.cgroup, str(record.state))),
                                          f"{d.kind} {d.target.display} {record.state}: {record.detail}"))
        if d.incident_id is None or (d.target.qos or "").upper() != "BE":
            return
        if record.state == ActionState.REFUSED and d.code in self._retry:
            self._done.discard(StepKey(d.incident_id, self._retry[d.code]))
        improvement = record.effect.get("improvement_percent")
        result = StepResult(d, step_outcome(record), float(record.effect.get("retry_in_s", 1.0)),
                            float(improvement) if isinstance(improvement, (int, float)) else None)
        now = self._clock()
        for ladder in self.ladders:
            ladder.on_result(result, now)

    # -- the loop -----------------------------------------------------------------------------------
    def __call__(self, inc: Incident, what: str) -> None:
        try:
            if inc.open:
                cause = spec(inc.cause)
                ctx = PlanContext(inc, what, self._clock(), self.policy, cause.verify_signal(inc), self.candidates,
                                  self, self._done, self._found)
                # A clean tick (the incident in its clear windows) decides nothing new for the cause; a
                # ladder goes on: its step undone as "did not help" while the incident is still open is
                # followed by the next (on 6.1 a victim that preempts the hog stops breaching for a few
                # ticks: it closed with the BE pod back on its CPU and nothing more tried, issue 41).
                if cause.plan is not None and what != CLEAN:
                    self._run(inc, cause.plan(ctx))
                for ladder in self.ladders:
                    self._run(inc, ladder.plan(ctx))
        except Exception:  # a hook must never stop detection
            log.exception("mitigation planner failed on %s", inc.incident_id)
        self._annotate(inc)
        now = self._clock()
        if what == "closed":
            self._done = {k for k in self._done if k.incident_id != inc.incident_id}
            self._found = {k: v for k, v in self._found.items() if k.incident_id != inc.incident_id}
            self._notes.pop(inc.incident_id, None)
            self.host.forget(inc.incident_id)
            for ladder in self.ladders:
                ladder.on_closed(inc, now)
        for ladder in self.ladders:
            ladder.forget_old(now)

    def _run(self, inc: Incident, steps: Iterator[PlanStep]) -> None:
        """Say each note, submit each decision as the plan yields it (the sink's answer, a refusal at
        once, is known to the plan's next step)."""
        for step in steps:
            if isinstance(step, Note):
                self.note(inc.incident_id, step)
            elif isinstance(step, Submit):
                self._submit(inc, step.decision)

    def _submit(self, inc: Incident, decision: Decision) -> None:
        inc.actions.append(f"{decision.kind}:{decision.target.display}")
        self.sink.submit(inc.for_verification(decision))

    def _annotate(self, inc: Incident) -> None:
        notes = self.notes(inc.incident_id)
        if not notes and not any(e.signal == "mitigation" for e in inc.evidence):
            return
        inc.evidence[:] = [e for e in inc.evidence if e.signal != "mitigation"]
        inc.evidence.extend(Evidence("mitigation", 0.0, 0.0, note=text) for text in notes)
