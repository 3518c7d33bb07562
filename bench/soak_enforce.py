#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Enforcing soak: the real agent, actuators enforcing, for many minutes of pod churn and a misbehaving pod source.

The agent (`python -m noisyneighbor.cli agent`, all four probes, enforcing actuators limited by
``--act-only`` to the BestEffort QoS cgroup this script creates) reads pods from the fake kubelet
(testkit/fakekube.py). Owned test cgroups are laid out like kubelet's (under ``nn-test-<pid>``):

- an LS pod running testkit/workloads/ls_worker.py and a BE pod running two CPU hogs, both on the last
  CPU: the detector keeps opening neighbour incidents and the actuators keep suppressing the BE level;
- churn: every ``--churn-every`` seconds a BE pod appears (cgroup, a short CPU burst, listed by the
  kubelet) and the oldest churn pod goes: unlisted, its tasks killed, its cgroup removed whenever that
  falls in the agent's tick (a cgroup vanishing mid-read);
- the pod source misbehaves on a cycle: the kubelet goes down and comes back (a restart), then answers
  with truncated JSON for a while, then heals.

Sampled every ``--sample-every`` seconds from /proc/<agent pid> and the agent's endpoints: open fds,
threads, RSS, /metrics series, entries in the agent's BPF hash maps (bpftool), journal entries, and
error lines in its log. "steady" is the median of the samples in the second quarter of the run, "end"
the median of the last quarter. Then the restore checks: SIGTERM must put back every file the journal
holds (and leave it empty); a kill -9 while actions are applied, then a restart, must leave nothing
changed once the restarted agent is stopped.

    sudo .venv/bin/python -m bench.soak_enforce                       # 10 minutes
    sudo .venv/bin/python -m bench.soak_enforce --minutes 2 --json /tmp/soak.json
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
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from probes.cgroupfs import discover  # noqa: E402
from testkit.exporter_support import CONTROLLERS, AgentProcess, write_config  # noqa: E402
from testkit.fakekube import FakeKube, make_pod  # noqa: E402
from testkit.sandbox import OwnedCgroup, cleanup_prefix  # noqa: E402

NODE = "nn-soak"
LS_WORKER = REPO / "testkit" / "workloads" / "ls_worker.py"
BURST = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback")
HASH_MAP_TYPES = {"hash", "lru_hash", "percpu_hash", "lru_percpu_hash"}


@dataclass
class Sample:
    t_s: float
    fds: int
    threads: int
    rss_mib: float
    series: int
    map_entries: int
    journal_entries: int
    error_lines: int
    churn_pods: int


@dataclass
class Result:
    minutes: float
    samples: list[Sample] = field(default_factory=list)
    churned: int = 0
    source_restarts: int = 0
    malformed_phases: int = 0
    actions: int = 0
    incidents_opened: int = 0
    term_exit: int | None = None
    term_restore: dict = field(default_factory=dict)
    kill9_restore: dict = field(default_factory=dict)


# ---- what the agent holds ----------------------------------------------------------------------


def _status_field(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


def _map_entries(pid: int) -> int:
    """Entries in the agent's BPF hash maps (arrays are always full; ring buffers hold no entries)."""
    bpftool = shutil.which("bpftool")
    if bpftool is None:
        return -1
    ids = set()
    for fd in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            m = re.search(r"^map_id:\s*(\d+)", fd.read_text(), re.M)
        except OSError:
            continue  # closed meanwhile
        if m:
            ids.add(m.group(1))
    total = 0
    for map_id in ids:
        show = subprocess.run([bpftool, "-j", "map", "show", "id", map_id], capture_output=True, text=True)
        if show.returncode or json.loads(show.stdout).get("type") not in HASH_MAP_TYPES:
            continue
        dump = subprocess.run([bpftool, "-j", "map", "dump", "id", map_id], capture_output=True, text=True)
        if dump.returncode == 0:
            total += len(json.loads(dump.stdout))
    return total


def _journal(agent: AgentProcess) -> dict[str, str]:
    """path -> original value of every file the journal holds."""
    try:
        doc = json.loads((agent.journal / "journal.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {e["path"]: e["original"] for e in doc.get("entries", [])}


def _series(agent: AgentProcess) -> int:
    try:
        code, body = agent.get("/metrics", timeout=10)
    except OSError:
        return -1
    return sum(1 for line in body.decode().splitlines() if line and not line.startswith("#")) if code == 200 else -1


def _error_lines(agent: AgentProcess) -> int:
    return sum(1 for line in agent.stderr_path.read_text(errors="replace").splitlines() if ERROR_LINE.search(line))


def sample(agent: AgentProcess, t0: float, churn_pods: int) -> Sample:
    pid = agent.proc.pid
    return Sample(
        t_s=round(time.monotonic() - t0, 1), fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=_status_field(pid, "Threads"), rss_mib=round(_status_field(pid, "VmRSS") / 1024, 1),
        series=_series(agent), map_entries=_map_entries(pid), journal_entries=len(_journal(agent)),
        error_lines=_error_lines(agent), churn_pods=churn_pods,
    )


def restore_check(originals: dict[str, str]) -> dict:
    """Each journaled file now holds its original again (or is gone with its cgroup)."""
    restored, vanished, still_changed = 0, 0, []
    for path, original in originals.items():
        try:
            now = Path(path).read_text().strip()
        except FileNotFoundError:
            vanished += 1
            continue
        if now == original.strip():
            restored += 1
        else:
            still_changed.append(f"{path}: {now!r}, was {original.strip()!r}")
    return {"journaled": len(originals), "restored": restored, "vanished": vanished, "still_changed": still_changed}


# ---- the pods ---------------------------------------------------------------------------------


def _container(pod_slice: str) -> str:
    return f"{pod_slice}/cri-containerd-{uuid.uuid4().hex}{uuid.uuid4().hex}.scope"


def _pod_slice(qos: str, uid: str) -> str:
    if qos == "guaranteed":
        return f"kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice"
    return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid.replace('-', '_')}.slice"


class Pods:
    """Owned pod cgroups with their processes, listed by the fake kubelet."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.cgroups: list[OwnedCgroup] = []
        self.procs: list[subprocess.Popen] = []
        self.churn: list[tuple[str, OwnedCgroup, subprocess.Popen]] = []
        self.churned = 0

    def cgroup(self, path: str) -> OwnedCgroup:
        cg = OwnedCgroup(path, CONTROLLERS).create()
        self.cgroups.append(cg)
        return cg

    def start(self, cg: OwnedCgroup, argv: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(argv, preexec_fn=cg.preexec, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def add_churn_pod(self, cpu: str) -> None:
        uid = str(uuid.uuid4())
        name = f"churn-{self.churned}"
        cg = self.cgroup(_container(_pod_slice("besteffort", uid)))
        p = self.start(cg, ["taskset", "-c", cpu, sys.executable, "-c", BURST, "1.5"])
        self.kube.add_pod(make_pod(name, "batch", uid, qos_class="BE", node_name=NODE))
        self.churn.append((name, cg, p))
        self.churned += 1

    def remove_oldest_churn_pod(self) -> None:
        name, cg, p = self.churn.pop(0)
        self.kube.remove_pod("batch", name)
        p.kill()
        p.wait()
        cg.remove()  # whenever that falls in the agent's tick: a cgroup vanishing mid-read
        self.cgroups.remove(cg)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for cg in reversed(self.cgroups):
            cg.remove()
        cleanup_prefix()


# ---- the run ------------------------------------------------------------------------------------


def _config(path: Path, kube: FakeKube) -> Path:
    return write_config(path, {
        "interval_seconds": 1.0,
        "slo": {"runq_p99_ms": 1.0},
        "actuators": {"dry_run": False, "cooldown_seconds": 5},
        "kubernetes": {"pod_source": "kubelet", "kubelet_url": kube.url, "kubelet_token_file": None},
        "resource-threshold-config": {"cpuSuppressPolicy": "cfsQuota"},
    })


def _start_agent(config: Path, workdir: Path, be_rel: str, incident_log: Path) -> AgentProcess:
    agent = AgentProcess(config, workdir, "--incident-log", str(incident_log), "--act-only", f"{be_rel}/*",
                         node=NODE)
    agent.wait_ready(timeout=90)
    return agent


def _wait_for_journal(agent: AgentProcess, timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = _journal(agent)
        if held:
            return held
        time.sleep(0.5)
    return {}


def run(minutes: float, churn_every: float, sample_every: float, workdir: Path, log=print) -> Result:
    layout = discover()
    cpu_h = layout.hierarchy_for("cpu")
    if cpu_h is None or cpu_h.version != 1:
        raise SystemExit("soak: needs the v1 cpu controller (CFS quota files) for the suppress actuator")
    last_cpu = str((os.cpu_count() or 1) - 1)
    result = Result(minutes)
    kube = FakeKube(node_name=NODE).start()
    pods = Pods(kube)
    agent: AgentProcess | None = None
    incident_log = workdir / "incidents.jsonl"
    try:
        be = pods.cgroup("kubepods.slice/kubepods-besteffort.slice")
        be_rel = str(be.dirs["cpu"].relative_to(cpu_h.mount))
        ls_uid, hog_uid = str(uuid.uuid4()), str(uuid.uuid4())
        ls = pods.cgroup(_container(_pod_slice("guaranteed", ls_uid)))
        hog = pods.cgroup(_container(_pod_slice("besteffort", hog_uid)))
        kube.add_pod(make_pod("web", "shop", ls_uid, qos_class="LS", node_name=NODE,
                              requests={"cpu": "1", "memory": "256Mi"}, limits={"cpu": "1", "memory": "256Mi"}))
        kube.add_pod(make_pod("crunch", "batch", hog_uid, qos_class="BE", node_name=NODE))
        total_s = minutes * 60
        long = str(int(total_s + 600))
        pods.start(ls, ["taskset", "-c", last_cpu, sys.executable, str(LS_WORKER), "--seconds", long])
        pods.start(hog, ["taskset", "-c", last_cpu, "stress-ng", "--cpu", "2", "--cpu-method", "int64",
                         "-t", long, "--quiet"])

        config = _config(workdir / "config.yaml", kube)
        agent = _start_agent(config, workdir, be_rel, incident_log)
        log(f"soak: agent pid {agent.proc.pid} ready; {minutes:g} min, a churn pod every {churn_every:g} s")
        t0 = time.monotonic()
        next_churn = next_sample = t0
        cycle_s = 120.0  # pod source: down 10 s at 30 s into each cycle, malformed 20 s at 70 s
        phase = "ok"
        while (now := time.monotonic()) - t0 < total_s:
            if agent.proc.poll() is not None:
                raise SystemExit(f"soak: the agent exited with {agent.proc.returncode}:\n{agent.log_tail()}")
            at = (now - t0) % cycle_s
            want = "down" if 30 <= at < 40 else "malformed" if 70 <= at < 90 else "ok"
            if want != phase:
                if phase == "down":
                    kube.come_up()
                elif phase == "malformed":
                    kube.heal()
                if want == "down":
                    kube.go_down()
                    result.source_restarts += 1
                elif want == "malformed":
                    kube.fail("malformed", path="/pods")
                    result.malformed_phases += 1
                phase = want
            if now >= next_churn:
                pods.add_churn_pod(last_cpu)
                while len(pods.churn) > 5:
                    pods.remove_oldest_churn_pod()
                next_churn = now + churn_every
            if now >= next_sample:
                s = sample(agent, t0, len(pods.churn))
                result.samples.append(s)
                log(f"  {s.t_s:6.0f} s  fds {s.fds:3}  threads {s.threads:2}  rss {s.rss_mib:6.1f} MiB  "
                    f"series {s.series:5}  map entries {s.map_entries:5}  journal {s.journal_entries:2}  "
                    f"errors {s.error_lines}  [{phase}]")
                next_sample = now + sample_every
            time.sleep(0.2)
        if phase == "down":
            kube.come_up()
        kube.heal()
        result.churned = pods.churned

        # SIGTERM with actions applied: every journaled file restored, the journal emptied.
        held = _wait_for_journal(agent, 60)
        result.term_exit = agent.terminate()
        result.term_restore = restore_check(held) | {"journal_after": len(_journal(agent))}
        log(f"soak: SIGTERM exit {result.term_exit}; restore {result.term_restore}")

        # kill -9 with actions applied, restart (reconcile), SIGTERM: nothing left changed.
        agent = _start_agent(config, workdir, be_rel, incident_log)
        held = _wait_for_journal(agent, 90)
        agent.proc.kill()
        agent.proc.wait()
        left = _journal(agent)
        agent = _start_agent(config, workdir, be_rel, incident_log)
        restart_exit = agent.terminate()
        result.kill9_restore = restore_check(held | left) | {
            "journal_at_kill": len(left), "journal_after": len(_journal(agent)), "restart_exit": restart_exit}
        log(f"soak: kill -9 + restart: {result.kill9_restore}")
        audit = agent.audit()
        result.actions = sum(1 for a in audit if a.get("event") == "action")
        if incident_log.exists():
            result.incidents_opened = sum(1 for line in incident_log.read_text().splitlines()
                                          if json.loads(line).get("event") == "opened")
        agent = None
    finally:
        if agent is not None:
            agent.terminate()
        pods.close()
        kube.stop()
    return result


# ---- report -------------------------------------------------------------------------------------

COLUMNS = ("fds", "threads", "rss_mib", "series", "map_entries", "journal_entries", "error_lines")


def summary(result: Result) -> dict[str, dict[str, float]]:
    """steady: median of the second quarter of the samples; end: median of the last quarter; max."""
    s = result.samples
    n = len(s)
    steady, end = s[n // 4: max(n // 2, n // 4 + 1)], s[-max(n // 4, 1):]
    return {c: {"steady": statistics.median(getattr(x, c) for x in steady),
                "end": statistics.median(getattr(x, c) for x in end),
                "max": max(getattr(x, c) for x in s)} for c in COLUMNS}


def render(result: Result) -> str:
    table = summary(result)
    lines = [f"soak: {result.minutes:g} min, {len(result.samples)} samples, {result.churned} churn pods, "
             f"{result.source_restarts} pod-source restarts, {result.malformed_phases} malformed phases, "
             f"{result.incidents_opened} incidents opened, {result.actions} actions",
             "", "| | steady | end | max |", "|---|---|---|---|"]
    for c in COLUMNS:
        row = table[c]
        lines.append(f"| {c} | {row['steady']:g} | {row['end']:g} | {row['max']:g} |")
    lines += ["", f"SIGTERM: exit {result.term_exit}, {result.term_restore}",
              f"kill -9 + restart: {result.kill9_restore}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--churn-every", type=float, default=3.0, help="seconds between churn pods (default 3)")
    ap.add_argument("--sample-every", type=float, default=15.0)
    ap.add_argument("--json", type=Path, help="also write the samples and checks here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("soak: needs root (BPF probes, cgroups)", file=sys.stderr)
        return 2
    for tool in ("stress-ng", "taskset"):
        if shutil.which(tool) is None:
            print(f"soak: {tool} not found (scripts/setup.sh test installs it)", file=sys.stderr)
            return 2
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with tempfile.TemporaryDirectory(prefix="nn-soak-") as d:
        result = run(args.minutes, args.churn_every, args.sample_every, Path(d))
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(asdict(result) | {"summary": summary(result)}, indent=1))
    restored = not result.term_restore.get("still_changed") and not result.kill9_restore.get("still_changed")
    return 0 if restored and result.term_exit == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
