# SPDX-License-Identifier: Apache-2.0
"""The probe plugin interface: what a probe declares so the collector, exporter, ``top``, the agent and
the benches can use it without naming it (the list of plugins is probes/registry.py).

See docs/architecture.md for the flow and a walk-through of adding a probe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from probes.engine import AttachMode, ProbeSpec

ENGINE_ATTACH_MODES: tuple[str, ...] = get_args(AttachMode)  # what every probe accepts


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A metric family a plugin adds to /metrics: per cgroup (filled from its ``cgroup_series``, labelled
    with the cgroup's pod and container by the exporter) or per node (from its ``node_series``)."""

    name: str  # noisyneighbor_..., _total for a counter, _seconds for a histogram of latencies
    type: str  # "gauge" | "counter" | "histogram" (a probes.hist.LatencyHistogram, cumulative)
    help: str
    labels: tuple[str, ...] = ()  # its own labels, after node (and after the cgroup's labels)
    per_cgroup: bool = True
    # A node metric whose `cpu` label grows with the node's CPUs: exported per CPU only with the
    # exporter's per_cpu_series, else its series are summed over CPUs (the label dropped).
    per_cpu: bool = False
    # With per_cpu, every label that grows with the node's CPUs, all dropped together without
    # per_cpu_series: besides `cpu`, e.g. an IRQ line (multi-queue devices have one per CPU).
    per_cpu_labels: tuple[str, ...] = ("cpu",)


# One value of a plugin's metric for one cgroup: (metric, cgroup, own label values, value). The cgroup is
# an id in the hierarchy of the plugin's ``id_controller`` or a path relative to that hierarchy's root;
# the value a float, or a LatencyHistogram for a histogram. Samples with the same key add up (counters,
# histograms); a gauge's last value stands.
CgroupSample = tuple[str, int | str, tuple[str, ...], Any]
NodeSample = tuple[str, tuple[str, ...], Any]  # (metric, own label values, value) for the node


@dataclass(frozen=True, slots=True)
class TopColumn:
    """One column of a plugin's ``top`` table, as data: ``probes/`` knows nothing of rendering, the view
    (noisyneighbor/views.py) formats the row's ``key`` by ``unit``."""

    title: str
    key: str  # the row's key holding the value
    unit: str = "text"  # "text", "count", "rate" (per s), "bytes", "ms", "us", "pct"
    sorted_by: bool = False  # the rows come sorted by it, highest first (the view marks it ▼)
    sort: str | None = None  # the table's sort option this column is (TopTable.sort_keys), marked when chosen
    exact: str | None = None  # the row's key saying whether the value is exact (else shown as a bound: ≤)
    when: str | None = None  # the row's key that must be non-zero for a value ("-" otherwise)
    scale: float = 1.0  # the value times this is in ``unit`` (ms -> us: 1e3)
    text: Callable[[dict[str, Any]], str] | None = None  # the cell's text from the row, instead of the unit's
    left: bool | None = None  # justified left (None: text columns only)
    flex: bool = False  # takes the width left over, ellipsized (lists)


@dataclass(frozen=True)
class TopInput:
    """What a plugin's ``top`` table is made from, once per interval: the two snapshots, the plugin's
    ``delta`` between them (the interval layer the detector reads too) and the seconds between them."""

    prev: Any
    cur: Any
    interval: Any
    dt: float


@dataclass(frozen=True)
class TopTable:
    """A plugin's ``top`` view declared as one table, so a probe's view needs no section class or renderer
    in noisyneighbor/. ``rows`` turns the interval into JSON-able rows, each naming its cgroup by ``cgroup``
    (a path in the probe's hierarchy, named by the path's pod and container) or ``cgroup_id`` (resolved in
    the probe's hierarchy), sorted as they should show. The section (`top --json`) is ``interval_s``, the
    rows under ``rows_key``, what ``extras`` adds, then the probe's ``drops``."""

    title: str  # after the view's name in its heading, e.g. "GPU memory per cgroup"
    columns: tuple[TopColumn, ...]
    rows: Callable[[TopInput], list[dict[str, Any]]]
    nothing: str  # what did not happen when there is no row ("no process on a GPU")
    hotkey: str | None = None  # the live view's key for it
    rows_key: str = "rows"  # the section's key holding the rows
    name_title: str | None = "CGROUP / POD"  # the cgroup name column (and QOS) first; None: rows name no cgroup
    kind_key: str = "kind"  # the key of the cgroup's kind in a row (when the row has a "kind" of its own)
    # Opened once after the baseline snapshot with (the probe, HostPaths): returns what adds the section's
    # own fields each interval, from (TopInput, name_of) where name_of(cgroup id) is a cgroup's display
    # name (e.g. the worst stall events, a node total, a /proc counter's difference).
    extras: Callable[[Any, Any], Callable[[TopInput, Callable[[int], str]], dict[str, Any]]] | None = None
    footer: Callable[[dict[str, Any]], str] | None = None  # the line under the table, from the section
    sort_keys: Mapping[str, str] = field(default_factory=dict)  # --sort option -> row key (highest first; "name": A-Z)
    sort_hotkeys: Mapping[str, str] = field(default_factory=dict)  # live key -> sort option
    record_top_level: bool = False  # `top --json`: its section's keys are the record's own (the first view)
    # The rows list the cgroups the psi view reads (CPU use, throttling, PSI): row key -> the key it is
    # shown under there.
    psi_cgroups: Mapping[str, str] | None = None


# cgroup id -> the key of the workload it belongs to (None: none), handed to an extractor by the
# detector; probes/ never sees the detector's types.
WorkloadKey = Callable[[int], str | None]
# Keys an extractor may use beside workload keys, e.g. for who ran instead of a waiting task: the
# CPU's idle task, or a culprit that could not be attributed.
IDLE = "<idle>"
UNKNOWN = "<unknown>"

# When an extractor runs among the signals the detector reads from cgroup files: after "tasks" come
# the cgroups' CPU accounting files, then "cpus" (per-CPU values joined through where each workload
# ran), then "memory", the memory files, "network", and the PSI files last.
SIGNAL_STAGES = ("tasks", "cpus", "memory", "network")


@dataclass(frozen=True, slots=True)
class SloSpec:
    """The SLO bounding a plugin's signal, as plain data (probes/ does not import detector/): the
    detector's catalog makes its ``Slo`` of it, the policy's ``slo:`` key ``field`` with its default and
    range, a field of SloThresholds."""

    field: str  # the SloThresholds field and policy key, in the SLO's unit ("runq_p99_ms")
    default: float
    # Its place among every SLO (the catalog's own and the plugins'), lowest first: the order the breach
    # checks run in and the SloThresholds fields (the policy's `slo:` keys) come in.
    check_order: int
    to_raw: float = 1.0  # field value x to_raw = threshold in the signal's raw unit
    range: tuple[float | None, float | None] = (0, None)  # valid values of the field (None: unbounded)
    divides: bool = False  # a cause rule divides by it: the lower bound is exclusive (0 is refused)
    # (the victim's WorkloadSignals row) -> the value to compare with the SLO this tick, None: not checked.
    # None: the row's value of the signal, every tick.
    gate: Callable[[Any], float | None] | None = None
    doc: str = ""
    # Judged over the victim's last this many ticks (sparse events: a client blocked in a SYN retry makes
    # one every few ticks): the SLO compares the worst (largest) of their values (the gate's; None is 0),
    # and is not checked while none is above 0. 0: this tick's value alone.
    window_ticks: int = 0


@dataclass(frozen=True, slots=True)
class SignalSpec:
    """A workload signal a plugin adds to the detector, declared with the plugin so that a new probe
    needs no edit in detector/: a WorkloadSignals field (``default`` on every row nothing set it on,
    the probe off included) and its detector.catalog entry: ``diagnose`` names it, the time-series
    store keeps it, and with an ``slo`` the detector breaches on it. A cause rule reading it is the
    detector's (detector/causes/)."""

    name: str  # the WorkloadSignals field and catalog name, its unit in the name ("hardirq_ms_per_s")
    label: str  # what a human calls it (diagnose, the HTML report)
    unit: str  # the unit it is shown in
    scale: float = 1.0  # raw value x scale = value in ``unit``
    noise_floor: float | None = None  # smallest spread worth calling noise, in its raw unit
    default: float | None = 0.0  # its value where nothing set it (None: unknown, NaN in the store)
    slo: SloSpec | None = None  # the SLO bounding it (None: evidence only)
    baseline: bool = False  # a baseline is learned for it (for the k-sigma rule and the evidence)
    k_sigma: bool = False  # also breaches at k sigma above its own baseline (and half way to the SLO)
    # What the detector's time-series store keeps of it: "set" (its value on the rows an extractor set it
    # on: a probe that is off adds no series), "always" (also its default on every other row: a signal
    # with a baseline, where a quiet tick is a 0 and not a gap), "never" (evidence only, not stored).
    stored: str = "set"
    # The row field (a count of the events the value is a statistic of) that must be non-zero for the
    # stored value to be one: without events a p99 is unknown (NaN in the store), not 0. None: always.
    stored_when: str | None = None
    # Shown in every incident's context while non-zero, with this note from the victim's row (None: not).
    context_note: Callable[[Any], str] | None = None
    # A rate in ms/s whose ns over the victim's recent ticks (the window its who-ran-instead shares are
    # summed over) the cause rules read: CauseContext.window_ns[name].
    summed_over_window: bool = False


@dataclass(frozen=True, slots=True)
class RowFieldSpec:
    """A WorkloadSignals field a plugin adds that is no catalog signal (a count of events, a histogram, a
    split by kind or by culprit that causes and the counterfactual read): every row has it, made from
    ``default`` where no extractor set it (a fresh one per row, so no two share it); never stored."""

    name: str
    default: Callable[[], Any] = float


@dataclass(frozen=True, slots=True)
class NodeFieldSpec:
    """A NodeSignals field a plugin adds (per-CPU values its ``exposure`` reads, say), and how its value
    is made where the plugin set none (the probe off): a fresh one per node, so no two share it."""

    name: str
    default: Callable[[], Any] = dict


@dataclass(frozen=True)
class SignalExtractor:
    """What a plugin's interval means to the detector (detector/signals.py joins every plugin's), declared
    here so probes/ need not import detector/: functions over the plugin's own ``delta`` that return
    values by WorkloadSignals / NodeSignals field name. The detector owns the rows and the join:

    - ``workloads(interval, dt, workload_key)``: {workload key: {field: value}} for the workloads whose
      cgroups moved, in the order first met (the order the detector makes their rows in);
    - ``node(interval, dt)``: {NodeSignals field: value};
    - ``exposure(cpu_weights, node_values)``: per workload, the fields read from per-CPU node values
      through the share of its CPU time on each CPU (every row that exists at stage "cpus");
    - ``every_row(interval)``: fields set on every row (a node-wide fact, e.g. that a matrix exists).

    ``fields`` and ``node_fields`` name everything it sets: tests/test_signal_plugins.py fails when one is
    declared and not produced, or produced and not declared. A field the detector's row types do not
    have is declared here too, with its default: ``signal_specs`` (workload fields, each a catalog
    signal the plugin lists in ``ProbePlugin.signals``) and ``node_specs`` (node fields);
    ``row_specs`` (workload fields that are no catalog signal); ``detector.catalog.check_plugin_signals``
    refuses one that is not among ``fields`` / ``node_fields``. ``evidence_specs`` are catalog signals
    with no row field (the detector derives them from the fields), refused when a field names one."""

    stage: str  # one of SIGNAL_STAGES
    fields: tuple[str, ...]  # WorkloadSignals fields (from workloads, exposure and every_row)
    node_fields: tuple[str, ...] = ()  # NodeSignals fields (from node)
    workloads: Callable[[Any, float, WorkloadKey], dict[str, dict[str, Any]]] | None = None
    node: Callable[[Any, float], dict[str, Any]] | None = None
    exposure: Callable[[dict[int, float], dict[str, Any]], dict[str, Any]] | None = None
    every_row: Callable[[Any], dict[str, Any]] | None = None
    signal_specs: tuple[SignalSpec, ...] = ()  # the fields above WorkloadSignals does not declare itself
    node_specs: tuple[NodeFieldSpec, ...] = ()  # the node_fields NodeSignals does not declare itself
    row_specs: tuple[RowFieldSpec, ...] = ()  # the fields above that are no catalog signal
    # Catalog signals the detector derives from these fields over a victim's recent ticks and cites as
    # evidence (the who-ran-instead shares of a wait, detector/causes/base.py CauseContext): their labels
    # and units, no row field, never stored.
    evidence_specs: tuple[SignalSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class ProbeOption:
    """A setting the agent opens a probe with (``factory(**{name: value})``), from the agent's command line
    (``flag``) or its policy (``policy``): the agent's parser builds the flag from this declaration, as for
    any probe, so a probe's settings need no edit in noisyneighbor/. A value of None (the flag not given)
    is not passed: the probe's own default holds."""

    name: str  # the factory keyword ("max_cgroups")
    flag: str | None = None  # the agent's flag ("--runq-cgroups"); its argparse dest is ``dest``
    type: Callable[[str], Any] = int
    default: Any = None
    help: str = ""
    metavar: str = "N"
    label: str = ""  # what the agent's one-line error calls it ("run-queue cgroups")
    range: tuple[int, int] | None = None  # the values the agent accepts (inclusive)
    policy: str | None = None  # without a flag: the Policy attribute it is read from ("runq_pair_quiet_seconds")

    @property
    def dest(self) -> str:
        """The flag's argparse dest: "--runq-cgroups" -> "runq_cgroups"."""
        return (self.flag or "").lstrip("-").replace("-", "_")

    def problem(self, value: Any) -> str | None:
        """What is wrong with a given value (one line), None when it is accepted."""
        if value is None or self.range is None:
            return None
        lo, hi = self.range
        return None if lo <= value <= hi else f"{self.label} must be between {lo} and {hi}, got {value}"


@dataclass(frozen=True)
class ProbePlugin:
    """One probe as the rest of the code sees it."""

    name: str  # the probe's name: ProbeSpec.name, ProbeStatus.name, the `probe` metric label, --probes
    default: bool = field(default=True, kw_only=True)  # loaded when --probes is not given
    specs: tuple[ProbeSpec, ...]  # its BPF object and programs with their attach flavours, cheapest first
    factory: Callable[..., Any]  # factory(paths=, layout=, attach_mode=, **options) -> the loaded probe
    # True: its snapshot reads /proc/stat, and factory(proc_stat=) gets the collector's reader, which reads
    # the file once a tick for every user (probes/procstat.py)
    reads_proc_stat: bool = field(default=False, kw_only=True)
    # Cumulative activity per cgroup id in one snapshot (grows while the cgroup is active): which cgroups
    # to read this tick, which removed cgroups to forget from the kernel map. None: no per-cgroup map.
    activity: Callable[[Any], Mapping[int, int]] | None = None
    # The ids whose activity can differ between two of its snapshots, `prev` the reader's one just before
    # `cur`, in `activity(cur)`'s order (None: not known, every id is compared): a tick's cost then
    # follows the cgroups that moved, not every one the map ever held.
    activity_moved: Callable[[Any, Any], Iterable[int] | None] | None = None
    # Its activity moves the cgroup's memory readings (a cgroup freeing or charging pages): the watch reads
    # the memory files of a cgroup it saw move every tick, not only when the memory usage text changed.
    activity_moves_memory: bool = False
    # The interval between two snapshots (prev None: since load), in the probe's own terms: the one
    # interval layer, read by `top` (its rows) and by the agent's detector (detector/signals.py). Holds
    # only what moved, so its cost follows the active cgroups.
    delta: Callable[[Any, Any], Any] | None = None
    # Entries in its per-cgroup kernel map (the bpf_map_entries gauge). None: nothing per cgroup.
    map_entries: Callable[[Any], int] | None = None
    # The controller whose hierarchy its cgroup ids are in (the BPF probe keys by that hierarchy's ids).
    id_controller: str = "cpu"
    # detector.catalog signal names computed from it (by signal_extractor), those its extractor declares
    # (SignalExtractor.signal_specs) included
    signals: tuple[str, ...] = ()
    # Of those, the ones `noisyneighbor diagnose` plots for an incident's victim (from the detector's store)
    victim_plots: tuple[str, ...] = ()
    signal_extractor: SignalExtractor | None = None
    metrics: tuple[str, ...] = ()  # exporter metric names filled from it (besides the per-probe health ones)
    # Metrics it defines, and their values from one (cumulative) snapshot: per cgroup (labelled by the
    # exporter with the cgroup's pod and container) and per node.
    metric_specs: tuple[MetricSpec, ...] = ()
    cgroup_series: Callable[[Any], Iterable[CgroupSample]] | None = None
    node_series: Callable[[Any], Iterable[NodeSample]] | None = None
    # Its node series read from the node's shared /proc readings (the NodeSnapshot the collector makes, e.g.
    # /proc/vmstat's allocstall for reclaim) rather than from its own snapshot: exported whether or not the
    # probe loaded, as the kernel counts them either way.
    shared_node_series: Callable[[Any], Iterable[NodeSample]] | None = None
    # Opened by the agent, with its HostPaths, when the probe itself is not loaded: the node's readings its
    # ``node_series`` exports whether or not the probe runs (the GPU devices, through NVML). ``.snapshot()``
    # returns the probe's snapshot type, node fields only (None: nothing this tick; the agent puts it in
    # NodeSnapshot.node_readings), ``.status`` (state, reason: /healthz under the probe's name), ``.close()``.
    node_reader: Callable[[Any], Any] | None = None
    flavours: tuple[str, ...] = ()  # its own attach modes beyond the engine's (auto, tp_btf, raw_tp)
    top_view: str | None = None  # its view in `noisyneighbor top` (--view)
    # That view as a declared table (rows from ``delta``), served by noisyneighbor/sections.py's
    # TableSource and rendered by noisyneighbor/views.py's table_renderer.
    top_table: TopTable | None = None
    top_options: Mapping[str, Any] = field(default_factory=dict)  # options `top` opens it with
    # The settings the agent opens it with (its flags and policy keys), and the factory keyword that takes
    # how many cgroups the node may hold (the agent's estimate from the Node's pod capacity; None: not taken).
    options: tuple[ProbeOption, ...] = ()
    expected_cgroups_option: str | None = None
    # The factory keyword that tells the probe its caller holds BPF run-time stats for the probe's life (the
    # agent does, for bpf_program_run_seconds), so its programs' run counts move with every run (None: not taken).
    run_counts_option: str | None = None

    def open(self, **kwargs: Any) -> Any:
        return self.factory(**kwargs)

    def agent_options(self, flags: Mapping[str, Any], policy: Any, expected_cgroups: int,
                      run_counts_live: bool = False) -> dict[str, Any]:
        """What the agent opens it with: its options' values from the command line (``flags``, by factory
        keyword) or the policy, those given only, the node's expected cgroups where it takes them, and whether
        the agent holds BPF run-time stats (``run_counts_live``) where it takes that."""
        values = {o.name: flags.get(o.name) if o.flag else getattr(policy, o.policy or "") for o in self.options}
        opened = {name: value for name, value in values.items() if value is not None}
        if self.expected_cgroups_option is not None:
            opened[self.expected_cgroups_option] = expected_cgroups
        if self.run_counts_option is not None and run_counts_live:
            opened[self.run_counts_option] = True
        return opened
