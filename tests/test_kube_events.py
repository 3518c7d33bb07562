# SPDX-License-Identifier: Apache-2.0
"""Incidents posted as core/v1 Events on the victim pod, against FakeKube over real HTTPS."""

from __future__ import annotations

import logging

import pytest

from detector.decisions import Cause, Target
from detector.kube_events import REASON_DETECTED, REASON_RESOLVED, IncidentEventPoster, event_name
from detector.model import Culprit, Evidence, Incident
from testkit.fakekube import FakeKube, make_pod

UID = "5dbe5657-826e-43bf-a3e6-b69f854fd160"


def _incident(incident_id: str = "inc-1", ended: bool = False) -> Incident:
    victim = Target("kubepods.slice/x", pod_uid=UID, namespace="shop", pod="web-0", qos="LS")
    culprit = Target("kubepods.slice/kubepods-besteffort.slice/y", namespace="batch", pod="spark-1", qos="BE")
    return Incident(
        incident_id=incident_id, victim=victim, cause=Cause.NEIGHBOR_CPU, started_at=1_700_000_000.0,
        confidence=0.87, signal="runq_p99_ms",
        culprits=[Culprit(culprit, score=0.83, who_ran_instead_share=0.64, cpu_cores=1.5),
                  Culprit(Target("system.slice/backup.service"), score=0.1)],
        evidence=[Evidence("runq_p99_ms", 12.5, 2.0, threshold=5.0)],
        ended_at=1_700_000_100.0 if ended else None,
    )


@pytest.fixture
def kube():
    with FakeKube(token="tok", tls=True, node_name="node-1") as k:
        k.add_pod(make_pod("web-0", "shop", UID))
        yield k


def test_event_on_victim_pod_then_aggregated(kube: FakeKube):
    now = [1_700_000_010.0]
    poster = IncidentEventPoster(kube.api_client(), node_name="node-1", min_update_interval=10, clock=lambda: now[0])
    assert poster.post(_incident()) is True
    assert len(kube.events) == 1
    ev = kube.events[0]
    assert ev["metadata"]["name"] == event_name("web-0", "inc-1") and ev["metadata"]["namespace"] == "shop"
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web-0", "uid": UID}
    assert (ev["reason"], ev["type"], ev["count"]) == (REASON_DETECTED, "Warning", 1)
    assert ev["source"] == {"component": "noisyneighbor", "host": "node-1"}
    assert ev["message"] == ("neighbor_cpu: runq_p99_ms=12.5 > 5 over 2s; top culprit batch/spark-1 (score 0.83, ran 64% "
                             "of the victim's wait, 1.50 cores); 1 more; confidence 0.87 [incident inc-1]")
    assert kube.requests_to("/api/v1/namespaces/shop/events", "POST")[0].headers["Authorization"] == "Bearer tok"

    # Repeats inside the interval are counted locally; the next update carries them all.
    now[0] += 1
    assert poster.post(_incident()) is True
    now[0] += 1
    assert poster.post(_incident()) is True
    assert kube.events[0]["count"] == 1 and kube.requests_to("/api/v1/namespaces/shop/events", "PATCH") == []
    now[0] += 10
    assert poster.post(_incident()) is True
    assert len(kube.events) == 1 and kube.events[0]["count"] == 4
    assert kube.events[0]["lastTimestamp"] == "2023-11-14T22:13:42Z"

    # The end of the incident is sent at once, as a Normal event on the same object.
    now[0] += 1
    assert poster.post(_incident(ended=True)) is True
    assert (kube.events[0]["reason"], kube.events[0]["type"], kube.events[0]["count"]) == (REASON_RESOLVED, "Normal", 5)
    assert kube.events[0]["message"].startswith("resolved; neighbor_cpu")

    # Another incident on the same pod is another Event.
    assert poster.post(_incident("inc-2")) is True
    assert len(kube.events) == 2


def test_restarted_agent_continues_the_count(kube: FakeKube):
    first = IncidentEventPoster(kube.api_client(), min_update_interval=0)
    first.post(_incident())
    first.post(_incident())
    assert kube.events[0]["count"] == 2
    second = IncidentEventPoster(kube.api_client(), min_update_interval=0)  # no memory of the first
    assert second.post(_incident()) is True
    assert len(kube.events) == 1 and kube.events[0]["count"] == 3


def test_failures_never_raise(kube: FakeKube, caplog: pytest.LogCaptureFixture):
    poster = IncidentEventPoster(kube.api_client(), min_update_interval=0, request_timeout=2)
    caplog.set_level(logging.WARNING, logger="noisyneighbor.events")
    kube.fail("500", times=1)
    assert poster.post(_incident()) is False
    kube.fail("close", times=1)
    assert poster.post(_incident()) is False
    kube.go_down()
    assert poster.post(_incident()) is False
    assert poster.failures == 3
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all("\n" not in m for m in lines)
    assert "HTTP 500" in lines[0]
    kube.come_up()
    assert poster.post(_incident()) is True and kube.events[0]["count"] == 1

    unauthorized = IncidentEventPoster(kube.api_client(token="wrong"))
    assert unauthorized.post(_incident("inc-9")) is False
    assert "HTTP 401" in caplog.records[-1].getMessage()


def test_non_pod_victim_is_skipped(kube: FakeKube):
    poster = IncidentEventPoster(kube.api_client())
    inc = _incident()
    inc.victim = Target("system.slice/nginx.service")
    assert poster.post(inc) is False
    assert kube.requests == []
