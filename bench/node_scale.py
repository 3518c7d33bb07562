#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What the agent costs on a large node, in counts and bytes: RSS, BPF map memory, bytes read per tick,
``/metrics`` series per idle pod and per node (issue 25 item 6).

The real ``noisyneighbor agent`` (all default probes, detector, dry-run actuators, exporter) runs as a
subprocess under bench.metered_agent, with the kubelet pod source pointed at a kubelet-shaped ``/pods``
on loopback (``testkit/fakekube.py``), as in bench.agent_footprint. ``--pods`` idle pods are made as the
kubelet's systemd driver makes them (pod slice + one container scope holding a task that wakes every
``--wake-every`` s), two thirds Burstable, a third BestEffort. After ``--settle`` s, over ``--window`` s:

- ``rss_mib`` / ``hwm_mib``: VmRSS / VmHWM of the agent at the end;
- ``bpf_map_memlock_kib``: the kernel's ``memlock`` of every BPF map the agent holds
  (``/proc/<pid>/fdinfo``), by map;
- ``bytes_per_tick``: bytes copied out of BPF maps (bpf(2) lookups and batch lookups, counted in the
  agent by bench.metered_agent) and bytes read through read(2) (``rchar`` of ``/proc/<pid>/io``:
  /proc, cgroup files, the kubelet's ``/pods``), per agent tick in the window;
- one ``/metrics`` scrape: series in all, node-level series (no ``cgroup`` label) by family, series
  carrying a ``cpu`` label, and series per idle pod (its cgroup and its container's).

Counts and bytes are exact anywhere (a TCG VM included); CPU is not measured here: bench.agent_footprint
measures one agent's, bench.agent_beside two checkouts' agents side by side.
Every cgroup and task is removed afterwards, also on failure.

    sudo .venv/bin/python -m bench.node_scale --pods 100                 # ~2 min on a 2-CPU host
    sudo .venv/bin/python -m bench.node_scale --pods 100 --json --agent-arg=--per-cpu-series
    sudo .venv/bin/python -m bench.node_scale --tree before=/tmp/base --tree after=.   # side by side
    scripts/vm/run.sh --cpus 64 --memory 8G -- .venv/bin/python -m bench.node_scale --pods 100 --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.agent_footprint import AgentUnderTest, PodFleet  # noqa: E402
from testkit.fakekube import FakeKube  # noqa: E402
from testkit.sandbox import cleanup_prefix  # noqa: E402


def possible_cpus() -> int:
    """CPUs in /sys/devices/system/cpu/possible ("0-63"): what per-CPU BPF maps are sized by."""
    n = 0
    for part in Path("/sys/devices/system/cpu/possible").read_text().strip().split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def map_memlock_kib(pid: int, map_fds: dict[str, int]) -> tuple[dict[str, float], float]:
    """(memlock KiB by named map, KiB of every BPF map fd the process holds) from fdinfo."""
    def memlock(fd: int | str) -> int | None:
        try:
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            return None
        if "map_type:" not in info:
            return None
        m = re.search(r"^memlock:\s+(\d+)", info, re.M)
        return int(m.group(1)) if m else None

    named = {name: v / 1024 for name, fd in map_fds.items() if (v := memlock(fd)) is not None}
    total = 0
    seen_ids: set[str] = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        map_id = re.search(r"^map_id:\s+(\d+)", info, re.M)
        if map_id is None or map_id.group(1) in seen_ids:
            continue  # not a map, or a second fd of one already counted
        seen_ids.add(map_id.group(1))
        total += int(re.search(r"^memlock:\s+(\d+)", info, re.M).group(1))  # type: ignore[union-attr]
    return dict(sorted(named.items(), key=lambda kv: -kv[1])), total / 1024


def rchar(pid: int) -> int:
    return int(re.search(r"^rchar:\s+(\d+)", Path(f"/proc/{pid}/io").read_text(), re.M).group(1))  # type: ignore[union-attr]


def count_scrape(text: str, pod_cgroups: set[str]) -> dict:
    """Series of one scrape: all, node-level (no cgroup label) by family, with a cpu label, per pod."""
    node: Counter = Counter()
    with_cpu = total = 0
    per_pod: dict[str, int] = dict.fromkeys(pod_cgroups, 0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            total += 1
            with_cpu += "cpu" in sample.labels
            cg = sample.labels.get("cgroup")
            if cg is None:
                node[family.name] += 1
                continue
            key = next((c for c in pod_cgroups if f"/{c}/" in f"{cg}/"), None)
            if key is not None:
                per_pod[key] += 1
    counts = sorted(per_pod.values()) or [0]
    return {"series": total, "node_level_series": sum(node.values()), "series_with_cpu_label": with_cpu,
            "series_per_idle_pod": {"min": counts[0], "median": statistics.median(counts), "max": counts[-1]},
            "node_level_by_family": dict(node.most_common())}


def meter(agent: AgentUnderTest, out: Path) -> dict:
    """The agent's BPF read counters now (it writes them on SIGUSR1)."""
    before = out.stat().st_mtime_ns if out.exists() else 0
    agent.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if out.exists() and out.stat().st_mtime_ns != before:
            return json.loads(out.read_text())
        time.sleep(0.2)
    raise RuntimeError("the agent did not write its meter (bench.metered_agent) within 120 s")


def progress(started: float, what: str) -> None:
    print(f"[{time.monotonic() - started:6.1f} s] {what}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict:
    """Every agent of ``args.tree`` (name=checkout) at once, on the same pods, measured over the same window."""
    started = time.monotonic()
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"this": str(REPO)}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="nn-scale-") as tmp, FakeKube(node_name="node-1") as kube:
        fleet = PodFleet(kube, args.wake_every)
        agents: dict[str, tuple[AgentUnderTest, Path]] = {}
        try:
            for name, tree in trees.items():
                work = Path(tmp) / name
                work.mkdir()
                out = work / "meter.json"
                agents[name] = (AgentUnderTest(work, args.interval, kube.url, module="bench.metered_agent",
                                               extra_args=tuple(args.agent_arg),
                                               env={**os.environ, "NN_METER_OUT": str(out)}, repo=Path(tree)), out)
            for name, (agent, _) in agents.items():
                agent.wait_ready(timeout=args.ready_timeout)
                results[name] = {"tree": trees[name], "agent_ready_s": round(time.monotonic() - started, 1)}
                progress(started, f"agent {name} ready")
            for i in range(args.pods):
                fleet.add()
                if (i + 1) % 25 == 0:
                    progress(started, f"{i + 1} pods")
            time.sleep(args.settle)
            progress(started, "settled; window starts")
            first = {name: (meter(a, out), rchar(a.proc.pid), a.health(), time.monotonic())
                     for name, (a, out) in agents.items()}
            time.sleep(args.window)
            for name, (agent, out) in agents.items():
                m0, r0, h0, w0 = first[name]
                m1, r1, h1, w1 = meter(agent, out), rchar(agent.proc.pid), agent.health(), time.monotonic()
                rss, hwm = agent.memory_mib()
                maps, maps_total = map_memlock_kib(agent.proc.pid, m1["map_fds"])
                text = agent.get("/metrics").decode()
                pod_cgroups = {pod.pod_cgroup.dirs["cpu"].name for pod in fleet.pods}
                ticks = h1["ticks"] - h0["ticks"]
                per_tick = max(ticks, 1)
                by_map = {k: round((v - m0["by_map"].get(k, 0)) / per_tick) for k, v in m1["by_map"].items()}
                scanned = {k: round((v - m0.get("mapped_scanned", {}).get(k, 0)) / per_tick)
                           for k, v in m1.get("mapped_scanned", {}).items()}
                results[name].update({
                    "window_s": round(w1 - w0, 1), "ticks": ticks,
                    "failed_ticks": h1.get("failed_ticks", 0) - h0.get("failed_ticks", 0),
                    "rss_mib": round(rss, 1), "hwm_mib": round(hwm, 1),
                    "bpf_map_memlock_kib": round(maps_total, 1),
                    "bpf_map_memlock_kib_by_map": {k: round(v, 1) for k, v in maps.items()},
                    "bpf_bytes_per_tick": round((m1["bpf_map_bytes"] - m0["bpf_map_bytes"]) / per_tick),
                    "bpf_calls_per_tick": round((m1["bpf_map_calls"] - m0["bpf_map_calls"]) / per_tick, 1),
                    "bpf_bytes_per_tick_by_map": dict(sorted(((k, v) for k, v in by_map.items() if v),
                                                             key=lambda kv: -kv[1])),
                    # Of the mapped maps' bytes: counters only looked at in place to find what moved
                    # (no copy); the rest of their bytes were values copied out.
                    "mapped_bytes_scanned_per_tick": scanned,
                    "bpf_bytes_copied_per_tick": round((m1["bpf_map_bytes"] - m0["bpf_map_bytes"]) / per_tick)
                    - sum(scanned.values()),
                    "read_bytes_per_tick": round((r1 - r0) / per_tick),
                    **count_scrape(text, pod_cgroups)})
                progress(started, f"agent {name} measured")
                # Partial results first: a slow guest that is stopped later still leaves these.
                print(json.dumps({name: results[name]}), file=sys.stderr, flush=True)
        finally:
            for name, (agent, _) in agents.items():
                rc = agent.stop()
                if name in results:
                    results[name]["agent_exit_code"] = rc
            fleet.close()
            cleanup_prefix()
    return {
        "cpus_online": os.cpu_count(), "cpus_possible": possible_cpus(), "kernel": os.uname().release,
        "cgroup": "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1/hybrid",
        "pods": args.pods, "agent_args": args.agent_arg, "interval_s": args.interval,
        "elapsed_s": round(time.monotonic() - started, 1), "agents": results,
    }


def render(r: dict) -> str:
    lines = [f"{r['cpus_online']} CPUs online ({r['cpus_possible']} possible), kernel {r['kernel']}, cgroup {r['cgroup']}, "
             f"{r['pods']} idle pods, agent args {' '.join(r['agent_args']) or '(none)'}, {r['elapsed_s']} s"]
    for name, a in r["agents"].items():
        if "rss_mib" not in a:
            lines.append(f"[{name}] not measured")
            continue
        s = a["series_per_idle_pod"]
        lines += [
            f"[{name}] {a['tree']}: ready after {a['agent_ready_s']} s; window {a['window_s']} s, {a['ticks']} ticks "
            f"({a['failed_ticks']} failed), interval {r['interval_s']} s",
            f"  RSS {a['rss_mib']} MiB (peak {a['hwm_mib']} MiB)",
            f"  BPF map memory (memlock) {a['bpf_map_memlock_kib']:.0f} KiB; largest: " + ", ".join(
                f"{k} {v:.0f}" for k, v in list(a["bpf_map_memlock_kib_by_map"].items())[:6]),
            f"  bytes read per tick: BPF maps {a['bpf_bytes_per_tick']} ({a['bpf_calls_per_tick']} calls), "
            f"read(2) {a['read_bytes_per_tick']}; by map: " + ", ".join(
                f"{k} {v}" for k, v in list(a["bpf_bytes_per_tick_by_map"].items())[:6]),
            f"  of which copied out {a.get('bpf_bytes_copied_per_tick', '?')}, looked at in place "
            + (", ".join(f"{k} {v}" for k, v in a.get("mapped_bytes_scanned_per_tick", {}).items()) or "-"),
            f"  series: {a['series']} in all, {a['node_level_series']} node-level, {a['series_with_cpu_label']} with a "
            f"cpu label; per idle pod min {s['min']} median {s['median']} max {s['max']}",
            "  node-level series by family: " + ", ".join(
                f"{k} {v}" for k, v in list(a["node_level_by_family"].items())[:8]),
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pods", type=int, default=100)
    p.add_argument("--interval", type=float, default=1.0, help="agent tick interval")
    p.add_argument("--settle", type=float, default=40.0, help="seconds between the last pod made and the window")
    p.add_argument("--window", type=float, default=20.0, help="seconds over which bytes per tick are counted")
    p.add_argument("--wake-every", type=float, default=30.0, help="seconds between an idle pod's wakeups")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the agent's /readyz")
    p.add_argument("--agent-arg", action="append", default=[], help="passed on to `noisyneighbor agent` (repeat)")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                   help="run the agent of this checkout (repeat: all at once, same pods, same window; default: this one)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("node_scale: needs root (BPF probes, cgroups)", file=sys.stderr)
        return 2
    try:
        result = run(args)
    except (RuntimeError, OSError) as e:
        print(f"node_scale: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
