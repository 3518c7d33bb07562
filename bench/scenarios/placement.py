# SPDX-License-Identifier: Apache-2.0
"""Where the bench's own work runs: off the victim's CPU(s), for the whole run and for each pass.

The bench is no scenario's workload: its orchestrator, the detector's ticks, the count sampler and
timeline, the scorer, the fake apiserver's and kubelet's threads, and the helpers it starts (``ip``,
bcc peers, the softirq floor's spinner) run in its own process tree. On the host that tree sits in its
own cgroup, a sandbox root the scorer never blames; in the VM lane it is in the root cgroup ``/``, where
the detector rightly names whatever of it runs on the victim's CPU ("the node's own processes"), and
under qemu TCG each of its ticks costs ~10 times the host's. ``make bench-vm-mitigate`` at 2026-11-29
17:53 UTC opened cpu-neighbor run 2's incident 1.9 s before the onset on ``/`` (12 ms/s of the victim's
wait); at 14:38 a softirq incident in run 1 had the same source.

What a guest run showed (perf's sched_switch on CPU 1 and every task's allowed CPUs, 2026-11-29 18:47
UTC): ``sched_setaffinity(0, ...)`` moves only the calling thread, and the bench's process already had a
second thread from its imports (numpy's OpenBLAS pool, allowed on both CPUs) when ``__main__`` pinned
its main thread (an idle pool, but one the kernel may run on CPU 1). With every thread pinned the bench's
Python ran nowhere on CPU 1 in the pass, and the root cgroup's time there in the baseline was kernel
threads: khugepaged (80 ms in one second: it wakes every 10 s, 30-80 ms a pass under TCG, and collapses
the pages of the processes it scans; which process's it was that run did not record, the bench's heap
is the largest and the one that grows through a run), an unbound kworker flushing the scratch disk,
rcu_preempt, jbd2. So :func:`keep_off` moves every thread of this
process (threads and processes started afterwards inherit it; the pods' workloads and antagonists are
placed by the scenario on their own CPUs after their fork), and :func:`no_huge_pages_for_the_bench` puts
the bench's memory out of khugepaged's reach while the pods keep the node's setting (:func:`workload_fork`).

What stays on the victim's CPU is the scenario's: the victim's own request loop (its client and, in ``tcp``
mode, its forked server: the LS pod's work, whose latency is the measurement) and the antagonist the
scenario puts there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterable, Iterator

PR_SET_THP_DISABLE = 41  # <linux/prctl.h>
PR_GET_THP_DISABLE = 42


def thread_ids(pid: int | str = "self") -> list[int]:
    """The threads of process ``pid`` (``/proc/<pid>/task``); [] once it has exited."""
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return []


def allowed_cpus(tid: int) -> frozenset[int] | None:
    """A thread's allowed CPUs; None once it has exited."""
    try:
        return frozenset(os.sched_getaffinity(tid))
    except (ProcessLookupError, FileNotFoundError):
        return None


def bench_cpus(victim_cpus: Iterable[int]) -> frozenset[int]:
    """The CPUs the bench may use: this process's allowed CPUs but the victim's; all of them on a node
    that has no other (a one-CPU machine: the bench cannot leave, and says nothing about it)."""
    allowed = frozenset(os.sched_getaffinity(0))
    return allowed - frozenset(victim_cpus) or allowed


def keep_off(victim_cpus: Iterable[int]) -> dict[int, frozenset[int]]:
    """Every thread of this process allowed only :func:`bench_cpus`; returns what each thread had."""
    away = bench_cpus(victim_cpus)
    before: dict[int, frozenset[int]] = {}
    for tid in thread_ids():
        had = allowed_cpus(tid)
        if had is None:
            continue  # exited since the listing
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, away)
            before[tid] = had
    return before


@contextlib.contextmanager
def off_victim_cpus(victim_cpus: Iterable[int]) -> Iterator[frozenset[int]]:
    """This process's threads off ``victim_cpus``, and its memory out of khugepaged's reach
    (:func:`no_huge_pages_for_the_bench`), while the block runs; as they were afterwards (threads started
    inside keep what they inherited and end with the block's work). Yields the bench's CPUs."""
    before = keep_off(victim_cpus)
    huge_pages_were_off = huge_pages_disabled()
    no_huge_pages_for_the_bench()
    try:
        yield bench_cpus(victim_cpus)
    finally:
        if not huge_pages_were_off:
            _prctl(PR_SET_THP_DISABLE, 0)
        for tid, cpus in before.items():
            with contextlib.suppress(ProcessLookupError, OSError):
                os.sched_setaffinity(tid, cpus)


def bench_threads_on(cpus: Iterable[int], pids: Iterable[int] = ()) -> list[tuple[int, int, frozenset[int]]]:
    """(pid, tid, allowed CPUs) of every thread of this process and of ``pids`` that may run on ``cpus``:
    what the bench would put on the victim's CPU. [] is what a pass wants."""
    wanted = frozenset(cpus)
    out = []
    for pid in (os.getpid(), *pids):
        for tid in thread_ids(pid):
            allowed = allowed_cpus(tid)
            if allowed is not None and allowed & wanted:
                out.append((pid, tid, allowed))
    return out


# -- huge pages: khugepaged's work for the bench's memory ----------------------------------------------------
# khugepaged, a kernel thread of the root cgroup, may run on any CPU: the victim waits behind it as "the node".


def _prctl(option: int, arg: int = 0) -> int:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0))
    except (OSError, AttributeError):
        return -1


def huge_pages_disabled() -> bool:
    """Whether this process's memory is out of reach of transparent huge pages (and khugepaged)."""
    return _prctl(PR_GET_THP_DISABLE) == 1


def no_huge_pages_for_the_bench() -> bool:
    """PR_SET_THP_DISABLE on this process: khugepaged skips its memory. A setting of this process only,
    inherited by what it forks: :func:`workload_fork` gives the pods' processes the node's. False where
    the kernel refuses it."""
    return _prctl(PR_SET_THP_DISABLE, 1) == 0


@contextlib.contextmanager
def workload_fork() -> Iterator[None]:
    """Around a fork of a workload (a pod's process, the floor's victim): the child gets the node's huge
    page setting, not the bench's. The flag is copied at fork and kept across exec, so it is this
    process's own for the fork's span only (the bench forks from one thread)."""
    was_off = huge_pages_disabled()
    if was_off:
        _prctl(PR_SET_THP_DISABLE, 0)
    try:
        yield
    finally:
        if was_off:
            _prctl(PR_SET_THP_DISABLE, 1)
