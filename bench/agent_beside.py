#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two agents side by side on the same pods: the CPU of one checkout's agent against another's, in one run.

``bench.agent_footprint`` measures one agent at a time, and the same tree's CPU at 300 pods moved between
0.93 and 1.15 % of a core from one run to the next (the host, the pods' wakeups, where the 15 s scrapes
fell): larger than most changes it was asked to judge. Here both agents (``--before`` and ``--after``
checkouts, each with its BPF objects built) run at the same time, over the same kubelet-shaped pods
(``bench.agent_footprint.PodFleet``: the same fake kubelet, the same tasks), ticking at the same interval
and scraped back to back every ``--scrape-interval`` seconds; each window's CPU is read for both at its
start and end from a cgroup of its own that each agent runs in (cpuacct.usage on v1, cpu.stat's usage_usec on
v2: every thread's time in ns, also of threads that ended; ``/proc/<pid>/stat`` counts in 10 ms clock ticks,
±4 % of a 30 s window at 1 % of a core). Whatever the host does in a window, both
agents live through it, so the per-window ratio after/before is what the change did; the table prints
each window and the median of the ratios per step.

Each agent loads its own BPF programs, so every sched_switch runs both: that cost lands in the tasks that
switch, not in either agent. Before the windows, both agents' exported series, map entries, exported
cgroups and pods with run-queue series are compared: a change that exports something else is not the same
work done cheaper, and the verdict says so.

    sudo .venv/bin/python -m bench.agent_beside --before /tmp/base --steps 300,1000 --rounds 4 --window 30
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.agent_footprint import DEFAULT_WAKE_EVERY_S, AgentUnderTest, PodFleet  # noqa: E402
from probes.cgroupfs import discover  # noqa: E402
from probes.cpuacct import read_cgroup_cpu  # noqa: E402
from testkit.fakekube import FakeKube  # noqa: E402
from testkit.sandbox import OwnedCgroup, cleanup_prefix  # noqa: E402

# What both agents must agree on (from one scrape each) for a CPU ratio to compare the same work.
SAME_WORK = ("series", "map_entries", "exported", "runq_pods")


@dataclass
class Window:
    seconds: float
    before_percent: float  # % of one core, the --before agent
    after_percent: float

    @property
    def ratio(self) -> float:
        return self.after_percent / self.before_percent if self.before_percent else float("inf")


@dataclass
class StepPair:
    pods: int
    windows: list[Window] = field(default_factory=list)
    before_work: dict[str, int] = field(default_factory=dict)
    after_work: dict[str, int] = field(default_factory=dict)
    before_rss_mib: float = 0.0
    after_rss_mib: float = 0.0

    @property
    def median_ratio(self) -> float:
        return statistics.median(w.ratio for w in self.windows)

    def median_percent(self, side: str) -> float:
        return statistics.median(getattr(w, f"{side}_percent") for w in self.windows)

    @property
    def same_work(self) -> bool:
        return self.before_work == self.after_work


def work_of(agent: AgentUnderTest, fleet: PodFleet) -> dict[str, int]:
    """What the agent exports for the fleet (SAME_WORK), from one scrape."""
    scrape = agent.scrape()
    uids = {pod.uid for pod in fleet.pods}
    return {"series": int(scrape["series"]), "map_entries": int(scrape["map_entries"]),
            "exported": int(scrape["exported"]), "runq_pods": len(scrape["runq_uids"] & uids)}


class CpuCgroup:
    """A cgroup of our own that one agent runs in, read for the CPU time of all its threads
    (probes.cpuacct.read_cgroup_cpu: cpuacct.usage on v1, cpu.stat's usage_usec on v2)."""

    def __init__(self, name: str) -> None:
        self.layout = discover()
        cpu = self.layout.hierarchy_for("cpu")
        v1 = cpu is not None and cpu.version == 1
        self.cgroup = OwnedCgroup(name, ("cpu", "cpuacct") if v1 else ("cpu",)).create()
        self.rel = "/" + str(self.cgroup.path("cpu").relative_to(cpu.mount)) if cpu is not None else "/"

    def cpu_seconds(self) -> float:
        stat = read_cgroup_cpu(self.layout, self.rel)
        if stat is None:
            raise RuntimeError(f"no CPU accounting for {self.rel}")
        return stat.usage_ns / 1e9

    def remove(self) -> None:
        self.cgroup.remove()


def measure_window(agents: tuple[CpuCgroup, CpuCgroup], scraped: tuple[AgentUnderTest, AgentUnderTest],
                   window: float, scrape_interval: float) -> Window:
    """Both agents' CPU over one window, scraped back to back every ``scrape_interval`` seconds (the side
    scraped first alternates, so neither always pays for a cold cache)."""
    start = [a.cpu_seconds() for a in agents]
    t0 = time.monotonic()
    deadline, next_scrape, turn = t0 + window, t0 + scrape_interval / 2, 0
    while (now := time.monotonic()) < deadline:
        if now >= next_scrape:
            for agent in (scraped if turn % 2 == 0 else scraped[::-1]):
                agent.get("/metrics")
            turn += 1
            next_scrape += scrape_interval
        time.sleep(max(0.0, min(0.5, deadline - time.monotonic(), next_scrape - time.monotonic())))
    end = [a.cpu_seconds() for a in agents]
    elapsed = time.monotonic() - t0
    before, after = (100 * (e - s) / elapsed for s, e in zip(start, end, strict=True))
    return Window(round(elapsed, 1), round(before, 3), round(after, 3))


def run(args: argparse.Namespace) -> list[StepPair]:
    steps = [int(s) for s in args.steps.split(",") if s.strip()]
    pairs: list[StepPair] = []
    with tempfile.TemporaryDirectory(prefix="nn-beside-") as tmp, FakeKube(node_name="node-1") as kube:
        fleet = PodFleet(kube, args.wake_every)
        agents: list[AgentUnderTest] = []
        cgroups: list[CpuCgroup] = []
        try:
            for side, repo in (("before", args.before), ("after", args.after)):
                workdir = Path(tmp) / side
                workdir.mkdir()
                cgroups.append(CpuCgroup(f"bench-agent-{side}"))
                agents.append(AgentUnderTest(workdir, args.interval, kube.url, args.scrape_interval,
                                             repo=Path(repo).resolve(), preexec=cgroups[-1].cgroup.preexec))
            for agent in agents:
                agent.wait_ready()
            pair_of_agents, their_cgroups = (agents[0], agents[1]), (cgroups[0], cgroups[1])
            for n in steps:
                fleet.grow_to(n, args.busy)
                time.sleep(args.settle + (6 if n else 0))  # kubelet poll and pod-cgroup listing: every 5 s
                pair = StepPair(n, before_work=work_of(agents[0], fleet), after_work=work_of(agents[1], fleet))
                for _ in range(args.rounds):
                    pair.windows.append(measure_window(their_cgroups, pair_of_agents, args.window, args.scrape_interval))
                    print(render_window(n, pair.windows[-1]), file=sys.stderr, flush=True)
                pair.before_rss_mib, pair.after_rss_mib = (round(a.memory_mib()[0], 1) for a in agents)
                pairs.append(pair)
        finally:
            for agent in agents:
                agent.stop()
            for cgroup in cgroups:
                cgroup.remove()
            fleet.close()
            cleanup_prefix()
    return pairs


def render_window(pods: int, w: Window) -> str:
    return f"{pods:>5} pods, {w.seconds:5.1f} s: before {w.before_percent:6.3f} %  after {w.after_percent:6.3f} %  " \
           f"ratio {w.ratio:5.3f}"


def render(pairs: list[StepPair], args: argparse.Namespace) -> str:
    lines = [f"{'pods':>5} {'windows':>7} {'before % core':>13} {'after % core':>12} {'ratio (median)':>14} "
             f"{'ratio range':>13} {'rss MiB b/a':>12}  same work"]
    for p in pairs:
        ratios = [w.ratio for w in p.windows]
        lines.append(f"{p.pods:>5} {len(p.windows):>7} {p.median_percent('before'):>13.3f} "
                     f"{p.median_percent('after'):>12.3f} {p.median_ratio:>14.3f} "
                     f"{min(ratios):>6.3f}-{max(ratios):<6.3f} {p.before_rss_mib:>5.1f}/{p.after_rss_mib:<6.1f} "
                     f" {'yes' if p.same_work else 'NO'}")
        if not p.same_work:
            lines.append(f"      before {p.before_work}, after {p.after_work}")
    lines.append(f"before: {args.before}; after: {args.after}; interval {args.interval:g} s, {args.busy} busy pods, "
                 f"sleeping pods wake every {args.wake_every:g} s, scraped every {args.scrape_interval:g} s; "
                 f"{os.cpu_count()} CPUs, kernel {os.uname().release}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="checkout whose agent is the baseline (its bpf objects built)")
    p.add_argument("--after", default=str(REPO), help="checkout compared with it (default: this one)")
    p.add_argument("--steps", default="300,1000", help="pod counts measured, in order")
    p.add_argument("--rounds", type=int, default=4, help="windows per step")
    p.add_argument("--window", type=float, default=30.0, help="seconds per window")
    p.add_argument("--settle", type=float, default=35.0, help="seconds between a step change and its first window")
    p.add_argument("--interval", type=float, default=1.0, help="both agents' tick interval")
    p.add_argument("--busy", type=int, default=3, help="pods whose task wakes every 100 ms")
    p.add_argument("--wake-every", type=float, default=DEFAULT_WAKE_EVERY_S, help="seconds between a sleeping pod's wakeups")
    p.add_argument("--scrape-interval", type=float, default=15.0, help="seconds between /metrics scrapes of each agent")
    p.add_argument("--json", action="store_true", help="one JSON document after the table")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("agent_beside: needs root (BPF probes, cgroups)", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print("agent_beside: --rounds must be at least 1", file=sys.stderr)
        return 2
    try:
        pairs = run(args)
    except (RuntimeError, OSError) as e:
        print(f"agent_beside: {e}", file=sys.stderr)
        return 1
    print(render(pairs, args))
    if args.json:
        print(json.dumps({"steps": [{**asdict(p), "median_ratio": p.median_ratio, "same_work": p.same_work}
                                    for p in pairs], "before": args.before, "after": args.after}, indent=2))
    return 0 if all(p.same_work for p in pairs) else 3


if __name__ == "__main__":
    sys.exit(main())
