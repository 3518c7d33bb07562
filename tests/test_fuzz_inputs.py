# SPDX-License-Identifier: Apache-2.0
"""Fuzzing every input the agent parses from outside: kubelet /pods JSON, the apiserver watch stream,
the policy file (ours and Koordinator's ConfigMap), cgroup and /proc stat files, and the actuator
journal read back at start.

The property is the same everywhere: no traceback, ever. A parser returns its value (bad lines or
records skipped), or raises its documented one-line error type; a pod source's tick goes on. The
generated inputs are shaped like the real ones (right keys, wrong types and values mixed in) as
well as plain noise, so the fuzzer gets past the first type check. Bounded for CI: a fixed number
of examples per target (NN_FUZZ_EXAMPLES to raise it locally), no example database written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from actuators.cgroupfile import parse_cpu_list as parse_actuator_cpu_list
from actuators.journal import Journal, JournalError
from detector.pods import (
    BATCH_CPU,
    BATCH_MEMORY,
    ApiserverPodSource,
    KubeletPodSource,
    PodInfo,
    PodParseError,
    pod_from_dict,
    pods_from_list,
)
from detector.policy import (
    CpuBurstStrategy,
    Policy,
    PolicyError,
    ResourceQosStrategy,
    ResourceThresholdStrategy,
    parse_policy,
)
from probes.cgroupfiles import CPU_MAX, CgroupFileParseError, parse_pressure, parse_proc_pairs
from probes.host import HostPaths
from probes.memstat import node_vmstat, parse_flat_keyed, parse_v1, parse_v2
from probes.snapshot import parse_proc_stat
from testkit.procfiles import read_proc_softirqs

EXAMPLES = int(os.environ.get("NN_FUZZ_EXAMPLES", "150"))
fuzz = settings(
    max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---- building blocks ------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly the right shape, sometimes anything JSON can hold."""
    return st.one_of(strategy, strategy, strategy, json_values)


def shaped(**fields: st.SearchStrategy) -> st.SearchStrategy:
    """A JSON object whose keys are the real ones (each present or not), values mostly right."""
    return st.fixed_dictionaries({}, optional={k: maybe(v) for k, v in fields.items()})


# ---- kubelet /pods and the apiserver watch -------------------------------------------------------

quantities = st.one_of(
    st.sampled_from(["500m", "1", "2", "1Gi", "128Mi", "1e3", "0.5", "-1", "1E18", "Inf", "NaN", "1e999999",
                     "9" * 40, "1Ki", "0x10", "", " ", "1.5Gi", "2000m"]),
    st.text(max_size=8), st.integers(), st.floats(allow_nan=True),
)
resource_names = st.sampled_from(["cpu", "memory", BATCH_CPU, BATCH_MEMORY, "nvidia.com/gpu"])
resources = shaped(
    requests=st.dictionaries(resource_names, quantities, max_size=4),
    limits=st.dictionaries(resource_names, quantities, max_size=4),
)
containers = shaped(name=st.text(max_size=6), resources=resources)
owner_refs = shaped(kind=st.sampled_from(["ReplicaSet", "DaemonSet", "Job"]), name=st.text(max_size=6),
                    controller=st.booleans())
timestamps = st.one_of(st.sampled_from(["2026-11-23T20:00:00Z", "2026-11-23T20:00:00+00:00", "yesterday", ""]),
                       st.text(max_size=25))
metadata = shaped(
    uid=st.text(min_size=1, max_size=8), name=st.text(min_size=1, max_size=8), namespace=st.text(max_size=6),
    labels=st.dictionaries(st.sampled_from(["koordinator.sh/qosClass", "app"]),
                           st.sampled_from(["LS", "BE", "LSR", "LSE", "SYSTEM", "x"]) | st.text(max_size=4), max_size=3),
    annotations=st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3),
    ownerReferences=st.lists(maybe(owner_refs), max_size=3),
    deletionTimestamp=timestamps, resourceVersion=st.text(max_size=6) | st.integers(),
)
container_statuses = shaped(name=st.text(max_size=6),
                            containerID=st.sampled_from(["containerd://abc123", "docker://x", "://", ""]) | st.text())
pods = shaped(
    metadata=metadata,
    spec=shaped(containers=st.lists(maybe(containers), max_size=3), priority=st.integers() | st.booleans(),
                nodeName=st.text(max_size=6)),
    status=shaped(qosClass=st.sampled_from(["Guaranteed", "Burstable", "BestEffort", "odd"]),
                  phase=st.sampled_from(["Running", "Pending", "Succeeded"]), startTime=timestamps,
                  containerStatuses=st.lists(maybe(container_statuses), max_size=3)),
)
pod_lists = shaped(kind=st.just("PodList"), items=st.lists(maybe(pods), max_size=4),
                   metadata=shaped(resourceVersion=st.text(max_size=6)))


def _use(pod: PodInfo) -> None:
    """What a tick asks of a pod: none of it may raise either."""
    _ = pod.display, pod.terminating, pod.eviction_priority
    _ = pod.cpu_request_cores, pod.cpu_limit_cores, pod.memory_request_bytes
    for c in pod.containers:
        pod.container(c.container_id or "")


@fuzz
@given(pods)
def test_pod_from_dict_returns_a_pod_or_its_error(obj: Any) -> None:
    try:
        pod = pod_from_dict(obj)
    except PodParseError as e:
        assert "\n" not in str(e)
        return
    assert isinstance(pod, PodInfo) and pod.uid and pod.name
    _use(pod)


@fuzz
@given(maybe(pod_lists))
def test_pods_from_list_skips_bad_items(obj: Any) -> None:
    try:
        got = pods_from_list(obj)
    except PodParseError:
        return
    assert all(isinstance(p, PodInfo) for p in got)
    for p in got:
        _use(p)


class _ServedKubelet(KubeletPodSource):
    """The kubelet source with its HTTP fetch replaced by the fuzzed body (no network)."""

    body: bytes = b""

    def _fetch(self) -> bytes:
        return self.body


@fuzz
@given(st.lists(st.one_of(pod_lists.map(lambda d: json.dumps(d).encode()), st.binary(max_size=64),
                          json_values.map(lambda d: json.dumps(d).encode())), min_size=1, max_size=4))
def test_kubelet_refresh_never_raises_and_keeps_the_last_good_list(bodies: list[bytes]) -> None:
    source = _ServedKubelet("http://127.0.0.1:1", empty_confirmations=1)
    good = b'{"kind": "PodList", "items": [{"metadata": {"uid": "u1", "name": "keep"}}]}'
    source.body = good
    assert source.refresh()
    for body in bodies:
        before = {p.uid for p in source.pods()}
        source.body = body
        ok = source.refresh()  # never raises: a bad body is a failed refresh
        assert isinstance(ok, bool)
        assert "\n" not in source.status.reason
        if not ok:
            assert {p.uid for p in source.pods()} == before, "a failed refresh must keep the last good list"
        for p in source.pods():
            _use(p)


events = shaped(type=st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"]),
                object=st.one_of(pods, shaped(code=st.integers(), message=st.text(max_size=8))))
watch_lines = st.one_of(events.map(json.dumps), st.binary(max_size=40), st.text(max_size=40),
                        json_values.map(json.dumps))


@fuzz
@given(st.lists(watch_lines, min_size=1, max_size=8))
def test_apiserver_watch_events_never_raise(lines: list[str | bytes]) -> None:
    source = ApiserverPodSource(None, "node-1")
    try:
        for line in lines:
            assert isinstance(source._apply(line), bool)  # False: relist, True: carry on
            assert "\n" not in (source.status.reason)
        for p in source.pods():
            _use(p)
    finally:
        source.close()


# ---- the policy file: ours and Koordinator's ConfigMap ----------------------------------------------


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def _strategy(cls: type) -> st.SearchStrategy:
    """A Koordinator strategy object with the class's real keys and mostly plausible values."""
    values = st.one_of(st.booleans(), st.integers(-5, 200), st.floats(-1, 1e6, allow_nan=False),
                       st.sampled_from(["auto", "none", "cpuBurstOnly", "true", "60"]), json_values)
    names = [_camel(f.name) for f in dataclasses.fields(cls)] + ["cpuQOS", "memoryQOS", "unknownKey"]
    return st.dictionaries(st.sampled_from(names), values, max_size=5)


selectors = shaped(matchLabels=st.dictionaries(st.sampled_from(["pool", "zone"]), st.text(max_size=4), max_size=2),
                   matchExpressions=st.lists(shaped(key=st.sampled_from(["pool", "zone"]),
                                                    operator=st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist",
                                                                              "Gt", "Bogus"]),
                                                    values=st.lists(st.text(max_size=4), max_size=3)), max_size=2))


def _layered(cls: type) -> st.SearchStrategy:
    node_strategy = st.one_of(_strategy(cls), shaped(nodeSelector=selectors, name=st.text(max_size=4)).flatmap(
        lambda sel: _strategy(cls).map(lambda s: {**s, **sel})))
    return st.one_of(_strategy(cls), shaped(clusterStrategy=_strategy(cls),
                                            nodeStrategies=st.lists(maybe(node_strategy), max_size=3)))


KOORD = {"resource-threshold-config": ResourceThresholdStrategy, "cpu-burst-config": CpuBurstStrategy,
         "resource-qos-config": ResourceQosStrategy}
configmaps = shaped(
    kind=st.just("ConfigMap"), metadata=shaped(name=st.just("slo-controller-config")),
    data=st.fixed_dictionaries({}, optional={k: st.one_of(_layered(c).map(json.dumps), st.text(max_size=20))
                                             for k, c in KOORD.items()}),
)
ours = shaped(
    interval_seconds=st.floats(-1, 100, allow_nan=False) | st.text(max_size=4), incident_log=st.text(max_size=10),
    slo=st.dictionaries(st.sampled_from(["runq_p99_ms", "softirq_stall_ms", "psi_some_pct", "bogus"]),
                        json_scalars, max_size=3),
    actuators=st.dictionaries(st.sampled_from(["dry_run", "max_actions_per_minute", "suppress", "evict"]),
                              json_scalars, max_size=3),
    kubernetes=st.dictionaries(st.sampled_from(["node_name", "pod_source", "kubelet_url"]), json_scalars, max_size=3),
    standalone=shaped(ls_cgroups=st.lists(st.text(max_size=8), max_size=2),
                      be_cgroups=st.lists(st.text(max_size=8), max_size=2)),
    **{k: _layered(c) for k, c in KOORD.items()},
)


@fuzz
@given(st.one_of(ours, configmaps, json_values).map(lambda d: yaml.safe_dump(d)) | st.text(max_size=80),
       st.dictionaries(st.sampled_from(["pool", "zone"]), st.text(max_size=4), max_size=2))
def test_policy_parses_or_says_what_is_wrong_in_one_line(text: str, node_labels: dict[str, str]) -> None:
    try:
        policy = parse_policy(text, "fuzz.yaml", node_labels=node_labels)
    except PolicyError as e:
        assert len(str(e).splitlines()) == 1, str(e)
        assert str(e).startswith("fuzz.yaml")
        return
    assert isinstance(policy, Policy)


# ---- cgroup and /proc stat files ----------------------------------------------------------------

tokens = st.one_of(st.sampled_from(["usage_usec", "nr_periods", "nr_throttled", "throttled_usec", "anon", "file",
                                    "cache", "total_cache", "rss", "pgfault", "pgscan", "pgsteal", "allocstall_normal",
                                    "some", "full", "avg10=1.00", "avg60=nan", "avg300=inf", "total=12", "total=-5",
                                    "max", "cpu", "cpu0", "cpu1", "cpu²", "CPU0", "NET_RX:", "Tcp:", "-", "0x1f"]),
                   st.integers(-(2**70), 2**70).map(str), st.text(max_size=6))
stat_files = st.one_of(
    st.lists(st.lists(tokens, max_size=5).map(" ".join), max_size=8).map("\n".join),
    st.text(max_size=200),
)


@fuzz
@given(stat_files)
def test_stat_file_parsers_skip_bad_lines(text: str) -> None:
    counters = parse_flat_keyed(text)  # cpu.stat, cpuacct.stat
    assert all(isinstance(v, int) for v in counters.values())
    assert all(isinstance(v, int) for v in parse_flat_keyed(text).values())  # memory.stat, vmstat
    got = CPU_MAX.parse_or_none(2, text)
    assert got is None or (got.period_us > 0 and (got.quota_us is None or got.quota_us > 0))
    parse_v1(text, text, text, text, text)
    parse_v2(text, text, text, text)
    node_vmstat(parse_flat_keyed(text)).allocstall_total  # noqa: B018 - the property reads the sum
    for line in parse_pressure(text).values():  # *.pressure
        assert line.total_us >= 0
    _total, per_cpu = parse_proc_stat(text)
    assert all(isinstance(c, int) for c in per_cpu)
    pairs = parse_proc_pairs(text)  # /proc/net/snmp, netstat
    assert all(isinstance(v, int) for kv in pairs.values() for v in kv.values())


cpu_lists = st.one_of(
    st.lists(st.one_of(st.integers(0, 4096).map(str),
                       st.tuples(st.integers(0, 4096), st.integers(0, 4096)).map(lambda t: f"{t[0]}-{t[1]}"),
                       st.sampled_from(["", " ", "-", "1-", "-3", "a", "1-2-3", "0x3", "1,,2"])),
             max_size=6).map(",".join),
    st.text(max_size=20),
)


@fuzz
@given(cpu_lists)
def test_cpuset_lists_parse_or_are_refused(text: str) -> None:
    # One parser for the collector (which skips a refused value) and the actuators (which report it).
    try:
        strict = parse_actuator_cpu_list(text)
    except CgroupFileParseError as e:
        assert "\n" not in str(e)
        return
    assert list(strict) == sorted(set(strict)) and all(c >= 0 for c in strict)


softirq_files = st.one_of(
    st.tuples(st.integers(0, 4), st.lists(st.tuples(st.sampled_from(["HI", "TIMER", "NET_RX", "BOGUS", ""]),
                                                    st.lists(tokens, max_size=5)), max_size=5))
    .map(lambda t: "\n".join(["    " + " ".join(f"CPU{i}" for i in range(t[0]))]
                             + [f"{name}: {' '.join(vals)}" for name, vals in t[1]])),
    st.text(max_size=120),
)


@fuzz
@given(softirq_files)
def test_proc_softirqs_reader_skips_what_it_cannot_read(text: str) -> None:
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "proc").mkdir()
        (Path(root) / "proc/softirqs").write_text(text)
        got = read_proc_softirqs(HostPaths.under(root))
    assert all(isinstance(cpu, int) and isinstance(n, int) for (cpu, _), n in got.items())


# ---- the actuator journal, read back at start -------------------------------------------------------

entries = shaped(path=st.sampled_from(["/sys/fs/cgroup/cpu/x/cpu.cfs_quota_us"]) | st.text(max_size=8),
                 original=st.text(max_size=6), last_written=st.none() | st.text(max_size=6),
                 pending=st.none() | st.text(max_size=6), seq=st.integers(0, 10), action_id=st.text(max_size=6),
                 kind=st.text(max_size=6), first_at=st.floats(0, 2e9))
journals = st.one_of(
    shaped(version=st.just(1), entries=st.lists(maybe(entries), max_size=4), pid=st.integers()).map(json.dumps),
    json_values.map(json.dumps), st.text(max_size=60),
)


@fuzz
@given(journals)
@example('{"version": 1, "pid": 0, "entries": [{"\\n": null}]}')  # found by CI: a key holding a newline
def test_journal_reader_loads_or_says_it_is_corrupt(text: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "journal.json").write_text(text)
        try:
            journal = Journal(d, read=lambda p: "", write=lambda p, v: None)
        except JournalError as e:
            assert "\n" not in str(e)
            return
        for path, e in journal.owned().items():
            assert isinstance(path, str) and isinstance(e.seq, int) and isinstance(e.original, str)


# ---- regressions: what the fuzzer found, pinned as plain cases ---------------------------------------


def test_regression_pod_fields_of_the_wrong_type_skip_the_pod_not_the_list() -> None:
    bad = [{"metadata": {"uid": "u", "name": "n", "ownerReferences": True}},
           {"metadata": {"uid": "u", "name": "n", "labels": ["a"]}},
           {"metadata": {"uid": "u", "name": "n"}, "spec": {"containers": [{"resources": ["cpu"]}]}},
           {"metadata": {"uid": "u", "name": "n"}, "status": {"qosClass": ["Guaranteed"]}}]
    for obj in bad:
        try:
            pod_from_dict(obj)
        except PodParseError as e:
            assert str(e).startswith("malformed pod: ") and "\n" not in str(e)
        else:
            raise AssertionError(f"accepted {obj}")
    good = {"metadata": {"uid": "ok", "name": "fine"}}
    assert [p.uid for p in pods_from_list({"items": [*bad, good]})] == ["ok"]


def test_regression_policy_key_with_line_breaks_still_gives_one_line() -> None:
    for text in ("? '\n\n'", "slo:\n  ? '\n\n    '\n  : null\n", "kubernetes:\n  ? \"a\\u2028b\"\n  : 1\n"):
        try:
            parse_policy(text, "fuzz.yaml")
        except PolicyError as e:
            assert len(str(e).splitlines()) == 1 and str(e).endswith("unknown key"), str(e)
        else:
            raise AssertionError(f"accepted {text!r}")


def test_regression_watch_event_with_metadata_not_an_object_is_skipped() -> None:
    source = ApiserverPodSource(None, "node-1")
    try:
        for meta in (True, [], "x", 3):
            assert source._apply(json.dumps({"type": "ADDED", "object": {"metadata": meta}})) is True
            assert source._apply(json.dumps({"type": "BOOKMARK", "object": {"metadata": meta}})) is True
        assert source.pods() == []
    finally:
        source.close()


def test_regression_proc_stat_line_with_a_non_ascii_digit_is_skipped() -> None:
    total, per_cpu = parse_proc_stat("cpu 1 2 3 4 5 6 7 8\ncpu\u00b2 1 2 3 4 5 6 7 8\ncpu0 1 2 3 4 5 6 7 8\n")
    assert total is not None and list(per_cpu) == [0]


def test_regression_empty_or_odd_proc_softirqs_reads_as_what_it_has(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/softirqs").write_text("")
    assert read_proc_softirqs(HostPaths.under(tmp_path)) == {}
    (tmp_path / "proc/softirqs").write_text("  CPU0 CPUx CPU1\n TIMER: 5 7\n NET_RX: x 9\n")
    assert read_proc_softirqs(HostPaths.under(tmp_path)) == {(0, "TIMER"): 5, (1, "TIMER"): 7, (1, "NET_RX"): 9}


def test_regression_journal_that_is_not_an_object_or_has_mistyped_entries_is_corrupt(tmp_path: Path) -> None:
    entry = {"path": "/x", "original": "1", "last_written": None, "pending": None, "seq": 1, "action_id": "a"}
    for doc in (None, [], {"version": 1, "entries": [{**entry, "seq": "2"}]},
                {"version": 1, "entries": [{**entry, "path": 3}]}):
        (tmp_path / "journal.json").write_text(json.dumps(doc))
        try:
            Journal(tmp_path, read=lambda p: "", write=lambda p, v: None)
        except JournalError as e:
            assert "corrupt" in str(e) and "\n" not in str(e)
        else:
            raise AssertionError(f"loaded {doc}")
    (tmp_path / "journal.json").write_text(json.dumps({"version": 1, "entries": [entry]}))
    assert list(Journal(tmp_path, read=lambda p: "", write=lambda p, v: None).owned()) == ["/x"]
