# SPDX-License-Identifier: Apache-2.0
"""The agent's policy: SLO thresholds, actuator limits and Koordinator's strategies, from one file.

Two input shapes are accepted, YAML or JSON (JSON is YAML, so one parser reads both):

1. Our own format (see ``deploy/base/config.yaml``)::

       interval_seconds: 1.0
       incident_log: /var/log/noisyneighbor/incidents.jsonl
       slo:        {runq_p99_ms: 5, ...}                 # SloThresholds
       actuators:  {dry_run: true, ...}                  # ActuatorPolicy
       kubernetes: {node_name: n1, pod_source: auto, kubelet_url: ..., ...}
       standalone: {ls_cgroups: ["system.slice/nginx.service"], be_cgroups: ["batch.slice/*"]}
       resource-threshold-config: {cpuSuppressThresholdPercent: 60, ...}
       cpu-burst-config: {policy: auto}
       resource-qos-config: {beClass: {resctrlQOS: {enable: true}}}

   The three Koordinator sections take a strategy directly, a JSON string (as in the ConfigMap), or
   the ConfigMap shape ``{clusterStrategy, nodeStrategies}``.

2. A whole Koordinator ``slo-controller-config`` ConfigMap (``data:`` whose values are JSON strings).
   For each of ``resource-threshold-config``, ``cpu-burst-config`` and ``resource-qos-config``: the
   ``clusterStrategy``, then the first ``nodeStrategies`` entry whose ``nodeSelector`` matches
   ``node_labels`` (deep-merged over it, as koord-manager does). ``colocation-config`` gives the
   reclaim thresholds of batch allocatable (detector/batch.py). Other data keys (``system-config``,
   ...) are not ours and are not parsed.

Keys are matched ignoring case, ``_`` and ``-``, so ``cpu_suppress_threshold_percent``,
``cpuSuppressThresholdPercent`` and Go's case-insensitive ``CPUEvictTimeWindowSeconds`` are the same
key. Koordinator keys we do not implement (``cpuQOS``, ``memoryQOS``, ``cpuEvictPolicy``...) are
accepted and ignored; any other unknown key is an error. Every error is a :class:`PolicyError`
whose message is one line: ``<file>: <key.path>: <what is wrong>``.

One module per job: :mod:`~detector.policy.schema` (the records and their value rules),
:mod:`~detector.policy.fields` (a checked dataclass from a mapping), :mod:`~detector.policy.koordinator`
(Koordinator's strategies translated) and :mod:`~detector.policy.loader` (the file, either shape).
The names below are re-exported so ``from detector.policy import X`` keeps working.
"""

from detector.policy.koordinator import KOORD_KEYS
from detector.policy.loader import load_policy, parse_policy, policy_from_mapping
from detector.policy.schema import (
    CPU_BURST_POLICIES,
    CPU_SUPPRESS_POLICIES,
    POD_SOURCES,
    ActuatorPolicy,
    ColocationStrategy,
    CpuBurstStrategy,
    Policy,
    PolicyError,
    ResctrlQos,
    ResourceQosStrategy,
    ResourceThresholdStrategy,
    SloThresholds,
)

__all__ = [
    "CPU_BURST_POLICIES",
    "CPU_SUPPRESS_POLICIES",
    "KOORD_KEYS",
    "POD_SOURCES",
    "ActuatorPolicy",
    "ColocationStrategy",
    "CpuBurstStrategy",
    "Policy",
    "PolicyError",
    "ResctrlQos",
    "ResourceQosStrategy",
    "ResourceThresholdStrategy",
    "SloThresholds",
    "load_policy",
    "parse_policy",
    "policy_from_mapping",
]
