# SPDX-License-Identifier: Apache-2.0
"""Which pod source to use (``pod_source`` in the policy; ``auto``: the apiserver in a cluster, else the
kubelet if it answers, else standalone).

In a cluster the apiserver watch comes first: it needs only ``pods list/watch`` (deploy/base/rbac.yaml),
while the kubelet's ``/pods`` needs ``nodes/pods`` (fine-grained kubelet authorization) or, on older
kubelets, ``nodes/proxy``, the grant that also allows exec into any pod. The kubelet is used in a cluster
only when asked for (``pod_source: kubelet``, ``--pods kubelet``: deploy/components/kubelet-pod-source)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from detector.pods.apiserver import ApiserverPodSource
from detector.pods.kubelet import KubeletPodSource
from detector.pods.source import _CachingSource
from detector.pods.standalone import StandalonePodSource
from detector.policy import Policy
from probes.host import HostPaths

log = logging.getLogger("noisyneighbor.pods")


def make_pod_source(policy: Policy, paths: HostPaths | None = None,
                    environ: Mapping[str, str] | None = None) -> _CachingSource:
    """The source the policy asks for; ``auto``: the apiserver in a cluster (with a node name), else the
    kubelet if it answers (an agent on a node outside a pod), else standalone. Never raises on an
    unreachable kubelet: that is a stale status, not an error. ``auto`` logs one line saying which
    source it chose and why (the others' reasons included)."""
    env = os.environ if environ is None else environ
    mode = policy.pod_source
    grace = policy.pod_vanish_grace_seconds
    if mode == "standalone":
        return StandalonePodSource.from_policy(policy, paths, vanish_grace_seconds=grace)
    if mode == "kubelet":
        return KubeletPodSource.from_policy(policy, env, vanish_grace_seconds=grace)
    in_cluster = bool(env.get("KUBERNETES_SERVICE_HOST"))
    node = policy.node_name or env.get("NODE_NAME")
    if mode == "apiserver":
        if not node:
            raise ValueError("pod_source apiserver needs kubernetes.node_name (or the NODE_NAME environment variable)")
        return ApiserverPodSource.in_cluster(node, vanish_grace_seconds=grace).start()
    if in_cluster and node:
        log.info("pod source auto: chose apiserver (list+watch of the pods of node %s; the kubelet source is "
                 "opt-in: pod_source kubelet)", node)
        return ApiserverPodSource.in_cluster(node, vanish_grace_seconds=grace).start()
    why_not_kubelet = _try_kubelet(policy, env)
    if isinstance(why_not_kubelet, KubeletPodSource):
        kubelet = why_not_kubelet
        log.info("pod source auto: chose kubelet %s (it answered with %d pods)", kubelet.url, len(kubelet.pods()))
        return kubelet
    why_not_apiserver = "not in a cluster (no KUBERNETES_SERVICE_HOST)" if not in_cluster else \
        "no node name (kubernetes.node_name or NODE_NAME)"
    log.info("pod source auto: chose standalone (cgroup globs): kubelet not usable: %s; apiserver: %s",
             why_not_kubelet, why_not_apiserver)
    return StandalonePodSource.from_policy(policy, paths, vanish_grace_seconds=grace)


def _try_kubelet(policy: Policy, env: Mapping[str, str]) -> KubeletPodSource | str:
    """The kubelet source when it answers now, else the one-line reason it is not usable."""
    if not policy.kubelet_read_only_port and not (policy.kubelet_token_file and Path(policy.kubelet_token_file).exists()):
        return f"no token file {policy.kubelet_token_file} and no read-only port"
    try:
        kubelet = KubeletPodSource.from_policy(policy, env, vanish_grace_seconds=policy.pod_vanish_grace_seconds)
    except ValueError as e:
        return str(e)
    if kubelet.refresh():
        return kubelet
    reason = kubelet.status.reason
    kubelet.close()
    return reason

