# SPDX-License-Identifier: Apache-2.0
"""What a probe counter may differ by from the kernel's own counter read at another instant.

Counters are read one at a time (a per-CPU map CPU by CPU, a /proc file line by line), so the
bounds here come from what can happen between two reads of the same counter, never from a
"close enough" constant.
"""

from __future__ import annotations

import math

from probes.memstat import NodeVmstat

# The softirq probe's BPF program misses a small share of the runs /proc/softirqs counts. Measured
# on this machine (kernel 6.18, 2 CPUs, tp_btf and raw_tp alike): over one window perf's count of
# irq:softirq_entry equalled /proc/softirqs exactly (850 and 6596 on the two CPUs) while the probe
# counted 13 fewer on CPU 0; in 60 windows of 2 s, idle and under stress-ng --cpu 2 --hdd 1, the
# probe was 0.2-3.0 % short (worst 21 of 696), all of it TIMER, SCHED and RCU runs, with no
# recursion misses recorded for the program. Cause not found (issue 15's report); the tests allow
# this share on the low side only: the probe never counts more than the kernel.
SOFTIRQ_ENTRY_LOSS = 0.05


# The runqlat probe's count of run-queue waits of a busy cgroup falls short of the kernel's timeslices
# (schedstat pcount) by 0-1.2 % under CI load, with no drop and no recursion miss recorded; in the
# schedinfo flavour, whose wait is the kernel's own run_delay, the sum stays exact while the count is
# short, so sched_switch runs are what is missing (the program's run count was 0.1-0.5 % below
# /proc/stat's ctxt in an earlier measurement). Cause not found; the same as the softirq probe's.
SCHED_SWITCH_LOSS = 0.01


def missed_allowance(runs: int, rate: float) -> float:
    """How many of `runs` events a probe may miss at `rate`: the misses fall one by one at random, so
    their count spreads like a binomial's; the mean plus three standard deviations."""
    mean = rate * runs
    return mean + 3 * math.sqrt(mean)


def softirq_missed_allowance(runs: int) -> float:
    """How many of `runs` softirq runs the probe may miss. The misses fall one by one at random, so
    over a few dozen runs of one vector their count spreads like a binomial's: at rate
    SOFTIRQ_ENTRY_LOSS the mean plus three standard deviations. Seen under CI load (stress-ng on the
    other CPU, file IO): 4 of 52 RCU runs on one CPU over 3.3 s, 7.7 %, above the mean alone."""
    return missed_allowance(runs, SOFTIRQ_ENTRY_LOSS)


def softirq_in_flight(ncpu: int) -> int:
    """Runs counted by the kernel but not yet by the probe at one instant: the kernel bumps
    /proc/softirqs right before the softirq_entry tracepoint, and softirqs do not nest, so at most
    one per CPU sits between the two."""
    return ncpu


def cgroup_reclaim_pgsteal(vmstat: NodeVmstat) -> int | None:
    """Pages reclaimed by cgroup reclaim (limits, memory.reclaim, v1 soft limits), node-wide, from /proc/vmstat.

    pgsteal_{anon,file} count every LRU reclaim; pgsteal_{kswapd,direct,khugepaged,proactive}
    only non-cgroup reclaim (mm/vmscan.c: `if (!cgroup_reclaim(sc)) __count_vm_events(...)`).
    """
    if vmstat.pgsteal_anon is None or vmstat.pgsteal_file is None:
        return None
    global_keys = ("pgsteal_kswapd", "pgsteal_direct", "pgsteal_khugepaged", "pgsteal_proactive")
    return vmstat.pgsteal_anon + vmstat.pgsteal_file - sum(vmstat.raw.get(k, 0) for k in global_keys)
