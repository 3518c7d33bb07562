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
        # Keys of the victims in a breach or with an open incident: what a tick without their row changes.
        # Kept by the engine's calls to ``settled`` after each change of a victim's breach or incident.
        self._unsettled: set[str] = set()
        self._made = 0
        self._walked_for: object = None  # the workload list every victim was last checked against (gone?)

    def state(self, key: str) -> VictimState:
        state = self.states.get(key)
        if state is None:  # not setdefault(key, VictimState()): that builds a state (a dozen deques) every tick
            self._made += 1
            state = self.states[key] = VictimState(order=self._made)
        return state

    def settled(self, key: str, state: VictimState) -> None:
        """After a change of ``key``'s breach ticks or incident: unsettled or not."""
        if state.breach_ticks or state.incident is not None:
            self._unsettled.add(key)
        else:
            self._unsettled.discard(key)

    def opened(self, key: str, state: VictimState) -> None:
        self._unsettled.add(key)  # at once: a hook reading the open incidents finds it

    def quiet(self, rows: Mapping[str, object], listed: Collection[str] | None) -> list[str]:
        """The victims without a row this tick that it may concern, in the victims' order: every one when the
        workload list (``listed``; None: the rows are the list) is another object than at the last such walk
        (the builder hands the same one while it is unchanged, and lists every row), else the unsettled ones."""
        if listed is None or listed is not self._walked_for:
            self._walked_for = listed
            return [k for k in self.states if k not in rows]
        states = self.states
        return sorted((k for k in self._unsettled if k not in rows), key=lambda k: states[k].order)

    def drop(self, key: str) -> VictimState:
        self._unsettled.discard(key)
        return self.states.pop(key)

    def open_states(self) -> list[VictimState]:
        """The victims with an open incident, in the victims' order (each is unsettled)."""
        states = self.states
        return sorted((s for s in (states[k] for k in self._unsettled) if s.incident is not None), key=_order)


def _order(state: VictimState) -> int:
    return state.order
