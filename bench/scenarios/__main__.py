# SPDX-License-Identifier: Apache-2.0
"""python -m bench.scenarios: run the interference scenarios and print one report (see bench/scenarios/__init__.py)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict

from bench.scenarios.catalog import SCENARIOS, by_name
from bench.scenarios.metrics import (
    ActionRecordLite,
    IncidentRecord,
    PassResult,
    Score,
    markdown_summary,
    markdown_table,
    score,
    summarize,
    to_json,
)
from bench.scenarios.peers import (
    PEER_TOOLS,
    agent_startup_cost,
    peer_row,
    peers_markdown,
    run_hackbench,
    run_overhead,
    start_peer,
)
from bench.scenarios.placement import keep_off, no_huge_pages_for_the_bench
from bench.scenarios.runner import VICTIM_CPU, Ctx, Timing, cgroup_hierarchy, measure_softirq_floor, run_pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.scenarios", description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", metavar="NAME", help=f"scenarios to run: {', '.join(s.name for s in SCENARIOS)}")
    p.add_argument("--modes", default=None, help="comma list limiting the modes (none,detect,mitigate,koordlet)")
    p.add_argument("--repeat", type=int, default=1, help="run every scenario N times")
    p.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    p.add_argument("--markdown", action="store_true", help="print the report as markdown (default: the same, plainer)")
    p.add_argument("--quick", action="store_true", help="short windows, no bcc peers, no overhead section")
    p.add_argument("--no-peers", action="store_true", help="skip the bcc tools")
    p.add_argument("--no-overhead", action="store_true", help="skip bench/overhead.py, hackbench and startup cost")
    p.add_argument("--overhead-rounds", type=int, default=3)
    p.add_argument("--docs", metavar="PATH", help="also write the report into PATH (docs/benchmarks.md) between the "
                   "bench.scenarios markers, replacing the previous run's report")
    p.add_argument("--rescore", metavar="JSON", help="re-score and re-render a previous --json result (no run)")
    p.add_argument("--softirq-floor", action="store_true",
                   help="measure the node's softirq load first, with the tcp victim's own traffic running, and keep "
                        "the softirq SLOs at twice it (the VM lane: an emulated CPU's own timer softirqs take ~10x a "
                        "real one's time); off: the defaults")
    p.add_argument("--evict", action="store_true",
                   help="the mitigate mode may evict (evict_enabled, off by default): the pods are served by a fake "
                        "apiserver whose accepted evictions kill the pod's processes, as the kubelet would")
    p.add_argument("--run-s", type=float, default=None,
                   help="seconds each pass runs after the onset (default 14, 7 with --quick): longer in the VM lane, "
                        "where Python starts and acts ~10x slower and the action comes later")
    p.add_argument("--judge-counts", action="store_true",
                   help="judge 'recovered' on the kernel's counts the action moves (BE CPU time on the victim's CPU, "
                        "throttled periods, direct-reclaim entries: bench/scenarios/counts.py) instead of the victim's "
                        "p99: the VM lane, whose latencies under TCG are not exact")
    return p


def rescore(path: str) -> int:
    """Score the recorded passes of an earlier run again (after a change of the scoring rules)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        known = {s.name: s for s in SCENARIOS}
        scores = []
        for p in data["passes"]:
            result = PassResult(p["scenario"], p["mode"], p["baseline_s"], p["run_s"],
                                incidents=[IncidentRecord(**{**i, "culprits": tuple(i["culprits"])}) for i in p["incidents"]],
                                actions=[ActionRecordLite(**a) for a in p["actions"]],
                                samples=[tuple(x) for x in p["samples"]], note=p.get("note", ""),
                                skipped=p.get("skipped", ""), above_own_limit=p.get("above_own_limit", False),
                                pods=p.get("pods") or ["web", "batch", "flood", "server"],
                                runq_ticks=[(x[0], tuple(x[1]), x[2], x[3]) for x in p.get("runq_ticks", [])],
                                kernel_work=[(x[0], x[1]) for x in p.get("kernel_work", [])],
                                # Runs before 2026-11-27 kept the true culprit's only: (s, ms).
                                counterfactual=[(x[0], x[1], x[2]) if len(x) == 3 else
                                                (x[0], known[p["scenario"]].truth.culprit or "", x[1])
                                                for x in p.get("counterfactual", [])],
                                counts=[(x[0], x[1], x[2]) for x in p.get("counts", [])],
                                judge_on_counts=p.get("judge_on_counts", False),
                                after_from_s=p.get("after_from_s"), aftermath=p.get("aftermath", ""))
            scores.append(score(known[p["scenario"]].truth, result))
    except (OSError, KeyError, TypeError, ValueError) as e:
        print(f"error: cannot rescore {path}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    meta = {**data["meta"], "command": data["meta"]["command"] + f" (rescored with --rescore {path})"}
    print(render(scores, summarize(scores), data.get("peers", []), data.get("overhead", {}), meta))
    return 0


DOCS_BEGIN = "<!-- bench.scenarios:begin (written by `make bench`; edits inside are overwritten) -->"
DOCS_END = "<!-- bench.scenarios:end -->"


def write_docs_section(path: str, report: str) -> None:
    """Put ``report`` between the markers in ``path`` (appended with the markers when they are absent)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    block = f"{DOCS_BEGIN}\n{report.strip()}\n{DOCS_END}\n"
    if DOCS_BEGIN in text and DOCS_END in text:
        head, rest = text.split(DOCS_BEGIN, 1)
        tail = rest.split(DOCS_END, 1)[1].lstrip("\n")
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.rescore:
        return rescore(args.rescore)
    if os.geteuid() != 0:
        print("error: needs root (loads BPF programs, creates cgroups and network namespaces)", file=sys.stderr)
        return 2
    try:
        specs = by_name(args.only)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        try:  # said before the run, not after it (in the VM lane only the work tree is writable)
            open(args.json, "a", encoding="utf-8").close()
        except OSError as e:
            print(f"error: --json {args.json}: {e.strerror}", file=sys.stderr)
            return 2
    # The harness (collector, detector, report) runs in this process, in no test pod: kept off the
    # victim's CPU it measures the victim instead of being its neighbour (run 2 of the quiet-machine
    # bench saw the detector, rightly, blame "/" — this process — in the busy-harmless scenario).
    # Every thread of it, and so every helper it starts (the floor's spinner, ip, bcc's tools), from
    # here to the report; each pass does the same again for its own span (run_pass).
    keep_off({VICTIM_CPU})
    no_huge_pages_for_the_bench()  # khugepaged's passes over its heap: the node's work on any CPU, the victim's too
    if args.repeat < 1:
        print("error: --repeat must be at least 1", file=sys.stderr)
        return 2
    modes_filter = set(args.modes.split(",")) if args.modes else None
    timing = Timing.quick() if args.quick else Timing()
    if args.run_s is not None:
        if args.run_s < 5:
            print("error: --run-s must be at least 5", file=sys.stderr)
            return 2
        timing = dataclasses.replace(timing, run_s=args.run_s)
    started = time.monotonic()
    floor = measure_softirq_floor() if args.softirq_floor else None
    if floor is not None:
        print(f"softirq floor (the tcp victim on the victim's CPU, the other CPU busy; busiest second): "
              f"{floor.ms_per_s} ms/s, delay p99 {floor.delay_p99_ms} ms", file=sys.stderr)
    scores: list[Score] = []
    passes: list[dict] = []
    peers: list[dict] = []
    interrupted = False
    try:
        for rep in range(args.repeat):
            for spec in specs:
                for mode in spec.modes:
                    if modes_filter is not None and mode not in modes_filter:
                        continue
                    hook = None
                    peer_runs: list = []
                    if not (args.quick or args.no_peers) and mode == "detect" and rep == 0 and spec.name in (
                            "cpu-neighbor", "softirq-netrx"):
                        measures = "runqlat" if spec.name == "cpu-neighbor" else "softirqs"

                        def hook(ctx: Ctx, onset: float, _measures: str = measures, _runs: list = peer_runs) -> None:
                            # libbpf-tools' and bcc's, side by side: each traces the rest of the run after its load
                            _runs += [start_peer(t, ctx, onset, timing.run_s) for t in PEER_TOOLS if t.measures == _measures]
                    print(f"[{time.monotonic() - started:6.1f} s] {spec.name} / {mode} (run {rep + 1})", file=sys.stderr,
                          flush=True)
                    try:
                        result, trace = run_pass(spec, mode, timing, during=hook, softirq_floor=floor,
                                                 evict=args.evict, judge_on_counts=args.judge_counts)
                    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as e:
                        result, trace = PassResult(spec.name, mode, timing.baseline_s, timing.run_s,
                                                   skipped=f"skipped: {' '.join(str(e).split())[:160]}"), None
                    s = score(spec.truth, result)
                    scores.append(s)
                    passes.append({"repeat": rep, **asdict(result), "score": asdict(s)})
                    for run in peer_runs:
                        if run.thread is not None:
                            run.thread.join(timeout=90)
                        peers.append(peer_row(run, spec.name, result.runq_ticks, trace.ticks if trace else []))
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: every pass cleans up after itself; reporting what ran", file=sys.stderr)
    overhead: dict = {}
    if not (args.quick or args.no_overhead or interrupted):
        print(f"[{time.monotonic() - started:6.1f} s] overhead", file=sys.stderr, flush=True)
        overhead = {"startup": asdict(agent_startup_cost()),
                    "overhead_py": run_overhead(args.overhead_rounds, "pipe"),
                    "hackbench": run_hackbench(args.overhead_rounds)}
    summary = summarize(scores)
    meta = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "python -m bench.scenarios " + " ".join(argv if argv is not None else sys.argv[1:]),
            "kernel": platform.release(), "cgroup": cgroup_hierarchy(), "vm": bool(os.environ.get("NN_VM")),
            "cpus": os.cpu_count(), "elapsed_s": round(time.monotonic() - started, 1),
            "timing": asdict(timing), "interrupted": interrupted, "evict": args.evict,
            "judge_counts": args.judge_counts,
            **({"softirq_floor": asdict(floor), "softirq_slo": floor.slo_floor()} if floor is not None else {})}
    report = render(scores, summary, peers, overhead, meta)
    print(report)
    if args.docs and not interrupted:
        write_docs_section(args.docs, report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(to_json(scores, summary, {"meta": meta, "peers": peers, "overhead": overhead, "passes": passes}))
    return 130 if interrupted else 0


def render(scores: list[Score], summary, peers: list[dict], overhead: dict, meta: dict) -> str:
    where = f"cgroup {meta['cgroup']}, " if "cgroup" in meta else ""  # runs before it was recorded: not said
    where += "VM lane, " if meta.get("vm") else ""
    out = [f"## Scenario benchmark ({meta['date']}, kernel {meta['kernel']}, {where}{meta['cpus']} CPUs, "
           f"{meta['elapsed_s']} s)", "",
           *([f"Softirq SLOs at twice the node's floor with the tcp victim running ({meta['softirq_floor']}): "
              f"{meta['softirq_slo'][0]:.0f} ms/s, delay p99 {meta['softirq_slo'][1]:.2f} ms (or the defaults if higher).",
              ""] if meta.get("softirq_floor") else []),
           *(["Eviction enabled (`--evict`): the mitigate mode may evict BE pods; an accepted eviction kills the "
              "pod's processes (bench/scenarios/kubelet.py).", ""] if meta.get("evict") else []),
           f"Command: `{meta['command']}`", "", markdown_table(scores), "",
           markdown_summary(summary)]
    if peers:
        out += ["", "### bcc peers (same window, same run)", ""]
        if all("package" in p for p in peers):
            out += peers_markdown(peers)
        else:  # rows of runs before 2026-11-28 (--rescore): bcc's tools only, as recorded
            out += [f"- {json.dumps(p, sort_keys=True)}" for p in peers]
    if overhead:
        out += ["", "### Overhead", "", f"- agent startup and RSS: {json.dumps(overhead.get('startup'))}"]
        ov = overhead.get("overhead_py", {})
        if ov.get("markdown"):
            out += ["", ov["markdown"]]
        if ov.get("error"):
            out += [f"- overhead.py error: {ov['error']}"]
        hb = overhead.get("hackbench", {})
        out += [f"- hackbench (none vs noisyneighbor top, alternated): {json.dumps({k: hb.get(k) for k in ('median_s', 'overhead_ratio', 'error') if k in hb})}"]  # noqa: E501
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
