#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Footprint of the real `noisyneighbor agent` at node scale: CPU, memory, series and map entries vs pods.

The agent runs as a subprocess, as deployed: all four BPF probes, the detector, dry-run actuators, the
exporter and its HTTP server scraped like Prometheus would, and the **kubelet** pod source pointed at
a kubelet-shaped ``/pods`` endpoint on loopback (``testkit/fakekube.py``). Pods are real: each one is a
pod cgroup plus one container cgroup (``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>
.slice/cri-containerd-<id>.scope``, cpu/cpuacct/cpuset/memory, under our ``nn-test-<pid>`` prefix)
holding one task. Most tasks sleep; ``--busy`` of them wake every 100 ms for ~2 ms of CPU, so the node
is not a museum. Two thirds of the pods are Burstable (100m request), a third BestEffort.

Steps, each measured over ``--window`` seconds after ``--settle`` seconds:

1. ``0``, ``100``, ``300`` pods (the pod count grows between steps);
2. ``churn``: at 300 pods, ``--churn-pods`` pods replaced every ``--churn-every`` seconds for
   ``--churn`` seconds (measured over the whole churn);
3. ``after churn``: churn stopped, measured once the pod source's vanish grace (60 s) and a few ticks
   have passed: series, RSS and map entries must be back to the 300-pod steady values;
4. ``1000`` pods.

Measured from ``/proc/<pid>``: CPU = (utime + stime) delta / window in % of one core (all threads);
``VmRSS`` at the end of the window and ``VmHWM`` (peak so far). ``series`` = sample lines of one
``/metrics`` scrape; ``map entries`` = the agent's own ``noisyneighbor_bpf_map_entries`` (entries in
the probes' per-cgroup kernel maps). The BPF programs' kernel time runs in whatever task hits the
tracepoint, not in the agent, so it is shown apart (``bpf % core``). Every cgroup and task is removed
afterwards, also on failure or Ctrl-C.

    sudo .venv/bin/python -m bench.agent_footprint                       # ~13 min
    sudo .venv/bin/python -m bench.agent_footprint --quick               # ~3 min, 60 s churn
    sudo .venv/bin/python -m bench.agent_footprint --steps 0,300 --no-churn --profile /tmp/agent.svg
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from testkit.fakekube import FakeKube, container_id_for, make_pod  # noqa: E402
from testkit.sandbox import OwnedCgroup, cleanup_prefix  # noqa: E402

CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
# Targets of the node-scale issue, % of one core by pod count, and RSS at 300 pods.
CPU_TARGETS = {100: 1.0, 300: 3.0, 1000: 8.0}
CHURN_CPU_TARGET = 4.0
RSS_TARGET_MIB = 100.0
AFTER_CHURN_TOLERANCE = 0.05
VANISH_GRACE_S = 60.0  # detector/pods.py _CachingSource default
# A busy pod: ~2 ms of CPU every 100 ms, forever (killed with its cgroup).
# A sleeping pod: its shell wakes after 50 ms (as a container's processes do while starting), then
# every --wake-every seconds (a timer, a health check; 0: never again, the first definition).
# Waking once only was not enough for every pod to have run-queue series: whether that one wait was
# seen varied between runs (177 to 300 of 300 pods), so "after churn vs steady" compared populations
# of different shapes. At the default 30 s: 10 wakeups/s at 300 pods.
DEFAULT_WAKE_EVERY_S = 30


def sleeper(wake_every_s: float) -> str:
    if wake_every_s <= 0:
        return "sleep 0.05; exec sleep 1000000"
    # tail polling /dev/null wakes every wake_every_s without a fork (a `sleep` a wakeup is a process start
    # per pod per wake: at 300 pods waking every second that is the guest's CPU, not the agent's)
    return f"sleep 0.05; exec tail ---disable-inotify -f -s {wake_every_s:g} /dev/null"
BUSY = "import time\nwhile True:\n    end = time.perf_counter() + 0.002\n    while time.perf_counter() < end:\n        pass\n" \
       "    time.sleep(0.1)\n"


@dataclass
class StepResult:
    step: str
    pods: int
    window_s: float
    cpu_percent: float  # of one core, agent process (all threads)
    rss_mib: float
    hwm_mib: float
    bpf_cpu_percent: float  # kernel time in the agent's BPF programs, % of one core
    ticks: int  # agent ticks completed in the window
    series: int  # sample lines in one /metrics scrape at the end of the window
    map_entries: int  # entries in the probes' per-cgroup kernel maps
    exported_cgroups: int
    rss_mid_mib: float = 0.0  # VmRSS half way through the window (a leak keeps growing; a plateau does not)
    removed_pod_series: int = 0  # series still labelled with a pod removed before the window ended
    series_by_metric: dict[str, int] = field(default_factory=dict)  # to say which metric grew, if one did
    failed_ticks: int = 0  # ticks that raised in the window (the agent logs each)
    last_error: str = ""
    fleet_pods_with_runq: int = 0  # of this bench's pods, those with run-queue series (their task waited)
    other_runq_cgroups: int = 0  # run-queue series of cgroups that are not this bench's pods (the machine's own)
    rss_split_mib: dict[str, float] = field(default_factory=dict)  # heap / arenas / other anonymous / files


def pod_name(qos: str, uid: str | None = None) -> str:
    """A pod cgroup's path as the kubelet's systemd driver lays it out (below our prefix)."""
    slug = (uid or str(uuid.uuid4())).replace("-", "_")
    return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slug}.slice"


@dataclass
class Pod:
    uid: str
    name: str
    pod_cgroup: OwnedCgroup
    container_cgroup: OwnedCgroup
    proc: subprocess.Popen


class PodFleet:
    """Pods as the kubelet would make them: cgroups, one task each, and an entry in the fake kubelet's /pods."""

    def __init__(self, kube: FakeKube, wake_every_s: float = DEFAULT_WAKE_EVERY_S) -> None:
        self.kube = kube
        self.sleeper = sleeper(wake_every_s)
        self.pods: deque[Pod] = deque()
        self.removed_uids: set[str] = set()
        self._made = 0

    def add(self, busy: bool = False) -> Pod:
        self._made += 1
        uid = str(uuid.uuid4())
        qos = "besteffort" if self._made % 3 == 0 else "burstable"
        name = f"bench-{self._made}"
        pod_path = pod_name(qos, uid)
        pod_cg = OwnedCgroup(pod_path, CONTROLLERS).create()
        ctr = OwnedCgroup(f"{pod_path}/cri-containerd-{container_id_for(uid, 'main')}.scope", CONTROLLERS)
        try:
            ctr.create()
            # A sleeping pod's task wakes soon after it is in its cgroup and then every --wake-every s,
            # so every pod, steady or churned in, has run-queue series by the end of its settle.
            argv = [sys.executable, "-c", BUSY] if busy else ["sh", "-c", self.sleeper]
            proc = subprocess.Popen(argv, preexec_fn=ctr.preexec, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            ctr.remove()
            pod_cg.remove()
            raise
        requests = {} if qos == "besteffort" else {"cpu": "100m", "memory": "64Mi"}
        self.kube.add_pod(make_pod(name, uid=uid, requests=requests))
        pod = Pod(uid, name, pod_cg, ctr, proc)
        self.pods.append(pod)
        return pod

    def grow_to(self, n: int, busy: int) -> None:
        while len(self.pods) < n:
            self.add(busy=len(self.pods) < busy)

    def remove_oldest_idle(self) -> None:
        """Remove the oldest sleeping pod (busy ones stay, so activity is the same through churn)."""
        for pod in self.pods:
            if pod.proc.args[0] == "sh":
                self.pods.remove(pod)
                self._remove(pod)
                return

    def _remove(self, pod: Pod) -> None:
        self.removed_uids.add(pod.uid)
        self.kube.remove_pod("default", pod.name)
        with contextlib.suppress(ProcessLookupError):
            pod.proc.kill()
        pod.proc.wait()
        pod.container_cgroup.remove()
        pod.pod_cgroup.remove()

    def close(self) -> None:
        while self.pods:
            self._remove(self.pods.pop())


class Churner:
    """Called about once a second: replaces ``pods`` idle pods every ``every`` seconds (catching up if late)."""

    def __init__(self, fleet: PodFleet, pods: int, every: float) -> None:
        self.fleet, self.pods, self.every = fleet, pods, every
        self.next_at = time.monotonic()
        self.replaced = 0

    def __call__(self) -> None:
        while time.monotonic() >= self.next_at:
            for _ in range(self.pods):
                self.fleet.remove_oldest_idle()
                self.fleet.add()
                self.replaced += 1
            self.next_at += self.every


class AgentUnderTest:
    def __init__(self, workdir: Path, interval: float, kubelet_url: str | None = None,
                 scrape_interval: float = 15.0, module: str = "noisyneighbor.cli",
                 extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None, repo: Path = REPO,
                 preexec: Callable[[], None] | None = None) -> None:
        """``kubelet_url``: the kubelet pod source there; None: the standalone pod source. ``module``
        runs the CLI (bench.metered_agent: with a meter on BPF map reads), ``extra_args`` follow the
        agent's own; ``repo``: the checkout it runs from (another commit's, to compare); ``preexec``: run
        in the child before it execs (joining a cgroup that counts its CPU time)."""
        self.scrape_interval = scrape_interval
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = workdir / "config.yaml"
        config.write_text(
            "kubernetes:\n  pod_source: kubelet\n"
            f"  kubelet_url: {kubelet_url}\n  kubelet_token_file: null\n  kubelet_ca_file: null\n"
            if kubelet_url else "kubernetes: {pod_source: standalone}\n"
        )
        self.log = open(workdir / "agent.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, "agent", "--config", str(config), "--dry-run",
             "--listen", f"127.0.0.1:{self.port}", "--journal-dir", str(workdir / "journal"),
             "--interval", str(interval), "--node-name", "node-1", *extra_args],
            cwd=repo, stdout=subprocess.DEVNULL, stderr=self.log, env=env, preexec_fn=preexec,
        )

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=30) as resp:
            return resp.read()

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}; see {self.log.name}")
            try:
                self.get("/readyz")
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"agent not ready after {timeout:.0f} s; see {self.log.name}")

    def health(self) -> dict:
        try:
            return json.loads(self.get("/healthz"))
        except urllib.error.HTTPError as e:
            return json.loads(e.read())

    def scrape(self) -> dict:
        """BPF run seconds, series, map entries and exported cgroups from one scrape."""
        text = self.get("/metrics").decode()
        run = sum(float(m.group(1)) for m in re.finditer(
            r"^noisyneighbor_bpf_program_run_seconds_total\{[^}]*\} (\S+)$", text, re.M))
        entries = sum(float(m.group(1)) for m in re.finditer(
            r"^noisyneighbor_bpf_map_entries\{[^}]*\} (\S+)$", text, re.M))
        exported = re.search(r'^noisyneighbor_exporter_cgroups\{[^}]*state="exported"[^}]*\} (\S+)$', text, re.M)
        by_metric: dict[str, int] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name = re.split(r"[{ ]", line, maxsplit=1)[0]
                by_metric[name] = by_metric.get(name, 0) + 1
        series = sum(by_metric.values())
        uids: dict[str, int] = {}
        for uid in re.findall(r'pod_uid="([^"]+)"', text):
            uids[uid] = uids.get(uid, 0) + 1
        runq_uids = set(re.findall(r'^noisyneighbor_runqueue_latency_seconds_count\{[^}]*pod_uid="([^"]+)"', text, re.M))
        return {"bpf_run_s": run, "series": series, "map_entries": entries, "uids": uids, "by_metric": by_metric,
                "runq_uids": runq_uids, "exported": float(exported.group(1)) if exported else 0.0}

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def memory_mib(self) -> tuple[float, float]:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        kib = {k: int(v.split()[0]) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(.+)$", status, re.M)}
        return kib["VmRSS"] / 1024, kib["VmHWM"] / 1024

    def rss_split_mib(self) -> dict[str, float]:
        """Where the RSS is (smaps): glibc's heap, Python's object arenas (anonymous 1 MiB maps),
        other anonymous maps (large buffers: numpy arrays, big strings, BPF map mmaps) and files."""
        split = {"heap": 0, "arenas": 0, "other_anon": 0, "files": 0}
        kind = "files"
        for line in Path(f"/proc/{self.proc.pid}/smaps").read_text().splitlines():
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                name = head[5] if len(head) > 5 else ""
                kind = "heap" if name == "[heap]" else "files" if name.startswith("/") else \
                    "arenas" if not name and hi - lo == 1 << 20 else "other_anon"
            elif head and head[0] == "Rss:":
                split[kind] += int(head[1])
        return {k: round(v / 1024, 1) for k, v in split.items()}

    def smaps_report(self, top: int = 8) -> str:
        """``smaps_rollup``'s memory lines and the largest anonymous mappings by Rss (``--smaps``): what
        grew between two steps, by mapping."""
        rollup = Path(f"/proc/{self.proc.pid}/smaps_rollup").read_text().splitlines()[1:]
        lines = [" ".join(line.split()) for line in rollup
                 if line.split()[0] in ("Rss:", "Pss_Anon:", "Pss_File:", "Anonymous:", "Private_Dirty:")]
        maps: list[tuple[int, int, str]] = []  # (rss KiB, size KiB, range and name)
        head: list[str] = []
        for line in Path(f"/proc/{self.proc.pid}/smaps").read_text().splitlines():
            fields = line.split()
            if fields and "-" in fields[0] and not fields[0].endswith(":"):
                head = fields
            elif fields and fields[0] == "Rss:" and head and (len(head) < 6 or not head[5].startswith("/")):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                maps.append((int(fields[1]), (hi - lo) // 1024, f"{head[0]} {head[5] if len(head) > 5 else ''}"))
        maps.sort(reverse=True)
        lines += [f"anon {rss:>7} KiB rss of {size:>7} KiB  {where}" for rss, size, where in maps[:top]]
        return "\n".join(lines)

    def measure(self, step: str, pods: int, window: float, during: object = None,
                removed_uids: set[str] | None = None, fleet: PodFleet | None = None) -> StepResult:
        """CPU over ``window`` s while ``during()`` (if given) is called about once a second; counts the
        series still labelled with one of ``removed_uids``."""
        health0 = self.health()
        cpu0, bpf0, ticks0, t0 = self.cpu_seconds(), self.scrape()["bpf_run_s"], health0["ticks"], time.monotonic()
        deadline = t0 + window
        next_scrape = t0 + self.scrape_interval
        rss_mid = None
        while (now := time.monotonic()) < deadline:
            if rss_mid is None and now >= t0 + window / 2:
                rss_mid = self.memory_mib()[0]
            if callable(during):
                during()
            if now >= next_scrape:  # scraped like Prometheus at the ServiceMonitor's interval
                self.scrape()
                next_scrape += self.scrape_interval
            time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))
        elapsed = time.monotonic() - t0
        cpu1, scrape, health = self.cpu_seconds(), self.scrape(), self.health()
        rss, hwm = self.memory_mib()
        removed = sum(scrape["uids"].get(uid, 0) for uid in removed_uids) if removed_uids else 0
        fleet_uids = {pod.uid for pod in fleet.pods} if fleet is not None else set()
        runq_fleet = len(scrape["runq_uids"] & fleet_uids)
        runq_all = scrape["by_metric"].get("noisyneighbor_runqueue_latency_seconds_count", 0)
        return StepResult(step, pods, round(elapsed, 1), round(100 * (cpu1 - cpu0) / elapsed, 2), round(rss, 1),
                          round(hwm, 1), round(100 * (scrape["bpf_run_s"] - bpf0) / elapsed, 3),
                          health["ticks"] - ticks0, int(scrape["series"]), int(scrape["map_entries"]),
                          int(scrape["exported"]), round(rss_mid if rss_mid is not None else rss, 1), removed,
                          scrape["by_metric"], health.get("failed_ticks", 0) - health0.get("failed_ticks", 0),
                          health.get("last_error", ""), runq_fleet, runq_all - runq_fleet, self.rss_split_mib())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


class Profiler:
    """py-spy on the agent for one step (optional: ``pip install py-spy``)."""

    def __init__(self, pid: int, out: str, seconds: float, rate: int = 50) -> None:
        exe = Path(sys.executable).parent / "py-spy"
        fmt = ["--format", "raw"] if out.endswith(".txt") else []  # collapsed stacks, for scripts
        self.proc = subprocess.Popen([str(exe if exe.exists() else "py-spy"), "record", "-p", str(pid), "-o", out,
                                      "-d", str(int(seconds)), "-r", str(rate), "--nonblocking", *fmt],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


def run(args: argparse.Namespace) -> tuple[list[StepResult], dict]:
    results: list[StepResult] = []
    steps = [int(s) for s in args.steps.split(",") if s.strip()]
    with tempfile.TemporaryDirectory(prefix="nn-footprint-") as tmp, FakeKube(node_name="node-1") as kube:
        fleet = PodFleet(kube, args.wake_every)
        agent = AgentUnderTest(Path(tmp), args.interval, kube.url, args.scrape_interval,
                               repo=Path(args.agent_repo).resolve() if args.agent_repo else REPO)
        try:
            agent.wait_ready()
            for n in steps:
                fleet.grow_to(n, args.busy)
                time.sleep(args.settle + (6 if n else 0))  # kubelet poll and pod-cgroup listing: every 5 s
                profiler = None
                if args.profile and n == max(steps):
                    profiler = Profiler(agent.proc.pid, args.profile, args.window, args.profile_rate)
                results.append(agent.measure(str(n), n, args.window, fleet=fleet))
                if profiler is not None:
                    profiler.wait()
                print(render_row(results[-1]), file=sys.stderr, flush=True)
                if args.smaps:
                    print(f"smaps at {n} pods:\n{agent.smaps_report()}", file=sys.stderr, flush=True)
                if n == args.churn_at and args.churn > 0:
                    churn = Churner(fleet, args.churn_pods, args.churn_every)
                    results.append(agent.measure("churn", n, args.churn, during=churn, fleet=fleet))
                    print(render_row(results[-1]), file=sys.stderr, flush=True)
                    time.sleep(VANISH_GRACE_S + 3 * args.interval + 5)
                    results.append(agent.measure("after churn", n, args.window, removed_uids=fleet.removed_uids, fleet=fleet))
                    print(render_row(results[-1]), file=sys.stderr, flush=True)
        finally:
            rc = agent.stop()
            fleet.close()
            cleanup_prefix()
    meta = {"exit_code": rc, "cpus": os.cpu_count(), "kernel": os.uname().release, "interval_s": args.interval,
            "busy_pods": args.busy, "wake_every_s": args.wake_every, "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
            "commit": _git_commit() if not args.agent_repo else f"agent from {args.agent_repo}"}
    return results, meta


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return "?"


HEADER = (f"{'step':<12} {'pods':>5} {'window s':>8} {'cpu % core':>10} {'rss MiB':>8} {'hwm MiB':>8} "
          f"{'bpf % core':>10} {'ticks':>6} {'series':>7} {'map ent.':>8} {'cgroups':>8}")


def render_row(r: StepResult) -> str:
    return (f"{r.step:<12} {r.pods:>5} {r.window_s:>8.1f} {r.cpu_percent:>10.2f} {r.rss_mib:>8.1f} {r.hwm_mib:>8.1f} "
            f"{r.bpf_cpu_percent:>10.3f} {r.ticks:>6} {r.series:>7} {r.map_entries:>8} {r.exported_cgroups:>8}")


def verdicts(results: list[StepResult]) -> list[str]:
    lines = []
    by_step = {r.step: r for r in results}
    for pods, target in CPU_TARGETS.items():
        r = by_step.get(str(pods))
        if r is not None:
            lines.append(f"target CPU <= {target:g} % at {pods} pods: {r.cpu_percent:.2f} % -> "
                         f"{'PASS' if r.cpu_percent <= target else 'FAIL'}")
    steady, churn, after = by_step.get("300"), by_step.get("churn"), by_step.get("after churn")
    if steady is not None:
        lines.append(f"target RSS <= {RSS_TARGET_MIB:g} MiB at 300 pods: {steady.rss_mib:.1f} MiB -> "
                     f"{'PASS' if steady.rss_mib <= RSS_TARGET_MIB else 'FAIL'}")
    if churn is not None:
        lines.append(f"target CPU <= {CHURN_CPU_TARGET:g} % during churn: {churn.cpu_percent:.2f} % -> "
                     f"{'PASS' if churn.cpu_percent <= CHURN_CPU_TARGET else 'FAIL'}")
    if steady is not None and after is not None:
        # Churn must leave nothing behind: no series of a removed pod, RSS within 5 % of steady, and no
        # growth in the second half of the churn (a leak keeps growing; an allocator plateau does not).
        lines.append(f"after churn, series of removed pods: {after.removed_pod_series} -> "
                     f"{'PASS' if after.removed_pod_series == 0 else 'FAIL'}")
        ratio = after.rss_mib / steady.rss_mib if steady.rss_mib else float("inf")
        lines.append(f"after churn vs steady, rss_mib: {steady.rss_mib} -> {after.rss_mib} ({ratio:.3f}x) -> "
                     f"{'PASS' if ratio <= 1 + AFTER_CHURN_TOLERANCE else 'FAIL'}")
        if steady.rss_split_mib and after.rss_split_mib:
            lines.append("  RSS by kind (MiB, steady -> after churn): " + ", ".join(
                f"{k} {steady.rss_split_mib.get(k, 0)} -> {v}" for k, v in after.rss_split_mib.items()))
        for what in ("series", "map_entries"):
            before, now = getattr(steady, what), getattr(after, what)
            ok = now <= before * (1 + AFTER_CHURN_TOLERANCE)
            lines.append(f"after churn vs steady, {what}: {before} -> {now} -> {'PASS' if ok else 'FAIL'}")
            if what == "series" and not ok:  # say which metrics grew, and whose run-queue series they are
                lines.append(f"  run-queue series: this bench's pods {steady.fleet_pods_with_runq} -> "
                             f"{after.fleet_pods_with_runq}, the machine's other cgroups {steady.other_runq_cgroups} -> "
                             f"{after.other_runq_cgroups}")
                grew = sorted(((after.series_by_metric.get(m, 0) - steady.series_by_metric.get(m, 0), m)
                               for m in after.series_by_metric), reverse=True)[:5]
                lines.append("  grew most: " + ", ".join(f"{m} +{d}" for d, m in grew if d > 0))
    if churn is not None:
        grew = churn.rss_mib / churn.rss_mid_mib if churn.rss_mid_mib else float("inf")
        lines.append(f"RSS in the second half of the churn: {churn.rss_mid_mib} -> {churn.rss_mib} MiB ({grew:.3f}x) "
                     f"-> {'PASS' if grew <= 1.02 else 'FAIL'}")
    failed = sum(r.failed_ticks for r in results)
    last_error = next((r.last_error for r in reversed(results) if r.last_error), "?")
    lines.append(f"failed agent ticks: {failed}" + (f" (last: {last_error})" if failed else "")
                 + f" -> {'PASS' if not failed else 'FAIL'}")
    counted = [r for r in results if r.step.isdigit()]
    if len(counted) >= 2:
        lo, hi = counted[0], counted[-1]
        slope = (hi.cpu_percent - lo.cpu_percent) / max(1, hi.pods - lo.pods) * 100
        lines.append(f"growth: {slope:.3f} % of a core per 100 pods ({lo.pods} -> {hi.pods} pods)")
    return lines


def render(results: list[StepResult], meta: dict) -> str:
    lines = [HEADER, "-" * len(HEADER), *(render_row(r) for r in results), "", *verdicts(results)]
    lines.append(f"agent exit code after SIGTERM: {meta['exit_code']}; {meta['cpus']} CPUs, kernel {meta['kernel']}, "
                 f"interval {meta['interval_s']:g} s, {meta['busy_pods']} busy pods, "
                 f"sleeping pods wake every {meta.get('wake_every_s', '?')} s, commit {meta['commit']}, "
                 f"load avg (1 min) at end {meta['load_avg_1m_at_end']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="0,100,300,1000", help="pod counts measured, in order")
    p.add_argument("--window", type=float, default=30.0, help="seconds measured per step")
    p.add_argument("--settle", type=float, default=35.0,
                   help="seconds between a step change and its window (past one 30-tick wheel turn: steady state)")
    p.add_argument("--interval", type=float, default=1.0, help="agent tick interval")
    p.add_argument("--busy", type=int, default=3, help="pods whose task wakes every 100 ms (of every step's pods)")
    p.add_argument("--wake-every", type=float, default=DEFAULT_WAKE_EVERY_S,
                   help="seconds between a sleeping pod's wakeups (0: it wakes once, after it starts)")
    p.add_argument("--churn", type=float, default=300.0, help="seconds of churn after the --churn-at step (0: none)")
    p.add_argument("--churn-at", type=int, default=300)
    p.add_argument("--churn-pods", type=int, default=5, help="pods replaced each --churn-every seconds")
    p.add_argument("--churn-every", type=float, default=2.0)
    p.add_argument("--no-churn", dest="churn", action="store_const", const=0.0)
    p.add_argument("--quick", action="store_true", help="15 s windows, 60 s churn")
    p.add_argument("--profile",
                   help="py-spy profile of the agent in the largest step: flame graph (.svg) or collapsed stacks (.txt)")
    p.add_argument("--profile-rate", type=int, default=50,
                   help="py-spy samples per second (50 for the numbers, 500 to find hot spots)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    p.add_argument("--smaps", action="store_true",
                   help="after each step, print the agent's smaps_rollup and largest anonymous mappings (stderr)")
    p.add_argument("--agent-repo",
                   help="run the agent from this checkout (another commit's, to compare; its bpf objects built)")
    p.add_argument("--scrape-interval", type=float, default=15.0,
                   help="seconds between /metrics scrapes (the ServiceMonitor scrapes every 15 s)")
    args = p.parse_args(argv)
    if args.quick:
        args.window, args.settle, args.churn = 15.0, 6.0, min(args.churn, 60.0)
    if os.geteuid() != 0:
        print("agent_footprint: needs root (BPF probes, cgroups)", file=sys.stderr)
        return 2
    try:
        results, meta = run(args)
    except (RuntimeError, OSError) as e:
        print(f"agent_footprint: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"steps": [asdict(r) for r in results], **meta, "verdicts": verdicts(results)}, indent=2))
    else:
        print(render(results, meta))
    return 3 if any(line.endswith("FAIL") for line in verdicts(results)) else 0


if __name__ == "__main__":
    sys.exit(main())
