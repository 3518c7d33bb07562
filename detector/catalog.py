"""The signal catalog: every signal the detector breaches on, learns or cites as evidence, once.

Each entry says what the number is (unit and how it reads to a human), which ``SloThresholds``
field bounds it (and how that field's unit converts to the signal's), whether the k-sigma rule
applies to it, whether a baseline is learned for it, and its noise floor (the smallest spread worth
calling noise, in the signal's unit; the baselines' sigma floor). Breach checks
(``detector.incidents``), baselines (``detector.baseline``), evidence and cause rules
(``detector.causes``), policy validation (``detector.policy``), the exporter's incident metrics and
``noisyneighbor diagnose`` read it from here.

A signal bounded by an SLO field that ``SloThresholds`` does not have cannot exist: the check runs
when this module is imported (:func:`check_catalog`), so a typo fails every import, not a tick.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from detector.policy import SloThresholds


@dataclass(frozen=True, slots=True)
class Signal:
    name: str  # the key in WorkloadSignals / the store / Evidence.signal
    label: str  # what a human calls it (diagnose, HTML report)
    unit: str  # the unit it is *shown* in
    scale: float = 1.0  # raw value x scale = value in ``unit``
    slo_field: str | None = None  # the SloThresholds field bounding it; None: evidence only
    slo_to_raw: float = 1.0  # SLO field value x slo_to_raw = threshold in the signal's raw unit
    slo_range: tuple[float | None, float | None] = (0, None)  # valid values of the SLO field
    k_sigma: bool = False  # also breaches at k sigma above its own baseline (and half way to the SLO)
    baseline: bool = False  # a baseline is learned for it (for the k-sigma rule and the evidence)
    noise_floor: float | None = None  # smallest spread worth calling noise, in its raw unit

    def threshold(self, slo: SloThresholds) -> float | None:
        """The SLO bound in the signal's raw unit, or None for an evidence-only signal."""
        if self.slo_field is None:
            return None
        return float(getattr(slo, self.slo_field)) * self.slo_to_raw

    def human(self, value: float) -> str:
        return f"{value * self.scale:.3g} {self.unit}".replace(" %", "%")


_PERCENT = (0, 100)

_ALL: tuple[Signal, ...] = (
    # -- signals with an SLO: a latency-sensitive workload breaches on these -------------------------
    Signal("runq_p99_ns", "Run-queue wait p99", "ms", 1e-6, slo_field="runq_p99_ms", slo_to_raw=1e6,
           k_sigma=True, baseline=True, noise_floor=5_000.0),
    Signal("connect_p99_ns", "TCP connect p99", "ms", 1e-6, slo_field="connect_p99_ms", slo_to_raw=1e6,
           baseline=True, noise_floor=20_000.0),
    Signal("reclaim_stall_ms_per_s", "Memory reclaim stall", "ms/s", slo_field="reclaim_stall_ms_per_s",
           slo_range=(0, 1000), baseline=True, noise_floor=0.5),
    Signal("softirq_ms_per_s", "Softirq time on its CPUs", "ms/s", slo_field="softirq_ms_per_s",
           slo_range=(0, 1000), baseline=True, noise_floor=1.0),
    Signal("softirq_delay_p99_ns", "Softirq delay p99", "ms", 1e-6, slo_field="softirq_delay_p99_ms",
           slo_to_raw=1e6, noise_floor=5_000.0),
    Signal("psi_cpu_some", "CPU pressure (some)", "%", slo_field="psi_cpu_some_percent", slo_range=_PERCENT,
           noise_floor=0.5),
    Signal("psi_memory_some", "Memory pressure (some)", "%", slo_field="psi_memory_some_percent",
           slo_range=_PERCENT, noise_floor=0.5),
    Signal("psi_io_some", "IO pressure (some)", "%", slo_field="psi_io_some_percent", slo_range=_PERCENT,
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
    Signal("runnable_per_cpu", "Its threads per CPU it may use", "x"),
    Signal("steal_ms_per_s", "Hypervisor steal on its CPUs", "ms/s", noise_floor=1.0),
    Signal("container_throttled_ratio", "Periods a container was throttled at its limit", "%", 100.0),
)

SIGNALS: dict[str, Signal] = {s.name: s for s in _ALL}
SLO_SIGNALS: tuple[Signal, ...] = tuple(s for s in _ALL if s.slo_field is not None)
BASELINE_SIGNALS: tuple[str, ...] = tuple(s.name for s in _ALL if s.baseline)
NOISE_FLOORS: dict[str, float] = {s.name: s.noise_floor for s in _ALL if s.noise_floor is not None}


class CatalogError(RuntimeError):
    pass


def check_catalog(signals: tuple[Signal, ...] = _ALL, slo_cls: type = SloThresholds) -> None:
    """Every SLO field a signal names exists on ``slo_cls``, and every name is unique."""
    fields = {f.name for f in dataclasses.fields(slo_cls)}
    seen: set[str] = set()
    for s in signals:
        if s.name in seen:
            raise CatalogError(f"signal {s.name!r} is in the catalog twice")
        seen.add(s.name)
        if s.slo_field is not None and s.slo_field not in fields:
            raise CatalogError(f"signal {s.name!r}: SLO field {s.slo_field!r} is not a SloThresholds field")
        if s.k_sigma and not s.baseline:
            raise CatalogError(f"signal {s.name!r}: the k-sigma rule needs a baseline")


def check_plugin_signals(plugins: Iterable[Any]) -> None:
    """Every signal a probe plugin (``probes.registry``) says it feeds is catalogued: the probes name
    signals as strings (they do not import the detector), so a typo there fails here, at start-up."""
    for plugin in plugins:
        unknown = [name for name in plugin.signals if name not in SIGNALS]
        if unknown:
            raise CatalogError(f"probe {plugin.name!r} feeds signal(s) not in the catalog: {', '.join(unknown)}")


def signal(name: str) -> Signal:
    """The catalog entry; KeyError names the signal when it is not catalogued."""
    return SIGNALS[name]


def slo_ranges() -> dict[str, tuple[float | None, float | None]]:
    """Valid values of each SLO field that bounds a signal (policy validation reads these)."""
    return {s.slo_field: s.slo_range for s in SLO_SIGNALS if s.slo_field is not None}


def human_value(name: str, value: float) -> str:
    """'59.9 ms' for runq_p99_ns=5.99e7; a signal not in the catalog keeps its raw number."""
    s = SIGNALS.get(name)
    return f"{value:.4g}" if s is None else s.human(value)


check_catalog()
