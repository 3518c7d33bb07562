# SPDX-License-Identifier: Apache-2.0
"""The scenarios: each with ground truth (victim, accepted causes, culprit) and an onset (the injection)."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

from bench.scenarios.metrics import RECOVERY_WINDOW_S, Truth
from bench.scenarios.runner import OTHER_CPU, VICTIM_CPU, Ctx, ScenarioSpec

PY = sys.executable
FLOODER = str(Path(__file__).with_name("antagonists.py"))


def _hog(ctx: Ctx, pod: str, cpu: int) -> None:
    ctx.spawn(ctx.pods[pod], [PY, FLOODER, "hog", "--seconds", str(ctx.lifetime_s)], (cpu,))


# 1. CPU neighbour: a BE hog on the LS pod's CPU, BE cpu.shares 2048 as koordinator sets from batch-cpu requests.
def _cpu_setup(ctx: Ctx) -> None:
    ls = ctx.pod("web", "LS")
    ctx.pod("batch", "BE", shares=2048)
    ctx.start_victim(ls, "cpu", "--work-ms", "1.5", "--period-ms", "5")


def _cpu_inject(ctx: Ctx) -> None:
    _hog(ctx, "batch", VICTIM_CPU)


# 2. Self-throttling: the LS pod gets a cfs quota below what its own work needs; no neighbour.
def _throttle_setup(ctx: Ctx) -> None:
    ls = ctx.pod("web", "LS")
    ctx.start_victim(ls, "cpu", "--work-ms", "2", "--period-ms", "5")


def _throttle_inject(ctx: Ctx) -> None:
    ctx.pods["web"].cgroup.write("cpu", "cpu.cfs_quota_us", "25000")  # 0.25 cores for a 0.4-core worker


# 3. Memcg reclaim: LS pod at its memory limit, page cache growing inside it; the victim allocates per request.
def _reclaim_setup(ctx: Ctx) -> None:
    ls = ctx.pod("web", "LS", memory_limit=192 * 1024 * 1024)
    ctx.start_victim(ls, "cpu", "--work-ms", "1", "--period-ms", "5", "--alloc-kb", "512")


def _reclaim_inject(ctx: Ctx) -> None:
    fill = ctx.workdir / "fill"
    ctx.spawn(ctx.pods["web"], [PY, FLOODER, "pagecache", "--file", str(fill), "--mb", "400",
                                "--seconds", str(ctx.lifetime_s)], (OTHER_CPU,))


# 4. Softirq: NET_RX flood over a veth between two test namespaces, steered (RPS, on our own veth) to the LS CPU.
def _net_setup(ctx: Ctx, victim_mode: str = "tcp") -> None:
    ls = ctx.pod("web", "LS")
    ctx.pod("flood", "BE")
    a = ctx.netns.add("a")
    b = ctx.netns.add("b")
    _, addr_b = ctx.netns.veth_pair(a, b)
    ctx.state.update(ns_a=a, ns_b=b, addr_b=addr_b)
    # RPS on the receiving veth in our own namespace: NET_RX for it runs on the victim's CPU.
    ctx.spawn(ctx.pods["flood"], ["sh", "-c", f"echo {1 << VICTIM_CPU:x} > /sys/class/net/nnvb/queues/rx-0/rps_cpus"],
              None, netns=b).wait(timeout=10)
    ctx.start_victim(ls, victim_mode, "--work-ms", "0.5", "--period-ms", "5")


def _net_inject(ctx: Ctx) -> None:
    ctx.spawn(ctx.pods["flood"], [PY, FLOODER, "udpflood", "--dest", ctx.state["addr_b"], "--seconds",
                                  str(ctx.lifetime_s)], (OTHER_CPU,), netns=ctx.state["ns_a"])


# 5. Softirq starvation: an RT busy task (bounded) on the LS CPU starves ksoftirqd while NET_RX is steered there.
def _rt_setup(ctx: Ctx) -> None:
    _net_setup(ctx)
    # RT_GROUP_SCHED: a cgroup needs its own RT budget, given top-down on the cgroups we created.
    pod = ctx.pods["flood"].cgroup
    leaf = pod.dirs["cpu"]
    levels = [leaf, *[p for p in leaf.parents if p.name.startswith("nn-test") or _below_prefix(p)]]
    for d in sorted({*levels}, key=lambda p: len(p.parts)):
        (d / "cpu.rt_runtime_us").write_text("400000")
    ctx.state["rt_dirs"] = levels


def _below_prefix(p: Path) -> bool:
    return any(part.startswith("nn-test-") for part in p.parts[:-1])


def _rt_inject(ctx: Ctx) -> None:
    _net_inject(ctx)
    # Through the run and the longest stretch a mitigate pass adds for its recovery window (runner.py),
    # so a pass is never judged on a tail the flood has already left.
    ctx.spawn(ctx.pods["flood"], [PY, FLOODER, "rtbusy", "--seconds", str(ctx.timing.run_s + RECOVERY_WINDOW_S + 2)],
              (VICTIM_CPU,))


def _rt_teardown(ctx: Ctx) -> None:
    for d in sorted(ctx.state.get("rt_dirs", []), key=lambda p: -len(p.parts)):
        if d.exists():
            (d / "cpu.rt_runtime_us").write_text("0")


# 6. Connect path: the LS client connects to a server whose accept queue is full (SYNs dropped), in a test netns.
def _connect_setup(ctx: Ctx) -> None:
    ls = ctx.pod("web", "LS")
    ctx.pod("server", "BE")
    ns = ctx.netns.add("c")
    ctx.state["server"] = ctx.spawn(ctx.pods["server"], [PY, FLOODER, "server", "--port", "8080", "--seconds",
                                                         str(ctx.lifetime_s)], (OTHER_CPU,), netns=ns)
    ctx.start_victim(ls, "connect", "--port", "8080", "--period-ms", "20", "--timeout-s", "3", netns=ns)


def _connect_inject(ctx: Ctx) -> None:
    import signal
    ctx.state["server"].send_signal(signal.SIGUSR1)  # the server stops accepting: the queue fills, SYNs drop


# 7. Quiet node and busy-but-harmless.
def _quiet_setup(ctx: Ctx) -> None:
    ls = ctx.pod("web", "LS")
    ctx.pod("batch", "BE", shares=2048)
    ctx.start_victim(ls, "cpu", "--work-ms", "1.5", "--period-ms", "5")


def _nothing(ctx: Ctx) -> None:
    return None


def _harmless_inject(ctx: Ctx) -> None:
    _hog(ctx, "batch", OTHER_CPU)


# The new shapes' pods weigh this much (cpu.shares up to our prefix): on a machine other work shares,
# the pods of a scenario compete with each other, not with whatever else runs on the victim's CPU.
LS_SHARES = 4096


# 8. A multi-container pod with one limited container (the pod cgroup has no quota): the victim runs
#    in that container and its limit drops below what it needs; the sidecar has no limit.
def _container_limit_setup(ctx: Ctx) -> None:
    web, containers = ctx.scenario.k8s_pod("web", "LS", [
        {"name": "main", "requests": {"cpu": "250m"}, "limits": {"cpu": "250m"}},
        {"name": "sidecar", "requests": {"cpu": "100m"}},
    ], shares=LS_SHARES)
    containers["main"].cgroup.write("cpu", "cpu.cfs_quota_us", "-1")  # the limit comes at onset
    ctx.pods["web"] = web
    ctx.state["containers"] = containers
    ctx.spawn(containers["sidecar"], [PY, "-c", f"import time; time.sleep({ctx.lifetime_s})"], (VICTIM_CPU,))
    ctx.start_victim(containers["main"], "cpu", "--work-ms", "2", "--period-ms", "5")


def _container_limit_inject(ctx: Ctx) -> None:
    ctx.state["containers"]["main"].cgroup.write("cpu", "cpu.cfs_quota_us", "25000")  # 0.25 cores for 0.4


# 9. More busy tasks than CPUs: the LS pod's cpuset is one CPU, its large request gives it the CPU
#    against everything else, and at onset it starts four busy tasks of its own.
def _contention_setup(ctx: Ctx) -> None:
    web, containers = ctx.scenario.k8s_pod("web", "LS", [{"name": "main", "requests": {"cpu": "8"}}],
                                           shares=8192, cpuset=str(VICTIM_CPU))
    ctx.pods["web"] = web
    ctx.state["containers"] = containers
    ctx.start_victim(containers["main"], "cpu", "--work-ms", "1.5", "--period-ms", "5")


def _contention_inject(ctx: Ctx) -> None:
    for _ in range(4):
        ctx.spawn(ctx.state["containers"]["main"], [PY, FLOODER, "hog", "--seconds", str(ctx.lifetime_s)],
                  (VICTIM_CPU,))


# 10. Two BE neighbours, equal weight and equal CPU on the LS CPU: one within its (batch) CPU request,
#     one far above it. The one above is the culprit to name first.
def _requests_setup(ctx: Ctx) -> None:
    web, containers = ctx.scenario.k8s_pod("web", "LS", [{"name": "main", "requests": {"cpu": "500m"}}],
                                           shares=LS_SHARES)
    ctx.pods["web"] = web
    for name, milli in (("within", "2000"), ("above", "100")):
        pod, cs = ctx.scenario.k8s_pod(name, "BE", [{"name": "job", "requests": {"kubernetes.io/batch-cpu": milli},
                                                      "limits": {"kubernetes.io/batch-cpu": milli}}],
                                        shares=LS_SHARES)
        ctx.pods[name] = pod
        ctx.state[name] = cs["job"]
    ctx.start_victim(containers["main"], "cpu", "--work-ms", "1.5", "--period-ms", "5")


def _requests_inject(ctx: Ctx) -> None:
    for name in ("within", "above"):
        ctx.spawn(ctx.state[name], [PY, FLOODER, "hog", "--seconds", str(ctx.lifetime_s)], (VICTIM_CPU,))


def _rt_allowed() -> bool:
    return hasattr(resource, "RLIMIT_RTTIME")


SCENARIOS: tuple[ScenarioSpec, ...] = (
    ScenarioSpec("cpu-neighbor", "BE CPU hog (shares 2048) on the LS pod's CPU",
                 Truth("web", ("neighbor_cpu",), "batch"), _cpu_setup, _cpu_inject,
                 modes=("none", "detect", "mitigate", "koordlet")),
    ScenarioSpec("self-throttle", "LS pod at its own cfs quota, no neighbour",
                 Truth("web", ("self_throttling",), None), _throttle_setup, _throttle_inject),
    ScenarioSpec("memcg-reclaim", "LS pod at its memory limit with page-cache growth",
                 Truth("web", ("reclaim",), None), _reclaim_setup, _reclaim_inject,
                 note="no neighbour action expected: reclaim at its own limit"),
    ScenarioSpec("softirq-netrx", "UDP flood over veth, NET_RX steered (RPS) to the LS CPU",
                 Truth("web", ("softirq",), "flood"), _net_setup, _net_inject),
    ScenarioSpec("softirq-starve", "RT busy task (RLIMIT_RTTIME, self-bounded) on the LS CPU under NET_RX load",
                 Truth("web", ("softirq", "neighbor_cpu"), "flood"), _rt_setup, _rt_inject, teardown=_rt_teardown,
                 note="RT variant (seed's zombie-memcg case not run: see docs/benchmarks.md)"),
    ScenarioSpec("connect-syndrop", "LS client vs a server whose accept queue is full (netns)",
                 Truth("web", ("network_connect",), None), _connect_setup, _connect_inject, modes=("detect",),
                 note="no connect actuator: detection only"),
    ScenarioSpec("container-limit", "two-container LS pod, its main container at its own limit, pod unlimited",
                 Truth("web", ("self_throttling",), None), _container_limit_setup, _container_limit_inject,
                 modes=("detect",), note="detection only: the burst actuator acts on the pod cgroup"),
    ScenarioSpec("self-contention", "LS pod with 4 busy tasks more than its 1-CPU cpuset holds",
                 Truth("web", ("self_contention",), None), _contention_setup, _contention_inject,
                 modes=("detect",), note="no actuator: the pod's own sizing"),
    ScenarioSpec("request-neighbors", "two BE hogs on the LS CPU, equal CPU: one within its request, one above",
                 Truth("web", ("neighbor_cpu",), "above"), _requests_setup, _requests_inject, modes=("detect",)),
    ScenarioSpec("quiet", "LS alone with an idle BE pod", Truth(None), _quiet_setup, _nothing, modes=("detect",)),
    ScenarioSpec("busy-harmless", "BE hog on the other CPU only", Truth(None), _quiet_setup, _harmless_inject,
                 modes=("detect", "koordlet")),
)

# issue 19's mitigation scenarios live in their own module (appended here, one line to merge)
from bench.scenarios.catalog_mitigate import MITIGATION_SCENARIOS  # noqa: E402

SCENARIOS = SCENARIOS + MITIGATION_SCENARIOS


def by_name(names: list[str] | None) -> list[ScenarioSpec]:
    if not names:
        return list(SCENARIOS)
    known = {s.name: s for s in SCENARIOS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names]
