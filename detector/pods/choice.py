"""Which pod source to use (``pod_source`` in the policy; ``auto`` tries the kubelet, then the
apiserver, then standalone)."""

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
    """The source the policy asks for; ``auto``: kubelet if it answers, else apiserver in a cluster,
    else standalone. Never raises on an unreachable kubelet: that is a stale status, not an error.
    ``auto`` logs one line saying which source it chose and why (the others' reasons included), so
    a silent fallback from the kubelet to the apiserver shows in the agent's log."""
    env = os.environ if environ is None else environ
    mode = policy.pod_source
    if mode == "standalone":
        return StandalonePodSource.from_policy(policy, paths)
    if mode == "kubelet":
        return KubeletPodSource.from_policy(policy, env)
    in_cluster = bool(env.get("KUBERNETES_SERVICE_HOST"))
    node = policy.node_name or env.get("NODE_NAME")
    if mode == "apiserver":
        if not node:
            raise ValueError("pod_source apiserver needs kubernetes.node_name (or the NODE_NAME environment variable)")
        return ApiserverPodSource.in_cluster(node).start()
    why_not_kubelet = _try_kubelet(policy, env)
    if isinstance(why_not_kubelet, KubeletPodSource):
        kubelet = why_not_kubelet
        log.info("pod source auto: chose kubelet %s (it answered with %d pods)", kubelet.url, len(kubelet.pods()))
        return kubelet
    if in_cluster and node:
        log.warning("pod source auto: chose apiserver (pods of node %s): kubelet not usable: %s", node, why_not_kubelet)
        return ApiserverPodSource.in_cluster(node).start()
    why_not_apiserver = "not in a cluster (no KUBERNETES_SERVICE_HOST)" if not in_cluster else \
        "no node name (kubernetes.node_name or NODE_NAME)"
    log.info("pod source auto: chose standalone (cgroup globs): kubelet not usable: %s; apiserver: %s",
             why_not_kubelet, why_not_apiserver)
    return StandalonePodSource.from_policy(policy, paths)


def _try_kubelet(policy: Policy, env: Mapping[str, str]) -> KubeletPodSource | str:
    """The kubelet source when it answers now, else the one-line reason it is not usable."""
    if not policy.kubelet_read_only_port and not (policy.kubelet_token_file and Path(policy.kubelet_token_file).exists()):
        return f"no token file {policy.kubelet_token_file} and no read-only port"
    try:
        kubelet = KubeletPodSource.from_policy(policy, env)
    except ValueError as e:
        return str(e)
    if kubelet.refresh():
        return kubelet
    reason = kubelet.status.reason
    kubelet.close()
    return reason

