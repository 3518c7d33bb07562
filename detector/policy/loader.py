# SPDX-License-Identifier: Apache-2.0
"""Loading a policy file: either shape (ours or a whole Koordinator ConfigMap), then the cross-field checks."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from detector.policy.fields import (
    _build,
    _check_value,
    _coerce,
    _Ctx,
    _join,
    _match_keys,
    _norm,
    _type_name,
    _unknown,
    _yaml_problem,
)
from detector.policy.koordinator import (
    KOORD_KEYS,
    _koord_section,
)
from detector.policy.schema import (
    _CHOICE_ALIASES,
    ActuatorPolicy,
    Policy,
    PolicyError,
    ResctrlQos,
    SloThresholds,
)

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
    top_fields = {"interval_seconds", "incident_log", "node_name", "runq_pair_quiet_seconds"}
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
    "vanish_grace_seconds": "pod_vanish_grace_seconds",
}
_STANDALONE_FIELDS = {"ls_cgroups": "ls_cgroups", "be_cgroups": "be_cgroups"}
_POLICY_FIELD_TYPES = typing.get_type_hints(Policy)


def _build_flat(names: Mapping[str, str], value: Any, keypath: str, ctx: _Ctx) -> dict[str, Any]:
    """Policy-level fields given under a section; returns {field: value}, validated per type. Every
    key must be known (no ``ignored``: our own format has no keys for other tools)."""
    out: dict[str, Any] = {}
    for key, kp, v in _match_keys(value, list(names), keypath, ctx):
        attr = names[key]
        out[attr] = _coerce(v, _POLICY_FIELD_TYPES[attr], kp, ctx)
        _check_value(Policy, attr, out[attr], kp, ctx)
    return out


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
