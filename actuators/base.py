# SPDX-License-Identifier: Apache-2.0
"""The one small interface every actuator implements: plan -> apply -> verify -> revert.

- ``plan`` turns a detector :class:`~detector.decisions.Decision` into concrete, reviewable steps
  (file writes with old and new values, or API calls) without changing anything; it raises
  :class:`Refused` with a one-line reason when policy forbids the action (LS limits, floors, rate
  limits) or the target is gone.
- ``apply`` carries a plan out all-or-nothing: originals are journaled before the first write and a
  failure part way rolls back what was written.
- ``revert`` undoes an applied plan (restores journaled originals). Eviction cannot be undone; its
  ``revert`` only records that.

Verification (did the victim's signal improve over N intervals?) is generic and lives in the
manager, not in each actuator. Dry-run is also the manager's: it calls ``plan`` only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from detector.decisions import ActionKind, Decision


class Refused(Exception):
    """A decision the actuator will not carry out; ``str(exc)`` is one line for the audit log, ``outcome``
    the code a hook keys on (a limit that passes, WAIT, or a step already judged, TRIED_BEFORE; NONE: this
    target never) and ``retry_in_s`` when a WAIT ends."""

    def __init__(self, message: str, outcome: ActionOutcome | None = None, retry_in_s: float | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome if outcome is not None else ActionOutcome.NONE
        self.retry_in_s = retry_in_s


class ActionError(RuntimeError):
    """Applying or reverting failed (after rollback); ``str(exc)`` is one line."""


@dataclass(frozen=True, slots=True)
class FileWrite:
    """One cgroup/resctrl file change. ``old`` is what was read at plan time (journaled at apply)."""

    path: str  # absolute path under the configured host root
    old: str | None
    new: str


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One Kubernetes API call (eviction), described for the audit log and dry-run output."""

    method: str
    path: str
    body: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Plan:
    decision: Decision
    summary: str  # one line: "suppress kubepods-besteffort: cfs quota 4.00 -> 1.50 cores"
    writes: tuple[FileWrite, ...] = ()
    calls: tuple[ApiCall, ...] = ()
    reversible: bool = True
    # Numbers the plan settled on after clamping (e.g. {"cpu_cores": 0.5, "policy": "cfsQuota"}), for
    # metrics and the audit log; added for the manager, optional for every actuator.
    details: dict[str, float | str] = field(default_factory=dict, compare=False, hash=False)


class ActionState(StrEnum):
    PLANNED = "planned"  # dry-run: logged, nothing written
    APPLIED = "applied"
    VERIFIED = "verified"  # victim improved within the window
    REVERTED = "reverted"  # did not help (or shutdown): originals restored
    FAILED = "failed"
    REFUSED = "refused"


class ActionOutcome(StrEnum):
    """Why a record reached its state, as a code (hooks key on it, never on ``detail``'s wording)."""

    NONE = ""
    IMPROVED = "improved"  # verified: the victim's signal improved enough
    DID_NOT_HELP = "did_not_help"  # reverted: the victim's signal did not improve within the window
    # refused for now: a limit that passes (cool-down, rate limit, a verification in progress, a recent revert)
    WAIT = "wait"
    # refused: the same step on the same target did not help the same victim lately (DID_NOT_HELP_MEMORY_S)
    TRIED_BEFORE = "tried_before"
    IN_PLACE = "in_place"  # refused: the same step for the same victim is in effect on the target already
    # applied on top of the target's step being verified, which it goes with (Decision.joins): judged with it
    JOINED = "joined"


@dataclass
class ActionRecord:
    """One audit-log entry; the manager updates ``state`` as the action moves on."""

    action_id: str
    plan: Plan | None
    decision: Decision
    state: ActionState
    detail: str = ""
    at: float = field(default_factory=time.time)
    # What the action did to its victim's signal (issue 19): before_action (the verification baseline: the
    # signal over the victim's breach, else the median of the last samples before it), after_action (the
    # verification median), latest, improvement_percent,
    # decision_to_action_s (decision made -> applied), action_to_recovery_s (applied -> first sample at or
    # below half the before_action value; absent while there has been none)
    effect: dict[str, float] = field(default_factory=dict)
    outcome: ActionOutcome = ActionOutcome.NONE


class Actuator(Protocol):
    kind: ActionKind

    def plan(self, decision: Decision) -> Plan: ...

    def apply(self, plan: Plan) -> None: ...

    def revert(self, plan: Plan) -> None: ...
