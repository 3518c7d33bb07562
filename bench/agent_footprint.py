#!/usr/bin/env python3
"""Footprint of the real `noisyneighbor agent` process: RSS and CPU at idle, under interference, with 500 cgroups.

The agent runs as a subprocess (all four BPF probes, dry-run actuators, standalone pod source, its
HTTP server scraped once per window like Prometheus would). Three phases, each measured over
``--window`` seconds after a settle time:

1. ``idle``: nothing of ours running (the machine's own load, and other work on a shared box, still is);
2. ``scenario``: owned test cgroups laid out as pods: one LS pod running ``tests/workloads/ls_worker.py``
   and one BE pod running two CPU hogs on the same CPU, so the detector has incidents to handle;
3. ``500 cgroups``: the scenario stopped and 500 empty owned cgroups named like BestEffort pods
   (``kubepods-besteffort-pod<uid>.slice`` under the ``nn-test-<pid>`` prefix), which the agent lists as
   pods and reads every tick. They are removed afterwards (also on failure or Ctrl-C).

Measured from ``/proc/<pid>``: CPU = (utime + stime) delta / window, in % of one core (all threads);
``VmRSS`` at the end of the window and ``VmHWM`` (peak RSS so far). The BPF programs' own kernel time
runs in whatever task hits the tracepoint, not in the agent, so it is shown apart, from the agent's
``noisyneighbor_bpf_program_run_seconds_total``. Targets: RSS <= 128 MiB with 500 cgroups, CPU <= 2 %
of a core at idle.

    sudo .venv/bin/python -m bench.agent_footprint                 # 20 s windows
    sudo .venv/bin/python -m bench.agent_footprint --window 30 --json
"""

from __future__ import annotations

import argparse
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
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from noisyneighbor.sandbox import OwnedCgroup, cleanup_prefix  # noqa: E402

RSS_TARGET_MIB = 128.0
IDLE_CPU_TARGET_PERCENT = 2.0
SYNTHETIC_CGROUPS = 500
CONTROLLERS = ("cpu", "cpuacct", "memory")
HOG = "import time, sys\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


@dataclass
class PhaseResult:
    phase: str
    window_s: float
    cpu_percent: float  # of one core, agent process (all threads)
    rss_mib: float
    hwm_mib: float
    bpf_cpu_percent: float  # kernel time in the agent's BPF programs, % of one core
    ticks: int  # agent ticks completed in the window
    exported_cgroups: int  # cgroups with their own series at the end of the window
    open_incidents: int


class AgentUnderTest:
    def __init__(self, workdir: Path, interval: float, scrape_interval: float = 15.0) -> None:
        self.scrape_interval = scrape_interval
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = workdir / "config.yaml"
        config.write_text("kubernetes: {pod_source: standalone}\n")
        self.log = open(workdir / "agent.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "noisyneighbor.cli", "agent", "--config", str(config), "--dry-run",
             "--listen", f"127.0.0.1:{self.port}", "--journal-dir", str(workdir / "journal"),
             "--interval", str(interval), "--node-name", "bench"],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=self.log,
        )

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as resp:
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

    def metrics(self) -> tuple[float, int]:
        """(BPF run seconds summed over programs, exported cgroups) from one scrape."""
        text = self.get("/metrics").decode()
        run = sum(float(m.group(1)) for m in re.finditer(
            r"^noisyneighbor_bpf_program_run_seconds_total\{[^}]*\} (\S+)$", text, re.M))
        exported = re.search(r'^noisyneighbor_exporter_cgroups\{[^}]*state="exported"[^}]*\} (\S+)$', text, re.M)
        return run, int(float(exported.group(1))) if exported else 0

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def memory_mib(self) -> tuple[float, float]:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        kib = {k: int(v.split()[0]) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(.+)$", status, re.M)}
        return kib["VmRSS"] / 1024, kib["VmHWM"] / 1024

    def measure(self, phase: str, window: float) -> PhaseResult:
        cpu0, bpf0, ticks0, t0 = self.cpu_seconds(), self.metrics()[0], self.health()["ticks"], time.monotonic()
        deadline = t0 + window
        while time.monotonic() < deadline:  # scraped like Prometheus at the ServiceMonitor's interval
            time.sleep(min(self.scrape_interval, max(0.0, deadline - time.monotonic())))
            self.metrics()
        elapsed = time.monotonic() - t0
        cpu1, (bpf1, exported), health = self.cpu_seconds(), self.metrics(), self.health()
        rss, hwm = self.memory_mib()
        return PhaseResult(phase, round(elapsed, 1), round(100 * (cpu1 - cpu0) / elapsed, 2), round(rss, 1),
                           round(hwm, 1), round(100 * (bpf1 - bpf0) / elapsed, 3), health["ticks"] - ticks0, exported,
                           health.get("open_incidents", 0))

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


def pod_name(qos: str) -> str:
    slug = str(uuid.uuid4()).replace("-", "_")
    return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slug}.slice"


def run(window: float, settle: float, interval: float, cgroups: int,
        scrape_interval: float = 15.0) -> tuple[list[PhaseResult], dict]:
    results: list[PhaseResult] = []
    procs: list[subprocess.Popen] = []
    owned: list[OwnedCgroup] = []
    with tempfile.TemporaryDirectory(prefix="nn-footprint-") as tmp:
        agent = AgentUnderTest(Path(tmp), interval, scrape_interval)
        try:
            agent.wait_ready()
            time.sleep(settle)
            results.append(agent.measure("idle", window))

            cpu = str((os.cpu_count() or 1) - 1)
            ls = OwnedCgroup(pod_name("burstable"), CONTROLLERS).create()
            be = OwnedCgroup(pod_name("besteffort"), CONTROLLERS).create()
            owned += [ls, be]
            seconds = str(window + settle + 10)
            procs.append(subprocess.Popen(["taskset", "-c", cpu, sys.executable, str(REPO / "tests/workloads/ls_worker.py"),
                                           "--seconds", seconds], preexec_fn=ls.preexec, stdout=subprocess.DEVNULL))
            for _ in range(2):
                procs.append(subprocess.Popen(["taskset", "-c", cpu, sys.executable, "-c", HOG, seconds],
                                              preexec_fn=be.preexec))
            time.sleep(settle)
            results.append(agent.measure("scenario", window))
            for p in procs:
                p.kill()
                p.wait()
            procs.clear()

            for _ in range(cgroups):
                owned.append(OwnedCgroup(pod_name("besteffort"), CONTROLLERS).create())
            time.sleep(settle + 6)  # the pod cgroup list is refreshed every 5 s
            results.append(agent.measure(f"{cgroups} cgroups", window))
        finally:
            for p in procs:
                p.kill()
                p.wait()
            rc = agent.stop()
            for cg in reversed(owned):
                cg.remove()
            cleanup_prefix()
    meta = {"exit_code": rc, "cpus": os.cpu_count(), "kernel": os.uname().release, "interval_s": interval,
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2)}
    return results, meta


def render(results: list[PhaseResult], meta: dict) -> str:
    head = f"{'phase':<14} {'window s':>8} {'cpu % core':>10} {'rss MiB':>8} {'hwm MiB':>8} {'bpf % core':>10} " \
           f"{'ticks':>6} {'cgroups':>8} {'incidents':>9}"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r.phase:<14} {r.window_s:>8.1f} {r.cpu_percent:>10.2f} {r.rss_mib:>8.1f} {r.hwm_mib:>8.1f} "
                     f"{r.bpf_cpu_percent:>10.3f} {r.ticks:>6} {r.exported_cgroups:>8} {r.open_incidents:>9}")
    idle = next(r for r in results if r.phase == "idle")
    big = results[-1]
    lines += [
        "",
        f"target CPU <= {IDLE_CPU_TARGET_PERCENT:g} % of a core at idle: {idle.cpu_percent:.2f} % -> "
        f"{'PASS' if idle.cpu_percent <= IDLE_CPU_TARGET_PERCENT else 'FAIL'}",
        f"target RSS <= {RSS_TARGET_MIB:g} MiB with {big.phase}: peak {big.hwm_mib:.1f} MiB -> "
        f"{'PASS' if big.hwm_mib <= RSS_TARGET_MIB else 'FAIL'}",
        f"agent exit code after SIGTERM: {meta['exit_code']}; {meta['cpus']} CPUs, kernel {meta['kernel']}, "
        f"interval {meta['interval_s']:g} s, load avg (1 min) at end {meta['load_avg_1m_at_end']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window", type=float, default=20.0, help="seconds measured per phase")
    p.add_argument("--settle", type=float, default=5.0, help="seconds between a phase change and its window")
    p.add_argument("--interval", type=float, default=1.0, help="agent tick interval")
    p.add_argument("--cgroups", type=int, default=SYNTHETIC_CGROUPS, help="synthetic pod cgroups in the last phase")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    p.add_argument("--scrape-interval", type=float, default=15.0,
                   help="seconds between /metrics scrapes (deploy/servicemonitor.yaml scrapes every 15 s)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("agent_footprint: needs root (BPF probes, cgroups)", file=sys.stderr)
        return 2
    try:
        results, meta = run(args.window, args.settle, args.interval, args.cgroups, args.scrape_interval)
    except (RuntimeError, OSError) as e:
        print(f"agent_footprint: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"phases": [asdict(r) for r in results], **meta,
                          "targets": {"idle_cpu_percent": IDLE_CPU_TARGET_PERCENT, "rss_mib": RSS_TARGET_MIB}}, indent=2))
    else:
        print(render(results, meta))
    idle = next(r for r in results if r.phase == "idle")
    return 0 if idle.cpu_percent <= IDLE_CPU_TARGET_PERCENT and results[-1].hwm_mib <= RSS_TARGET_MIB else 3


if __name__ == "__main__":
    sys.exit(main())
