#!/usr/bin/env python3
"""What the agent costs on a large node, in counts and bytes: RSS, BPF map memory, bytes read per tick,
``/metrics`` series per idle pod and per node (issue 25 item 6).

The real ``noisyneighbor agent`` (all default probes, detector, dry-run actuators, exporter) runs as a
subprocess under bench.metered_agent, with the kubelet pod source pointed at a kubelet-shaped ``/pods``
on loopback (``tests/fakekube.py``), as in bench.agent_footprint. ``--pods`` idle pods are made as the
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

Counts and bytes are exact anywhere (a TCG VM included); the CPU figures of bench.agent_footprint are
not measured here. Every cgroup and task is removed afterwards, also on failure.

    sudo .venv/bin/python -m bench.node_scale --pods 100                 # ~2 min on a 2-CPU host
    sudo .venv/bin/python -m bench.node_scale --pods 100 --json --agent-arg=--per-cpu-series
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
from bench.sandbox import cleanup_prefix  # noqa: E402
from tests.fakekube import FakeKube  # noqa: E402


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
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if out.exists() and out.stat().st_mtime_ns != before:
            return json.loads(out.read_text())
        time.sleep(0.2)
    raise RuntimeError("the agent did not write its meter (bench.metered_agent) within 60 s")


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="nn-scale-") as tmp, FakeKube(node_name="node-1") as kube:
        out = Path(tmp) / "meter.json"
        fleet = PodFleet(kube, args.wake_every)
        agent = AgentUnderTest(Path(tmp), args.interval, kube.url, module="bench.metered_agent",
                               extra_args=tuple(args.agent_arg), env={**os.environ, "NN_METER_OUT": str(out)})
        try:
            t0 = time.monotonic()
            agent.wait_ready(timeout=args.ready_timeout)
            ready_s = time.monotonic() - t0
            fleet.grow_to(args.pods, 0)
            time.sleep(args.settle)
            pid = agent.proc.pid
            m0, r0, h0, w0 = meter(agent, out), rchar(pid), agent.health(), time.monotonic()
            time.sleep(args.window)
            m1, r1, h1, w1 = meter(agent, out), rchar(pid), agent.health(), time.monotonic()
            rss, hwm = agent.memory_mib()
            maps, maps_total = map_memlock_kib(pid, m1["map_fds"])
            text = agent.get("/metrics").decode()
            pod_cgroups = {pod.pod_cgroup.dirs["cpu"].name for pod in fleet.pods}
        finally:
            rc = agent.stop()
            fleet.close()
            cleanup_prefix()
    ticks = h1["ticks"] - h0["ticks"]
    per_tick = max(ticks, 1)
    by_map = {k: round((v - m0["by_map"].get(k, 0)) / per_tick) for k, v in m1["by_map"].items()}
    return {
        "cpus_online": os.cpu_count(), "cpus_possible": possible_cpus(), "kernel": os.uname().release,
        "cgroup": "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "v1/hybrid",
        "pods": args.pods, "agent_args": args.agent_arg, "interval_s": args.interval,
        "agent_ready_s": round(ready_s, 1), "window_s": round(w1 - w0, 1), "ticks": ticks,
        "failed_ticks": h1.get("failed_ticks", 0) - h0.get("failed_ticks", 0),
        "rss_mib": round(rss, 1), "hwm_mib": round(hwm, 1),
        "bpf_map_memlock_kib": round(maps_total, 1), "bpf_map_memlock_kib_by_map": {k: round(v, 1) for k, v in maps.items()},
        "bpf_bytes_per_tick": round((m1["bpf_map_bytes"] - m0["bpf_map_bytes"]) / per_tick),
        "bpf_calls_per_tick": round((m1["bpf_map_calls"] - m0["bpf_map_calls"]) / per_tick, 1),
        "bpf_bytes_per_tick_by_map": dict(sorted(((k, v) for k, v in by_map.items() if v), key=lambda kv: -kv[1])),
        "read_bytes_per_tick": round((r1 - r0) / per_tick),
        **count_scrape(text, pod_cgroups),
        "agent_exit_code": rc,
    }


def render(r: dict) -> str:
    s = r["series_per_idle_pod"]
    lines = [
        f"{r['cpus_online']} CPUs online ({r['cpus_possible']} possible), kernel {r['kernel']}, cgroup {r['cgroup']}, "
        f"{r['pods']} idle pods, agent args {' '.join(r['agent_args']) or '(none)'}",
        f"agent ready after {r['agent_ready_s']} s; window {r['window_s']} s, {r['ticks']} ticks "
        f"({r['failed_ticks']} failed), interval {r['interval_s']} s",
        f"RSS {r['rss_mib']} MiB (peak {r['hwm_mib']} MiB)",
        f"BPF map memory (memlock) {r['bpf_map_memlock_kib']:.0f} KiB; largest: " + ", ".join(
            f"{k} {v:.0f}" for k, v in list(r["bpf_map_memlock_kib_by_map"].items())[:6]),
        f"bytes read per tick: BPF maps {r['bpf_bytes_per_tick']} ({r['bpf_calls_per_tick']} calls), "
        f"read(2) {r['read_bytes_per_tick']}; by map: " + ", ".join(
            f"{k} {v}" for k, v in list(r["bpf_bytes_per_tick_by_map"].items())[:6]),
        f"series: {r['series']} in all, {r['node_level_series']} node-level, {r['series_with_cpu_label']} with a cpu "
        f"label; per idle pod min {s['min']} median {s['median']} max {s['max']}",
        "node-level series by family: " + ", ".join(f"{k} {v}" for k, v in list(r["node_level_by_family"].items())[:10]),
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
