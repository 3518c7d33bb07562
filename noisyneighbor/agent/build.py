# SPDX-License-Identifier: Apache-2.0
"""The agent's start-up parts that take the most choosing: its actuators (one journal for all) and its
exporter (pod-metadata labels)."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import Any

from actuators.base import Actuator
from actuators.burst import BurstActuator
from actuators.cgroupfile import CgroupFiles
from actuators.journal import Journal
from actuators.memory import MemorySuppressActuator
from actuators.resctrl import KernelResctrlFs, ResctrlActuator, ResctrlFileIO, resctrl_root
from detector.cgroups import CgroupResolver
from detector.policy import Policy
from noisyneighbor.agent.config import AgentConfig
from noisyneighbor.agent.wiring import (
    JournalIO,
    PodMetadataLabeler,
    ScopedActuator,
    _evict_actuator,
    resize_io,
    suppress_actuator,
)
from noisyneighbor.exporter import Exporter, ResolverLabeler
from probes.cgroupfs import CgroupLayout
from probes.host import HostPaths
from probes.procstat import ProcStatReader


def build_journal(config: AgentConfig, policy: Policy, paths: HostPaths, given_actuators: bool) -> tuple[Journal, Any]:
    """(journal, resize IO). One journal for cgroup and resctrl files, so a crash leaves one file to
    reconcile from; in-place resize entries (cpuSuppressVia resize) go through the apiserver."""
    resize = resize_io(policy) if not given_actuators else None
    io = JournalIO(ResctrlFileIO(resctrl_root(paths), KernelResctrlFs()), resize)
    return Journal(config.journal_dir, read=io.read, write=io.write), resize


def build_actuators(config: AgentConfig, policy: Policy, paths: HostPaths, layout: CgroupLayout | None,
                    journal: Journal, resize: Any, pod_source: Any, proc_stat: ProcStatReader) -> list[Actuator]:
    files = CgroupFiles(paths, layout)
    suppress = suppress_actuator(policy, files, journal, resize)
    actuators: list[Actuator] = [
        *([suppress] if suppress is not None else []),
        BurstActuator(files, journal, policy.cpu_burst, proc_stat=proc_stat),
        MemorySuppressActuator(files, journal),
    ]
    if policy.actuators.resctrl_enabled:
        actuators.append(ResctrlActuator(paths, journal=journal))
    if policy.actuators.evict_enabled:
        evict = _evict_actuator(policy, pod_source)
        if evict is not None:
            actuators.append(evict)
    if config.act_only:
        actuators = [ScopedActuator(a, config.act_only) for a in actuators]
    return actuators


def build_exporter(config: AgentConfig, policy: Policy, paths: HostPaths, layout: CgroupLayout | None,
                   resolver: CgroupResolver, pod_source: Any, qos_of_path: Callable[[str], str | None],
                   container_name: Callable[[str, str], str | None],
                   cgroups_token: Callable[[], Collection[str]] | None = None) -> Exporter:
    labeler = PodMetadataLabeler(ResolverLabeler(resolver), pod_source.get, qos_of_path)
    # Not in the agent's registry: /metrics writes the exporter's series directly (render_text) and
    # adds the registry's (actuator metrics); OpenMetrics scrapes get both through one registry.
    return Exporter(None, labeler, paths=paths, layout=layout,
                    node=policy.node_name or os.environ.get("NODE_NAME") or None,
                    max_cgroups=config.max_cgroups,
                    max_bucket_seconds=config.max_bucket_seconds,
                    min_bucket_seconds=config.min_bucket_seconds,
                    extra_node_series=config.extra_node_series,
                    per_cpu_series=config.per_cpu_series,
                    container_name=container_name,
                    # The source hands out a new record per change of a pod: labels made with one stay
                    # good while it does (a vanished pod's record goes at its grace, and so do they).
                    labels_token=pod_source.get,
                    # The listing the collector watches: a kept key is checked at its path (an lstat) once
                    # per change of it, not every scrape.
                    cgroups_token=cgroups_token)
