"""Shared fixtures: root/kernel checks and owned test cgroups that are always removed."""

from __future__ import annotations

import os
import shutil

import pytest

from noisyneighbor.sandbox import OwnedCgroup, cleanup_prefix


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root: loads BPF programs and creates cgroups on the real kernel")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _remove_owned_cgroups_at_exit():
    yield
    if os.geteuid() == 0:
        cleanup_prefix()


@pytest.fixture
def make_cgroup(request: pytest.FixtureRequest):
    """make_cgroup(name, controllers=("cpu",)) -> OwnedCgroup, removed at teardown even on failure."""
    created: list[OwnedCgroup] = []

    def factory(name: str, controllers=("cpu",)) -> OwnedCgroup:
        base = "".join(c if c.isalnum() or c in "-_" else "_" for c in request.node.name)[:40]
        cg = OwnedCgroup(f"{base}-{name}", controllers).create()
        created.append(cg)
        return cg

    yield factory
    for cg in reversed(created):
        cg.remove()


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (scripts/setup.sh test installs it)")
    return path
