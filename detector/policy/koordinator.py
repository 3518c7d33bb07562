# SPDX-License-Identifier: Apache-2.0
"""Koordinator's three ``slo-controller-config`` strategies (resource-threshold, cpu-burst, resource-qos)
translated into our records: a JSON string or mapping, layered ``clusterStrategy`` + the first
matching ``nodeStrategies`` entry, and the Koordinator keys we accept and ignore."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from detector.policy.fields import (
    _build,
    _Ctx,
    _join,
    _norm,
    _type_name,
    _unknown,
)
from detector.policy.schema import (
    ColocationStrategy,
    CpuBurstStrategy,
    ResctrlQos,
    ResourceQosStrategy,
    ResourceThresholdStrategy,
)

# Koordinator keys we accept and do not use, per section, in normalized form.
_KOORD_IGNORED = {
    ResourceThresholdStrategy: {"cpuevictpolicy", "memoryevictpolicy", "name"},
    CpuBurstStrategy: {"name"},
    # colocation-config keys for koord-manager's other calculations (we compute batch allocatable only;
    # its per-node nodeConfigs are not applied: the cluster-level thresholds are).
    ColocationStrategy: {"enable", "metricaggregatedurationseconds", "metricreportintervalseconds",
                         "metricaggregatepolicy", "metricmemorycollectpolicy", "cpucalculatepolicy",
                         "memorycalculatepolicy", "degradetimeminutes", "updatetimethresholdseconds",
                         "resourcediffthreshold", "midcputhresholdpercent", "midmemorythresholdpercent",
                         "midunallocatedpercent", "batchcputhresholdpercent", "batchmemorythresholdpercent",
                         "allocatablememoryreservedpercent", "nodeconfigs", "name"},
}
_QOS_CLASS_IGNORED = {"cpuqos", "memoryqos", "blkioqos", "networkqos"}
_QOS_STRATEGY_IGNORED = {"systemclass", "lseclass", "cgroupbase", "cgrouproot", "policies", "name"}

KOORD_KEYS = {
    "resource-threshold-config": "resource_threshold",
    "cpu-burst-config": "cpu_burst",
    "resource-qos-config": "resource_qos",
    "colocation-config": "colocation",
}


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
    if attr == "colocation":
        return _build(ColocationStrategy, strategy, keypath, ctx, ignored=_KOORD_IGNORED[ColocationStrategy])
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


