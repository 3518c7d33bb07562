#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""CPU and memory cost of the detector's per-tick path on synthetic cgroups (no BPF, no sleeping).

Feeds N synthetic cgroups at a simulated 1 Hz (realistic per-workload levels with noise, plus
injected anomalies: a best-effort CPU hog hurting three latency-sensitive pods, a self-throttled
pod, a pod stalling in memory reclaim) through:

* ``detector.incidents.IncidentEngine.step`` when that module exists (store + baselines + breach
  rules + diagnosis + decisions, i.e. everything after the probes), else
* the store/baseline path alone plus the queries an engine typically makes per tick (stats over 10 s
  and 60 s for every entity on 2 signals, one frame, ten correlations), and the output says so.

Not measured: reading the probes and cgroup files and building the per-workload signals from two
snapshots (``detector.signals.SignalBuilder``): the synthetic rows are built outside the timed part.

Each size runs in its own child process so peak RSS (``ru_maxrss``) belongs to that size alone. The
timed pass runs without tracemalloc (it slows Python several-fold); a second, identical pass runs
under tracemalloc for the peak of Python allocations. CPU time is process time (user + sys).

    .venv/bin/python -m bench.detector                      # 500 and 50 cgroups, 600 ticks
    .venv/bin/python -m bench.detector --ticks 300 --sizes 500 --json /tmp/detector.json
    .venv/bin/python -m bench.detector --json -             # JSON on stdout instead of text
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from detector.baseline import Baselines  # noqa: E402
from detector.store import SignalStore  # noqa: E402

LS_SHARE = 0.4  # share of cgroups that are latency-sensitive (victim candidates); the rest are BE
QUERY_SIGNALS = ("runq_p99_ns", "cpu_cores")


@dataclass
class SizeResult:
    cgroups: int
    ticks: int
    path: str  # "incident_engine" or "store+baselines+queries"
    cpu_ms_per_tick_mean: float
    cpu_ms_per_tick_p50: float
    cpu_ms_per_tick_p95: float
    cpu_ms_per_tick_max: float
    core_percent_at_1hz: float
    rss_before_feed_mib: float  # after imports and setup: the interpreter and numpy
    rss_peak_mib: float  # ru_maxrss of the child process
    tracemalloc_peak_mib: float  # peak of Python-level allocations during an identical pass
    store_array_mib: float
    gen2_gc_ticks: int  # steady-state ticks during which a full (generation 2) garbage collection ran
    cpu_ms_per_tick_without_gen2_gc: float
    incidents_opened: int | None = None
    incidents: list[str] = field(default_factory=list)  # "victim: cause, top culprit X"


class SyntheticNode:
    """Per-tick synthetic signals for ``n`` cgroups: stable per-cgroup levels, noise, and anomalies."""

    def __init__(self, n: int, seed: int = 1) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)
        rng = self.rng
        self.keys = [f"/kubepods/pod{i:04d}" for i in range(n)]
        n_ls = max(4, int(n * LS_SHARE))
        self.ls = np.zeros(n, dtype=bool)
        self.ls[:n_ls] = True
        self.cpu_level = rng.lognormal(math.log(0.3), 0.8, n).clip(0.01, 3.0)
        self.runq_p99_level = rng.lognormal(math.log(150e3), 0.5, n)  # ~150 us
        self.wait_level = rng.lognormal(math.log(5.0), 0.7, n)  # ms of runqueue wait per s
        self.softirq_level = rng.lognormal(math.log(1.0), 0.5, n)
        self.connect_level = rng.lognormal(math.log(300e3), 0.4, n)
        self.has_connects = rng.random(n) < 0.3
        self.mem_level = rng.lognormal(math.log(300e6), 0.8, n)
        self.quota = np.where(rng.random(n) < 0.5, np.ceil(self.cpu_level * 2 + 0.5), np.nan)
        self.neighbors = [rng.choice(n, size=4, replace=False) for _ in range(n)]
        # Anomalies: a BE hog (the last cgroup) hurting three LS pods, one LS pod throttling itself,
        # one LS pod stalling in reclaim. Windows in ticks.
        self.hog = n - 1
        self.hog_victims = [0, 1, 2]
        self.throttled = 3
        self.reclaimer = min(4, n_ls - 1)

    def anomalies(self, tick: int, ticks: int) -> dict[str, bool]:
        return {
            "hog": int(ticks * 0.3) <= tick < int(ticks * 0.3) + 60,
            "throttle": int(ticks * 0.55) <= tick < int(ticks * 0.55) + 40,
            "reclaim": int(ticks * 0.75) <= tick < int(ticks * 0.75) + 30,
        }

    def tick_arrays(self, tick: int, ticks: int) -> dict[str, np.ndarray]:
        rng = self.rng
        n = self.n

        def noisy(level: np.ndarray, cv: float) -> np.ndarray:
            return level * rng.lognormal(0.0, cv, n)

        a = {
            "cpu_cores": noisy(self.cpu_level, 0.15),
            "runq_p99_ns": noisy(self.runq_p99_level, 0.3),
            "runq_wait_ms_per_s": noisy(self.wait_level, 0.3),
            "softirq_ms_per_s": noisy(self.softirq_level, 0.3),
            "connect_p99_ns": noisy(self.connect_level, 0.25),
            "reclaim_stall_ms_per_s": np.where(rng.random(n) < 0.02, rng.exponential(0.5, n), 0.0),
            "throttled_ratio": np.where(np.isnan(self.quota), np.nan, np.where(rng.random(n) < 0.1, 0.02, 0.0)),
            "psi_cpu_some": noisy(self.wait_level / 5.0, 0.3),
            "memory_bytes": self.mem_level * (1 + 0.0005 * tick) * rng.normal(1.0, 0.002, n),
        }
        on = self.anomalies(tick, ticks)
        if on["hog"]:
            a["cpu_cores"][self.hog] = 1.9
            for v in self.hog_victims:
                a["runq_p99_ns"][v] = rng.uniform(8e6, 12e6)
                a["runq_wait_ms_per_s"][v] = rng.uniform(150, 250)
        if on["throttle"]:
            t = self.throttled
            a["throttled_ratio"][t] = 0.7
            a["runq_p99_ns"][t] = rng.uniform(12e6, 20e6)
            a["runq_wait_ms_per_s"][t] = 300.0
        if on["reclaim"]:
            a["reclaim_stall_ms_per_s"][self.reclaimer] = rng.uniform(60, 120)
        return a

    def store_values(self, arrays: dict[str, np.ndarray]) -> dict[tuple[str, str], float]:
        values: dict[tuple[str, str], float] = {}
        for signal, arr in arrays.items():
            col = arr.tolist()
            for key, v in zip(self.keys, col, strict=True):
                values[(key, signal)] = v
        for i in np.flatnonzero(~self.has_connects):
            values[(self.keys[i], "connect_p99_ns")] = math.nan
        return values

    def node_signals(self, arrays: dict[str, np.ndarray], tick: int, ticks: int):  # -> NodeSignals
        from detector.decisions import Target
        from detector.signals import NodeSignals, WorkloadSignals
        from detector.workloads import Workload

        on = self.anomalies(tick, ticks)
        rows: dict[str, WorkloadSignals] = {}
        cols = {k: v.tolist() for k, v in arrays.items()}
        for i, key in enumerate(self.keys):
            qos = "LS" if self.ls[i] else "BE"
            w = Workload(key, Target(key, pod_uid=f"uid-{i}", namespace="bench", pod=f"pod-{i}", qos=qos))
            wait_ms = cols["runq_wait_ms_per_s"][i]
            wait_ns = wait_ms * 1e6
            ran_instead: dict[str, float] = {}
            if on["hog"] and i in self.hog_victims:
                ran_instead[self.keys[self.hog]] = 0.8 * wait_ns
            else:
                for j in self.neighbors[i]:
                    if j != i:
                        ran_instead[self.keys[j]] = 0.15 * wait_ns
            quota = self.quota[i]
            throttled = cols["throttled_ratio"][i]
            rows[key] = WorkloadSignals.of(
                workload=w,
                interval_s=1.0,
                runq_count=500,
                runq_wait_ms_per_s=wait_ms,
                runq_p99_ns=cols["runq_p99_ns"][i],
                runq_max_ns=cols["runq_p99_ns"][i] * 2,
                ran_instead_ns=ran_instead,
                own_wait_ns=wait_ns - sum(ran_instead.values()),
                who_ran_instead_available=True,
                cpu_cores=cols["cpu_cores"][i],
                quota_cores=None if math.isnan(quota) else float(quota),
                throttled_ratio=None if math.isnan(throttled) else throttled,
                throttled_ms_per_s=None if math.isnan(throttled) else throttled * (600.0 if throttled > 0.5 else 20.0),
                softirq_ms_per_s=cols["softirq_ms_per_s"][i],
                softirq_delay_p99_ns=20e3,
                cpu_weights={0: 0.5, 1: 0.5},
                reclaim_stall_ms_per_s=cols["reclaim_stall_ms_per_s"][i],
                reclaim_by_kind_ms_per_s=(
                    {"memcg": cols["reclaim_stall_ms_per_s"][i]} if cols["reclaim_stall_ms_per_s"][i] else {}
                ),
                memory_usage_bytes=int(cols["memory_bytes"][i]),
                memory_limit_bytes=int(cols["memory_bytes"][i] * 2),
                connects=50 if self.has_connects[i] else 0,
                connect_p99_ns=cols["connect_p99_ns"][i] if self.has_connects[i] else 0.0,
                psi_cpu_some=cols["psi_cpu_some"][i],
            )
        return NodeSignals.of(
            interval_s=1.0,
            workloads=rows,
            softirq_ms_per_s_by_cpu={0: 5.0, 1: 5.0},
            softirq_delay_p99_ns_by_cpu={0: 20e3, 1: 20e3},
            node_direct_reclaim_ms_per_s=0.0,
            node_cpu_busy=1.2,
            node_psi={"cpu_some": 3.0},
        )


def _engine_class():
    try:
        from detector import incidents
    except Exception as e:  # any import problem means "no engine yet": fall back, and say why
        return None, f"detector.incidents not importable: {type(e).__name__}: {e}"
    engine = getattr(incidents, "IncidentEngine", None)
    if engine is None or not hasattr(engine, "step"):
        return None, "detector.incidents has no IncidentEngine.step"
    return engine, ""


def _make_runner(n: int, ticks: int, use_engine: bool) -> tuple[str, Callable[[int], None], Callable[[int], object], object]:
    """(path name, run(tick) for the timed part, prepare(tick) for the untimed part, state)."""
    node = SyntheticNode(n)
    engine_cls, _ = _engine_class() if use_engine else (None, "")
    if engine_cls is not None:
        from detector.decisions import LoggingSink

        clock_now = [0.0]
        engine = engine_cls(sink=LoggingSink(), clock=lambda: clock_now[0])
        pending: dict[int, object] = {}

        def prepare(tick: int) -> object:
            pending[tick] = node.node_signals(node.tick_arrays(tick, ticks), tick, ticks)
            return pending[tick]

        def run(tick: int) -> None:
            clock_now[0] = 1_700_000_000.0 + tick
            engine.step(pending.pop(tick), ts=1000.0 + tick)

        return "incident_engine", run, prepare, engine

    store = SignalStore()
    baselines = Baselines()
    ls_keys = [k for k, ls in zip(node.keys, node.ls, strict=True) if ls]
    pending_values: dict[int, dict] = {}

    def prepare_plain(tick: int) -> object:
        pending_values[tick] = node.store_values(node.tick_arrays(tick, ticks))
        return pending_values[tick]

    def run_plain(tick: int) -> None:
        values = pending_values.pop(tick)
        ts = 1000.0 + tick
        learn_values = {k: v for k, v in values.items() if k[1] in ("runq_p99_ns", "connect_p99_ns")}
        baselines.scores("runq_p99_ns", {k: values[(k, "runq_p99_ns")] for k in ls_keys})
        store.add(ts, values)
        baselines.update_tick(learn_values)
        for signal in QUERY_SIGNALS:
            for seconds in (10.0, 60.0):
                for key in node.keys:
                    store.stats(key, signal, seconds)
        store.frame("cpu_cores", 10.0)
        for j in range(10):
            store.correlation(node.keys[(j + 1) % n], "cpu_cores", ls_keys[0], "runq_p99_ns", 60.0)

    return "store+baselines+queries", run_plain, prepare_plain, store


def _feed(n: int, ticks: int, use_engine: bool, trace: bool) -> tuple[list[float], list[bool], str, object]:
    """Per tick: CPU seconds and whether a full GC ran inside the timed part."""
    path, run, prepare, state = _make_runner(n, ticks, use_engine)
    per_tick: list[float] = []
    had_gen2: list[bool] = []
    gen2_runs = [0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start" and info.get("generation") == 2:
            gen2_runs[0] += 1

    gc.callbacks.append(on_gc)
    if trace:
        tracemalloc.start()
    try:
        for tick in range(ticks):
            prepare(tick)
            before = gen2_runs[0]
            t0 = time.process_time()
            run(tick)
            per_tick.append(time.process_time() - t0)
            had_gen2.append(gen2_runs[0] > before)
    finally:
        gc.callbacks.remove(on_gc)
    return per_tick, had_gen2, path, state


def run_size(n: int, ticks: int, use_engine: bool) -> SizeResult:
    """One size, in this process (the parent runs it in a child for a clean ru_maxrss)."""
    import numpy  # noqa: F401  # imported before the baseline RSS so it is not counted as the detector's

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    per_tick, had_gen2, path, state = _feed(n, ticks, use_engine, trace=False)
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    engine = state if path == "incident_engine" else None
    store: SignalStore = engine.store if engine is not None else state  # type: ignore[union-attr]
    store_mib = store.nbytes() / 2**20
    opened = None
    described: list[str] = []
    if engine is not None:
        incidents = engine.all_incidents()
        opened = len(incidents)
        for inc in sorted(incidents, key=lambda i: (i.started_at, i.victim.cgroup)):
            top = inc.culprits[0].target.cgroup if inc.culprits else "-"
            described.append(f"{inc.victim.cgroup}: {inc.cause}, top culprit {top}")
    del state, engine, store
    _, _, _, traced_state = _feed(n, ticks, use_engine, trace=True)
    _, trace_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del traced_state
    ms = [t * 1e3 for t in per_tick]
    first = min(60, len(ms) // 2)  # after the first minute: store and baselines are full-size
    steady = ms[first:]
    steady_gen2 = had_gen2[first:]
    without_gc = [t for t, g in zip(steady, steady_gen2, strict=True) if not g] or steady
    mean = statistics.fmean(steady)
    return SizeResult(
        cgroups=n,
        ticks=ticks,
        path=path,
        cpu_ms_per_tick_mean=round(mean, 3),
        cpu_ms_per_tick_p50=round(statistics.median(steady), 3),
        cpu_ms_per_tick_p95=round(float(np.percentile(steady, 95)), 3),
        cpu_ms_per_tick_max=round(max(steady), 3),
        core_percent_at_1hz=round(mean / 1000 * 100, 3),
        rss_before_feed_mib=round(rss_before, 1),
        rss_peak_mib=round(rss_peak, 1),
        tracemalloc_peak_mib=round(trace_peak / 2**20, 2),
        store_array_mib=round(store_mib, 2),
        gen2_gc_ticks=sum(steady_gen2),
        cpu_ms_per_tick_without_gen2_gc=round(statistics.fmean(without_gc), 3),
        incidents_opened=opened,
        incidents=described,
    )


def _child(n: int, ticks: int, use_engine: bool) -> SizeResult:
    cmd = [sys.executable, "-m", "bench.detector", "--child", str(n), "--ticks", str(ticks)]
    if not use_engine:
        cmd.append("--no-engine")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"bench child for {n} cgroups failed (exit {proc.returncode}): {tail}")
    return SizeResult(**json.loads(proc.stdout.strip().splitlines()[-1]))


def _text(results: list[SizeResult], note: str) -> str:
    lines = []
    if note:
        lines.append(f"note: {note}")
    for r in results:
        lines.append(f"[{r.cgroups} cgroups, {r.ticks} simulated ticks at 1 Hz, path: {r.path}]")
        lines.append(
            f"detector CPU per tick {r.cpu_ms_per_tick_mean:.2f} ms = {r.core_percent_at_1hz:.2f} % of one core at 1 Hz"
            f" (p50 {r.cpu_ms_per_tick_p50:.2f}, p95 {r.cpu_ms_per_tick_p95:.2f}, max {r.cpu_ms_per_tick_max:.2f} ms;"
            " steady state, after the first 60 ticks)"
        )
        lines.append(
            f"full (gen 2) GC ran in {r.gen2_gc_ticks} of {r.ticks - min(60, r.ticks // 2)} ticks;"
            f" mean without those ticks {r.cpu_ms_per_tick_without_gen2_gc:.2f} ms"
        )
        lines.append(
            f"RSS {r.rss_peak_mib:.1f} MiB peak (process; {r.rss_before_feed_mib:.1f} MiB before feeding:"
            f" interpreter + numpy), tracemalloc peak {r.tracemalloc_peak_mib:.2f} MiB,"
            f" store arrays {r.store_array_mib:.2f} MiB"
        )
        if r.incidents_opened is not None:
            lines.append(f"incidents opened: {r.incidents_opened} (injected: hog -> pod0000-0002 neighbor CPU,"
                         " pod0003 self-throttling, pod0004 reclaim)")
            lines.extend(f"  {d}" for d in r.incidents)
    by_n = {r.cgroups: r for r in results}
    sizes = sorted(by_n)
    if len(sizes) >= 2:
        small, big = by_n[sizes[0]], by_n[sizes[-1]]
        cpu_ratio = big.cpu_ms_per_tick_mean / max(small.cpu_ms_per_tick_mean, 1e-9)
        mem_ratio = (big.rss_peak_mib - big.rss_before_feed_mib) / max(small.rss_peak_mib - small.rss_before_feed_mib, 1e-9)
        lines.append(
            f"ratio {big.cgroups}/{small.cgroups} cgroups: CPU per tick x{cpu_ratio:.1f},"
            f" RSS growth while feeding x{mem_ratio:.1f} (cgroups x{big.cgroups / small.cgroups:.0f})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.detector", description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=600, help="simulated ticks per size (default 600)")
    parser.add_argument("--sizes", default="500,50", help="comma-separated cgroup counts (default 500,50)")
    parser.add_argument("--no-engine", action="store_true", help="store/baseline path even if the engine exists")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' = stdout only, as JSON)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ticks < 2:
        parser.error("--ticks must be >= 2")
    use_engine = not args.no_engine
    if args.child is not None:
        print(json.dumps(asdict(run_size(args.child, args.ticks, use_engine))))
        return 0
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not sizes or min(sizes) < 10:
        parser.error("--sizes needs cgroup counts >= 10 (the anomalies need a few LS pods and a hog)")
    note = ""
    if use_engine:
        engine_cls, why = _engine_class()
        if engine_cls is None:
            note = f"incident engine not measured ({why}); measured the store/baseline path plus typical queries"
    else:
        note = "--no-engine: measured the store/baseline path plus typical queries"
    try:
        results = [_child(n, args.ticks, use_engine) for n in sizes]
    except RuntimeError as e:
        print(f"bench.detector: {e}", file=sys.stderr)
        return 1
    doc = {"note": note, "python": sys.version.split()[0], "cpus": os.cpu_count(), "results": [asdict(r) for r in results]}
    if args.json == "-":
        print(json.dumps(doc, indent=2))
        return 0
    print(_text(results, note))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
