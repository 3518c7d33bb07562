# SPDX-License-Identifier: Apache-2.0
"""The signal catalog: every signal the detector breaches on, learns or cites as evidence, once.

Each entry says what the number is (unit and how it reads to a human), the SLO bounding it when it
has one (:class:`Slo`: its policy key and default, the conversion to the signal's unit, its valid
values, whether a cause rule divides by it, and the gate that says when a reading is worth checking),
whether the k-sigma rule applies, whether a baseline is learned for it, and its noise floor (the
smallest spread worth calling noise, in the signal's unit; the baselines' sigma floor). Breach checks
(``detector.incidents``), baselines (``detector.baseline``), evidence and cause rules
(``detector.causes``), the policy (``detector.policy``: :class:`SloThresholds` is built here from the
declarations), the exporter's incident metrics and ``noisyneighbor diagnose`` read it from here.

The catalog imports nothing of the policy (the policy reads it): adding an SLO is one :class:`Slo`
on its signal, and the policy file accepts the key, range-checks it and defaults it from there.

A probe plugin may declare signals of its own (``SignalExtractor.signal_specs``, probes/plugin.py): each
becomes an evidence entry here (:func:`plugin_signals`), after the detector's own, so adding a probe with
a new signal needs no edit in this file. What the detector does with one beyond showing and storing it
(an SLO, a baseline, a cause) is declared here and in detector/causes/ as for any signal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from probes.registry import PLUGINS

Range = tuple[float | None, float | None]  # (min, max) of a setting; None: unbounded on that side

MIN_RUNQ_EVENTS = 20  # fewer switch-ins than this in a tick: a p99 means nothing
SOFTIRQ_DELAY_MIN_MS_PER_S = 10.0  # softirq time on its CPUs below which a late softirq is not a breach

# What a breach check reads: (the victim's WorkloadSignals row, its recent connect window of
# (failed, retransmits, p99 ns) per tick) -> the value to compare with the SLO, None: not checked.
Gate = Callable[[Any, Sequence[tuple[float, float, float]]], float | None]


class SloError(ValueError):
    """An SLO setting outside its declared values (the policy loader says the same with file and key)."""


@dataclass(frozen=True, slots=True)
class Slo:
    """The SLO that bounds one signal, declared once (the policy's ``slo:`` key is ``field``)."""

    field: str  # the SloThresholds field and policy key, in the SLO's unit ("runq_p99_ms")
    default: float
    to_raw: float = 1.0  # field value x to_raw = threshold in the signal's raw unit
    range: Range = (0, None)  # valid values of the field
    divides: bool = False  # a cause rule divides by it: the lower bound is exclusive (0 is refused)
    gate: Gate | None = None  # None: the row's attribute named like the signal, every tick
    doc: str = ""

    def problem(self, value: float) -> str | None:
        """What is wrong with ``value`` for this field (one phrase), None when it is valid."""
        if self.divides and value <= 0:
            return f"must be > 0 (a cause rule divides by it), got {value:g}"
        return range_problem(self.range, value)


def range_problem(bounds: Range, value: float) -> str | None:
    """One phrase when ``value`` is outside ``bounds`` (the wording every policy range check uses)."""
    lo, hi = bounds
    if (lo is None or value >= lo) and (hi is None or value <= hi):
        return None
    if bounds == (0, 100):
        return f"must be a percent in 0..100, got {value:g}"
    if hi is None:
        return f"must be >= {lo:g}, got {value:g}"
    return f"must be in {lo:g}..{hi:g}, got {value:g}"


@dataclass(frozen=True, slots=True)
class Knob:
    """A detector setting under ``slo:`` that bounds no signal (k sigma, hysteresis)."""

    field: str
    type: type
    default: float
    range: Range
    doc: str = ""


@dataclass(frozen=True, slots=True)
class Signal:
    name: str  # the key in WorkloadSignals / the store / Evidence.signal
    label: str  # what a human calls it (diagnose, HTML report)
    unit: str  # the unit it is *shown* in
    scale: float = 1.0  # raw value x scale = value in ``unit``
    slo: Slo | None = None  # the SLO bounding it; None: evidence only
    k_sigma: bool = False  # also breaches at k sigma above its own baseline (and half way to the SLO)
    baseline: bool = False  # a baseline is learned for it (for the k-sigma rule and the evidence)
    noise_floor: float | None = None  # smallest spread worth calling noise, in its raw unit

    @property
    def slo_field(self) -> str | None:
        return None if self.slo is None else self.slo.field

    def threshold(self, slo: Any) -> float | None:
        """The SLO bound in the signal's raw unit (``slo``: a SloThresholds), None for evidence only."""
        if self.slo is None:
            return None
        return float(getattr(slo, self.slo.field)) * self.slo.to_raw

    def breach_value(self, row: Any, connect_window: Sequence[tuple[float, float, float]] = ()) -> float | None:
        """The value its breach check compares with the SLO this tick; None: not checked (gated out)."""
        if self.slo is not None and self.slo.gate is not None:
            return self.slo.gate(row, connect_window)
        return getattr(row, self.name)

    def human(self, value: float) -> str:
        return f"{value * self.scale:.3g} {self.unit}".replace(" %", "%")


def _runq_gate(row: Any, window: Sequence[tuple[float, float, float]]) -> float | None:
    return row.runq_p99_ns if row.runq_count >= MIN_RUNQ_EVENTS else None


def _connect_gate(row: Any, window: Sequence[tuple[float, float, float]]) -> float | None:
    # Connect trouble is sparse: the worst p99 of the recent window, when any connect completed in it.
    return max((p for _, _, p in window), default=0.0) or None


def _softirq_delay_gate(row: Any, window: Sequence[tuple[float, float, float]]) -> float | None:
    # A late softirq matters when there is softirq work to be late: a quiet CPU's occasional timer
    # softirq deferred to ksoftirqd has a long raise->entry delay and steals nothing.
    if row.softirq_delay_p99_ns and row.cpu_cores and row.cpu_cores > 0.05 \
            and row.softirq_ms_per_s >= SOFTIRQ_DELAY_MIN_MS_PER_S:
        return row.softirq_delay_p99_ns
    return None


_PERCENT: Range = (0, 100)

_OWN: tuple[Signal, ...] = (
    # -- signals with an SLO: a latency-sensitive workload breaches on these (checked in this order) -
    Signal("runq_p99_ns", "Run-queue wait p99", "ms", 1e-6,
           Slo("runq_p99_ms", 5.0, to_raw=1e6, gate=_runq_gate,
               doc=f"checked when it switched in at least {MIN_RUNQ_EVENTS} times in the tick"),
           k_sigma=True, baseline=True, noise_floor=5_000.0),
    Signal("connect_p99_ns", "TCP connect p99", "ms", 1e-6,
           Slo("connect_p99_ms", 200.0, to_raw=1e6, gate=_connect_gate, doc="worst p99 of the recent ticks"),
           baseline=True, noise_floor=20_000.0),
    Signal("reclaim_stall_ms_per_s", "Memory reclaim stall", "ms/s",
           slo=Slo("reclaim_stall_ms_per_s", 20.0, range=(0, 1000), divides=True),
           baseline=True, noise_floor=0.5),
    Signal("softirq_ms_per_s", "Softirq time on its CPUs", "ms/s",
           slo=Slo("softirq_ms_per_s", 100.0, range=(0, 1000), divides=True,
                   doc="softirq run time on its CPUs (a tenth of a CPU) before it is a breach"),
           baseline=True, noise_floor=1.0),
    Signal("softirq_delay_p99_ns", "Softirq delay p99", "ms", 1e-6,
           Slo("softirq_delay_p99_ms", 2.0, to_raw=1e6, gate=_softirq_delay_gate,
               doc=f"checked with at least {SOFTIRQ_DELAY_MIN_MS_PER_S:g} ms/s of softirq on its CPUs"),
           noise_floor=5_000.0),
    # The hard IRQ probe's signal (probes/hardirq.py declares it; the SLO is the detector's): device
    # interrupt handlers on its CPUs, the hardirq cause's evidence (detector/causes/hardirq.py).
    Signal("hardirq_ms_per_s", "Hard IRQ handler time on its CPUs", "ms/s",
           slo=Slo("hardirq_ms_per_s", 100.0, range=(0, 1000),
                   doc="device interrupt handler time on its CPUs (a tenth of a CPU) before it is a breach"),
           noise_floor=1.0),
    Signal("psi_cpu_some", "CPU pressure (some)", "%", slo=Slo("psi_cpu_some_percent", 20.0, range=_PERCENT),
           noise_floor=0.5),
    Signal("psi_memory_some", "Memory pressure (some)", "%",
           slo=Slo("psi_memory_some_percent", 10.0, range=_PERCENT), noise_floor=0.5),
    Signal("psi_io_some", "IO pressure (some)", "%", slo=Slo("psi_io_some_percent", 20.0, range=_PERCENT),
           noise_floor=0.5),
    # -- evidence and culprit signals (no SLO of their own) ------------------------------------------
    Signal("syn_retransmits_per_s", "SYN retransmits", "/s"),
    Signal("connect_failures_per_s", "Failed connects", "/s"),
    Signal("runq_wait_ms_per_s", "Run-queue wait per second", "ms/s"),
    Signal("runq_wait_share", "Share of time waiting", "%", 100.0, noise_floor=0.005),
    Signal("throttled_ratio", "Periods throttled at its CPU limit", "%", 100.0, noise_floor=0.01),
    Signal("throttled_ms_per_s", "Time throttled at its CPU limit", "ms/s"),
    Signal("cpu_cores", "CPU used", "cores", noise_floor=0.02),
    Signal("who_ran_instead_foreign_share", "Wait spent behind other cgroups", "%", 100.0),
    Signal("who_ran_instead_own_share", "Wait spent behind its own threads", "%", 100.0),
    Signal("who_ran_instead_node_share", "Wait spent behind the node's processes outside pods", "%", 100.0),
    Signal("who_ran_instead_kernel_work_share", "Wait the node's kernel work ran in (softirq, kernel threads)", "%",
           100.0),
    Signal("cause_wait_share", "Share of its wait the cause explains", "%", 100.0),
    Signal("runnable_per_cpu", "Its threads per CPU it may use", "x"),
    Signal("steal_ms_per_s", "Hypervisor steal on its CPUs", "ms/s", noise_floor=1.0),
    Signal("who_ran_instead_container_share", "Own wait behind one of its containers", "%", 100.0),
    Signal("container_throttled_ratio", "Periods a container was throttled at its limit", "%", 100.0),
)


def plugin_signals(plugins: Iterable[Any], declared: Iterable[str] = ()) -> tuple[Signal, ...]:
    """The signals the probe plugins declare themselves (``SignalExtractor.signal_specs``), as evidence
    entries: no SLO, no baseline (those are the detector's to declare, on its own entries). Those in
    ``declared`` (the detector's own entries: an SLO or a baseline on a plugin's signal) are not repeated."""
    skip = set(declared)
    return tuple(Signal(spec.name, spec.label, spec.unit, spec.scale, noise_floor=spec.noise_floor)
                 for p in plugins if p.signal_extractor is not None for spec in p.signal_extractor.signal_specs
                 if spec.name not in skip)


_ALL: tuple[Signal, ...] = (*_OWN, *plugin_signals(PLUGINS, declared=(s.name for s in _OWN)))


SIGNALS: dict[str, Signal] = {s.name: s for s in _ALL}
SLO_SIGNALS: tuple[Signal, ...] = tuple(s for s in _ALL if s.slo is not None)
BASELINE_SIGNALS: tuple[str, ...] = tuple(s.name for s in _ALL if s.baseline)
NOISE_FLOORS: dict[str, float] = {s.name: s.noise_floor for s in _ALL if s.noise_floor is not None}

# The detector's settings under `slo:` that bound no signal.
KNOBS: tuple[Knob, ...] = (
    Knob("k_sigma", float, 4.0, (0, None), "a signal also breaches when it is k sigma above its own baseline"),
    # At most a day: an incident that waits longer is never opened (and ticks of it overflowed an int).
    Knob("breach_seconds", float, 2.0, (0, 86400), "how long a breach must last before it is an incident"),
    Knob("clear_windows", int, 5, (1, None), "clean windows in a row before an incident ends (hysteresis)"),
    Knob("min_baseline_samples", int, 30, (1, None), "the k-sigma rule is off until the baseline has this many"),
)


class CatalogError(RuntimeError):
    pass


def check_catalog(signals: Iterable[Signal] = _ALL, knobs: Iterable[Knob] = KNOBS) -> None:
    """Every signal name and every `slo:` key is declared once; the k-sigma rule has a baseline."""
    seen: set[str] = set()
    fields: set[str] = {k.field for k in knobs}
    for s in signals:
        if s.name in seen:
            raise CatalogError(f"signal {s.name!r} is in the catalog twice")
        seen.add(s.name)
        if s.slo is not None:
            if s.slo.field in fields:
                raise CatalogError(f"signal {s.name!r}: SLO field {s.slo.field!r} is declared twice")
            fields.add(s.slo.field)
            if s.slo.problem(s.slo.default) is not None:
                raise CatalogError(f"signal {s.name!r}: default {s.slo.default:g} {s.slo.problem(s.slo.default)}")
        if s.k_sigma and not s.baseline:
            raise CatalogError(f"signal {s.name!r}: the k-sigma rule needs a baseline")


check_catalog()

# Every `slo:` setting by its field name: the SLOs (in catalog order), then the knobs.
SLO_SETTINGS: dict[str, Slo | Knob] = {**{s.slo.field: s.slo for s in SLO_SIGNALS if s.slo is not None},
                                       **{k.field: k for k in KNOBS}}


def slo_problem(field: str, value: float) -> str | None:
    """What is wrong with ``value`` for the `slo:` setting ``field`` (one phrase), None when valid."""
    setting = SLO_SETTINGS[field]
    if isinstance(setting, Slo):
        return setting.problem(value)
    return range_problem(setting.range, value)


def _check_slo_thresholds(self: Any) -> None:
    for f in dataclasses.fields(self):
        problem = slo_problem(f.name, getattr(self, f.name))
        if problem is not None:
            raise SloError(f"slo.{f.name}: {problem}")


# Absolute SLOs per victim signal, plus the anomaly and hysteresis knobs of the detector: one field per
# declaration above (an SLO: float in its own unit; a knob: its type), defaulted and checked from it.
SloThresholds = dataclasses.make_dataclass(
    "SloThresholds",
    [(s.field, float, dataclasses.field(default=float(s.default))) for s in SLO_SETTINGS.values() if isinstance(s, Slo)]
    + [(k.field, k.type, dataclasses.field(default=k.type(k.default))) for k in KNOBS],
    namespace={"__post_init__": _check_slo_thresholds, "__module__": __name__,
               "__doc__": "The `slo:` section of the policy, built from detector.catalog's declarations: "
                          + ", ".join(SLO_SETTINGS) + "."},
    frozen=True,
    slots=True,
)


def check_plugin_signals(plugins: Iterable[Any]) -> None:
    """Every signal a probe plugin (``probes.registry``) says it feeds is catalogued: the probes name
    signals as strings (they do not import the detector), so a typo there fails here, at start-up. A
    signal or node field the plugin declares itself (``signal_specs``, ``node_specs``) is one of its
    extractor's ``fields`` / ``node_fields``, and a declared signal is one it says it feeds."""
    for plugin in plugins:
        unknown = [name for name in plugin.signals if name not in SIGNALS]
        if unknown:
            raise CatalogError(f"probe {plugin.name!r} feeds signal(s) not in the catalog: {', '.join(unknown)}")
        plots = [name for name in plugin.victim_plots if name not in plugin.signals]
        if plots:
            raise CatalogError(f"probe {plugin.name!r} plots signal(s) it does not feed: {', '.join(plots)}")
        extractor = plugin.signal_extractor
        if extractor is None:
            continue
        for spec in extractor.signal_specs:
            if spec.name not in extractor.fields or spec.name not in plugin.signals:
                raise CatalogError(f"probe {plugin.name!r} declares signal {spec.name!r} but its extractor's "
                                   "fields and the signals it feeds must both name it")
        for row_spec in extractor.row_specs:
            if row_spec.name not in extractor.fields:
                raise CatalogError(f"probe {plugin.name!r} declares row field {row_spec.name!r} that its "
                                   "extractor's fields do not name")
        for node_spec in extractor.node_specs:
            if node_spec.name not in extractor.node_fields:
                raise CatalogError(f"probe {plugin.name!r} declares node field {node_spec.name!r} that its "
                                   "extractor's node_fields do not name")


def signal(name: str) -> Signal:
    """The catalog entry; KeyError names the signal when it is not catalogued."""
    return SIGNALS[name]


def human_value(name: str, value: float) -> str:
    """'59.9 ms' for runq_p99_ns=5.99e7; a signal not in the catalog keeps its raw number."""
    s = SIGNALS.get(name)
    return f"{value:.4g}" if s is None else s.human(value)
