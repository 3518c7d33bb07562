# SPDX-License-Identifier: Apache-2.0
"""The shipped packages (pyproject's [tool.setuptools] packages) import nothing from bench/ or tests/:
test and bench helpers such as the owned-cgroup sandbox (bench/sandbox.py) are not installed with the
agent, so an import of them would fail on a node."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOT_SHIPPED = ("bench", "tests")


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
    assert "noisyneighbor" in packages and "bench" not in packages and "tests" not in packages
    for package in packages:
        for path in sorted((REPO / package.replace(".", "/")).glob("*.py")):
            for module in imported_modules(path):
                if module.split(".")[0] in NOT_SHIPPED:
                    offenders.append(f"{path.relative_to(REPO)} imports {module}")
    assert not offenders, offenders


def test_the_sandbox_lives_outside_the_shipped_packages():
    assert (REPO / "bench" / "sandbox.py").is_file()
    assert not (REPO / "noisyneighbor" / "sandbox.py").exists()
