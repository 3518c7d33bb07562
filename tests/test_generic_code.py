# SPDX-License-Identifier: Apache-2.0
"""The generic side names no probe, and the runtime stays small and acyclic.

- exporter.py, sections.py, views.py and detector/signals.py loop over probes.registry: none of them
  names a plugin (its name, view, module, snapshot field), reads a field of a plugin's snapshot or
  interval, or spells one of its metrics. Adding a probe must not need an edit there.
- Runtime functions over 60 lines: at most 3 (AST, docstrings and comments included).
- No runtime class over 300 lines (AST, counted the same way): a class that long does several jobs.
- No import cycle among the runtime packages (probes → detector → actuators; noisyneighbor reads).
"""

from __future__ import annotations

import ast
import dataclasses
import io
import tokenize
import typing
from pathlib import Path

import pytest

from detector.model import Culprit, Incident
from detector.signals import NodeSignals, WorkloadSignals
from probes.plugin import MetricSpec, NodeFieldSpec, ProbePlugin, SignalExtractor, SignalSpec, TopColumn, TopInput, TopTable
from probes.registry import PLUGINS
from probes.snapshot import NodeSnapshot

ROOT = Path(__file__).resolve().parent.parent
GENERIC = ("noisyneighbor/exporter.py", "noisyneighbor/sections.py", "noisyneighbor/views.py", "detector/signals.py")
RUNTIME = ("probes", "detector", "actuators", "noisyneighbor")
MAX_LINES = 60
MAX_LONG_FUNCTIONS = 3
MAX_CLASS_LINES = 300
# Attributes every reader may use: the fields of the generic snapshot, signal, incident and plugin
# interface types, and names every plugin snapshot has by the interface (its time and drops, an
# interval's length).
GENERIC_TYPES = (NodeSnapshot, NodeSignals, WorkloadSignals, Incident, Culprit, ProbePlugin, MetricSpec, TopTable,
                 TopColumn, TopInput, SignalExtractor, SignalSpec, NodeFieldSpec)
GENERIC_FIELDS = {f.name for t in GENERIC_TYPES for f in dataclasses.fields(t)} | {"monotonic_s", "drops", "interval_s",
                                                                                   "node"}
# Strings a generic file may hold although a probe uses them too (none: the GPU device label moved into
# the gpu plugin with its node metrics).
ALLOWED_STRINGS: set[str] = set()


def _types_of(plugin) -> set[type]:
    """The dataclasses a plugin's snapshot and interval are (from its delta's annotations)."""
    hints = typing.get_type_hints(plugin.delta) if plugin.delta is not None else {}
    out = set()
    for hint in hints.values():
        for t in (hint, *typing.get_args(hint)):
            if dataclasses.is_dataclass(t):
                out.add(t)
    return out


def _vocabulary() -> tuple[set[str], set[str], set[str]]:
    """(names, snapshot fields, strings) that name a probe."""
    names: set[str] = set()
    fields: set[str] = set()
    strings: set[str] = set()
    for p in PLUGINS:
        own = {p.name, p.top_view, p.factory.__module__.rsplit(".", 1)[-1]} - {None}
        names |= own  # type: ignore[arg-type]
        strings |= own  # type: ignore[arg-type]
        strings |= {spec.name for spec in p.metric_specs} | set(p.metrics)
        for t in _types_of(p):
            fields |= {f.name for f in dataclasses.fields(t)}
    return names, fields - GENERIC_FIELDS, strings - ALLOWED_STRINGS


def probe_names_in(source: str) -> list[str]:
    names, fields, strings = _vocabulary()
    found = []
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        after_dot = i > 0 and tokens[i - 1].type == tokenize.OP and tokens[i - 1].string == "."
        if tok.type == tokenize.NAME and (tok.string in names or (after_dot and tok.string in fields)):
            found.append(f"line {tok.start[0]}: {tok.string}")
        elif tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):
                continue
            if isinstance(value, str) and value in strings:
                found.append(f"line {tok.start[0]}: {tok.string}")
    return found


@pytest.mark.parametrize("path", GENERIC)
def test_generic_files_name_no_probe(path):
    found = probe_names_in((ROOT / path).read_text())
    assert not found, f"{path} names a probe: {found}"


def test_the_check_sees_a_probe_named():
    assert probe_names_in('x = snap.softirq\ny = BY_NAME["runqlat"]\nfor k in interval.per_key: pass\n') == [
        "line 1: softirq", 'line 2: "runqlat"', "line 3: per_key"]
    assert probe_names_in('name = "noisyneighbor_tcp_connect_latency_seconds"\n')


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return [(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", node.end_lineno - node.lineno + 1)  # type: ignore[operator]
            for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def long_functions() -> list[tuple[str, int]]:
    out = []
    for package in RUNTIME:
        for path in sorted((ROOT / package).rglob("*.py")):
            out += [(name, n) for name, n in _functions(path) if n > MAX_LINES]
    return sorted(out, key=lambda x: -x[1])


def test_few_runtime_functions_over_60_lines():
    found = long_functions()
    assert len(found) <= MAX_LONG_FUNCTIONS, f"{len(found)} functions over {MAX_LINES} lines: {found}"


def classes_over(source: str, max_lines: int = MAX_CLASS_LINES) -> list[tuple[str, int]]:
    """(name at line, lines) of the classes in ``source`` longer than ``max_lines`` (nested ones too)."""
    return [(f"{node.name} at line {node.lineno}", node.end_lineno - node.lineno + 1)  # type: ignore[operator]
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > max_lines]  # type: ignore[operator]


def test_no_runtime_class_over_300_lines():
    found = [(f"{path.relative_to(ROOT)}: {name}", n) for package in RUNTIME
             for path in sorted((ROOT / package).rglob("*.py")) for name, n in classes_over(path.read_text())]
    assert not found, f"classes over {MAX_CLASS_LINES} lines: {found}"


def test_the_class_check_counts_a_class_to_its_last_line():
    body = "".join(f"    x{i} = {i}\n" for i in range(4))
    source = f'class Short:\n{body}\n\nclass Long:\n    """doc"""\n{body}    # a comment\n    y = 1\n'
    assert classes_over(source, max_lines=7) == [("Long at line 8", 8)]  # docstring and comment counted
    assert classes_over(source, max_lines=8) == []


def _imports(path: Path) -> set[str]:
    """The runtime packages a module imports at module level or in functions (TYPE_CHECKING too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out & set(RUNTIME)


def package_cycles() -> list[tuple[str, str]]:
    edges = {p: set() for p in RUNTIME}
    for package in RUNTIME:
        for path in (ROOT / package).rglob("*.py"):
            edges[package] |= _imports(path) - {package}
    seen, cycles = set(), []

    def visit(node: str, stack: list[str]) -> None:
        for nxt in sorted(edges[node]):
            if nxt in stack:
                cycles.append((*stack[stack.index(nxt):], nxt))
            elif (node, nxt) not in seen:
                seen.add((node, nxt))
                visit(nxt, [*stack, nxt])

    for p in RUNTIME:
        visit(p, [p])
    return sorted(set(cycles))


def test_no_import_cycle_among_the_runtime_packages():
    assert package_cycles() == []


def test_the_cycle_check_finds_one(monkeypatch):
    real = _imports

    def with_back_edge(path: Path) -> set[str]:
        return real(path) | ({"detector"} if path.parts[-2] == "probes" else set())

    monkeypatch.setitem(globals(), "_imports", with_back_edge)
    assert package_cycles()
