# SPDX-License-Identifier: Apache-2.0
"""The shipped packages (pyproject's [tool.setuptools] packages) import nothing from bench/, tests/ or
testkit/: test and bench helpers such as the owned-cgroup sandbox (testkit/sandbox.py) are not installed
with the agent, so an import of them would fail on a node. And tests/ and bench/ do not import each other:
what both use is in testkit/, which imports neither (issue 42)."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOT_SHIPPED = ("bench", "tests", "testkit")


def shipped_packages() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_shipped_packages_do_not_import_bench_or_tests():
    offenders = []
    packages = shipped_packages()
    assert "noisyneighbor" in packages and not set(NOT_SHIPPED) & {p.split(".")[0] for p in packages}
    for package in packages:
        for path in sorted((REPO / package.replace(".", "/")).glob("*.py")):
            for module in imported_modules(path):
                if module.split(".")[0] in NOT_SHIPPED:
                    offenders.append(f"{path.relative_to(REPO)} imports {module}")
    assert not offenders, offenders


def test_the_sandbox_lives_outside_the_shipped_packages():
    assert (REPO / "testkit" / "sandbox.py").is_file()
    assert not (REPO / "noisyneighbor" / "sandbox.py").exists()


def import_offenders(directory: str, forbidden: tuple[str, ...]) -> list[str]:
    """Every import in a .py file under `directory` (its subdirectories included) of a top-level
    package in `forbidden`, as "path imports module"."""
    offenders = []
    for path in sorted((REPO / directory).rglob("*.py")):
        for module in imported_modules(path):
            if module.split(".")[0] in forbidden:
                offenders.append(f"{path.relative_to(REPO)} imports {module}")
    return offenders


def test_tests_and_bench_do_not_import_each_other():
    # bench/tests/ (the bench's own tests) is under bench/: it may import bench, never tests.
    assert not import_offenders("tests", ("bench",))
    assert not import_offenders("bench", ("tests",))
    assert not import_offenders("testkit", ("tests", "bench"))


def test_the_import_check_sees_imports_at_any_depth(tmp_path, monkeypatch):
    """The check above would pass on an empty tree: fed a file that imports the other side inside a
    function, it must name it."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def f():\n    from bench.scenarios import metrics\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert import_offenders("tests", ("bench",)) == ["tests/test_x.py imports bench.scenarios"]
