# SPDX-License-Identifier: Apache-2.0
"""cgroup path -> :class:`PodInfo` and :class:`~detector.decisions.Target`, over a pod source."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from detector.cgroups import parse_cgroup_path
from detector.decisions import Target
from detector.pods.model import (
    _PATH_QOS_TO_KOORD,
    PodInfo,
)
from detector.pods.source import PodSource, _CachingSource
from detector.pods.standalone import StandalonePodSource


class PodIndex:
    """cgroup path -> PodInfo and Target, over a source (or a fixed list of pods)."""

    def __init__(self, source: PodSource | Iterable[PodInfo]) -> None:
        if isinstance(source, _CachingSource) or hasattr(source, "get"):
            self._source: Any = source
        else:
            fixed = _CachingSource()
            fixed._replace_all(source)  # type: ignore[arg-type]
            self._source = fixed
        self._standalone: list[tuple[str, PodInfo]] = []
        self._standalone_key: int | None = None

    def pod_for_cgroup(self, cgroup_path: str) -> PodInfo | None:
        ident = parse_cgroup_path(cgroup_path)
        if ident.pod_uid is not None:
            return self._source.get(ident.pod_uid)
        path = ident.path.strip("/")
        for prefix, pod in self._standalone_entities():
            if path == prefix or path.startswith(prefix + "/"):
                return pod
        return None

    def _standalone_entities(self) -> list[tuple[str, PodInfo]]:
        pods = [p for p in self._source.pods() if p.cgroup_path]
        key = hash(tuple(p.uid for p in pods))
        if key != self._standalone_key:
            # Longest prefix first so a nested entity wins over its parent.
            self._standalone = sorted(((p.cgroup_path or "", p) for p in pods), key=lambda t: -len(t[0]))
            self._standalone_key = key
        return self._standalone

    def target_for(self, cgroup_path: str) -> Target:
        """The Target for a cgroup: pod name and koordinator class when known, else from the path."""
        ident = parse_cgroup_path(cgroup_path)
        cgroup = ident.path.strip("/")
        pod = self.pod_for_cgroup(cgroup_path)
        if pod is not None:
            return Target(cgroup=cgroup, pod_uid=None if pod.cgroup_path else pod.uid,
                          namespace=pod.namespace or None, pod=pod.name, qos=pod.qos_class)
        qos = _PATH_QOS_TO_KOORD.get(ident.qos or "")
        if qos is None and isinstance(self._source, StandalonePodSource):
            qos = self._source.classify(cgroup)
        return Target(cgroup=cgroup, pod_uid=ident.pod_uid, qos=qos)
