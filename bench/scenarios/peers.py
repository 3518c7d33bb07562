# SPDX-License-Identifier: Apache-2.0
"""Observability peers (bcc tools) next to our numbers, plus the agent's startup time and RSS, plus overhead.py."""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.scenarios.metrics import runq_ticks_histogram, ticks_within
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


@dataclass(frozen=True)
class PeerTool:
    """A peer tool as users run it: bcc's runtime-compiled Python tool, or libbpf-tools' CO-RE binary."""

    command: str  # what users type: runqlat, runqlat-bpfcc, softirqs, softirqs-bpfcc
    package: str  # the Debian package that has it (scripts/setup.sh bench installs both)
    measures: str  # "runqlat" (a log2 histogram of run-queue waits) or "softirqs" (softirq time by kind)
    load_s: int  # seconds from start to tracing: bcc compiles its C with clang first, libbpf-tools only load
    on_other_headers: str = ""  # what it did on 6.18 with 6.1's headers (bcc only), seen 2026-11-28

    @property
    def compiles_at_run_time(self) -> bool:
        return self.package == "bpfcc-tools"


PEER_TOOLS: tuple[PeerTool, ...] = (
    PeerTool("runqlat", "libbpf-tools", "runqlat", 2),
    PeerTool("runqlat-bpfcc", "bpfcc-tools", "runqlat", 8, "its -p filter matched no task: an empty histogram"),
    PeerTool("softirqs", "libbpf-tools", "softirqs", 2),
    PeerTool("softirqs-bpfcc", "bpfcc-tools", "softirqs", 8, "it failed to compile"),
)


def headers_release(build_dir: Path) -> str | None:
    """The kernel release the headers under ``build_dir`` are of (their utsrelease.h); None: none there."""
    try:
        text = (build_dir / "include" / "generated" / "utsrelease.h").read_text()
    except OSError:
        return None
    m = re.search(r'UTS_RELEASE\s+"([^"]+)"', text)
    return m[1] if m else None


def cannot_run(tool: PeerTool, running: str | None = None, modules: Path = Path("/lib/modules"),
               btf: Path = Path("/sys/kernel/btf/vmlinux")) -> str:
    """Why ``tool`` cannot give a true answer on the running kernel, in one line; "" when it can.
    bcc compiles against /lib/modules/<release>/build: headers of another release give it another kernel's
    struct offsets (on 6.18 with Debian's 6.1 headers, bench/bcc_env.sh's link, runqlat-bpfcc -p read
    task_struct's tgid at 6.1's offset and matched no task: an empty histogram; softirqs-bpfcc did not
    compile). libbpf-tools relocate against the running kernel's BTF."""
    running = running or platform.release()
    if shutil.which(tool.command) is None:
        return f"{tool.command} is not installed (scripts/setup.sh bench installs {tool.package})"
    if tool.compiles_at_run_time:
        have = headers_release(modules / running / "build")
        if have is None:
            return f"not run: no kernel headers for {running} (bcc compiles against /lib/modules/{running}/build)"
        if have != running:
            return (f"not run on {running}: bcc compiles against {have}'s headers, another kernel's struct offsets "
                    f"(on 6.18: {tool.on_other_headers}); libbpf-tools' {tool.measures} is the row to read")
    elif not btf.exists():
        return f"not run: no kernel BTF at {btf} (libbpf-tools relocate against it)"
    return ""


@dataclass
class PeerRun:
    tool: PeerTool
    argv: list[str]
    seconds: int  # the interval the tool traces and then prints
    started_s: float = 0.0  # relative to onset
    ended_s: float = 0.0
    output: str = ""
    error: str = ""
    thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def traced_from_s(self) -> float:
        """Both kinds attach, sleep ``seconds``, print and exit: the window they traced is the ``seconds``
        before their exit (their banner cannot tell: a pipe holds libbpf-tools' stdout until they exit)."""
        return max(self.started_s, self.ended_s - self.seconds)


def start_peer(tool: PeerTool, ctx: Ctx, onset: float, run_s: float) -> PeerRun:
    """``tool`` over what is left of the run after its own load time, in a thread; with the victim's pid
    for runqlat (-p: that process's threads), node-wide for softirqs. Not started where it cannot run."""
    seconds = max(3, int(run_s) - tool.load_s - 1)
    pid = [] if tool.measures != "runqlat" else ["-p", str(ctx.victim.pid if ctx.victim else 0)]
    run = PeerRun(tool, [shutil.which(tool.command) or tool.command, *pid, str(seconds), "1"], seconds)
    run.error = cannot_run(tool)
    if run.error:
        return run

    def target() -> None:
        run.started_s = time.monotonic() - onset
        try:
            with subprocess.Popen(run.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
                try:
                    out, err = p.communicate(timeout=seconds + 60)  # a tool that never prints its interval
                except subprocess.TimeoutExpired:
                    p.kill()
                    raise
            run.output = out
            if p.returncode != 0:
                run.error = (err.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            run.error = str(e).splitlines()[0]
        run.ended_s = time.monotonic() - onset

    run.thread = threading.Thread(target=target, daemon=True)
    run.thread.start()
    return run


def peer_row(run: PeerRun, scenario: str, runq_ticks: list, trace_ticks: list) -> dict:
    """One peer beside ours over the window the peer traced: for runqlat its p99 (the upper bound of its
    log2 bucket) and the victim pod's runqueue p99 from our per-tick histograms of the ticks inside that
    window; for softirqs its NET_RX time on all CPUs and ours on the victim's CPU (median tick)."""
    lo = run.traced_from_s
    ran = run.ended_s > 0  # not started (cannot_run): no window, and nothing of ours to set beside it
    row: dict = {"scenario": scenario, "tool": run.tool.command, "package": run.tool.package, "argv": run.argv,
                 "window_s": [round(lo, 1), round(run.ended_s, 1)], "error": run.error, "output": run.output}
    if run.tool.measures == "runqlat":
        hist = runq_ticks_histogram(ticks_within(runq_ticks, lo, run.ended_s + 0.5)) if ran else None
        ours = hist.quantile_ns(0.99) / 1e3 if hist is not None and hist.count >= 20 else None
        peer = hist_p99_upper(run.output)
        row |= {"peer_p99_us_log2_upper": peer, "ours_runq_p99_us": None if ours is None else round(ours, 1)}
        if peer is None and not run.error:
            row["error"] = f"printed no histogram: no run-queue wait of pid {run.argv[2]} traced in its window"
    else:
        usecs = softirq_usecs(run.output)
        ours_ms = [t[2] for t in trace_ticks if ran and lo <= t[0] <= run.ended_s + 0.5]
        row |= {"peer_net_rx_ms_per_s_all_cpus": None if usecs is None else round(usecs / 1e3 / run.seconds, 1),
                "ours_softirq_ms_per_s_victim_cpu_median_tick":
                    round(sorted(ours_ms)[len(ours_ms) // 2], 1) if ours_ms else None}
        if usecs is None and not run.error:
            row["error"] = "printed no net_rx row: no NET_RX softirq ran in its window"
    return row


def peers_markdown(rows: list[dict]) -> list[str]:
    """The peer rows as a table: the peer's number beside ours, or why the peer has none."""
    out = ["| scenario | peer (package) | measure | traced, s after onset | peer | ours, same window | why none |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "peer_p99_us_log2_upper" in r:
            measure = "victim's run-queue p99 (peer: its log2 bucket's upper bound)"
            peer, ours = r.get("peer_p99_us_log2_upper"), r.get("ours_runq_p99_us")
            unit = "µs"
        else:
            measure = "NET_RX softirq time (peer: all CPUs; ours: the victim's CPU, median tick)"
            peer, ours = r.get("peer_net_rx_ms_per_s_all_cpus"), r.get("ours_softirq_ms_per_s_victim_cpu_median_tick")
            unit = "ms/s"
        peer_cell, ours_cell = ("-" if v is None else f"{v:g} {unit}" for v in (peer, ours))
        window = f"{r['window_s'][0]}-{r['window_s'][1]}" if r.get("output") else "-"  # not run: no window
        out.append(f"| {r.get('scenario', '-')} | {r['tool']} ({r['package']}) | {measure} | "
                   f"{window} | {peer_cell} | {ours_cell} | {r.get('error') or ''} |")
    return out


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
