# SPDX-License-Identifier: Apache-2.0
"""psi_unknown: pressure without an attributable mechanism (the fallback: its rule always holds)."""

from __future__ import annotations

from detector.causes.base import CauseContext, CauseSpec, Verdict
from detector.decisions import Cause


def rule(ctx: CauseContext) -> Verdict:
    return Verdict(Cause.PSI_UNKNOWN, 0.3)


SPEC = CauseSpec(
    Cause.PSI_UNKNOWN, rule,
    title="pressure without an attributable mechanism",
    advice="pressure without an attributable mechanism: check IO and node-level pressure",
)
