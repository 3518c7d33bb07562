# SPDX-License-Identifier: Apache-2.0
"""Tools a test needs from the machine (ip, clang, make, ...): a test without one skips, it does not fail."""

from __future__ import annotations

import shutil

import pytest


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (scripts/setup.sh test installs it)")
    return path
