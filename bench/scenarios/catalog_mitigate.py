"""Scenarios for the mitigation side (issue 19), kept apart from catalog.py so its rows merge easily.

- ``self-throttle-bursty``: the LS pod's own batch side-job bursts (60 ms of CPU every 500 ms) next to
  the request loop; on average the pod stays under its 0.5-core quota, but the periods with a burst
  run out of quota and the requests wait. Quota scaling with node headroom should get it back.
- ``self-throttle-steady``: the pod needs 0.9 cores all the time against a 0.25-core quota: more
  than the x3 burst cap. Burst cannot help; the expected outcome is "no neighbour action" (the pass
  notes the verdict and its p99 is not judged).
"""

from __future__ import annotations

import sys

from bench.scenarios.metrics import Truth
from bench.scenarios.runner import VICTIM_CPU, Ctx, ScenarioSpec

NO_NEIGHBOUR_ACTION = "no neighbour action expected"

BURSTY_SIDEJOB = """
import time, sys
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.06:
        pass
    time.sleep(0.5)
"""


def _bursty_setup(ctx: Ctx) -> None:
    ls = ctx.pod("web", "LS")
    ctx.start_victim(ls, "cpu", "--work-ms", "1.5", "--period-ms", "5")  # 0.3 cores


def _bursty_inject(ctx: Ctx) -> None:
    ctx.pods["web"].cgroup.write("cpu", "cpu.cfs_quota_us", "50000")  # 0.5 cores: 0.42 on average, bursts 0.9
    ctx.spawn(ctx.pods["web"], [sys.executable, "-c", BURSTY_SIDEJOB, str(ctx.lifetime_s)], (VICTIM_CPU,))


def _steady_setup(ctx: Ctx) -> None:
    ls = ctx.pod("web", "LS")
    ctx.start_victim(ls, "cpu", "--work-ms", "4.5", "--period-ms", "5")  # 0.9 cores


def _steady_inject(ctx: Ctx) -> None:
    ctx.pods["web"].cgroup.write("cpu", "cpu.cfs_quota_us", "25000")  # 0.25 cores, x3 = 0.75 < 0.9


MITIGATION_SCENARIOS: tuple[ScenarioSpec, ...] = (
    ScenarioSpec("self-throttle-bursty", "LS pod's own bursty side-job runs it out of a 0.5-core quota in bursts",
                 Truth("web", ("self_throttling",), None), _bursty_setup, _bursty_inject),
    ScenarioSpec("self-throttle-steady", "LS pod needs 0.9 cores against a 0.25-core quota (above the x3 cap)",
                 Truth("web", ("self_throttling",), None), _steady_setup, _steady_inject,
                 note=NO_NEIGHBOUR_ACTION),
)
