# SPDX-License-Identifier: Apache-2.0
"""Grafana dashboards for noisyneighbor, generated from the exporter's metric name constants.

    .venv/bin/python dashboards/generate.py          # (re)write dashboards/*.json
    .venv/bin/python dashboards/generate.py --check  # exit 1 if the committed JSON is out of date

Plain Python, no network, no Grafana SDK: the JSON is what Grafana 10/11 exports (schemaVersion 39),
with the data source as a `${datasource}` variable so the files import into any Grafana. Metric names
come from ``noisyneighbor.exporter``, so renaming a metric there changes the dashboards here, and
tests/test_dashboards.py fails until the JSON is regenerated.

For a fleet, as kube-prometheus-stack's mixins do: variables datasource -> cluster -> node (multi-select,
All by default) -> namespace/pod; every selector is ``cluster=~"$cluster"``, which matches series without
a ``cluster`` label too (the All value is ``.*``), so the same JSON works on a single-cluster Prometheus
(the variable hidden, the default) and on a multi-cluster one (``--show-cluster``: Thanos, Mimir, a
Prometheus with a ``cluster`` external or target label). Incidents show as annotations (the spans an
incident was open), and ``fleet-overview`` ranks victims and culprits across nodes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from noisyneighbor import metric_names as m

OUT_DIR = Path(__file__).resolve().parent
SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
CLUSTER = 'cluster=~"$cluster"'
# The agent's `up`, by the pod label the ServiceMonitor copies (not the job: that is the Service's name).
AGENT_UP = 'app_kubernetes_io_name="noisyneighbor"'
NODE = f'{CLUSTER}, node=~"$node"'
POD = f'{NODE}, namespace="$namespace", pod="$pod"'
VICTIM = f'{NODE}, victim_namespace="$namespace", victim_pod="$pod"'
NOT_OVERFLOW = f'{NODE}, cgroup!="{m.OVERFLOW_CGROUP}"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False
    heatmap: bool = False


@dataclass
class Panel:
    title: str
    queries: list[Query]
    kind: str = "timeseries"  # timeseries | heatmap | table | stat
    unit: str = "short"
    width: int = 12
    height: int = 8
    description: str = ""
    stack: bool = False


@dataclass
class Row:
    title: str
    panels: list[Panel] = field(default_factory=list)


def _target(q: Query, ref: str) -> dict:
    t = {"datasource": DS, "refId": ref, "expr": q.expr, "legendFormat": q.legend or "__auto", "range": not q.instant,
         "instant": q.instant, "editorMode": "code"}
    if q.heatmap:
        t["format"] = "heatmap"
        t["legendFormat"] = "{{le}}"
    elif q.instant:
        t["format"] = "table"
    return t


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict:
    out: dict = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "targets": [_target(q, chr(ord("A") + i)) for i, q in enumerate(p.queries)],
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
    }
    if p.kind == "timeseries":
        out["fieldConfig"]["defaults"]["custom"] = {
            "drawStyle": "line", "lineWidth": 1, "fillOpacity": 10 if p.stack else 0, "showPoints": "never",
            "stacking": {"mode": "normal" if p.stack else "none", "group": "A"},
        }
        out["options"] = {"legend": {"displayMode": "table", "placement": "right", "calcs": ["mean", "max"]},
                          "tooltip": {"mode": "multi", "sort": "desc"}}
    elif p.kind == "heatmap":
        out["options"] = {
            "calculate": False, "cellGap": 1, "yAxis": {"unit": p.unit, "axisPlacement": "left"},
            "color": {"mode": "scheme", "scheme": "Oranges", "exponent": 0.5, "steps": 64},
            "rowsFrame": {"layout": "le"}, "tooltip": {"mode": "single", "yHistogram": True},
            "filterValues": {"le": 1e-9},
        }
    elif p.kind == "table":
        out["options"] = {"showHeader": True, "sortBy": [{"displayName": "Value", "desc": True}]}
        out["transformations"] = [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]
    elif p.kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                          "colorMode": "value", "graphMode": "area"}
    return out


ALL = {"text": "All", "value": "$__all"}


def _variables(with_pod: bool) -> list[dict]:
    def query_var(name: str, label: str, query: str, *, every: bool = False, multi: bool = False,
                  hide: int = 0) -> dict:
        # every: an "All" option matching any value, also a missing label (.*); the default selection.
        return {
            "name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": "StandardVariableQuery"}, "definition": query,
            "refresh": 2, "sort": 1, "includeAll": every, "multi": multi, "hide": hide,
            "current": dict(ALL) if every else {}, "options": [], "regex": "",
            **({"allValue": ".*"} if every else {}),
        }

    out = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus", "refresh": 1,
         "hide": 0, "current": {}, "options": [], "regex": ""},
        # hide 2: not shown (a single-cluster Prometheus has no cluster label); All still matches everything.
        # build_all(show_cluster=True) shows it.
        query_var("cluster", "Cluster", f"label_values({m.EXPORTER_LAST_UPDATE}, cluster)", every=True, hide=2),
        query_var("node", "Node", f"label_values({m.EXPORTER_LAST_UPDATE}{{{CLUSTER}}}, node)", every=True, multi=True),
    ]
    if with_pod:
        # Any node by default: the pod is found wherever it runs (no node to pick first).
        out.append(query_var("namespace", "Namespace", f'label_values({m.RUNQ_LATENCY}_count{{{NODE}, pod!=""}}, namespace)'))
        out.append(query_var(
            "pod", "Pod", f'label_values({m.RUNQ_LATENCY}_count{{{NODE}, namespace="$namespace", pod!=""}}, pod)'
        ))
    return out


def _incident_annotations(selector: str) -> list[dict]:
    """Incidents as annotations: a region for as long as one was open (from the incidents gauge, so an
    incident already open when the range starts shows too)."""
    return [{
        "name": "Interference incidents", "datasource": DS, "enable": True, "hide": False, "iconColor": "red",
        "expr": f"max by (node, victim_namespace, victim_pod, cause) ({m.INCIDENTS_OPEN}{{{selector}}}) > 0",
        "step": "30s", "titleFormat": "{{cause}}: {{victim_namespace}}/{{victim_pod}}",
        "textFormat": "incident open on {{node}}", "tagKeys": "cause,node", "useValueForTime": False,
    }]


def dashboard(uid: str, title: str, description: str, rows: list[Row], with_pod: bool,
              annotations: str = NODE) -> dict:
    panels: list[dict] = []
    pid, y = 1, 0
    for row in rows:
        panels.append({"id": pid, "type": "row", "title": row.title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        x, row_height = 0, 0
        for p in row.panels:
            if x + p.width > 24:
                x, y, row_height = 0, y + row_height, 0
            panels.append(_panel_json(p, pid, x, y))
            pid, x, row_height = pid + 1, x + p.width, max(row_height, p.height)
        y += row_height
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["noisyneighbor"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "annotations": {"list": _incident_annotations(annotations)},
        "links": [{"title": "noisyneighbor", "type": "dashboards", "tags": ["noisyneighbor"], "asDropdown": True}],
        "templating": {"list": _variables(with_pod)},
        "panels": panels,
    }


def _p99(metric: str, selector: str, by: str, window: str = RATE) -> str:
    return f"histogram_quantile(0.99, sum by ({by}, le) (rate({metric}_bucket{{{selector}}}[{window}])))"


def _mean(metric: str, selector: str, by: str) -> str:
    return (f"sum by ({by}) (rate({metric}_sum{{{selector}}}[{RATE}])) / "
            f"sum by ({by}) (rate({metric}_count{{{selector}}}[{RATE}]))")


def node_overview() -> dict:
    rows = [
        Row("Runqueue", [
            Panel("Runqueue latency, all CPUs (heatmap)", [Query(
                f"sum by (le) (increase({m.CPU_RUNQ_LATENCY}_bucket{{{NODE}}}[{RATE}]))", heatmap=True)],
                kind="heatmap", unit="s", description="Waits between wakeup/preemption and running, from the "
                "log2 histogram buckets (each bucket is a factor of 2)."),
            Panel("Runqueue latency p99 per CPU", [Query(_p99(m.CPU_RUNQ_LATENCY, NODE, "node, cpu"), "{{node}} cpu {{cpu}}")],
                  unit="s"),
            Panel("Hypervisor steal per CPU", [Query(f"rate({m.CPU_STEAL}{{{NODE}}}[{RATE}])", "cpu {{cpu}}")],
                  unit="percentunit", description="Time the hypervisor ran something else while the vCPU was "
                  "runnable (/proc/stat steal); no series on bare metal."),
            Panel("Top victims: runqueue p99 per cgroup (5m)", [Query(
                f"topk(10, {_p99(m.RUNQ_LATENCY, NOT_OVERFLOW, 'node, namespace, pod, container, qos, cgroup', '5m')})",
                instant=True)], kind="table", unit="s", width=24),
        ]),
        Row("Softirq", [
            Panel("Softirq time share per CPU", [Query(
                f"sum by (node, cpu) (rate({m.SOFTIRQ_RUNTIME}_sum{{{NODE}}}[{RATE}]))", "{{node}} cpu {{cpu}}")],
                unit="percentunit", stack=True, description="Seconds of softirq handling per second: the CPU "
                "taken from whatever task was running there."),
            Panel("Softirq time by vector", [Query(
                f"sum by (node, vector) (rate({m.SOFTIRQ_RUNTIME}_sum{{{NODE}}}[{RATE}]))", "{{node}} {{vector}}")],
                unit="percentunit", stack=True),
            Panel("Softirq delay p99 per CPU (raise to run)", [Query(
                _p99(m.SOFTIRQ_DELAY, NODE, "node, cpu"), "{{node}} cpu {{cpu}}")],
                  unit="s"),
            Panel("Softirq run time p99 per CPU and vector", [Query(
                _p99(m.SOFTIRQ_RUNTIME, NODE, "node, cpu, vector"), "{{node}} cpu {{cpu}} {{vector}}")], unit="s"),
        ]),
        Row("Pressure and reclaim", [
            Panel("Node pressure (PSI stall share)", [Query(
                f"rate({m.PSI_STALL}{{{NODE}}}[{RATE}])", "{{node}} {{resource}} {{kind}}")], unit="percentunit"),
            Panel("Reclaim stall time on the node by kind", [Query(
                f"sum by (node, kind) (rate({m.NODE_RECLAIM_LATENCY}_sum{{{NODE}}}[{RATE}]))", "{{node}} {{kind}}")],
                unit="percentunit", description="Seconds spent in reclaim per second, summed over the tasks "
                "that stalled (softlimit passes are also inside direct ones)."),
        ]),
        Row("Incidents", [
            Panel("Open incidents", [Query(f"sum by (node, victim_namespace, victim_pod, cause) ({m.INCIDENTS_OPEN}{{{NODE}}})",
                                           instant=True)], kind="table"),
            Panel("Top culprits (highest score in any open incident)", [Query(
                f"topk(10, max by (node, culprit_namespace, culprit_pod, culprit_cgroup) ({m.CULPRIT_SCORE}{{{NODE}}}))",
                instant=True)], kind="table", unit="percentunit"),
            Panel("Incidents opened by cause", [Query(
                f"sum by (cause) (increase({m.INCIDENTS}{{{NODE}}}[{RATE}]))", "{{cause}}")], stack=True),
            Panel("Top CPU users", [Query(
                f'topk(10, sum by (namespace, pod, qos) (rate({m.CGROUP_CPU_USAGE}{{{NODE}, pod!=""}}[{RATE}])))',
                "{{namespace}}/{{pod}} {{qos}}")], unit="short", description="CPUs used per pod."),
        ]),
        Row("Batch allocatable (what BE pods can still get)", [
            Panel("Batch allocatable CPU by policy", [Query(f"{m.BATCH_ALLOCATABLE_CPU}{{{NODE}}}", "{{policy}}")],
                  description="Koordinator's Node(Batch).Alloc[usage|request|maxUsageRequest], from this node's "
                  "own readings and reservations (detector/batch.py)."),
            Panel("Batch allocatable memory by policy", [Query(f"{m.BATCH_ALLOCATABLE_MEMORY}{{{NODE}}}", "{{policy}}")],
                  unit="bytes"),
        ]),
        Row("Agent health", [
            Panel("Probe state", [Query(f'{m.PROBE_STATE}{{{NODE}}} == 1', "{{probe}}: {{state}}", instant=True)],
                  kind="table", width=8),
            Panel("Probe drops per second", [Query(
                f"sum by (node, probe, reason) (rate({m.PROBE_DROPS}{{{NODE}}}[{RATE}]))",
                "{{node}} {{probe}} {{reason}}")], width=8),
            Panel("Agent BPF CPU (needs kernel.bpf_stats_enabled=1)", [Query(
                f"sum by (node, program) (rate({m.BPF_RUN_SECONDS}{{{NODE}}}[{RATE}]))", "{{node}} {{program}}")],
                unit="percentunit", width=8, stack=True),
            Panel("Exporter cgroups", [Query(f"{m.EXPORTER_CGROUPS}{{{NODE}}}", "{{node}} {{state}}")], width=12),
            Panel("GPU utilisation", [Query(f"{m.GPU_UTILIZATION}{{{NODE}}}", "gpu {{gpu}} {{model}}")],
                  unit="percentunit", width=12),
        ]),
    ]
    return dashboard("nn-node-overview", "noisyneighbor / Node overview",
                     "Where time goes on one node: runqueue, softirq, pressure, reclaim; who suffers and who causes it.",
                     rows, with_pod=False)


def pod_interference() -> dict:
    rows = [
        Row("Latency", [
            Panel("Runqueue latency p99 / mean per container", [
                Query(_p99(m.RUNQ_LATENCY, POD, "container"), "p99 {{container}}"),
                Query(_mean(m.RUNQ_LATENCY, POD, "container"), "mean {{container}}"),
            ], unit="s"),
            Panel("Runqueue latency (heatmap)", [Query(
                f"sum by (le) (increase({m.RUNQ_LATENCY}_bucket{{{POD}}}[{RATE}]))", heatmap=True)], kind="heatmap",
                unit="s"),
            Panel("Time waiting on the runqueue per second", [Query(
                f"sum by (container) (rate({m.RUNQ_LATENCY}_sum{{{POD}}}[{RATE}]))", "{{container}}")],
                unit="percentunit", description="Seconds its tasks spent runnable but not running, per second."),
            Panel("Pressure (PSI stall share, v2 cgroup)", [Query(
                f"max by (resource, kind) (rate({m.CGROUP_PSI_STALL}{{{POD}}}[{RATE}]))", "{{resource}} {{kind}}")],
                unit="percentunit"),
        ]),
        Row("Who ran instead", [
            Panel("Culprit score for this pod's incidents", [Query(
                f"max by (culprit_namespace, culprit_pod, cause) ({m.CULPRIT_SCORE}{{{VICTIM}}})",
                "{{culprit_namespace}}/{{culprit_pod}} ({{cause}})")], unit="percentunit"),
            Panel("Open incidents of this pod", [Query(
                f"sum by (cause) ({m.INCIDENTS_OPEN}{{{VICTIM}}})", "{{cause}}")], stack=True),
            Panel("CPU of the busiest other pods on the node", [Query(
                f'topk(5, sum by (namespace, pod, qos) (rate({m.CGROUP_CPU_USAGE}{{{NODE}, pod!="$pod", pod!=""}}[{RATE}])))',
                "{{namespace}}/{{pod}} {{qos}}")], width=24),
        ]),
        Row("CPU and throttling", [
            Panel("CPU used vs quota", [
                Query(f"sum by (container) (rate({m.CGROUP_CPU_USAGE}{{{POD}}}[{RATE}]))", "used {{container}}"),
                Query(f"{m.CGROUP_CPU_QUOTA}{{{POD}}}", "quota {{container}}"),
            ]),
            Panel("Throttled periods share", [Query(
                f"sum by (container) (rate({m.CGROUP_CPU_THROTTLED_PERIODS}{{{POD}}}[{RATE}])) / "
                f"sum by (container) (rate({m.CGROUP_CPU_PERIODS}{{{POD}}}[{RATE}]))", "{{container}}")],
                unit="percentunit", description="A pod throttled by its own quota is not a neighbor's victim."),
            Panel("Throttled time per second", [Query(
                f"sum by (container) (rate({m.CGROUP_CPU_THROTTLED}{{{POD}}}[{RATE}]))", "{{container}}")],
                unit="percentunit"),
        ]),
        Row("Memory reclaim", [
            Panel("Reclaim stall time per second by kind", [Query(
                f"sum by (kind) (rate({m.RECLAIM_LATENCY}_sum{{{POD}}}[{RATE}]))", "{{kind}}")], unit="percentunit"),
            Panel("Reclaim pass p99 by kind", [Query(_p99(m.RECLAIM_LATENCY, POD, "kind"), "{{kind}}")], unit="s"),
            Panel("Pages reclaimed per second", [Query(
                f"sum by (kind) (rate({m.RECLAIM_PAGES}{{{POD}}}[{RATE}]))", "{{kind}}")]),
            Panel("Memory usage vs limit", [
                Query(f"sum by (container) ({m.CGROUP_MEMORY_USAGE}{{{POD}}})", "usage {{container}}"),
                Query(f"min by (container) ({m.CGROUP_MEMORY_LIMIT}{{{POD}}})", "limit {{container}}"),
            ], unit="bytes"),
        ]),
        Row("TCP connect", [
            Panel("Connect latency p99 / mean", [
                Query(_p99(m.CONNECT_LATENCY, POD, "container"), "p99 {{container}}"),
                Query(_mean(m.CONNECT_LATENCY, POD, "container"), "mean {{container}}"),
            ], unit="s", width=8),
            Panel("Connects per second", [
                Query(f"sum(rate({m.CONNECT_SUCCESSES}{{{POD}}}[{RATE}]))", "established"),
                Query(f"sum(rate({m.CONNECT_FAILURES}{{{POD}}}[{RATE}]))", "failed"),
            ], width=8),
            Panel("SYN retransmits and errors per second", [
                Query(f"sum(rate({m.CONNECT_SYN_RETRANSMITS}{{{POD}}}[{RATE}]))", "SYN retransmits"),
                Query(f"sum by (reason) (rate({m.CONNECT_ERRORS}{{{POD}}}[{RATE}]))", "{{reason}}"),
            ], width=8),
        ]),
    ]
    return dashboard("nn-pod-interference", "noisyneighbor / Pod interference",
                     "One pod: its latencies, who ran instead, its own throttling, reclaim and connects.",
                     rows, with_pod=True, annotations=VICTIM)


def actuators() -> dict:
    be = f'{NODE}, qos="BE", pod=""'
    rows = [
        Row("Suppress (BestEffort CPU cap)", [
            Panel("BestEffort quota vs use", [
                Query(f"{m.CGROUP_CPU_QUOTA}{{{be}}}", "quota {{cgroup}}"),
                Query(f"rate({m.CGROUP_CPU_USAGE}{{{be}}}[{RATE}])", "used {{cgroup}}"),
            ], description="The BE QoS cgroup's cfs quota, which suppress lowers, next to what BE uses."),
            Panel("Suppress caps in effect", [Query(f"{m.ACTION_SUPPRESS_CORES}{{{NODE}}}", "{{target_cgroup}} "
                                                    "({{policy}})")]),
            Panel("BestEffort throttled time per second", [Query(
                f'sum(rate({m.CGROUP_CPU_THROTTLED}{{{NODE}, qos="BE"}}[{RATE}]))', "throttled")],
                unit="percentunit"),
        ]),
        Row("Actions", [
            Panel("Actions by kind and state (per interval)", [Query(
                f"sum by (node, kind, state) (increase({m.ACTIONS}{{{NODE}}}[{RATE}]))",
                "{{node}} {{kind}} {{state}}")], stack=True),
            Panel("Evictions", [Query(
                f'sum(increase({m.ACTIONS}{{{NODE}, kind="evict", state="applied"}}[1h]))', "evicted, last hour")],
                kind="stat", width=6),
            Panel("Reverts", [Query(f'sum(increase({m.ACTIONS}{{{NODE}, state="reverted"}}[1h]))', "reverted, last hour")],
                  kind="stat", width=6),
            Panel("CPU bursts in effect", [Query(
                f'sum by (target_namespace, target_pod) ({m.ACTION_ACTIVE}{{{NODE}, kind="burst"}})',
                "{{target_namespace}}/{{target_pod}}")], width=12),
            Panel("Resctrl settings in effect", [Query(
                f'sum by (target_cgroup) ({m.ACTION_ACTIVE}{{{NODE}, kind="resctrl"}})', "{{target_cgroup}}")], width=12),
            Panel("Actions in effect", [Query(f"{m.ACTION_ACTIVE}{{{NODE}}}", instant=True)], kind="table", width=24),
            Panel("Reverted (did not help) by kind", [Query(
                f'sum by (kind) (increase({m.ACTIONS}{{{NODE}, state="reverted"}}[{RATE}]))', "{{kind}}")], width=12),
            Panel("Refused and failed by kind", [Query(
                f'sum by (kind, state) (increase({m.ACTIONS}{{{NODE}, state=~"refused|failed"}}[{RATE}]))',
                "{{kind}} {{state}}")], width=12),
        ]),
    ]
    return dashboard("nn-actuators", "noisyneighbor / Actuators",
                     "What the agent changed on the node: suppress quota, evictions, bursts, resctrl, reverts.",
                     rows, with_pod=False)


def fleet_overview() -> dict:
    every = f'{NOT_OVERFLOW}, pod!=""'
    rows = [
        Row("Fleet", [
            Panel("Nodes reporting", [Query(f"count({m.EXPORTER_LAST_UPDATE}{{{NODE}}})", "nodes")], kind="stat", width=6),
            Panel("Agents not scraped", [Query(f'count(up{{{AGENT_UP}, {CLUSTER}}} == 0) or vector(0)',
                                               "down")], kind="stat", width=6,
                  description="Nodes whose agent Prometheus cannot scrape (NoisyNeighborAgentDown)."),
            Panel("Open incidents", [Query(f"sum({m.INCIDENTS_OPEN}{{{NODE}}}) or vector(0)", "open")], kind="stat",
                  width=6),
            Panel("Probe states across nodes", [Query(
                f"count by (probe, state) ({m.PROBE_STATE}{{{NODE}}} == 1)", instant=True)], kind="table", width=6),
        ]),
        Row("Worst victims and culprits across nodes", [
            Panel("Worst victims: runqueue p99 per pod (5m)", [Query(
                f"topk(15, {_p99(m.RUNQ_LATENCY, every, 'cluster, node, namespace, pod, qos', '5m')})",
                instant=True)], kind="table", unit="s", description="The pods waiting longest for a CPU, on any "
                "node: open the pod dashboard for who ran instead."),
            Panel("Top culprits: highest score in any open incident", [Query(
                f"topk(15, max by (cluster, node, culprit_namespace, culprit_pod, cause) ({m.CULPRIT_SCORE}{{{NODE}}}))",
                instant=True)], kind="table", unit="percentunit"),
            Panel("Open incidents by node, victim and cause", [Query(
                f"sum by (cluster, node, victim_namespace, victim_pod, cause) ({m.INCIDENTS_OPEN}{{{NODE}}})",
                instant=True)], kind="table", width=24),
        ]),
        Row("Over time", [
            Panel("Incidents opened per node and cause", [Query(
                f"sum by (node, cause) (increase({m.INCIDENTS}{{{NODE}}}[{RATE}]))", "{{node}} {{cause}}")], stack=True),
            Panel("Runqueue p99 per node (all CPUs)", [Query(
                _p99(m.CPU_RUNQ_LATENCY, NODE, "node"), "{{node}}")], unit="s"),
            Panel("Actions per node and kind", [Query(
                f"sum by (node, kind) (increase({m.ACTIONS}{{{NODE}}}[{RATE}]))", "{{node}} {{kind}}")], stack=True),
            Panel("BestEffort CPU per node", [Query(
                f'sum by (node) (rate({m.CGROUP_CPU_USAGE}{{{NODE}, qos="BE", pod!=""}}[{RATE}]))', "{{node}}")],
                description="CPUs used by BestEffort pods: the usual culprits."),
        ]),
    ]
    return dashboard("nn-fleet-overview", "noisyneighbor / Fleet overview",
                     "Every node at once: the worst victims and culprits, open incidents, probe and agent health.",
                     rows, with_pod=False)


DASHBOARDS = {
    "fleet-overview.json": fleet_overview,
    "node-overview.json": node_overview,
    "pod-interference.json": pod_interference,
    "actuators.json": actuators,
}


def render(dash: dict) -> str:
    return json.dumps(dash, indent=2, ensure_ascii=False) + "\n"


def build_all(show_cluster: bool = False) -> dict[str, str]:
    """Every dashboard's JSON; ``show_cluster``: the cluster variable shown (a multi-cluster Prometheus)."""
    out = {}
    for name, build in DASHBOARDS.items():
        dash = build()
        if show_cluster:
            for var in dash["templating"]["list"]:
                if var["name"] == "cluster":
                    var["hide"] = 0
        out[name] = render(dash)
    return out


def iter_queries(dash: dict) -> Iterator[tuple[str, str]]:
    """(panel title, expr) of every query of every panel, then of every annotation."""
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for annotation in dash["annotations"]["list"]:
        yield f"annotation {annotation['name']}", annotation["expr"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="directory for the JSON files")
    parser.add_argument("--show-cluster", action="store_true",
                        help="show the cluster variable (a Prometheus holding several clusters' series)")
    args = parser.parse_args(argv)
    stale = []
    for name, text in build_all(args.show_cluster).items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run dashboards/generate.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
