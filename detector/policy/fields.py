# SPDX-License-Identifier: Apache-2.0
"""Typed, range-checked dataclass fields from a parsed mapping: key matching that ignores case, ``_``
and ``-``, coercion to the field's type, and the one-line error naming the key path."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import yaml

from detector.catalog import range_problem, slo_problem
from detector.policy.schema import (
    _CHOICE_ALIASES,
    _CHOICES,
    _RANGES,
    PolicyError,
    SloThresholds,
)


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

def _build(cls: type, value: Any, keypath: str, ctx: _Ctx, base: Any = None, ignored: set[str] = frozenset()) -> Any:
    """A dataclass from a mapping, over ``base`` (default: the class defaults)."""
    base = base if base is not None else cls()
    if value is None:
        return base
    hints = typing.get_type_hints(cls)
    changes: dict[str, Any] = {}
    for name, kp, v in _match_keys(value, [f.name for f in dataclasses.fields(cls)], keypath, ctx, ignored):
        changes[name] = _coerce(v, hints[name], kp, ctx)
        _check_value(cls, name, changes[name], kp, ctx)
    return dataclasses.replace(base, **changes)


def _match_keys(
    value: Any, names: Sequence[str], keypath: str, ctx: _Ctx, ignored: AbstractSet[str] = frozenset()
) -> list[tuple[str, str, Any]]:
    """(name, key path, value) for each key of the mapping ``value``, matched to ``names`` in any
    spelling (camelCase, kebab, snake). A key that matches none is skipped when its normalised
    spelling is in ``ignored`` (keys another tool reads), else an error that suggests the closest
    name. None: no keys. One loop for dataclass sections and for flat name lists, so both spell and
    report keys the same way."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        raise ctx.error(keypath, f"expected a mapping, got {_type_name(value)}")
    by_norm = {_norm(n): n for n in names}
    out: list[tuple[str, str, Any]] = []
    for raw_key, v in value.items():
        kp = _join(keypath, str(raw_key))
        name = by_norm.get(_norm(str(raw_key)))
        if name is None:
            if _norm(str(raw_key)) in ignored:
                continue
            raise ctx.error(kp, _unknown(str(raw_key), list(names)))
        out.append((name, kp, v))
    return out


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


def _check_value(cls: type, name: str, value: Any, keypath: str, ctx: _Ctx) -> None:
    if value is None:
        return
    if cls is SloThresholds:  # declared with the signals they bound (detector.catalog)
        problem = slo_problem(name, value)
    else:
        bounds = _RANGES.get(cls, {}).get(name)
        problem = None if bounds is None else range_problem(bounds, value)
    if problem is not None:
        raise ctx.error(keypath, problem)
    choices = _CHOICES.get(cls, {}).get(name)
    if choices is not None and value not in choices and _CHOICE_ALIASES.get(value) not in choices:
        raise ctx.error(keypath, f"must be one of {', '.join(choices)}, got {value!r}")


