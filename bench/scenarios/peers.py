# SPDX-License-Identifier: Apache-2.0
"""Observability peers (bcc tools) next to our numbers, plus the agent's startup time and RSS, plus overhead.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.scenarios.runner import REPO, Ctx

HIST_ROW = re.compile(r"^\s*(\d+)\s*->\s*(\d+)\s*:\s*(\d+)")


def hist_p99_upper(text: str) -> float | None:
    """p99 of a bcc log2 histogram, as the upper bound of the bucket that holds it (same unit as the histogram)."""
    rows = [(int(m[1]), int(m[2]), int(m[3])) for line in text.splitlines() if (m := HIST_ROW.match(line))]
    total = sum(n for _, _, n in rows)
    if total == 0:
        return None
    need = 0.99 * total
    seen = 0
    for _, hi, n in rows:
        seen += n
        if seen >= need:
            return float(hi)
    return float(rows[-1][1])


@dataclass
class PeerRun:
    tool: str
    argv: list[str]
    started_s: float = 0.0  # relative to onset
    ended_s: float = 0.0
    output: str = ""
    error: str = ""
    thread: threading.Thread | None = field(default=None, repr=False)


def start_bcc_runqlat(ctx: Ctx, onset: float, seconds: int) -> PeerRun:
    """runqlat-bpfcc for the victim's pid over ``seconds`` (after its own compile time), in a thread."""
    tool = shutil.which("runqlat-bpfcc")
    run = PeerRun("runqlat-bpfcc", [tool or "runqlat-bpfcc", "-p", str(ctx.victim.pid if ctx.victim else 0),
                                    str(seconds), "1"])
    if tool is None:
        run.error = "runqlat-bpfcc is not installed (bench/bcc_env.sh installs bpfcc-tools)"
        return run
    return _start(run, onset, seconds)


def start_bcc_softirqs(onset: float, seconds: int) -> PeerRun:
    tool = shutil.which("softirqs-bpfcc")
    run = PeerRun("softirqs-bpfcc", [tool or "softirqs-bpfcc", str(seconds), "1"])
    if tool is None:
        run.error = "softirqs-bpfcc is not installed"
        return run
    return _start(run, onset, seconds)


def _start(run: PeerRun, onset: float, seconds: int) -> PeerRun:
    def target() -> None:
        run.started_s = time.monotonic() - onset
        try:
            p = subprocess.run(run.argv, capture_output=True, text=True, timeout=seconds + 60)
            run.output = p.stdout
            if p.returncode != 0:
                run.error = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            run.error = str(e).splitlines()[0]
        run.ended_s = time.monotonic() - onset

    run.thread = threading.Thread(target=target, daemon=True)
    run.thread.start()
    return run


def softirq_usecs(text: str, kind: str = "net_rx") -> float | None:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].lower() == kind and parts[1].isdigit():
            return float(parts[1])
    return None


@dataclass
class StartupCost:
    startup_s: float | None
    rss_mib: float | None
    error: str = ""


STARTUP_CODE = """
import resource, time, json
t0 = time.monotonic()
from detector.runtime import Detector
from probes.collect import NodeCollector
d = Detector()
c = NodeCollector(cgroup_paths=d.cgroup_paths).start()
d.step(c.collect()); time.sleep(1.0); d.step(c.collect())
t1 = time.monotonic()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
c.close()
print(json.dumps({"startup_s": t1 - t0 - 1.0, "rss_mib": rss}))
"""


def agent_startup_cost() -> StartupCost:
    """Import + probe load + first two ticks (minus the 1 s between them), and peak RSS, in a fresh process."""
    try:
        p = subprocess.run([sys.executable, "-c", STARTUP_CODE], cwd=str(REPO), capture_output=True, text=True,
                           timeout=120)
        if p.returncode != 0:
            return StartupCost(None, None, (p.stderr.strip().splitlines() or ["failed"])[-1])
        d = json.loads(p.stdout.strip().splitlines()[-1])
        return StartupCost(round(d["startup_s"], 2), round(d["rss_mib"], 1))
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        return StartupCost(None, None, str(e).splitlines()[0])


def run_overhead(rounds: int, workloads: str) -> dict:
    """bench/overhead.py (pipe, and hackbench if it has it): none vs noisyneighbor vs bcc runqlat, alternated."""
    subprocess.run([str(REPO / "bench" / "bcc_env.sh")], capture_output=True, timeout=600)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "overhead.json"
        argv = [sys.executable, str(REPO / "bench" / "overhead.py"), "--workload", workloads, "--rounds", str(rounds),
                "--arms", "none,noisyneighbor,bcc-runqlat", "--json", str(out), "--markdown"]
        p = subprocess.run(argv, cwd=str(REPO), capture_output=True, text=True, timeout=1200)
        result: dict = {"argv": argv[1:], "returncode": p.returncode, "markdown": p.stdout.strip()}
        if p.returncode != 0:
            result["error"] = (p.stderr.strip().splitlines() or ["failed"])[-1]
        if out.exists():
            result["json"] = json.loads(out.read_text())
        return result


def run_hackbench(rounds: int) -> dict:
    """hackbench under none vs our probes, alternated (overhead.py has no hackbench arm of its own)."""
    tool = shutil.which("hackbench")
    if tool is None:
        return {"error": "hackbench is not installed (rt-tests)"}
    times: dict[str, list[float]] = {"none": [], "noisyneighbor": []}
    for _ in range(rounds):
        for arm in ("none", "noisyneighbor"):
            agent = None
            if arm == "noisyneighbor":
                agent = subprocess.Popen([str(REPO / ".venv" / "bin" / "noisyneighbor"), "top", "--json", "--interval", "1"],
                                         cwd=str(REPO), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(4.0)  # probes loaded
            t0 = time.monotonic()
            subprocess.run([tool, "-g", "4", "-l", "2000", "-s", "100"], capture_output=True, timeout=300)
            times[arm].append(time.monotonic() - t0)
            if agent is not None:
                agent.terminate()
                agent.wait(timeout=10)
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items() if v}
    return {"seconds": times, "median_s": med,
            "overhead_ratio": round(med["noisyneighbor"] / med["none"], 4) if med.get("none") else None}
