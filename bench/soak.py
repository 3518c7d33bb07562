#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Churn soak (issue 39): the real agent under thousands of pods coming and going, naming the right culprit.

One agent (``python -m noisyneighbor.cli agent`` as ``make run`` starts it: all default probes, the
exporter, the kubelet pod source on the fake kubelet of testkit/fakekube.py; ``--dry-run`` and
``--act-only`` on this bench's own cgroups: it detects, it changes nothing). The pods are kubelet-shaped
(pod and container cgroups under ``nn-test-<pid>``, bench.agent_footprint.PodFleet), ``--pods`` alive at
any time; each pod's task wakes every ``--wake-every`` seconds for a short CPU burst, so pods wait
behind each other and fill the who-ran-instead pair table. Churn: ``--churn-pods`` pods replaced every
``--churn-every`` seconds. Every ``--episode-every`` seconds during churn an episode: a known BestEffort
hog pinned next to a known latency-sensitive victim on the last CPU (the bench and the agent keep off
that CPU); the incident the agent opens for the victim must name the hog first.

Time is compressed through the agent's own config (stated in the output): the pod source's vanish grace
(``kubernetes.vanish_grace_seconds``, 60 s by default) and the quiet-pair age
(``runq_pair_quiet_seconds``, 60 s by default) are ``--grace`` and ``--pair-quiet`` seconds, so minutes
here hold the slot and series turnover of hours at the default timings.

Checkpoints every ``--checkpoint-every`` seconds print, from the agent: pair and cgroup table use,
``culprit_map_full`` / ``cgroup_map_full`` / ``key_map_full`` drops, /metrics series (all, and those of
this bench's live and removed pods), map entries, RSS and the BPF map memory (memlock of the agent's
maps, from /proc/<pid>/fdinfo). The run: ``--warmup`` s with the pods started together ("start",
printed only); a warm-up churn that replaces every pod once, then the settle below ("steady": a node
that has seen churn); ``--minutes`` of churn (thousands of pods), then the settle ("end"). The settle is
``--grace`` + ``--pair-quiet`` + the kubelet poll, sweep and forget periods + a margin. Exit 1 on: any
drop, an episode whose incident names another culprit first or that opens none, a failed agent tick,
a removed pod's series at the end, or end vs steady outside the bounds (BOUNDS, printed with the result).

    sudo .venv/bin/python -m bench.soak                        # make bench-soak: ~13 min, 3,300 pods
    sudo .venv/bin/python -m bench.soak --minutes 2 --pods 100 --json /tmp/soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.agent_footprint import CONTROLLERS, Churner, Pod, PodFleet  # noqa: E402
from noisyneighbor.sections import FORGET_AFTER_INTERVALS  # noqa: E402
from probes.runqlat import PAIR_SWEEP_S  # noqa: E402
from testkit.exporter_support import AgentProcess, cgroup_rel_path, write_config  # noqa: E402
from testkit.fakekube import FakeKube, container_id_for, make_pod  # noqa: E402
from testkit.sandbox import OwnedCgroup, cleanup_prefix  # noqa: E402

NODE = "node-1"  # bench.agent_footprint's pods name this node
INTERVAL_S = 1.0
LS_WORKER = REPO / "testkit" / "workloads" / "ls_worker.py"
HOG = "while True:\n    pass\n"
SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)")  # name{labels} value (exposition text)
DROP_REASONS = ("culprit_map_full", "cgroup_map_full", "key_map_full")
# End vs steady: what "back to the steady level" allows. The same pods are alive in both (same count,
# same task shape), so the per-pod series and the kernel tables hold the same population; the margins
# cover the machine's own cgroups coming and going (they are in the tables and the series too) and,
# for pairs, which pods happened to wait behind which in the last quiet-pair age.
BOUNDS = {
    "series": (1.05, 0),  # (factor, plus): end <= steady x factor + plus
    "own_series": (1.02, 0),
    "cgroup_slots_used": (1.05, 16),
    "pair_slots_used": (1.25, 64),
    "map_entries": (1.05, 16),
    "rss_mib": (1.10, 0),
    "map_memlock_kib": (1.0, 0),  # preallocated tables: their size never moves
}
# Sleeping most of the time, then ~2 ms of shell arithmetic (dash: ~1 us a loop): pods wait behind each
# other's bursts, so pairs form between pods, not only behind the episode's hog.
# A pod's task first takes back every CPU (the bench itself keeps off the episodes' CPU: see run()).
WAKER = ("taskset -p -c {cpus} $$ >/dev/null; sleep 0.05; "
         "while :; do sleep {every:g}; i=0; while [ $i -lt {loops} ]; do i=$((i+1)); done; done")


@dataclass
class Checkpoint:
    t_s: float
    phase: str  # warm-up | churn | settle
    pods_alive: int
    pods_made: int
    ticks: int
    failed_ticks: int
    drops: dict[str, int]
    cgroup_slots_used: int
    cgroup_slots: int
    pair_slots_used: int
    pair_slots: int
    series: int
    own_series: int  # series labelled with a pod of this bench that is alive
    removed_pod_series: int  # ... with a pod of this bench that was removed
    map_entries: int
    rss_mib: float
    hwm_mib: float
    map_memlock_kib: int
    maps: int


@dataclass
class Episode:
    at_s: float
    victim: str  # namespace/pod
    hog: str
    opened_after_s: float | None = None
    cause: str = ""
    culprits: list[str] = field(default_factory=list)  # of the opened incident, ranked: "name (who-ran-instead share)"
    ok: bool = False
    why: str = ""
    record: dict = field(default_factory=dict)  # the opened incident as logged, kept when it is wrong (--json)


@dataclass
class Result:
    settings: dict
    checkpoints: list[Checkpoint] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    start: Checkpoint | None = None  # the pods started together, no churn yet (printed, not judged)
    steady: Checkpoint | None = None
    end: Checkpoint | None = None
    pods_made: int = 0
    incidents_opened: int = 0
    agent_exit: int | None = None
    failures: list[str] = field(default_factory=list)


# ---- what the agent holds -----------------------------------------------------------------------


def _labels(text: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', text))


def _bpf_maps(pid: int) -> tuple[int, int]:
    """(memlock KiB, maps) of the BPF maps the agent holds open: what the kernel charges for them."""
    seen: dict[str, int] = {}
    for fd in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            info = fd.read_text()
        except OSError:
            continue  # closed meanwhile
        map_id, memlock = re.search(r"^map_id:\s*(\d+)", info, re.M), re.search(r"^memlock:\s*(\d+)", info, re.M)
        if map_id and memlock:
            seen[map_id.group(1)] = int(memlock.group(1))
    return sum(seen.values()) // 1024, len(seen)


def _memory_mib(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    kib = {k: int(v.split()[0]) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(.+)$", status, re.M)}
    return round(kib["VmRSS"] / 1024, 1), round(kib["VmHWM"] / 1024, 1)


def checkpoint(agent: AgentProcess, fleet: PodFleet, t0: float, phase: str) -> Checkpoint:
    _, body = agent.get("/healthz", timeout=30)  # 503 when stale: its body says so too
    health = json.loads(body)
    text = agent.scrape_text()
    drops = dict.fromkeys(DROP_REASONS, 0)
    slots: dict[tuple[str, str], int] = {}
    series = entries = 0
    alive = {pod.uid for pod in fleet.pods}
    own = removed = 0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series += 1
        m = SAMPLE.match(line)
        if m is None:
            continue
        name, labels, value = m.group(1), _labels(m.group(2) or ""), m.group(3)
        uid = labels.get("pod_uid")
        own += uid in alive
        removed += uid in fleet.removed_uids
        if name == "noisyneighbor_probe_drops_total" and labels.get("reason") in drops:
            drops[labels["reason"]] += int(float(value))
        elif name == "noisyneighbor_runqueue_table_slots":
            slots[(labels.get("table", ""), labels.get("state", ""))] = int(float(value))
        elif name == "noisyneighbor_bpf_map_entries":
            entries += int(float(value))
    rss, hwm = _memory_mib(agent.proc.pid)
    memlock, maps = _bpf_maps(agent.proc.pid)
    return Checkpoint(
        round(time.monotonic() - t0, 1), phase, len(fleet.pods), fleet.made, health["ticks"], health["failed_ticks"],
        drops, slots.get(("cgroups", "used"), -1), slots.get(("cgroups", "capacity"), -1),
        slots.get(("pairs", "used"), -1), slots.get(("pairs", "capacity"), -1), series, own, removed, entries,
        rss, hwm, memlock, maps)


def render_checkpoint(c: Checkpoint) -> str:
    drops = sum(c.drops.values())
    return (f"  {c.t_s:6.0f} s {c.phase:<8} pods {c.pods_alive:4} (made {c.pods_made:5})  pairs {c.pair_slots_used:5}/"
            f"{c.pair_slots}  cgroups {c.cgroup_slots_used:5}/{c.cgroup_slots}  drops {drops}  series {c.series:6} "
            f"(own {c.own_series:5}, removed pods {c.removed_pod_series:3})  map entries {c.map_entries:5}  "
            f"rss {c.rss_mib:6.1f} MiB (peak {c.hwm_mib:6.1f})  maps {c.map_memlock_kib} KiB  ticks {c.ticks} "
            f"(failed {c.failed_ticks})")


# ---- the pods -----------------------------------------------------------------------------------


class SoakFleet(PodFleet):
    """bench.agent_footprint's pods, each task waking for a short CPU burst, counting the pods made."""

    def __init__(self, kube: FakeKube, wake_every_s: float, burst_loops: int) -> None:
        super().__init__(kube, wake_every_s)
        self.sleeper = WAKER.format(cpus=f"0-{(os.cpu_count() or 1) - 1}", every=wake_every_s, loops=burst_loops)
        self.made = 0

    def add(self, busy: bool = False) -> Pod:
        self.made += 1
        return super().add(busy)


@dataclass
class PinnedPod:
    uid: str
    name: str
    namespace: str
    cgroups: list[OwnedCgroup]
    proc: subprocess.Popen


def _pinned_pod(kube: FakeKube, namespace: str, name: str, guaranteed: bool, weight_v1: int, weight_v2: int,
                argv: list[str]) -> PinnedPod:
    """A pod on the last CPU: a Guaranteed one (1 CPU) or a BestEffort one, with the given CPU weight."""
    uid = str(uuid.uuid4())
    slug = uid.replace("-", "_")
    pod_path = f"kubepods.slice/kubepods-pod{slug}.slice" if guaranteed else \
        f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{slug}.slice"
    pod_cg = OwnedCgroup(pod_path, CONTROLLERS).create()
    ctr = OwnedCgroup(f"{pod_path}/cri-containerd-{container_id_for(uid, 'main')}.scope", CONTROLLERS)
    try:
        ctr.create()
        v2 = not (ctr.path("cpu") / "cpu.shares").exists()
        ctr.write("cpu", "cpu.weight" if v2 else "cpu.shares", str(weight_v2 if v2 else weight_v1))
        last_cpu = str((os.cpu_count() or 1) - 1)
        proc = subprocess.Popen(["taskset", "-c", last_cpu, *argv], preexec_fn=ctr.preexec,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except BaseException:
        ctr.remove()
        pod_cg.remove()
        raise
    resources = {"cpu": "1", "memory": "256Mi"} if guaranteed else None
    kube.add_pod(make_pod(name, namespace, uid, requests=resources, limits=resources, node_name=NODE))
    return PinnedPod(uid, name, namespace, [ctr, pod_cg], proc)


def _remove_pinned(kube: FakeKube, pod: PinnedPod) -> None:
    kube.remove_pod(pod.namespace, pod.name)
    pod.proc.kill()
    pod.proc.wait()
    for cg in pod.cgroups:
        cg.remove()


class Episodes:
    """Every ``every`` s: a BE hog and an LS victim on the last CPU until the agent opens an incident for
    the victim (or ``timeout`` s pass); that incident's first culprit must be the hog. The weights are
    the ones test_agent's enforcing test uses (LS 512 / BE 2048 shares, v2 weights 20 / 79): the victim's
    fair share of the CPU (1/5) is below what it needs (3/10), so it waits under CFS."""

    def __init__(self, kube: FakeKube, incident_log: Path, every: float, timeout: float, t0: float,
                 log: Callable[[str], None]) -> None:
        self.kube, self.incident_log, self.every, self.timeout, self.t0, self.log = \
            kube, incident_log, every, timeout, t0, log
        self.next_at = time.monotonic()
        self.done: list[Episode] = []
        self._current: tuple[Episode, PinnedPod, PinnedPod, float] | None = None
        self._n = 0

    def __call__(self) -> None:
        now = time.monotonic()
        if self._current is None:
            if now >= self.next_at:
                self._start(now)
            return
        episode, victim, hog, started = self._current
        opened = self._opened_for(victim.uid)
        if opened is None and now - started < self.timeout:
            return
        if opened is not None:
            episode.opened_after_s = round(now - started, 1)
            episode.cause = str(opened.get("cause", ""))
            ranked = [c.get("target", {}) for c in opened.get("culprits", [])]
            episode.culprits = [_culprit_text(c) for c in opened.get("culprits", [])]
            episode.ok = bool(ranked) and ranked[0].get("pod_uid") == hog.uid
            episode.why = "" if episode.ok else "no culprit named" if not ranked else "another culprit named first"
            episode.record = {} if episode.ok else opened
        else:
            episode.why = f"no incident for the victim in {self.timeout:g} s"
        self.log(f"  episode {len(self.done) + 1}: {episode.victim} next to {episode.hog}: "
                 + (f"{episode.cause} incident after {episode.opened_after_s:g} s, culprits {episode.culprits[:3]}"
                    if opened is not None else episode.why) + f" -> {'OK' if episode.ok else 'WRONG'}")
        self.stop()
        self.next_at = now + self.every

    def _start(self, now: float) -> None:
        self._n += 1
        victim = _pinned_pod(self.kube, "shop", f"web-{self._n}", True, 512, 20,
                             [sys.executable, str(LS_WORKER), "--seconds", str(int(self.timeout + 60))])
        try:
            hog = _pinned_pod(self.kube, "batch", f"crunch-{self._n}", False, 2048, 79,
                              [sys.executable, "-c", HOG])
        except BaseException:
            _remove_pinned(self.kube, victim)
            raise
        episode = Episode(round(now - self.t0, 1), f"shop/{victim.name}", f"batch/{hog.name}")
        self._current = (episode, victim, hog, now)

    def _opened_for(self, victim_uid: str) -> dict | None:
        try:
            lines = self.incident_log.read_text().splitlines()
        except FileNotFoundError:
            return None
        for line in lines:
            rec = json.loads(line)
            if rec.get("event") == "opened" and rec.get("victim", {}).get("pod_uid") == victim_uid:
                return rec
        return None

    def stop(self) -> None:
        """End the episode under way (its pods go, as churned pods do)."""
        if self._current is not None:
            episode, victim, hog, _ = self._current
            self._current = None
            for pod in (hog, victim):
                _remove_pinned(self.kube, pod)
            if episode.opened_after_s is not None or episode.why:
                self.done.append(episode)


def _culprit_text(c: dict) -> str:
    """A culprit of the incident log: its pod (or cgroup), its who-ran-instead share, and for the node
    (its processes outside pods) the top commands."""
    t = c.get("target", {})
    name = f"{t.get('namespace')}/{t.get('pod')}" if t.get("pod") else str(t.get("cgroup"))
    tasks = ", ".join(f"{x.get('comm')} {x.get('cpu_share', 0):.0%}" for x in c.get("tasks", [])[:3])
    return f"{name} ({c.get('who_ran_instead_share', 0):.0%})" + (f" [{tasks}]" if tasks else "")


# ---- the run ------------------------------------------------------------------------------------


def settle_seconds(grace: float, pair_quiet: float) -> float:
    """After the churn: a removed pod's series go after the grace (the kubelet source lists pods every
    5 s), its cgroups' slots after FORGET_AFTER_INTERVALS idle ticks, a quiet pair's slot after the quiet
    age (looked for every PAIR_SWEEP_S); plus a margin of 10 s."""
    return grace + 5 + pair_quiet + PAIR_SWEEP_S + FORGET_AFTER_INTERVALS * INTERVAL_S + 10


def _own_glob(cg: OwnedCgroup) -> str:
    """--act-only glob: everything below this process's nn-test-<pid> prefix (the cpu hierarchy)."""
    rel = cgroup_rel_path(cg)
    head, sep, _ = rel.partition(f"{cg.prefix}/")
    assert sep, rel
    return f"{head}{cg.prefix}/*"


def run(args: argparse.Namespace, workdir: Path, log: Callable[[str], None] = print) -> Result:
    settings = {k: getattr(args, k) for k in ("minutes", "warmup", "pods", "churn_pods", "churn_every", "wake_every",
                                              "burst_loops", "episode_every", "episode_timeout", "grace",
                                              "pair_quiet", "checkpoint_every")}
    result = Result(settings)
    incident_log = workdir / "incidents.jsonl"
    kube = FakeKube(node_name=NODE).start()
    fleet = SoakFleet(kube, args.wake_every, args.burst_loops)
    agent: AgentProcess | None = None
    episodes: Episodes | None = None
    all_cpus = os.sched_getaffinity(0)
    harness_cpus = all_cpus - {max(all_cpus)} or all_cpus
    try:
        config = write_config(workdir / "config.yaml", {
            "interval_seconds": INTERVAL_S,
            "slo": {"runq_p99_ms": 2.0},  # as test_agent's enforcing test: the episode's victim breaches it
            "runq_pair_quiet_seconds": args.pair_quiet,
            "kubernetes": {"pod_source": "kubelet", "kubelet_url": kube.url, "kubelet_token_file": None,
                           "kubelet_ca_file": None, "vanish_grace_seconds": args.grace},
        })
        # The bench (which makes 5 pods a second) and the agent keep off the last CPU, where the episodes'
        # victim and hog run: their own CPU time there would be the node's (cgroup "/") and compete with
        # the victim like a culprit. The pods' tasks take every CPU back (WAKER).
        os.sched_setaffinity(0, harness_cpus)
        fleet.grow_to(1, 0)
        act_only = _own_glob(fleet.pods[0].container_cgroup)
        agent = AgentProcess(config, workdir, "--dry-run", "--act-only", act_only, "--incident-log",
                             str(incident_log), node=NODE)
        agent.wait_ready(timeout=120)
        t0 = time.monotonic()
        fleet.grow_to(args.pods, 0)
        log(f"soak: agent pid {agent.proc.pid}; {args.pods} pods in {time.monotonic() - t0:.0f} s; compressed "
            f"timings: vanish grace {args.grace:g} s (default 60), quiet-pair age {args.pair_quiet:g} s (default 60); "
            f"warm-up {args.warmup:g} s, churn {args.minutes:g} min ({args.churn_pods} pods every "
            f"{args.churn_every:g} s), an episode every {args.episode_every:g} s on CPU {max(all_cpus)} (the bench and the "
            f"agent on {sorted(harness_cpus)}); act-only {act_only} (dry run)")

        def take(phase: str) -> Checkpoint:
            if agent.proc.poll() is not None:
                raise RuntimeError(f"the agent exited with {agent.proc.returncode}:\n{agent.log_tail()}")
            c = checkpoint(agent, fleet, t0, phase)
            result.checkpoints.append(c)
            log(render_checkpoint(c))
            return c

        episodes = Episodes(kube, incident_log, args.episode_every, args.episode_timeout, t0, log)
        settle = settle_seconds(args.grace, args.pair_quiet)

        def churn_for(seconds: float) -> None:
            churn = Churner(fleet, args.churn_pods, args.churn_every)
            until = time.monotonic() + seconds
            next_checkpoint = time.monotonic() + args.checkpoint_every
            while time.monotonic() < until:
                churn()
                episodes()
                if time.monotonic() >= next_checkpoint:
                    take("churn")
                    next_checkpoint += args.checkpoint_every
                time.sleep(0.2)
            episodes.stop()
            log(f"soak: churn stopped; settling {settle:g} s (grace + kubelet poll + quiet-pair age + sweep + "
                f"forget + 10 s)")
            _wait(settle, lambda: None)

        # Warm-up: the pods start together, then every one of them is replaced once, with episodes, so
        # the steady level is that of a node that has seen churn (pods of mixed ages, the agent's memory
        # past its first incidents and departed pods), not that of a fresh start.
        _wait(args.warmup, lambda: None)
        result.start = take("start")
        churn_for(args.pods / args.churn_pods * args.churn_every)
        result.steady = take("steady")
        churn_for(args.minutes * 60)
        result.end = take("end")
        result.episodes = episodes.done
        result.pods_made = fleet.made
        if incident_log.exists():
            result.incidents_opened = sum(1 for line in incident_log.read_text().splitlines()
                                          if json.loads(line).get("event") == "opened")
        result.agent_exit = agent.terminate()
        agent = None
    finally:
        os.sched_setaffinity(0, all_cpus)
        if episodes is not None:
            episodes.stop()
        if agent is not None:
            agent.terminate()
        fleet.close()
        kube.stop()
        cleanup_prefix()
    result.failures = failures(result)
    return result


def _wait(seconds: float, during: Callable[[], None]) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        during()
        time.sleep(min(left, 0.5))


# ---- the verdict --------------------------------------------------------------------------------


def failures(r: Result) -> list[str]:
    out: list[str] = []
    if r.steady is None or r.end is None:
        return ["the run did not finish"]
    for reason in DROP_REASONS:
        if r.end.drops[reason]:
            out.append(f"{reason} drops: {r.end.drops[reason]}")
    if not r.episodes:
        out.append("no episode finished")
    out += [f"episode at {e.at_s:g} s ({e.victim}, hog {e.hog}): {e.why}, culprits {e.culprits[:3]}"
            for e in r.episodes if not e.ok]
    if r.end.failed_ticks:
        out.append(f"failed agent ticks: {r.end.failed_ticks}")
    if r.end.removed_pod_series:
        out.append(f"series of removed pods at the end: {r.end.removed_pod_series}")
    for what, (factor, plus) in BOUNDS.items():
        steady, end = getattr(r.steady, what), getattr(r.end, what)
        if end > steady * factor + plus:
            out.append(f"{what} not back to steady: {steady} -> {end} (bound {steady * factor + plus:g})")
    if r.agent_exit not in (0, None):
        out.append(f"agent exit code after SIGTERM: {r.agent_exit}")
    return out


def render(r: Result) -> str:
    lines = [f"soak: {r.pods_made} pods made, {len(r.episodes)} episodes "
             f"({sum(e.ok for e in r.episodes)} named the hog first), {r.incidents_opened} incidents opened "
             f"(all victims), settings {json.dumps(r.settings)}"]
    churn = [c for c in r.checkpoints if c.phase == "churn"]
    if r.steady and r.end:
        lines += ["", "| | start | steady | churn (median) | churn (max) | end | bound |", "|---|---|---|---|---|---|---|"]
        for what in ("pair_slots_used", "cgroup_slots_used", "series", "own_series", "removed_pod_series",
                     "map_entries", "rss_mib", "map_memlock_kib"):
            values = [getattr(c, what) for c in churn] or [0]
            factor, plus = BOUNDS.get(what, (0, 0))
            bound = f"<= {factor:g} x steady" + (f" + {plus}" if plus else "") if what in BOUNDS else \
                "0" if what == "removed_pod_series" else ""
            start = getattr(r.start, what) if r.start else ""
            lines.append(f"| {what} | {start} | {getattr(r.steady, what)} | {statistics.median(values):g} | {max(values):g} | "
                         f"{getattr(r.end, what)} | {bound} |")
        lines.append(f"| drops ({', '.join(DROP_REASONS)}) | | {sum(r.steady.drops.values())} | | "
                     f"{max(sum(c.drops.values()) for c in churn) if churn else 0} | {sum(r.end.drops.values())} | 0 |")
        lines.append(f"| peak RSS (VmHWM, MiB) | {r.start.hwm_mib if r.start else ''} | {r.steady.hwm_mib} | | | "
                     f"{r.end.hwm_mib} | |")
    lines.append("")
    lines.append("PASS" if not r.failures else "FAIL:\n  " + "\n  ".join(r.failures))
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=9.0, help="minutes of churn after the warm-up (default 9)")
    p.add_argument("--warmup", type=float, default=60.0,
                   help="seconds at --pods pods before the warm-up's churn (one replacement of every pod)")
    p.add_argument("--pods", type=int, default=300, help="pods alive at any time (default 300)")
    p.add_argument("--churn-pods", type=int, default=5, help="pods replaced each --churn-every seconds")
    p.add_argument("--churn-every", type=float, default=1.0)
    p.add_argument("--wake-every", type=float, default=2.0, help="seconds between a pod's CPU bursts")
    p.add_argument("--burst-loops", type=int, default=2000, help="shell loops a burst does (~1 us each)")
    p.add_argument("--episode-every", type=float, default=45.0, help="seconds from one episode's end to the next")
    p.add_argument("--episode-timeout", type=float, default=45.0, help="seconds an episode waits for its incident")
    p.add_argument("--grace", type=float, default=10.0, help="the agent's pod vanish grace, s (compressed)")
    p.add_argument("--pair-quiet", type=float, default=10.0, help="the agent's quiet-pair age, s (compressed)")
    p.add_argument("--checkpoint-every", type=float, default=60.0)
    p.add_argument("--json", type=Path, help="also write the checkpoints, episodes and verdict here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if os.geteuid() != 0:
        print("soak: needs root (BPF probes, cgroups)", file=sys.stderr)
        return 2
    if shutil.which("taskset") is None:
        print("soak: taskset not found (util-linux)", file=sys.stderr)
        return 2
    if args.pods < 2 or args.churn_pods >= args.pods or args.minutes <= 0:
        print("soak: needs --pods >= 2, --churn-pods below --pods and --minutes > 0", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with tempfile.TemporaryDirectory(prefix="nn-soak-") as d:
        try:
            result = run(args, Path(d))
        except (RuntimeError, OSError, AssertionError) as e:
            print(f"soak: {e or type(e).__name__}", file=sys.stderr)  # an agent that died: its log tail too
            return 1
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=1))
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
