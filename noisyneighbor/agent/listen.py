# SPDX-License-Identifier: Apache-2.0
"""The agent's listen-queue evidence: the pods' listen queues (probes/listenq.py) read on connect trouble or
on a slow cadence, joined to the incidents of the clients by the culprit sources the causes declare over
them (``CauseSpec.culprit_source`` reading a ``ListenReport``: the connect cause's, which names the
servers), hooked into the incident engine here, and carried in every snapshot (exported per pod)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from detector import causes
from detector.causes.base import CulpritSource, SourceWiring
from detector.decisions import Target
from detector.runtime import Detector
from detector.signals import ProbeTick
from noisyneighbor.agent.logs import _one_line
from probes.cgroupfs import CgroupLayout
from probes.listenq import ListenReport, ListenWatch
from probes.snapshot import NodeSnapshot

log = logging.getLogger("noisyneighbor.agent")


class ListenQueues:
    """Reads the pods' listen queues when a culprit source over them says the tick had trouble (the connect
    cause's: connects failed, SYN retransmitted or slow) or the slow cadence is due; :meth:`attach` puts the
    last read into each snapshot."""

    def __init__(self, proc: str, layout: CgroupLayout | None, detector: Detector) -> None:
        self.layout = layout
        self.detector = detector
        self.watch = ListenWatch(proc, self._cgroup_dir)
        self.sources: list[CulpritSource] = []
        wiring = SourceWiring(self._workload_of_id, self._target_of_owner, detector.engine.slo)
        for spec in causes.CULPRIT_SOURCES:  # each source over the listen queues is its cause's culprit hook
            if spec.culprit_source is None or spec.culprit_source.reads is not ListenReport:
                continue  # another reading's
            source = spec.culprit_source.build(wiring)
            detector.engine.culprit_hooks[spec.cause] = source.culprits_for
            self.sources.append(source)
        self.report: ListenReport | None = None
        self.errors: set[str] = set()  # each reason once: a missing capability fails every netns

    def attach(self, snapshot: NodeSnapshot, tick: ProbeTick) -> NodeSnapshot:
        """``snapshot`` with the last listen-queue read (read now when due); errors are logged once per
        reason and never cost the tick's detection (listen queues are extra evidence). ``tick``: the
        detector's probe_tick of ``snapshot``, which its step then takes (each probe's interval once)."""
        errors: list[str] = []
        try:
            # Every source hears every tick, with the detector's probe intervals.
            trouble = [source.observe(tick) for source in self.sources]
            reason = self.watch.due(any(trouble))
            if reason is not None:
                index = self.detector.index
                owners = [p for p in self.detector.cgroup_paths() if p != "/" and index.is_workload_root(p)]
                report = self.watch.read(owners, reason)
                errors = list(report.errors)
                self.report = report
                for source in self.sources:
                    source.observe_report(report)
        except Exception as e:  # listen queues are extra evidence: never worth the tick's detection
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
        """The workload key of a cgroup id a source reads from its probe (keyed like runqlat: the cpu hierarchy)."""
        w = self.detector.ids.workload_of(cgroup_id, self.detector.builder.cpu_h)
        return w.key if w is not None else None

    def _target_of_owner(self, path: str) -> Target:
        return self.detector.index.workload_of(path).target
