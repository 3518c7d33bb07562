# SPDX-License-Identifier: Apache-2.0
"""The agent's listen-queue evidence: the pods' listen queues (probes/listenq.py) read on connect trouble or
on a slow cadence, joined to the connect incidents of the clients (detector/listen_join.py) and carried
in every snapshot (exported per pod)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from detector.decisions import Target
from detector.listen_join import PROBE as LISTEN_JOIN_PROBE
from detector.listen_join import ListenJoin
from detector.runtime import Detector
from noisyneighbor.agent.logs import _one_line
from probes.cgroupfs import CgroupLayout
from probes.listenq import ListenReport, ListenWatch
from probes.snapshot import NodeSnapshot

log = logging.getLogger("noisyneighbor.agent")


class ListenQueues:
    """Reads the pods' listen queues when a tick's connects had trouble (failed, SYN retransmitted, slow)
    or the slow cadence is due; :meth:`attach` puts the last read into each snapshot."""

    def __init__(self, proc: str, layout: CgroupLayout | None, detector: Detector, slow_ns: float) -> None:
        self.layout = layout
        self.detector = detector
        self.watch = ListenWatch(proc, self._cgroup_dir)
        self.join = ListenJoin(self._workload_of_id, self._target_of_owner, slow_ns=slow_ns)
        self.report: ListenReport | None = None
        self.errors: set[str] = set()  # each reason once: a missing capability fails every netns
        self._prev_tcp: Any = None  # the connect probe's last snapshot (detector.listen_join.PROBE)

    def attach(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """``snapshot`` with the last listen-queue read (read now when due); errors are logged once per
        reason and never cost the tick's detection (listen queues are extra evidence)."""
        errors: list[str] = []
        try:
            tcp = snapshot.probe(LISTEN_JOIN_PROBE)
            trouble = self.join.observe_tcp(self._prev_tcp, tcp)
            self._prev_tcp = tcp
            reason = self.watch.due(trouble)
            if reason is not None:
                index = self.detector.index
                owners = [p for p in self.detector.cgroup_paths() if p != "/" and index.is_workload_root(p)]
                report = self.watch.read(owners, reason)
                errors = list(report.errors)
                self.report = report
                self.join.observe_report(report)
        except Exception as e:  # listen queues are extra evidence: never worth the tick's detection
            self._prev_tcp = snapshot.probe(LISTEN_JOIN_PROBE)
            errors = [f"listenq: {type(e).__name__}: {_one_line(e)}"]
        for error in errors:
            why = error.split(" (netns ", 1)[0]
            if why not in self.errors:
                self.errors.add(why)
                log.warning("%s (the first; each reason is logged once)", error)
        if self.report is None:
            return snapshot
        return dataclasses.replace(snapshot, listen=self.report)

    def health(self) -> dict[str, Any]:
        """What /healthz says of the listen queues."""
        return {
            "reads": self.watch.reads,
            "last_reason": self.report.reason if self.report else None,
            "namespaces": len(self.report.namespaces) if self.report else 0,
            "errors": sorted(self.errors)[-5:],
        }

    def _cgroup_dir(self, path: str) -> Path | None:
        hierarchy = self.layout.hierarchy_for("cpu") if self.layout is not None else None
        return hierarchy.path_of(path) if hierarchy is not None else None

    def _workload_of_id(self, cgroup_id: int) -> str | None:
        """The workload key of a tcpconnect cgroup id (keyed like runqlat: the cpu hierarchy)."""
        w = self.detector.ids.workload_of(cgroup_id, self.detector.builder.cpu_h)
        return w.key if w is not None else None

    def _target_of_owner(self, path: str) -> Target:
        return self.detector.index.workload_of(path).target
