# SPDX-License-Identifier: Apache-2.0
"""Pod metadata for the detector: who a cgroup belongs to, its QoS class, requests, priority, owner.

One module per job:

- :mod:`detector.pods.model`: the records (:class:`PodInfo`, :class:`ContainerInfo`) and their parsing;
- :mod:`detector.pods.source`: the :class:`PodSource` interface every source implements: ``pods()``
  returns the last good list and never raises; ``status`` says ``ok`` or stale with a one-line reason;
- :mod:`detector.pods.kubelet`: :class:`KubeletPodSource`, the kubelet's ``GET /pods`` (HTTPS 10250
  with the service-account token and a CA, or the plain read-only port), polled;
- :mod:`detector.pods.apiserver`: :class:`ApiserverPodSource`, list + watch ``/api/v1/pods`` filtered
  by ``spec.nodeName``, in a background thread; relists when the watch expires (410) or breaks;
- :mod:`detector.pods.standalone`: :class:`StandalonePodSource`, no Kubernetes. Entities are cgroups
  named by path (systemd units, docker/containerd scopes), classed LS/BE by the policy's globs;
- :mod:`detector.pods.choice`: :func:`make_pod_source`, the source the policy asks for;
- :mod:`detector.pods.index`: :class:`PodIndex` maps a cgroup path to its :class:`PodInfo` (through
  ``detector.cgroups.parse_cgroup_path``) and builds the :class:`~detector.decisions.Target` for it.

Failure handling is the same everywhere: a kubelet restart (refused/reset), malformed JSON, an
error status or an empty list right after a non-empty one keep the last good data and mark the
source stale; pods that vanish stay resolvable for ``vanish_grace_seconds``, because the samples of
the window being evaluated were taken while they still ran.

The names below are re-exported so ``from detector.pods import X`` keeps working.
"""

from detector.pods.apiserver import ApiserverPodSource
from detector.pods.choice import make_pod_source
from detector.pods.index import PodIndex
from detector.pods.kubelet import KubeletPodSource, expand_kubelet_url
from detector.pods.model import (
    BATCH_CPU,
    BATCH_MEMORY,
    EVICTION_PRIORITY_ANNOTATION,
    KOORD_QOS_CLASSES,
    QOS_LABEL,
    ContainerInfo,
    PodInfo,
    PodParseError,
    koord_qos_class,
    pod_from_dict,
    pods_from_list,
)
from detector.pods.source import PodSource, SourceStatus
from detector.pods.standalone import StandalonePodSource

__all__ = [
    "BATCH_CPU",
    "BATCH_MEMORY",
    "EVICTION_PRIORITY_ANNOTATION",
    "KOORD_QOS_CLASSES",
    "QOS_LABEL",
    "ApiserverPodSource",
    "ContainerInfo",
    "KubeletPodSource",
    "PodIndex",
    "PodInfo",
    "PodParseError",
    "PodSource",
    "SourceStatus",
    "StandalonePodSource",
    "expand_kubelet_url",
    "koord_qos_class",
    "make_pod_source",
    "pod_from_dict",
    "pods_from_list",
]
