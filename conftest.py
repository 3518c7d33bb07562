# SPDX-License-Identifier: Apache-2.0
"""Session-wide pytest hooks for every test directory (tests/ and bench/tests/): a TERM ends the session
the way Ctrl-C does, tests marked root skip without root, and the owned test cgroups go at exit.
Fixtures for the product's tests are in tests/conftest.py."""

from __future__ import annotations

import os
import signal

import pytest

from testkit.sandbox import cleanup_prefix


def _term_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # A TERM (a cancelled CI job, scripts/ci-under-load.sh stopped) ends the session the way Ctrl-C
    # does, so fixture teardown still removes the owned test cgroups; Python's default for TERM is
    # to die on the spot and leave them behind.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _term_as_interrupt)


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
