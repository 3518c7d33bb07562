# SPDX-License-Identifier: Apache-2.0
"""Culprit naming for the incident engine: who ran on the victim's CPU while it waited, who correlates with
its latency where no one is seen running, and the causes' own culprit hooks wired from outside
(``causes.base.CulpritHook``: the connect cause's servers); and the workloads' history
(``causes.base.WorkloadHistory``) for a cause that ranks its culprits itself (the memory growers of
global reclaim: detector/causes/reclaim.py). Split out of ``detector/incidents.py`` (issue 42).

Culprits are ranked by the share of the victim's wait during which they ran on its CPU (the runqlat
victim x culprit matrix), blended with a CPI2-style correlation of their CPU use with the victim's
latency. The victim and idle time are never culprits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from detector import causes
from detector.causes.base import CULPRIT_MIN_SCORE, MAX_CULPRITS, CulpritHook
from detector.counterfactual import Counterfactuals
from detector.decisions import Target
from detector.model import Culprit, TaskShare
from detector.signals import NodeSignals
from detector.store import SignalStore
from detector.workloads import key_of


class CulpritFinder:
    """The cause rules' culprit callbacks (``causes.CauseContext``) and the workloads' history they may
    read, over the engine's store and counterfactuals. ``targets``, ``node_tasks``, ``culprit_hooks`` and
    ``cpu_request`` are wired from outside (the engine's record of the tick, detector/runtime.py, the agent)."""

    def __init__(self, store: SignalStore, counterfactual: Counterfactuals,
                 cpu_request: Callable[[str], float | None]) -> None:
        self.store = store
        self.counterfactual = counterfactual
        self.cpu_request = cpu_request  # workload key -> its CPU request in cores (None: unknown)
        # workload key -> Target as last seen: rows come only for workloads that moved, and a culprit
        # idle this tick is still named by its cgroup (forgotten with the workload when it goes)
        self.targets: dict[str, Target] = {}
        # The node's own processes outside any pod: its workload key (the root cgroup; tests name a cgroup
        # of their own, never touching the root) and its top commands (detector/node_tasks.py, wired by
        # detector/runtime.py: none without a host to read).
        self.node_key = causes.ROOT_CGROUP
        self.node_tasks: Callable[[str], tuple[TaskShare, ...]] = lambda key: ()
        # A cause's NAME -> its own culprit finder over what the engine does not hold (the agent hooks in
        # each cause's CauseSpec.culprit_source): CauseContext.culprit_hooks.
        self.culprit_hooks: dict[str, CulpritHook] = {}

    def cpu_culprits(self, key: str, foreign: dict[str, float], total_wait: float) -> list[Culprit]:
        """Who ran instead of the victim (``foreign``: workload key -> ns of its waits), by share and correlation."""
        if not foreign or total_wait <= 0:
            return []
        foreign_total = sum(foreign.values())
        culprits = []
        for ck, ns in foreign.items():
            share = ns / total_wait
            corr = self.store.correlation(ck, "cpu_cores", key, "runq_p99_ns", 60.0)
            score = 0.8 * (ns / foreign_total) + 0.2 * max(corr or 0.0, 0.0)
            cost = self.counterfactual.cost(key, ck)
            tasks = self.node_tasks(ck) if ck == self.node_key else ()
            culprits.append(self.judged(Culprit(
                self.target(ck), round(score, 4), who_ran_instead_share=round(share, 4),
                correlation=round(corr or 0.0, 4), cpu_cores=self.last(ck, "cpu_cores"),
                **({} if ck != self.node_key else {"tasks": tasks, "note": node_note(share, tasks)}),
                **({} if cost is None else {
                    "victim_runq_p99_ns": round(cost.p99_ns), "runq_p99_without_ns": round(cost.p99_without_ns),
                    "victim_wait_ms_per_s": round(cost.wait_ms_per_s, 3),
                    "wait_ms_per_s_without": round(cost.wait_ms_per_s_without, 3)}))))
        return self.ranked(culprits)

    def correlation_culprits(self, key: str, signals: NodeSignals) -> list[Culprit]:
        """No who-ran-instead matrix (tp_btf/raw_tp flavours): CPI2-style, suspects' CPU use vs victim latency."""
        culprits = []
        for ck, row in signals.workloads.items():
            if ck == key or row.cpu_cores is None or row.cpu_cores < 0.25:  # CPI2 ignores < 0.25 CPU
                continue
            if not set(row.cpu_weights) & set(signals.workloads[key].cpu_weights):
                continue
            corr = self.store.correlation(ck, "cpu_cores", key, "runq_p99_ns", 60.0) or 0.0
            score = min(1.0, row.cpu_cores) * (0.5 + 0.5 * max(corr, 0.0))
            culprits.append(self.judged(Culprit(self.target(ck), round(score, 4), correlation=round(corr, 4),
                                                cpu_cores=round(row.cpu_cores, 4))))
        return self.ranked(culprits)

    def judged(self, c: Culprit) -> Culprit:
        """The culprit with its CPU request and whether it used more than that (pods with a spec)."""
        key = key_of(c.target)
        request = self.cpu_request(key)
        if request is None:
            return c
        if request == 0 and c.who_ran_instead_share > 0:  # it asked for no CPU, and ran while the victim waited
            return replace(c, cpu_request_cores=0.0, above_request=True, note=f"above its request: it requests no CPU "
                           f"and ran {c.who_ran_instead_share:.0%} of the victim's wait")
        if self.measured(key, "cpu_cores") is None:
            # A pod that just started has no CPU use measured yet (two reads of its cpu.stat): not
            # "within its request", which would rank it after every pod above theirs.
            return replace(c, cpu_request_cores=round(request, 4), note="CPU use not measured yet")
        above = c.cpu_cores > request
        note = f"above its request ({c.cpu_cores:.2f} of {request:.2f} cores)" if above \
            else f"busy within its request ({c.cpu_cores:.2f} of {request:.2f} cores)"
        return replace(c, cpu_request_cores=round(request, 4), above_request=above, note=note)

    @staticmethod
    def ranked(culprits: list[Culprit]) -> list[Culprit]:
        """Culprits above their request (or whose request is unknown) first, each group by score; zero
        scores are never culprits. The node (its processes outside pods) is one when it ran instead, named
        with its top commands: a neighbour cause always names whom it blames (never acted on: not BE)."""
        kept = [c for c in culprits if c.score > CULPRIT_MIN_SCORE]
        kept.sort(key=lambda c: (c.above_request is False, -c.score, c.target.cgroup))
        return kept[:MAX_CULPRITS]

    def recent(self, key: str, signal: str, seconds: float) -> Sequence[float]:
        """The workload's present values of ``signal`` over the last ``seconds``, oldest first
        (causes.base.WorkloadHistory: a cause that ranks its culprits itself reads them)."""
        return self.store.window(key, signal, seconds).values

    def measured(self, entity: str, signal: str) -> float | None:
        """The signal's last value in the last 10 s; None when none was measured (a pod that just started)."""
        s = self.store.stats(entity, signal, 10.0)
        return None if s.empty or s.last is None or math.isnan(s.last) else round(float(s.last), 4)

    def last(self, entity: str, signal: str) -> float:
        return self.measured(entity, signal) or 0.0

    def target(self, key: str) -> Target:
        return self.targets.get(key) or Target(key)

    def is_node(self, c: Culprit) -> bool:
        """The culprit is the node's own processes outside pods (named, never moved)."""
        return key_of(c.target) == self.node_key


def node_note(share: float, tasks: tuple[TaskShare, ...]) -> str:
    """How the node reads as a culprit: its share of the victim's wait and its top commands."""
    said = ", ".join(f"{t.comm} (pid {t.pid}) {t.cpu_share:.0%}" for t in tasks)
    return (f"the node's own processes outside pods ran {share:.0%} of its wait"
            + (f"; by their CPU time: {said}" if said else ""))
