# SPDX-License-Identifier: Apache-2.0
"""Scoring and reporting for the scenario benchmark: pure functions over plain records (unit-tested).

Times are seconds relative to the scenario's onset (the moment the antagonist was injected); the
victim's latency samples are (seconds since onset, latency ms).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from bench.scenarios.counts import count_recovery
from probes.hist import IntervalHistogram, merge_intervals

RECOVERY_FACTOR = 1.5  # "LS p99 back within 1.5x of the quiet baseline"
RECOVERY_WINDOW_S = 10.0
COUNTERFACTUAL_SLACK_S = 0.5  # a tick's record follows its step (where the action was applied) by this much at most
SETTLE_AFTER_MITIGATION_S = 2.0  # skip the first seconds after an action: the queue drains


@dataclass(frozen=True)
class Truth:
    """Ground truth of a scenario. ``cause`` None means no incident should be opened."""

    victim: str | None
    causes: tuple[str, ...] = ()  # accepted causes, first is the canonical one
    culprit: str | None = None  # pod name expected first in the culprit list; None: nobody is to blame
    # Other pods the injection truly harms (an LS neighbour on the victim's CPU waits behind the culprit
    # too): their incidents after the onset, with an accepted cause and the culprit named, are not
    # false; only ``victim``'s is scored.
    also_victims: tuple[str, ...] = ()

    @property
    def expects_incident(self) -> bool:
        return bool(self.causes)


@dataclass(frozen=True)
class IncidentRecord:
    victim: str  # pod name or cgroup path
    cause: str
    culprits: tuple[str, ...]
    started_s: float  # relative to onset
    ended_s: float | None = None
    signal: str = ""  # the signal that broke its SLO (what a softirq incident's actions are verified on)


@dataclass(frozen=True)
class ActionRecordLite:
    at_s: float
    kind: str
    target: str
    state: str
    summary: str


@dataclass
class PassResult:
    """One run of one scenario in one mode (none, detect, mitigate, koordlet)."""

    scenario: str
    mode: str
    baseline_s: float
    run_s: float
    incidents: list[IncidentRecord] = field(default_factory=list)
    actions: list[ActionRecordLite] = field(default_factory=list)
    samples: list[tuple[float, float]] = field(default_factory=list)  # (s since onset, latency ms)
    note: str = ""
    skipped: str = ""
    # The burst loop concluded the victim is steadily above its own limit (its verdict, not its words):
    # burst cannot help, no neighbour action is due, so the pass's recovery is not counted as a failure.
    above_own_limit: bool = False
    pods: list[str] = field(default_factory=list)  # our pods; incidents on anything else (another test's cgroups) are ignored
    # Per detector tick: (s since onset, kswapd pages reclaimed/s, node direct reclaim ms/s): whether and
    # when the node was in global reclaim, for the scenarios that provoke it.
    node_reclaim: list[tuple[float, float, float]] = field(default_factory=list)
    # Per detector tick, the victim's runqueue histogram (s since onset, slots, sum ns, count), and its open
    # incident's counterfactual for each of our pods it names (s since onset, pod, victim runq p99 ms
    # without it): issue 28's check of the counterfactual against the runqueue p99 measured after the
    # action moved that pod away. Pods its step moved together are one name, "a+b" (moved_together_name).
    runq_ticks: list[tuple[float, tuple[int, ...], int, int]] = field(default_factory=list)
    counterfactual: list[tuple[float, str, float]] = field(default_factory=list)
    # Per detector tick, the victim's wait behind the node's kernel work (s since onset, ms/s: kswapd,
    # kcompactd, kdamond, ksoftirqd slices in its waits of 128 µs or more): whether an action left the
    # kernel work a culprit caused (a capped grower still streaming, pages DAMON keeps paging out).
    kernel_work: list[tuple[float, float]] = field(default_factory=list)
    # Per detector tick, running totals of the kernel's counts a mitigation moves (s since onset, counter,
    # total: bench/scenarios/counts.py), and whether "recovered" is judged on them instead of the victim's
    # p99 (--judge-counts: the VM lane, whose latencies under TCG are not exact).
    counts: list[tuple[float, str, float]] = field(default_factory=list)
    judge_on_counts: bool = False
    # The manager's audit log lines and each incident's mitigation notes (its evidence, in order): what the
    # agent did and why, step by step, so a run that did not recover can be read afterwards.
    audit: list[dict] = field(default_factory=list)
    # Per detector tick, what the victim waited behind and how our other pods fared (issue 41: a run that
    # did not recover, read afterwards): see bench/scenarios/runner.py _note_timeline. Not scored.
    timeline: list[dict] = field(default_factory=list)
    incident_notes: list[tuple[str, float, tuple[str, ...]]] = field(default_factory=list)  # (victim, started_s, notes)
    # Where the after-window starts when an action's aftermath on the node had to settle first (s since
    # onset; None: SETTLE_AFTER_MITIGATION_S after the action), and what settled, in words: an eviction's
    # freed memory reported to the hypervisor, which takes the victim's vCPU (steal) for ~30 s on a VM
    # with free page reporting (bench/scenarios/runner.py _wait_out_eviction_aftermath).
    after_from_s: float | None = None
    aftermath: str = ""


@dataclass
class Score:
    scenario: str
    mode: str
    expected: str  # canonical cause or "none"
    detected: bool | None  # None: no incident expected (quiet scenarios)
    cause: str  # what we said ("" when nothing)
    cause_correct: bool | None
    culprit_rank: int | None  # 1-based rank of the true culprit; None when not listed / not applicable
    culprit_ok: bool | None  # rank 1 when there is a culprit; an empty list when nobody is to blame
    time_to_detect_s: float | None
    time_to_mitigate_s: float | None
    p99_before_ms: float | None
    p99_during_ms: float | None
    p99_after_ms: float | None
    recovered: bool | None  # after <= 1.5x before, within 10 s of the first action
    false_incidents: int
    actions: int
    note: str = ""
    skipped: bool = False  # the pass did not run (its note says why)
    # The victim's runqueue p99 the detector said it would have without the culprit (the last value before
    # the first action), and its runqueue p99 measured after the action (+2 s to +10 s after it: p99 after's
    # window, unless the action's aftermath on the node moved that one: PassResult.after_from_s).
    runq_p99_without_culprit_ms: float | None = None
    runq_p99_after_ms: float | None = None
    runq_p99_within: bool | None = None  # the two within 25 % (cf_within)
    counts_recovery: str = ""  # the judgement on the kernel's counts (counts.py), whether or not it decided


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def window_p99(samples: Iterable[tuple[float, float]], start_s: float, end_s: float, min_samples: int = 20) -> float | None:
    vals = [lat for t, lat in samples if start_s <= t < end_s]
    return percentile(vals, 99.0) if len(vals) >= min_samples else None


def load_samples(text: str, onset_ns: int) -> list[tuple[float, float]]:
    """The victim's ``<monotonic ns> <latency ns>`` lines -> (s since onset, ms); a torn last line is dropped."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[0].isdigit() or not parts[1].lstrip("-").isdigit():
            continue
        out.append(((int(parts[0]) - onset_ns) / 1e9, int(parts[1]) / 1e6))
    return out


def after_window(acted_s: float, after_from_s: float | None = None) -> tuple[float, float]:
    """The window "recovered" is judged over, s since onset: from SETTLE_AFTER_MITIGATION_S after the
    action (the queue drains), or from ``after_from_s`` when later (the action's aftermath on the node
    settled then: PassResult.after_from_s), for RECOVERY_WINDOW_S - SETTLE_AFTER_MITIGATION_S."""
    lo = acted_s + SETTLE_AFTER_MITIGATION_S
    if after_from_s is not None:
        lo = max(lo, after_from_s)
    return lo, lo + RECOVERY_WINDOW_S - SETTLE_AFTER_MITIGATION_S


def _aftermath_note(result: PassResult, acted_s: float | None) -> str:
    """What the after-window waited for, and the victim's p99 meanwhile (shown, not judged)."""
    if acted_s is None or result.after_from_s is None or not result.aftermath:
        return ""
    lo, hi = after_window(acted_s, result.after_from_s)
    meanwhile = window_p99(result.samples, acted_s + SETTLE_AFTER_MITIGATION_S, lo)
    said = "" if meanwhile is None else f"; p99 {meanwhile:.2f} ms until then"
    return f"after-window +{lo:.1f}-{hi:.1f} s: {result.aftermath}{said}"


def score(truth: Truth, result: PassResult) -> Score:
    ours = [i for i in result.incidents if not result.pods or i.victim in result.pods]
    matching = [i for i in ours if truth.victim is not None and i.victim == truth.victim and i.started_s >= 0]
    also = [i for i in ours if i.victim in truth.also_victims and i.started_s >= 0 and i.cause in truth.causes
            and (truth.culprit is None or truth.culprit in i.culprits)]
    false = [i for i in ours if (i not in matching and i not in also) or not truth.expects_incident]
    first = matching[0] if matching and truth.expects_incident else None
    detected = (first is not None) if truth.expects_incident else None
    cause_correct = (first.cause in truth.causes) if first is not None else (None if not truth.expects_incident else False)
    rank: int | None = None
    culprit_ok: bool | None = None
    if first is not None:
        if truth.culprit is not None:
            rank = first.culprits.index(truth.culprit) + 1 if truth.culprit in first.culprits else None
            culprit_ok = rank == 1
        else:
            culprit_ok = not first.culprits
    applied = [a for a in result.actions if a.state in ("applied", "verified") and a.at_s >= 0]
    ttm = applied[0].at_s if applied else None
    before = window_p99(result.samples, -result.baseline_s, 0.0)
    during_end = ttm if ttm is not None else result.run_s
    during = window_p99(result.samples, 0.0, during_end)
    after = None
    recovered = None
    if ttm is not None:
        after = window_p99(result.samples, *after_window(ttm, result.after_from_s))
        if after is not None and before is not None:
            recovered = after <= RECOVERY_FACTOR * before
    # On counts, from the first action left in place, as the p99 (a ladder's step that did not help and was
    # undone is not the mitigation: the one after it is); with none left in place, from the first action in
    # any state, so one reverted as "did not help" is judged on what followed it.
    acted = ttm if ttm is not None else min((a.at_s for a in result.actions if a.at_s >= 0), default=None)
    counts_window = after_window(acted, result.after_from_s) if acted is not None else (0.0, 0.0)
    on_counts = (count_recovery(result.counts, truth.causes[0], result.baseline_s, acted,
                                counts_window[0], min(counts_window[1], result.run_s))
                 if acted is not None and result.counts and truth.causes else None)
    note = "; ".join(x for x in (result.skipped or result.note, _aftermath_note(result, ttm)) if x)
    if on_counts is not None and result.judge_on_counts:
        recovered = on_counts.recovered
        note = "; ".join([*([note] if note else []), on_counts.summary()])
    if acted is not None and result.above_own_limit:
        recovered = None  # burst cannot help a pod steadily above its limit: said, not counted as a failure
    return Score(
        scenario=result.scenario, mode=result.mode, expected=truth.causes[0] if truth.causes else "none",
        detected=detected, cause=first.cause if first else (false[0].cause if false else ""),
        cause_correct=cause_correct, culprit_rank=rank, culprit_ok=culprit_ok,
        time_to_detect_s=round(first.started_s, 2) if first else None,
        time_to_mitigate_s=round(ttm, 2) if ttm is not None else None,
        p99_before_ms=_r(before), p99_during_ms=_r(during), p99_after_ms=_r(after), recovered=recovered,
        false_incidents=len(false), actions=len(applied), note=note,
        skipped=bool(result.skipped), counts_recovery=on_counts.summary() if on_counts is not None else "",
        **_counterfactual_check(result, ttm, moved_by_first_action([(a.at_s, a.target) for a in applied])
                                if applied else truth.culprit, in_place=bool(applied) and applied[0].kind in IN_PLACE_ACTIONS),
    )


MOVED_TOGETHER_S = 0.5  # actions applied this close to the first one came from the same tick's decisions


def moved_together_name(pods: Iterable[str]) -> str:
    """One name for pods an incident's step moved together ("a+b", sorted): the runner records their
    joint counterfactual under it."""
    return "+".join(sorted(set(pods)))


def moved_by_first_action(applied: Sequence[tuple[float, str]]) -> str:
    """What the first applied action moved, as (s since onset, target) pairs in order: its pod, or the
    pods the same tick's actions moved with it (moved_together_name)."""
    first = applied[0][0]
    return moved_together_name(target for at, target in applied if at - first <= MOVED_TOGETHER_S)


# Actions that leave the culprit running where it was: a memory cap stops a grower's growth, not its
# stream through its page cache, and the kernel work that stream makes stays (docs/benchmarks.md, global
# reclaim). Issue 28 compares the counterfactual with the p99 after an action moved the culprit away, so
# after these the two are shown and not judged.
IN_PLACE_ACTIONS = ("memory_suppress",)  # ActionKind values


CF_WITHIN = 0.25  # issue 28: the counterfactual within 25 % of the p99 measured after the action ...
CF_FIRST_MOVED_MS = 0.128  # ... or both below the first slot the kernel moves waits from (bpf/runqlat.h RUNQ_CF_MIN_NS)


def cf_within(without_ms: float | None, after_ms: float | None) -> bool | None:
    """Issue 28's check: |counterfactual - after| <= 25 % of after, or both under 0.128 ms (below it the
    log2 histograms cannot tell them apart); None when either is missing."""
    if without_ms is None or after_ms is None:
        return None
    if without_ms < CF_FIRST_MOVED_MS and after_ms < CF_FIRST_MOVED_MS:
        return True
    return abs(without_ms - after_ms) <= CF_WITHIN * after_ms


def _counterfactual_check(result: PassResult, ttm: float | None, moved: str | None, *,
                          in_place: bool = False) -> dict[str, float | bool | None]:
    """The counterfactual the detector gave during the incident for the pod the first action ``moved`` (its
    last value before the action) and the victim's runqueue p99 from 2 s to 10 s after the action (merged
    histograms of those ticks); judged within 25 % or not unless the action left it ``in_place``."""
    if ttm is None:
        return {}
    # The tick whose decision applied the action is recorded just after it (the action is taken inside
    # the detector's step): its counterfactual is still the one the action was decided on.
    said = [v for t, pod, v in result.counterfactual if t <= ttm + COUNTERFACTUAL_SLACK_S and pod == moved]
    # Right after the action, as the counterfactual predicts it (issue 28; bench/scenarios/cfcheck.py), even
    # where "recovered" waits for the action's aftermath on the node (PassResult.after_from_s)
    hist = runq_ticks_histogram(ticks_within(result.runq_ticks, *after_window(ttm)))
    measured = hist.quantile_ns(0.99) / 1e6 if hist is not None and hist.count >= 20 else None
    without = said[-1] if said else None
    return {"runq_p99_without_culprit_ms": _r(without), "runq_p99_after_ms": _r(measured),
            "runq_p99_within": None if in_place else cf_within(without, measured)}  # judged on the exact values


TickRecord = TypeVar("TickRecord", bound=tuple)  # a per-tick record of PassResult, s since onset first


def ticks_within(ticks: Sequence[TickRecord], lo: float, hi: float) -> list[TickRecord]:
    """The recorded ticks (tuples, s since onset first: runq_ticks, kernel_work) whose whole interval lies
    in [lo, hi). A tick is recorded at its end and covers the time since the one before it: a tick loop
    stalled across the action (2.3 s at an eviction, under global reclaim) records a tick just after
    ``lo`` that holds mostly the waits from before it."""
    ticks = sorted(ticks, key=lambda t: t[0])
    starts = [ticks[0][0], *(t[0] for t in ticks[:-1])] if ticks else []
    return [t for start, t in zip(starts, ticks, strict=True) if lo <= start and t[0] < hi]


def runq_ticks_histogram(ticks: Sequence[tuple[float, tuple[int, ...], int, int]]) -> IntervalHistogram | None:
    """The victim's runqueue histogram over recorded ticks (PassResult.runq_ticks), merged; None: no tick."""
    if not ticks:
        return None
    return merge_intervals(IntervalHistogram(tuple(slots), total, count, None) for _, slots, total, count in ticks)


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


@dataclass
class Summary:
    scenarios: int
    recall: float | None  # detected / scenarios that expect an incident
    precision: float | None  # correct incidents / all incidents opened
    cause_correct: float | None
    culprit_first: float | None
    false_incidents_quiet: int  # incidents in the scenarios that expect none
    median_time_to_detect_s: float | None


def summarize(scores: Sequence[Score]) -> Summary:
    """Over the detection passes (detect mode), the ones that ran."""
    rows = [s for s in scores if s.mode == "detect" and not s.skipped]
    expect = [s for s in rows if s.detected is not None]
    detected = [s for s in expect if s.detected]
    true_incidents = len(detected)
    all_incidents = true_incidents + sum(s.false_incidents for s in rows)
    with_culprit = [s for s in detected if s.culprit_ok is not None]
    ttd = sorted(s.time_to_detect_s for s in detected if s.time_to_detect_s is not None)
    return Summary(
        scenarios=len(rows),
        recall=_ratio(len(detected), len(expect)),
        precision=_ratio(true_incidents, all_incidents),
        cause_correct=_ratio(sum(1 for s in detected if s.cause_correct), len(detected)),
        culprit_first=_ratio(sum(1 for s in with_culprit if s.culprit_ok), len(with_culprit)),
        false_incidents_quiet=sum(s.false_incidents for s in rows if s.detected is None),
        median_time_to_detect_s=ttd[len(ttd) // 2] if ttd else None,
    )


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 3) if b else None


COLUMNS = (
    ("scenario", "scenario"), ("mode", "mode"), ("expected", "expected"), ("detected", "detected"),
    ("cause", "cause said"), ("cause_correct", "cause ok"), ("culprit_rank", "culprit rank"),
    ("time_to_detect_s", "detect s"), ("time_to_mitigate_s", "mitigate s"), ("p99_before_ms", "p99 before ms"),
    ("p99_during_ms", "p99 during ms"), ("p99_after_ms", "p99 after ms"), ("recovered", "recovered"),
    ("false_incidents", "false inc."), ("actions", "actions"),
    ("runq_p99_without_culprit_ms", "runq p99 w/o culprit ms"), ("runq_p99_after_ms", "runq p99 after ms"),
    ("runq_p99_within", "within 25 %"),
    ("note", "note"),
)


def cell(v: object) -> str:
    """A table cell: '-' for None, yes/no for a bool, two decimals for a float."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.2f}"
    return str(v).replace("|", "/")


def markdown_table(scores: Sequence[Score]) -> str:
    head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
    sep = "|" + "|".join("---" for _ in COLUMNS) + "|"
    rows = ["| " + " | ".join(cell(getattr(s, key)) for key, _ in COLUMNS) + " |" for s in scores]
    return "\n".join([head, sep, *rows])


def markdown_summary(summary: Summary) -> str:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:.0f} %"

    ttd = "-" if summary.median_time_to_detect_s is None else f"{summary.median_time_to_detect_s:.2f} s"
    return (f"Detection passes: {summary.scenarios} scenarios; recall {pct(summary.recall)}, precision "
            f"{pct(summary.precision)}, cause correct {pct(summary.cause_correct)}, culprit first "
            f"{pct(summary.culprit_first)}, false incidents in quiet scenarios {summary.false_incidents_quiet}, "
            f"median time to detect {ttd}.")


def to_json(scores: Sequence[Score], summary: Summary, extra: dict | None = None) -> str:
    return json.dumps({"summary": asdict(summary), "scores": [asdict(s) for s in scores], **(extra or {})},
                      indent=2, sort_keys=True, default=str)
