# SPDX-License-Identifier: Apache-2.0
"""The apiserver and kubelet of a bench pass, for ``--evict``: an eviction that really removes the pod.

The agent evicts through the Eviction API (actuators/evict.py), and the bench's pods are cgroups with
processes, not pods of a cluster. ``PassKube`` serves them on the apiserver's real REST paths
(testkit/fakekube.py) and does what the kubelet does once the apiserver accepted an eviction and the pod's
grace period ran out: it kills the pod's processes (every task of its own cgroup), then deletes the pod.
A memory grower's heap is freed that way, which a cap at its usage never does: the state after an
eviction is the node without the culprit, the state issue 28's counterfactual predicts.
"""

from __future__ import annotations

from collections.abc import Mapping

from testkit.fakekube import FakeKube, make_pod
from testkit.sandbox import kill_processes
from testkit.scenario_support import PodCgroup

GRACE_S = 0.5  # accepted eviction -> processes killed (a BE batch pod stops at once; the kubelet's default is 30 s)
NAMESPACE = "default"  # as the bench's pods are named (default/web, default/batch)


class PassKube(FakeKube):
    """A pass's pods on a fake apiserver; an accepted eviction kills the pod's processes after GRACE_S."""

    def __init__(self, pods: Mapping[str, PodCgroup]) -> None:
        super().__init__(eviction_delete_delay=GRACE_S)
        self._cgroups = dict(pods)
        self.killed: dict[str, int] = {}  # pod name -> processes killed
        for name, pod in self._cgroups.items():
            self.add_pod(make_pod(name, NAMESPACE, pod.uid, qos_class=pod.qos_class))

    def remove_pod(self, namespace: str, name: str) -> bool:
        pod = self._cgroups.get(name) if namespace == NAMESPACE else None
        if pod is not None:
            # Every process of the pod's cgroups and its containers' below them.
            self.killed[name] = kill_processes(pod.cgroup.dirs.values(), below=True)
        return super().remove_pod(namespace, name)

