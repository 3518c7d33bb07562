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
   ``node_labels`` (deep-merged over it, as koord-manager does). Other data keys
   (``colocation-config``, ``system-config``, ...) are not ours and are not parsed.

Keys are matched ignoring case, ``_`` and ``-``, so ``cpu_suppress_threshold_percent``,
``cpuSuppressThresholdPercent`` and Go's case-insensitive ``CPUEvictTimeWindowSeconds`` are the same
key. Koordinator keys we do not implement (``cpuQOS``, ``memoryQOS``, ``cpuEvictPolicy``...) are
accepted and ignored; any other unknown key is an error. Every error is a :class:`PolicyError`
whose message is one line: ``<file>: <key.path>: <what is wrong>``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class PolicyError(ValueError):
    """Bad policy input. ``str(exc)`` is one line naming the file, the key path and the problem."""

    def __init__(self, message: str) -> None:
        # Keys and values come from the file and may hold line breaks (a YAML key "\n\n" is legal):
        # unprintable characters are escaped here, so the message stays one line whatever the input.
        super().__init__("".join(c if c.isprintable() else repr(c)[1:-1] for c in message))


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------

CPU_SUPPRESS_POLICIES = ("cpuset", "cfsQuota")
CPU_BURST_POLICIES = ("none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto")
POD_SOURCES = ("auto", "kubelet", "apiserver", "standalone")

# Range checks per field: (min, max); None means unbounded on that side.
_Range = tuple[float | None, float | None]
_PERCENT: _Range = (0, 100)


@dataclass(frozen=True, slots=True)
class ResourceThresholdStrategy:
    """Koordinator ``resource-threshold-config``: BE CPU suppress and BE eviction thresholds."""

    enable: bool = True
    cpu_suppress_threshold_percent: int = 65
    cpu_suppress_policy: str = "cpuset"  # "cpuset" | "cfsQuota"
    cpu_suppress_min_cpus: int = 2  # our extension: the cpuset floor koordlet hard-codes
    memory_evict_threshold_percent: int = 70
    memory_evict_lower_percent: int | None = None  # None -> threshold - 2 (koordlet's default)
    cpu_evict_be_satisfaction_upper_percent: int = 90
    cpu_evict_be_satisfaction_lower_percent: int = 60
    cpu_evict_be_usage_threshold_percent: int = 90
    cpu_evict_time_window_seconds: int = 300
    cpu_evict_enabled: bool = False
    memory_evict_enabled: bool = False

    @property
    def memory_evict_lower(self) -> int:
        """The percent memory eviction stops at, with koordlet's default applied."""
        if self.memory_evict_lower_percent is not None:
            return self.memory_evict_lower_percent
        return max(0, self.memory_evict_threshold_percent - 2)


@dataclass(frozen=True, slots=True)
class CpuBurstStrategy:
    """Koordinator ``cpu-burst-config``."""

    policy: str = "none"  # none | cpuBurstOnly | cfsQuotaBurstOnly | auto
    cpu_burst_percent: int = 1000
    cfs_quota_burst_percent: int = 300
    cfs_quota_burst_period_seconds: int = -1  # -1: unlimited
    share_pool_threshold_percent: int = 50

    @property
    def cpu_burst_enabled(self) -> bool:
        return self.policy in ("cpuBurstOnly", "auto")

    @property
    def cfs_quota_burst_enabled(self) -> bool:
        return self.policy in ("cfsQuotaBurstOnly", "auto")


@dataclass(frozen=True, slots=True)
class ResctrlQos:
    """One QoS class's ``resctrlQOS``: L3 ways as a [start, end] percent range and MBA percent."""

    enable: bool = False
    cat_range_start_percent: int = 0
    cat_range_end_percent: int = 100
    mba_percent: int = 100


@dataclass(frozen=True, slots=True)
class ResourceQosStrategy:
    """Koordinator ``resource-qos-config``; only ``resctrlQOS`` is ours, per class LSR, LS and BE."""

    lsr: ResctrlQos = field(default_factory=ResctrlQos)
    ls: ResctrlQos = field(default_factory=ResctrlQos)
    be: ResctrlQos = field(default_factory=lambda: ResctrlQos(cat_range_end_percent=30))


@dataclass(frozen=True, slots=True)
class SloThresholds:
    """Absolute SLOs per victim signal, plus the anomaly and hysteresis knobs of the detector."""

    runq_p99_ms: float = 5.0
    connect_p99_ms: float = 200.0
    reclaim_stall_ms_per_s: float = 20.0
    psi_cpu_some_percent: float = 20.0
    psi_memory_some_percent: float = 10.0
    psi_io_some_percent: float = 20.0
    softirq_delay_p99_ms: float = 2.0
    softirq_ms_per_s: float = 100.0  # softirq run time on its CPUs (a tenth of a CPU) before it is a breach
    k_sigma: float = 4.0  # a signal also breaches when it is k sigma above its own baseline
    breach_seconds: float = 2.0  # how long a breach must last before it is an incident
    clear_windows: int = 5  # clean windows in a row before an incident ends (hysteresis)
    min_baseline_samples: int = 30  # the k-sigma rule is off until the baseline has this many


@dataclass(frozen=True, slots=True)
class ActuatorPolicy:
    """What actuators may do and how fast; dry-run by default, so installing changes nothing."""

    dry_run: bool = True
    max_changes_per_minute: int = 6
    verify_intervals: int = 5
    verify_min_improvement_percent: float = 10.0
    cooldown_seconds: float = 20.0
    suppress_enabled: bool = True
    evict_enabled: bool = False
    burst_enabled: bool = True
    resctrl_enabled: bool = False
    evictions_per_minute: int = 2
    cpu_evict_cooldown_seconds: float = 20.0
    memory_evict_cooldown_seconds: float = 4.0


_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True, slots=True)
class Policy:
    slo: SloThresholds = field(default_factory=SloThresholds)
    resource_threshold: ResourceThresholdStrategy = field(default_factory=ResourceThresholdStrategy)
    cpu_burst: CpuBurstStrategy = field(default_factory=CpuBurstStrategy)
    resource_qos: ResourceQosStrategy = field(default_factory=ResourceQosStrategy)
    actuators: ActuatorPolicy = field(default_factory=ActuatorPolicy)
    node_name: str | None = None
    interval_seconds: float = 1.0
    pod_source: str = "auto"  # auto | kubelet | apiserver | standalone
    # ${HOST_IP}: the node's IP (DaemonSet env from status.hostIP); in a pod 127.0.0.1 is the pod's own
    # loopback. The default applies outside a pod (a systemd agent on the node). See detector.pods.
    kubelet_url: str = "https://${HOST_IP:-127.0.0.1}:10250"
    kubelet_token_file: str | None = f"{_SA_DIR}/token"
    kubelet_ca_file: str | None = f"{_SA_DIR}/ca.crt"
    kubelet_insecure_skip_verify: bool = False
    kubelet_read_only_port: int | None = None  # e.g. 10255; plain HTTP, no auth, when set
    incident_log: str | None = None
    # Standalone mode (no Kubernetes): cgroup path globs (fnmatch, relative to the hierarchy root,
    # no leading slash) naming latency-sensitive and best-effort cgroups. Tuples: Policy is frozen.
    ls_cgroups: tuple[str, ...] = ()
    be_cgroups: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
# Validation rules beyond the type
# --------------------------------------------------------------------------------------------

_RANGES: dict[type, dict[str, _Range]] = {
    ResourceThresholdStrategy: {
        "cpu_suppress_threshold_percent": _PERCENT,
        "cpu_suppress_min_cpus": (0, None),
        "memory_evict_threshold_percent": _PERCENT,
        "memory_evict_lower_percent": _PERCENT,
        "cpu_evict_be_satisfaction_upper_percent": _PERCENT,
        "cpu_evict_be_satisfaction_lower_percent": _PERCENT,
        "cpu_evict_be_usage_threshold_percent": _PERCENT,
        "cpu_evict_time_window_seconds": (1, None),
    },
    CpuBurstStrategy: {
        "cpu_burst_percent": (0, None),
        "cfs_quota_burst_percent": (100, None),  # a quota scaled below its base is not a burst
        "cfs_quota_burst_period_seconds": (-1, None),
        "share_pool_threshold_percent": _PERCENT,
    },
    ResctrlQos: {
        "cat_range_start_percent": _PERCENT,
        "cat_range_end_percent": _PERCENT,
        "mba_percent": (1, 100),
    },
    SloThresholds: {  # the fields bounding a signal get their ranges from detector.catalog (_ranges_of)
        "k_sigma": (0, None),
        "breach_seconds": (0, None),
        "clear_windows": (1, None),
        "min_baseline_samples": (1, None),
    },
    ActuatorPolicy: {
        "max_changes_per_minute": (0, None),
        "verify_intervals": (1, None),
        "verify_min_improvement_percent": _PERCENT,
        "cooldown_seconds": (0, None),
        "evictions_per_minute": (0, None),
        "cpu_evict_cooldown_seconds": (0, None),
        "memory_evict_cooldown_seconds": (0, None),
    },
    Policy: {
        "interval_seconds": (0.01, 3600),
        "kubelet_read_only_port": (1, 65535),
    },
}

_CHOICES: dict[type, dict[str, tuple[str, ...]]] = {
    ResourceThresholdStrategy: {"cpu_suppress_policy": CPU_SUPPRESS_POLICIES},
    CpuBurstStrategy: {"policy": CPU_BURST_POLICIES},
    Policy: {"pod_source": POD_SOURCES},
}

# Spellings of a choice that mean the same (our decisions use "cfs_quota").
_CHOICE_ALIASES = {"cfs_quota": "cfsQuota", "cfsquota": "cfsQuota"}

# Koordinator keys we accept and do not use, per section, in normalized form.
_KOORD_IGNORED = {
    ResourceThresholdStrategy: {"cpuevictpolicy", "memoryevictpolicy", "name"},
    CpuBurstStrategy: {"name"},
}
_QOS_CLASS_IGNORED = {"cpuqos", "memoryqos", "blkioqos", "networkqos"}
_QOS_STRATEGY_IGNORED = {"systemclass", "lseclass", "cgroupbase", "cgrouproot", "policies", "name"}

KOORD_KEYS = {
    "resource-threshold-config": "resource_threshold",
    "cpu-burst-config": "cpu_burst",
    "resource-qos-config": "resource_qos",
}


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def load_policy(path: str | os.PathLike[str] | None, node_labels: Mapping[str, str] | None = None) -> Policy:
    """Read a policy file (our format or a Koordinator ConfigMap); None gives the defaults.

    ``node_labels`` select the ConfigMap's ``nodeStrategies``; without them only the cluster
    strategy applies. Raises :class:`PolicyError` (one line) on any bad input, before returning
    anything, so a bad file never yields a half-applied policy.
    """
    if path is None:
        return Policy()
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError(f"{source}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise PolicyError(f"{source}: not UTF-8 text: byte {e.start}") from None
    return parse_policy(text, source=source, node_labels=node_labels)


def parse_policy(text: str, source: str = "<string>", node_labels: Mapping[str, str] | None = None) -> Policy:
    """Like :func:`load_policy` for text already read; ``source`` names it in error messages."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyError(f"{source}: not valid YAML or JSON: {_yaml_problem(e)}") from None
    if doc is None:
        return Policy()
    return policy_from_mapping(doc, source=source, node_labels=node_labels)


def policy_from_mapping(
    doc: Any, source: str = "<mapping>", node_labels: Mapping[str, str] | None = None
) -> Policy:
    """Build a Policy from an already parsed document (either shape)."""
    ctx = _Ctx(source, dict(node_labels or {}))
    if not isinstance(doc, Mapping):
        raise PolicyError(f"{source}: top level: expected a mapping, got {_type_name(doc)}")
    if _is_configmap(doc):
        return _from_configmap(doc, ctx)
    return _from_ours(doc, ctx)


@dataclass(frozen=True)
class _Ctx:
    source: str
    node_labels: dict[str, str]

    def error(self, keypath: str, what: str) -> PolicyError:
        return PolicyError(f"{self.source}: {keypath or 'top level'}: {what}")


def _norm(key: str) -> str:
    return re.sub(r"[_\-]", "", key).lower()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _join(keypath: str, key: str) -> str:
    return f"{keypath}.{key}" if keypath else key


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping"}.get(type(value), type(value).__name__)


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is not None:
        return f"line {mark.line + 1} column {mark.column + 1}: {problem}"
    return " ".join(str(problem).split())


def _is_configmap(doc: Mapping) -> bool:
    # Our format has no `data` key, so a `data` mapping (or kind: ConfigMap) means a ConfigMap.
    return doc.get("kind") == "ConfigMap" or isinstance(doc.get("data"), Mapping)


def _from_configmap(doc: Mapping, ctx: _Ctx) -> Policy:
    data = doc.get("data")
    if not isinstance(data, Mapping):
        raise ctx.error("data", f"expected a mapping of strings, got {_type_name(data)}")
    fields: dict[str, Any] = {}
    for key, attr in KOORD_KEYS.items():
        if key in data:
            fields[attr] = _koord_section(data[key], f"data.{key}", attr, ctx)
    return _finish(Policy(**fields), ctx, "data")


def _from_ours(doc: Mapping, ctx: _Ctx) -> Policy:
    sections = {"slo": "slo", "actuators": "actuators", "kubernetes": "kubernetes", "standalone": "standalone"}
    koord_by_norm = {_norm(k): v for k, v in KOORD_KEYS.items()}
    koord_by_norm.update({_norm(v): v for v in KOORD_KEYS.values()})  # resource_threshold, cpu_burst...
    top_fields = {"interval_seconds", "incident_log", "node_name"}
    known = {_norm(k): k for k in (*sections, *top_fields)}
    fields: dict[str, Any] = {}
    for raw_key, value in doc.items():
        if not isinstance(raw_key, str):
            raise ctx.error(str(raw_key), "keys must be strings")
        n = _norm(raw_key)
        if n in koord_by_norm:
            attr = koord_by_norm[n]
            fields[attr] = _koord_section(value, raw_key, attr, ctx)
        elif n in ("slo",):
            fields["slo"] = _build(SloThresholds, value, raw_key, ctx)
        elif n == "actuators":
            fields["actuators"] = _build(ActuatorPolicy, value, raw_key, ctx)
        elif n == "kubernetes":
            fields.update(_build_flat(_KUBE_FIELDS, value, raw_key, ctx))
        elif n == "standalone":
            fields.update(_build_flat(_STANDALONE_FIELDS, value, raw_key, ctx))
        elif n in known:
            fields.update(_build_flat({known[n]: known[n]}, {raw_key: value}, "", ctx))
        else:
            choices = [*sections, *top_fields, *KOORD_KEYS]
            raise ctx.error(raw_key, _unknown(raw_key, choices))
    return _finish(Policy(**fields), ctx, "")


# Policy fields grouped under `kubernetes:` and `standalone:` (key in the file -> Policy field).
_KUBE_FIELDS = {
    "node_name": "node_name",
    "pod_source": "pod_source",
    "kubelet_url": "kubelet_url",
    "kubelet_token_file": "kubelet_token_file",
    "kubelet_ca_file": "kubelet_ca_file",
    "kubelet_insecure_skip_verify": "kubelet_insecure_skip_verify",
    "kubelet_read_only_port": "kubelet_read_only_port",
}
_STANDALONE_FIELDS = {"ls_cgroups": "ls_cgroups", "be_cgroups": "be_cgroups"}
_POLICY_FIELD_TYPES = typing.get_type_hints(Policy)


def _build_flat(names: Mapping[str, str], value: Any, keypath: str, ctx: _Ctx) -> dict[str, Any]:
    """Policy-level fields given under a section; returns {field: value}, validated per type."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ctx.error(keypath, f"expected a mapping, got {_type_name(value)}")
    by_norm = {_norm(k): k for k in names}
    out: dict[str, Any] = {}
    for raw_key, v in value.items():
        kp = _join(keypath, str(raw_key))
        key = by_norm.get(_norm(str(raw_key)))
        if key is None:
            raise ctx.error(kp, _unknown(str(raw_key), list(names)))
        attr = names[key]
        out[attr] = _coerce(v, _POLICY_FIELD_TYPES[attr], kp, ctx)
        _check_value(Policy, attr, out[attr], kp, ctx)
    return out


def _build(cls: type, value: Any, keypath: str, ctx: _Ctx, base: Any = None, ignored: set[str] = frozenset()) -> Any:
    """A dataclass from a mapping, over ``base`` (default: the class defaults)."""
    base = base if base is not None else cls()
    if value is None:
        return base
    if not isinstance(value, Mapping):
        raise ctx.error(keypath, f"expected a mapping, got {_type_name(value)}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    by_norm = {_norm(n): n for n in names}
    changes: dict[str, Any] = {}
    for raw_key, v in value.items():
        kp = _join(keypath, str(raw_key))
        name = by_norm.get(_norm(str(raw_key)))
        if name is None:
            if _norm(str(raw_key)) in ignored:
                continue
            raise ctx.error(kp, _unknown(str(raw_key), names))
        changes[name] = _coerce(v, hints[name], kp, ctx)
        _check_value(cls, name, changes[name], kp, ctx)
    return dataclasses.replace(base, **changes)


def _unknown(key: str, names: list[str]) -> str:
    # Suggest in the spelling the user writes in: camelCase keys get camelCase suggestions.
    camel = "_" not in key and "-" not in key and key != key.lower()
    shown = {(_camel(n) if camel else n): n for n in names}
    close = difflib.get_close_matches(key, list(shown), n=1, cutoff=0.6)
    if not close:
        close = difflib.get_close_matches(_norm(key), [_norm(n) for n in names], n=1, cutoff=0.6)
        close = [next(s for s in shown if _norm(s) == close[0])] if close else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key{hint}"


def _coerce(value: Any, hint: Any, keypath: str, ctx: _Ctx) -> Any:
    """Check ``value`` against a field's type; returns the value in the field's Python type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], keypath, ctx)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ctx.error(keypath, f"expected true or false, got {_show(value)}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ctx.error(keypath, f"expected an integer, got {_show(value)}")
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ctx.error(keypath, f"expected a number, got {_show(value)}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ctx.error(keypath, f"expected a string, got {_show(value)}")
    if origin is tuple:  # tuple[str, ...]: a list of strings (a single string is a list of one)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ctx.error(keypath, f"expected a list of strings, got {_show(value)}")
        return tuple(value)
    raise ctx.error(keypath, f"unsupported type {hint}")  # pragma: no cover - a bug in this module


def _show(value: Any) -> str:
    if isinstance(value, str):
        s = value if len(value) <= 40 else value[:37] + "..."
        return f"{_type_name(value)} {s!r}"
    if isinstance(value, bool | int | float):
        return f"{_type_name(value)} {json.dumps(value)}"
    return _type_name(value)


def _ranges_of(cls: type) -> dict[str, _Range]:
    if cls is SloThresholds:
        from detector.catalog import slo_ranges  # the catalog imports this module: read it late

        return {**_RANGES[cls], **slo_ranges()}
    return _RANGES.get(cls, {})


def _check_value(cls: type, name: str, value: Any, keypath: str, ctx: _Ctx) -> None:
    if value is None:
        return
    bounds = _ranges_of(cls).get(name)
    if bounds is not None:
        lo, hi = bounds
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            if bounds == _PERCENT:
                raise ctx.error(keypath, f"must be a percent in 0..100, got {value:g}")
            if hi is None:
                raise ctx.error(keypath, f"must be >= {lo:g}, got {value:g}")
            raise ctx.error(keypath, f"must be in {lo:g}..{hi:g}, got {value:g}")
    choices = _CHOICES.get(cls, {}).get(name)
    if choices is not None and value not in choices and _CHOICE_ALIASES.get(value) not in choices:
        raise ctx.error(keypath, f"must be one of {', '.join(choices)}, got {value!r}")


# -- Koordinator sections ---------------------------------------------------------------------


def _koord_section(value: Any, keypath: str, attr: str, ctx: _Ctx) -> Any:
    """One of the three Koordinator keys: JSON string or mapping; layered or a bare strategy."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ctx.error(keypath, f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ctx.error(keypath, f"expected a mapping, got {_type_name(value)}")
    layered = {_norm(str(k)) for k in value} & {"clusterstrategy", "nodestrategies"}
    if not layered:
        return _koord_build(attr, value, keypath, ctx)
    merged = _layer(value, keypath, attr, ctx)
    # The pieces were validated one by one (so errors name the piece); this only merges them.
    return _koord_build(attr, merged, keypath, ctx)


def _layer(value: Mapping, keypath: str, attr: str, ctx: _Ctx) -> dict:
    """clusterStrategy deep-merged with the first matching nodeStrategy.

    Every piece is validated on its own, also node strategies that do not match this node, so a
    typo is reported on every node rather than only where it happens to apply.
    """
    cluster: Any = {}
    nodes: Any = []
    for raw_key, v in value.items():
        n = _norm(str(raw_key))
        if n == "clusterstrategy":
            cluster = v if v is not None else {}
        elif n == "nodestrategies":
            nodes = v if v is not None else []
        else:
            raise ctx.error(_join(keypath, str(raw_key)), _unknown(str(raw_key), ["clusterStrategy", "nodeStrategies"]))
    if not isinstance(cluster, Mapping):
        raise ctx.error(f"{keypath}.clusterStrategy", f"expected a mapping, got {_type_name(cluster)}")
    if not isinstance(nodes, list):
        raise ctx.error(f"{keypath}.nodeStrategies", f"expected a list, got {_type_name(nodes)}")
    _koord_build(attr, cluster, f"{keypath}.clusterStrategy", ctx)
    merged = copy.deepcopy(dict(cluster))
    chosen: Mapping | None = None
    for i, node in enumerate(nodes):
        kp = f"{keypath}.nodeStrategies[{i}]"
        if not isinstance(node, Mapping):
            raise ctx.error(kp, f"expected a mapping, got {_type_name(node)}")
        selector = next((v for k, v in node.items() if _norm(str(k)) == "nodeselector"), None)
        # Every selector is validated, also after a match, so a typo is found on every node.
        matches = _selector_matches(selector, f"{kp}.nodeSelector", ctx)
        override = {k: v for k, v in node.items() if _norm(str(k)) not in ("nodeselector", "name")}
        _koord_build(attr, override, kp, ctx)
        if chosen is None and matches:
            chosen = override
    if chosen is not None:
        merged = _deep_merge(merged, chosen)
    return merged


def _deep_merge(base: dict, override: Mapping) -> dict:
    out = dict(base)
    base_by_norm = {_norm(str(k)): k for k in base}
    for k, v in override.items():
        existing = base_by_norm.get(_norm(str(k)))
        if existing is not None and isinstance(out[existing], Mapping) and isinstance(v, Mapping):
            out[existing] = _deep_merge(dict(out[existing]), v)
        else:
            if existing is not None:
                del out[existing]
            out[k] = copy.deepcopy(v)
    return out


def _selector_matches(selector: Any, keypath: str, ctx: _Ctx) -> bool:
    """Kubernetes LabelSelector semantics: absent matches nothing, empty matches everything."""
    if selector is None:
        return False
    if not isinstance(selector, Mapping):
        raise ctx.error(keypath, f"expected a mapping, got {_type_name(selector)}")
    labels = ctx.node_labels
    ok = True
    for raw_key, v in selector.items():
        kp = _join(keypath, str(raw_key))
        if raw_key == "matchLabels":
            if not isinstance(v, Mapping):
                raise ctx.error(kp, f"expected a mapping, got {_type_name(v)}")
            ok = ok and all(labels.get(str(k)) == str(val) for k, val in v.items())
        elif raw_key == "matchExpressions":
            if not isinstance(v, list):
                raise ctx.error(kp, f"expected a list, got {_type_name(v)}")
            for i, expr in enumerate(v):
                ok = _expression_matches(expr, f"{kp}[{i}]", ctx) and ok
        else:
            raise ctx.error(kp, _unknown(str(raw_key), ["matchLabels", "matchExpressions"]))
    return ok


def _expression_matches(expr: Any, keypath: str, ctx: _Ctx) -> bool:
    if not isinstance(expr, Mapping) or not isinstance(expr.get("key"), str):
        raise ctx.error(keypath, "expected {key, operator, values}")
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    key = expr["key"]
    have = key in ctx.node_labels
    if op == "In":
        return have and ctx.node_labels[key] in values
    if op == "NotIn":
        return not have or ctx.node_labels[key] not in values
    if op == "Exists":
        return have
    if op == "DoesNotExist":
        return not have
    raise ctx.error(f"{keypath}.operator", f"must be one of In, NotIn, Exists, DoesNotExist, got {op!r}")


def _koord_build(attr: str, strategy: Mapping, keypath: str, ctx: _Ctx) -> Any:
    if attr == "resource_threshold":
        return _build(ResourceThresholdStrategy, strategy, keypath, ctx, ignored=_KOORD_IGNORED[ResourceThresholdStrategy])
    if attr == "cpu_burst":
        return _build(CpuBurstStrategy, strategy, keypath, ctx, ignored=_KOORD_IGNORED[CpuBurstStrategy])
    return _build_qos(strategy, keypath, ctx)


def _build_qos(value: Any, keypath: str, ctx: _Ctx) -> ResourceQosStrategy:
    if not isinstance(value, Mapping):
        raise ctx.error(keypath, f"expected a mapping, got {_type_name(value)}")
    default = ResourceQosStrategy()
    classes = {"lsrclass": "lsr", "lsclass": "ls", "beclass": "be", "lsr": "lsr", "ls": "ls", "be": "be"}
    changes: dict[str, ResctrlQos] = {}
    for raw_key, v in value.items():
        kp = _join(keypath, str(raw_key))
        n = _norm(str(raw_key))
        if n in _QOS_STRATEGY_IGNORED:
            continue
        attr = classes.get(n)
        if attr is None:
            raise ctx.error(kp, _unknown(str(raw_key), ["lsrClass", "lsClass", "beClass"]))
        if v is None:
            continue
        if not isinstance(v, Mapping):
            raise ctx.error(kp, f"expected a mapping, got {_type_name(v)}")
        for ck, cv in v.items():
            ckp = _join(kp, str(ck))
            cn = _norm(str(ck))
            if cn in _QOS_CLASS_IGNORED:
                continue
            if cn != "resctrlqos":
                raise ctx.error(ckp, _unknown(str(ck), ["resctrlQOS", "cpuQOS", "memoryQOS", "blkioQOS", "networkQOS"]))
            changes[attr] = _build(ResctrlQos, cv, ckp, ctx, base=getattr(default, attr))
    return dataclasses.replace(default, **changes)


# -- cross-field checks -----------------------------------------------------------------------


def _finish(policy: Policy, ctx: _Ctx, where: str) -> Policy:
    rt = policy.resource_threshold
    rt_path = _join(where, "resource-threshold-config")
    if rt.cpu_suppress_policy != _CHOICE_ALIASES.get(rt.cpu_suppress_policy, rt.cpu_suppress_policy):
        rt = dataclasses.replace(rt, cpu_suppress_policy=_CHOICE_ALIASES[rt.cpu_suppress_policy])
        policy = dataclasses.replace(policy, resource_threshold=rt)
    if rt.cpu_evict_be_satisfaction_lower_percent > rt.cpu_evict_be_satisfaction_upper_percent:
        raise ctx.error(
            f"{rt_path}.cpuEvictBESatisfactionLowerPercent",
            f"must not exceed cpuEvictBESatisfactionUpperPercent ({rt.cpu_evict_be_satisfaction_lower_percent} > "
            f"{rt.cpu_evict_be_satisfaction_upper_percent})",
        )
    if rt.memory_evict_lower_percent is not None and rt.memory_evict_lower_percent > rt.memory_evict_threshold_percent:
        raise ctx.error(
            f"{rt_path}.memoryEvictLowerPercent",
            f"must not exceed memoryEvictThresholdPercent ({rt.memory_evict_lower_percent} > "
            f"{rt.memory_evict_threshold_percent})",
        )
    for cls_name in ("lsr", "ls", "be"):
        q: ResctrlQos = getattr(policy.resource_qos, cls_name)
        if q.cat_range_start_percent > q.cat_range_end_percent:
            raise ctx.error(
                f"{_join(where, 'resource-qos-config')}.{cls_name}Class.resctrlQOS.catRangeStartPercent",
                f"must not exceed catRangeEndPercent ({q.cat_range_start_percent} > {q.cat_range_end_percent})",
            )
    return policy
