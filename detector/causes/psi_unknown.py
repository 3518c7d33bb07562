# SPDX-License-Identifier: Apache-2.0
"""psi_unknown: pressure without an attributable mechanism (the fallback: its rule always holds)."""

from __future__ import annotations

from detector.causes.base import CauseContext, CauseSpec, Verdict

NAME = "psi_unknown"  # its member of the Cause enum, which the registry builds (detector/causes/__init__.py)


def rule(ctx: CauseContext) -> Verdict:
    return Verdict(NAME, 0.3)


SPEC = CauseSpec(
    NAME, rule,
    title="pressure without an attributable mechanism",
    advice="pressure without an attributable mechanism: check IO and node-level pressure",
)
