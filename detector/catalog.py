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

A probe declares its own signals with its plugin (``SignalExtractor.signal_specs``, probes/plugin.py),
their SLO (``SloSpec``, plain data made into a :class:`Slo` here), baseline and k-sigma rule included:
each becomes an entry here (:func:`plugin_signals`), so adding a probe with a new signal, SLO'd or not,
needs no edit in this file. The SLOs, the catalog's own and the plugins', are in ``check_order``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from probes.registry import PLUGINS

Range = tuple[float | None, float | None]  # (min, max) of a setting; None: unbounded on that side

# What a breach check reads: the victim's WorkloadSignals row -> the value to compare with the SLO this
# tick, None: not checked.
Gate = Callable[[Any], float | None]


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
    # Its place among every SLO, lowest first: the breach checks' order and SloThresholds' field order
    # (the plugins' SLOs say theirs: SloSpec.check_order).
    check_order: int = 0
    # Judged over the victim's last this many ticks: the worst of their values (SloSpec.window_ticks).
    window_ticks: int = 0

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

    @property
    def window_ticks(self) -> int:
        return 0 if self.slo is None else self.slo.window_ticks

    def tick_value(self, row: Any) -> float | None:
        """This tick's reading for its SLO; None: gated out."""
        if self.slo is not None and self.slo.gate is not None:
            return self.slo.gate(row)
        return getattr(row, self.name)

    def breach_value(self, row: Any, recent: Sequence[float] = ()) -> float | None:
        """The value its breach check compares with the SLO this tick; None: not checked (gated out). An
        SLO judged over a window (``window_ticks``) compares the worst of ``recent``, the victim's last
        ticks' readings (this one's included), while one is above 0."""
        if self.window_ticks:
            return max(recent, default=0.0) or None
        return self.tick_value(row)

    def human(self, value: float) -> str:
        return f"{value * self.scale:.3g} {self.unit}".replace(" %", "%")


_PERCENT: Range = (0, 100)

# The detector's own signals. A probe's signal, its SLO included, is declared with its plugin (above,
# through plugin_signals), and so is the evidence the detector derives from one probe's fields alone
# (the who-ran-instead shares of a wait: SignalExtractor.evidence_specs); the SLOs here say where they
# come among the plugins' (check_order): the run queue's is 10, the connect path's 20, reclaim's 30,
# softirq's 40 and 50, hardirq's 60.
_OWN: tuple[Signal, ...] = (
    # -- signals with an SLO: a latency-sensitive workload breaches on these ------------------------
    Signal("psi_cpu_some", "CPU pressure (some)", "%",
           slo=Slo("psi_cpu_some_percent", 20.0, range=_PERCENT, check_order=70), noise_floor=0.5),
    Signal("psi_memory_some", "Memory pressure (some)", "%",
           slo=Slo("psi_memory_some_percent", 10.0, range=_PERCENT, check_order=80), noise_floor=0.5),
    Signal("psi_io_some", "IO pressure (some)", "%",
           slo=Slo("psi_io_some_percent", 20.0, range=_PERCENT, check_order=90), noise_floor=0.5),
    # -- evidence and culprit signals (no SLO of their own) ------------------------------------------
    Signal("runq_wait_share", "Share of time waiting", "%", 100.0, noise_floor=0.005),
    Signal("throttled_ratio", "Periods throttled at its CPU limit", "%", 100.0, noise_floor=0.01),
    Signal("throttled_ms_per_s", "Time throttled at its CPU limit", "ms/s"),
    Signal("cpu_cores", "CPU used", "cores", noise_floor=0.02),
    Signal("cause_wait_share", "Share of its wait the cause explains", "%", 100.0),
    Signal("gone_culprit_wait_share", "Wait behind culprits gone since, left out of the causes' shares", "%", 100.0),
    Signal("runnable_per_cpu", "Its threads per CPU it may use", "x"),
    Signal("container_throttled_ratio", "Periods a container was throttled at its limit", "%", 100.0),
)


def _plugin_slo(spec: Any) -> Slo:
    """A plugin's SloSpec as the catalog's Slo."""
    return Slo(spec.field, spec.default, to_raw=spec.to_raw, range=spec.range, divides=spec.divides,
               gate=spec.gate, doc=spec.doc, check_order=spec.check_order, window_ticks=spec.window_ticks)


def plugin_signals(plugins: Iterable[Any], declared: Iterable[str] = ()) -> tuple[Signal, ...]:
    """The signals the probe plugins declare themselves (``SignalExtractor.signal_specs``, and the evidence
    derived from their fields, ``evidence_specs``), with their SLO, baseline and k-sigma rule as declared.
    Those in ``declared`` (the detector's own entries) are not repeated."""
    skip = set(declared)
    return tuple(Signal(spec.name, spec.label, spec.unit, spec.scale,
                        slo=None if spec.slo is None else _plugin_slo(spec.slo), k_sigma=spec.k_sigma,
                        baseline=spec.baseline, noise_floor=spec.noise_floor)
                 for p in plugins if p.signal_extractor is not None
                 for spec in (*p.signal_extractor.signal_specs, *p.signal_extractor.evidence_specs)
                 if spec.name not in skip)


def _in_order(signals: Iterable[Signal]) -> tuple[Signal, ...]:
    """The SLO'd signals first, in check_order (ties: as declared), then the evidence as declared."""
    listed = tuple(signals)
    slo = sorted((s for s in listed if s.slo is not None), key=lambda s: s.slo.check_order if s.slo else 0)
    return (*slo, *(s for s in listed if s.slo is None))


_ALL: tuple[Signal, ...] = _in_order((*_OWN, *plugin_signals(PLUGINS, declared=(s.name for s in _OWN))))


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
        for spec in extractor.evidence_specs:
            if spec.name in extractor.fields:
                raise CatalogError(f"probe {plugin.name!r} declares evidence {spec.name!r} that its extractor "
                                   "sets as a field: declare it as a signal instead")
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
