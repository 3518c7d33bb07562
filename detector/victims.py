# SPDX-License-Identifier: Apache-2.0
"""The incident engine's victims and which of them a tick without their row still concerns.

Most victims on a node are settled: no breach, no open incident. A tick in which such a victim has no row
(it did not run, nothing about it moved) changes nothing for it, so the engine's quiet pass walks only the
unsettled ones, and every victim only when the workload list changed (one may be gone). At 1,000 pods that
is a handful of keys a tick instead of a thousand.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from detector.incident_diagnosis import VictimState


class Victims:
    """Workload key -> its :class:`VictimState`, in the order they came, with the unsettled ones apart."""

    def __init__(self) -> None:
        self.states: dict[str, VictimState] = {}
        # In a breach or with an open incident: what a tick without their row changes.
        self._unsettled: dict[str, VictimState] = {}
        self._made = 0
        self._walked_for: object = None  # the workload list every victim was last checked against (gone?)

    def state(self, key: str) -> VictimState:
        state = self.states.get(key)
        if state is None:  # not setdefault(key, VictimState()): that builds a state (a dozen deques) every tick
            self._made += 1
            state = self.states[key] = VictimState(order=self._made)
        return state

    def settled(self, key: str, state: VictimState) -> None:
        if state.breach_ticks or state.incident is not None:
            self._unsettled[key] = state
        else:
            self._unsettled.pop(key, None)

    def opened(self, key: str, state: VictimState) -> None:
        self._unsettled[key] = state  # at once: a hook reading the open incidents finds it

    def quiet(self, rows: Mapping[str, object], listed: Collection[str] | None) -> list[str]:
        """The victims without a row this tick that it may concern, in the victims' order: every one when the
        workload list (``listed``; None: the rows are the list) is another object than at the last such walk
        (the builder hands the same one while it is unchanged, and lists every row), else the unsettled ones."""
        # Those the last quiet pass settled (cleared, closed) leave the unsettled ones now.
        self._unsettled = {k: s for k, s in self._unsettled.items() if s.breach_ticks or s.incident is not None}
        if listed is None or listed is not self._walked_for:
            self._walked_for = listed
            return [k for k in self.states if k not in rows]
        return sorted((k for k in self._unsettled if k not in rows), key=lambda k: self.states[k].order)

    def drop(self, key: str) -> VictimState:
        self._unsettled.pop(key, None)
        return self.states.pop(key)

    def open_states(self) -> list[VictimState]:
        """The victims with an open incident, in the victims' order (each is unsettled)."""
        return sorted((s for s in self._unsettled.values() if s.incident is not None), key=_order)


def _order(state: VictimState) -> int:
    return state.order
