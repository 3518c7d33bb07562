# SPDX-License-Identifier: Apache-2.0
"""No Kubernetes: cgroups that are workloads (systemd units, container scopes) as a pod source."""

from __future__ import annotations

import fnmatch
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from detector.cgroups import parse_cgroup_path
from detector.pods.model import (
    ContainerInfo,
    PodInfo,
)
from detector.pods.source import _CachingSource, _describe_error
from detector.policy import Policy
from probes.cgroupfs import CgroupLayout, discover
from probes.host import HostPaths

_UNIT_RE = re.compile(r"^[^/]+\.(service|scope)$")
_SKIP_DIRS = {"init.scope"}


class StandalonePodSource(_CachingSource):
    """No Kubernetes: the cgroups that are workloads become entities.

    An entity is a systemd service or scope (``system.slice/nginx.service``), a docker or
    containerd container (``docker-<id>.scope``, ``/docker/<id>``), or any cgroup matching one of the
    ``ls_cgroups``/``be_cgroups`` globs (fnmatch on the path without leading slash). Matching a BE
    glob makes it BE, an LS glob LS (BE wins when both match), neither leaves it unclassed (None).
    The uid is ``cgroup:<path>``, the namespace empty, the name the last path component.
    """

    name = "standalone"

    def __init__(
        self,
        paths: HostPaths | None = None,
        layout: CgroupLayout | None = None,
        *,
        ls_cgroups: Iterable[str] = (),
        be_cgroups: Iterable[str] = (),
        max_depth: int = 6,
        refresh_interval: float = 5.0,
        vanish_grace_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(vanish_grace_seconds, clock)
        self.paths = paths or HostPaths()
        self.layout = layout
        self.ls_cgroups = tuple(g.strip("/") for g in ls_cgroups)
        self.be_cgroups = tuple(g.strip("/") for g in be_cgroups)
        self.max_depth = max_depth
        self.refresh_interval = refresh_interval
        self._last_attempt: float | None = None

    @classmethod
    def from_policy(cls, policy: Policy, paths: HostPaths | None = None, **kwargs: Any) -> StandalonePodSource:
        return cls(paths, ls_cgroups=policy.ls_cgroups, be_cgroups=policy.be_cgroups, **kwargs)

    def classify(self, cgroup_path: str) -> str | None:
        """LS/BE by the globs, or None."""
        p = cgroup_path.strip("/")
        if any(fnmatch.fnmatchcase(p, g) for g in self.be_cgroups):
            return "BE"
        if any(fnmatch.fnmatchcase(p, g) for g in self.ls_cgroups):
            return "LS"
        return None

    def pods(self) -> list[PodInfo]:
        last = self._last_attempt
        if last is None or self._clock() - last >= self.refresh_interval:
            self.refresh()
        return super().pods()

    def refresh(self) -> bool:
        self._last_attempt = self._clock()
        try:
            layout = self.layout or discover(self.paths)
            h = layout.cpu
            if h is None:
                self._failed("no cpu cgroup hierarchy found")
                return False
            entities = [self._entity(p) for p in self._walk(h.mount)]
        except OSError as e:
            self._failed(f"cannot walk cgroups: {_describe_error(e)}")
            return False
        self._replace_all(entities)
        return True

    def _walk(self, mount: Path) -> list[str]:
        found: list[str] = []
        stack: list[tuple[Path, str, int]] = [(mount, "", 0)]
        while stack:
            fs_dir, rel, depth = stack.pop()
            try:
                with os.scandir(fs_dir) as it:
                    children = [e.name for e in it if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue  # vanished while walking
            for child in children:
                path = f"{rel}/{child}".lstrip("/")
                if child in _SKIP_DIRS:
                    continue
                if self._is_entity(path):
                    found.append(path)
                    continue  # a unit's sub-cgroups belong to it
                if depth + 1 < self.max_depth:
                    stack.append((fs_dir / child, path, depth + 1))
        return sorted(found)

    def _is_entity(self, path: str) -> bool:
        if self.classify(path) is not None:
            return True
        ident = parse_cgroup_path(path)
        if ident.kind in ("docker", "container"):
            return True
        name = path.rsplit("/", 1)[-1]
        return bool(_UNIT_RE.match(name)) and ident.kind in ("system", "user", "other")

    def _entity(self, path: str) -> PodInfo:
        ident = parse_cgroup_path(path)
        container = ()
        if ident.container_id:
            container = (ContainerInfo(name=path.rsplit("/", 1)[-1], container_id=ident.container_id, runtime=ident.runtime),)
        return PodInfo(
            uid=f"cgroup:{path}", namespace="", name=path.rsplit("/", 1)[-1], qos_class=self.classify(path),
            containers=container, cgroup_path=path, phase="Running",
        )

