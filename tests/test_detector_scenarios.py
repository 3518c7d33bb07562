# SPDX-License-Identifier: Apache-2.0
"""Detector acceptance on the real kernel: test cgroups labelled as pods, fake kubelet metadata.

Each scenario has ground truth (victim, cause, culprit, onset) and checks what the detector said.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest

from detector.causes import SELF_THROTTLE_SHARE
from detector.decisions import Cause
from detector.incidents import CULPRIT_WINDOW_TICKS
from detector.policy import Policy, SloThresholds
from testkit.scenario_support import IncidentView, Scenario, scenario_harness

pytestmark = [pytest.mark.root, pytest.mark.slow]

VICTIM_CPU = 1


def _policy(**slo) -> Policy:
    return dataclasses.replace(Policy(), slo=dataclasses.replace(SloThresholds(), **slo))


@pytest.fixture
def scenario(make_cgroup):
    yield from scenario_harness(make_cgroup, VICTIM_CPU, _policy)


def _only_others_blamed(s: Scenario, views: list[IncidentView]) -> None:
    """Incidents of the scenario's pods while its own pods do nothing to each other: the node's other
    work may cause them (it ran on the victim's CPU; the detector is right), never a scenario pod."""
    for v in views:
        assert s.explained_by_others(v), v


def test_a_be_cpu_hog_is_the_culprit(scenario):
    s = scenario(_policy(runq_p99_ms=2.0))
    ls = s.pod("web", "LS")
    be = s.pod("batch", "BE", shares=2048)
    s.ls_worker(ls, [VICTIM_CPU], seconds=40)
    s.run_for(6)  # warm-up: the victim runs alone among the scenario's pods
    _only_others_blamed(s, s.views())
    onset = time.monotonic()
    s.hog(be, [VICTIM_CPU], seconds=30)
    s.run_for(CULPRIT_WINDOW_TICKS + 3)  # room for the bound below when another incident was open
    assert s.incidents_for(ls), "no incident for the LS pod next to a BE CPU hog"
    # The first tick whose incident for the LS pod names the hog first: a new incident (cause
    # neighbor_cpu), or one the node's other work opened before the onset, now updated with the hog
    # on top (the detector keeps an incident's first cause unless a later one is more confident).
    after = s.views(ls, after=onset)
    named = [v for v in after if v.culprits[:1] == (be.path,)
             and (v.cause == Cause.NEIGHBOR_CPU or v.started_at < onset)]
    assert named, [v.brief() for v in after]
    time_to_detect = named[0].updated_at - onset
    print(f"time to detect {time_to_detect:.2f} s; {named[0].brief()}")
    # breach_seconds (2 s) of 1 s ticks after the first tick that contains the onset: ~2 s; the target is 3 s.
    # Culprits are ranked on the last CULPRIT_WINDOW_TICKS ticks of who ran instead: when the node's
    # other work had the victim waiting before the onset (an incident open then), its share stays in
    # that window for up to that many ticks after the tick containing the onset.
    before_onset = [r for r in s.ticks if r.t <= onset]
    open_at_onset = bool(before_onset) and any(v.victim == ls.path for v in before_onset[-1].open)
    bound = (CULPRIT_WINDOW_TICKS + 1) * 1.0 if open_at_onset else 3.0
    assert time_to_detect <= bound, (open_at_onset, [v.brief() for v in after])
    # Once named, the hog stays the culprit while it runs (nothing else of the scenario competes).
    later = [v for v in after if v.updated_at > named[0].updated_at]
    assert later and all(v.culprits[:1] == (be.path,) for v in later), [v.brief() for v in later]


def test_b_self_throttling_blames_nobody(scenario):
    s = scenario(_policy(runq_p99_ms=2.0))
    # The worker wants 0.3 cores: it throttles itself. At 0.1 cores (throttled ~2/3 of the time) its
    # own quota stays the main part of its wait even when the node's other work delays its wakeups.
    ls = s.pod("api", "LS", cpu_quota_cores=0.1)
    be = s.pod("batch", "BE")  # an idle neighbour: present, never guilty
    s.ls_worker(ls, [VICTIM_CPU], seconds=20)
    s.run_for(10)
    views = s.views(ls)
    assert s.incidents_for(ls), "a pod throttled at its own quota shows runqueue wait: the detector must see it"
    assert any(v.cause == Cause.SELF_THROTTLING for v in views), [v.brief() for v in views]
    for v in views:
        assert be.path not in v.culprits, v.brief()
        throttled, wait = v.evidence.get("throttled_ms_per_s", 0.0), v.evidence.get("runq_wait_ms_per_s", 0.0)
        if v.cause == Cause.SELF_THROTTLING and wait > 0.5 and throttled / wait >= SELF_THROTTLE_SHARE:
            assert v.culprits == (), v.brief()  # its own quota explains its wait: nobody is blamed
        else:  # a window where the node's other work kept it waiting longer than its own quota did
            assert s.explained_by_others(v) or v.cause == Cause.SELF_THROTTLING, v.brief()
            assert not any(s.own(c) for c in v.culprits), v.brief()
    decisions = s.detector.sink.decisions
    suppressed = [d for d in decisions if d.kind == "suppress" and s.own(d.target.cgroup)]
    assert not suppressed, [d.to_dict() for d in suppressed]


def test_c_memory_limited_pod_under_reclaim(scenario, tmp_path):
    s = scenario(_policy(runq_p99_ms=50.0))
    data = tmp_path / "data.bin"
    with open(data, "wb") as f:  # 256 MiB written outside the pod, then dropped from the page cache
        for _ in range(256):
            f.write(b"\0" * (1 << 20))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # our own file: its reads charge the pod
    ls = s.pod("cache", "LS", memory_limit=64 << 20)
    reader = (
        "import sys, time\nend = time.monotonic() + float(sys.argv[2])\n"
        "while time.monotonic() < end:\n"
        "    with open(sys.argv[1], 'rb', buffering=0) as f:\n"
        "        while f.read(1 << 20): pass\n"
    )
    s.spawn(ls, [sys.executable, "-c", reader, str(data), "20"], [VICTIM_CPU])
    s.run_for(8)
    incidents = s.incidents_for(ls)
    assert incidents, "re-reading 4x its memory limit must stall the pod in memcg reclaim"
    inc = incidents[0]
    assert inc.cause == Cause.RECLAIM, inc.to_dict()
    # The stall is memcg reclaim at its own limit, measured in its own allocations.
    assert any(e.signal == "reclaim_stall_ms_per_s" and "memcg" in e.note for e in inc.evidence), inc.to_dict()


def test_d_net_rx_flood_on_the_victims_cpu(scenario, veth_pair):
    s = scenario(_policy(runq_p99_ms=50.0))
    ls = s.pod("web", "LS")
    be = s.pod("sender", "BE")
    # RPS steers the receiving veth's NET_RX to the victim's CPU; the sender runs on the other CPU,
    # so the only thing the victim shares its CPU with is softirq work.
    subprocess.run(["ip", "netns", "exec", veth_pair["b"], "sh", "-c",
                    f"echo {1 << VICTIM_CPU:x} > /sys/class/net/{veth_pair['dev_b']}/queues/rx-0/rps_cpus"],
                   check=True, timeout=10)
    s.ls_worker(ls, [VICTIM_CPU], seconds=30)
    s.run_for(4)
    flood = ("import socket, sys, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
             "end = time.monotonic() + float(sys.argv[2])\n"
             "while time.monotonic() < end:\n    s.sendto(b'x' * 64, (sys.argv[1], 9))\n")
    other_cpu = 1 - VICTIM_CPU
    s.spawn(be, ["ip", "netns", "exec", veth_pair["a"], sys.executable, "-c", flood, veth_pair["dst"], "15"],
            [other_cpu])
    s.run_for(8)
    incidents = s.incidents_for(ls)
    assert incidents, "a NET_RX flood steered to the victim's CPU must be seen"
    inc = incidents[0]
    assert inc.cause == Cause.SOFTIRQ, inc.to_dict()
    sirq = [e for e in inc.evidence if e.signal == "softirq_ms_per_s"]
    assert sirq and sirq[0].value >= 100.0, inc.to_dict()


def test_e_quiet_node_has_no_incidents(scenario):
    s = scenario()
    ls = s.pod("web", "LS")
    s.pod("batch", "BE")
    s.ls_worker(ls, [VICTIM_CPU], seconds=65)
    s.run_for(60)
    # Quiet as far as the scenario goes: its pods never harm each other. Pods of other test runs on a
    # shared node are not the scenario's (the detector sees them too); their incidents are theirs.
    _only_others_blamed(s, s.views())
    ours = [i for i in s.incidents() if s.own(i.victim.cgroup)]
    assert all(i.victim.cgroup == ls.path for i in ours), [i.to_dict() for i in ours]  # the idle BE pod: none
