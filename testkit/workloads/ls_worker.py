# SPDX-License-Identifier: Apache-2.0
"""A latency-sensitive worker: W ms of CPU work every P ms, for D seconds (or until killed).

A victim that only sleeps is favoured by wakeup preemption and shows no interference
(shared/reference/detection.md); one that needs CPU each period does. It prints one line at the
end: the p50/p99 of its own response time (work start delay + work) in ms, for scenario reports.

    python ls_worker.py --work-ms 1.5 --period-ms 5 --seconds 30
"""

from __future__ import annotations

import argparse
import signal
import sys
import time


def busy(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--work-ms", type=float, default=1.5)
    p.add_argument("--period-ms", type=float, default=5.0)
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args()
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    period = int(args.period_ms * 1e6)
    work = int(args.work_ms * 1e6)
    t_end = time.perf_counter_ns() + int(args.seconds * 1e9)
    due = time.perf_counter_ns()
    latencies = []
    while not stop and time.perf_counter_ns() < t_end:
        due += period
        start = time.perf_counter_ns()
        busy(work)
        latencies.append(time.perf_counter_ns() - start)
        delay = due - time.perf_counter_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
        else:
            due = time.perf_counter_ns()  # overran: do not try to catch up in a burst
    latencies.sort()
    if latencies:
        p50 = latencies[len(latencies) // 2] / 1e6
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] / 1e6
        print(f"ls_worker n={len(latencies)} p50_ms={p50:.3f} p99_ms={p99:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
