"""The fleet page's traffic charts and the audit page's time range, pages, exports and verification."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from registry import serving
from registry.models import AuditEvent, InferenceWorker, Role
from registry.serving import LoadedRow, LoadState, TrafficBucket, WorkerReport
from registry.ui.charts import line_chart, nice_ceiling, traffic_charts
from tests.support.audit_factory import append_bulk_events
from tests.support.people import login_person

pytestmark = pytest.mark.django_db

MINUS = "\u2212"


def test_a_chart_has_a_value_axis_up_to_a_round_number_and_breaks_at_missing_values():
    chart = line_chart("p50", [1.0, 2.0, None, 4.0, None], title="p50 latency", unit="ms", suffix=" ms")
    assert chart.segments == ("34.0,72.5 83.5,53.0", "179.5,14.0 182.5,14.0")  # the lone point is a short dash
    # The value axis: 0 at the bottom of the plot, up to the round number above the peak, in the series' unit.
    assert (chart.unit, chart.y_ticks) == ("ms", (("92.0", "0"), ("53.0", "2"), ("14.0", "4")))
    assert (chart.latest, chart.peak) == ("4 ms", "4 ms")  # the newest interval has only begun
    idle = line_chart("requests/s", [None, None], title="Requests", unit="requests/s", idle=0.0)
    assert (idle.segments, idle.latest, idle.peak) == (("34.0,92.0 232.0,92.0",), "0", "0")
    assert idle.y_ticks[-1] == ("14.0", "1")
    assert line_chart("p99", [None, None], title="p99 latency", unit="ms").segments == ()


@pytest.mark.parametrize(
    ("peak", "top"),
    [(0.0, 1.0), (0.3, 0.3), (2.2, 2.5), (4.0, 4.0), (7.0, 8.0), (12.0, 20.0), (30.5, 40.0), (1000.0, 1000.0)],
)
def test_the_value_axis_ends_at_a_round_number(peak, top):
    assert nice_ceiling(peak) == pytest.approx(top)


def test_each_chart_names_its_unit_and_its_time_axis_counts_minutes_back_to_now():
    heartbeat = datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC)
    charts = traffic_charts((), until=heartbeat)
    assert [(c.label, c.title, c.unit) for c in charts] == [
        ("requests/s", "Requests", "requests/s"),
        ("p50", "p50 latency", "ms"),
        ("p99", "p99 latency", "ms"),
        ("errors", "Errors", "errors per 10 s"),
    ]
    # The time axis: a tick a minute, back from the newest interval at the right edge.
    assert charts[0].x_ticks == (
        ("68.1", f"{MINUS}4 min"),
        ("109.1", f"{MINUS}3 min"),
        ("150.1", f"{MINUS}2 min"),
        ("191.0", f"{MINUS}1 min"),
        ("232.0", "now"),
    )


def test_traffic_lies_on_the_five_minutes_before_the_heartbeat():
    heartbeat = datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC)
    end = heartbeat.timestamp() // 10 * 10
    buckets = (
        TrafficBucket(start=end - 600, seconds=10, requests=99, errors=0, p50_ms=1.0, p99_ms=1.0),  # too old
        TrafficBucket(start=end - 20, seconds=10, requests=50, errors=5, p50_ms=2.0, p99_ms=8.0),
        TrafficBucket(start=end, seconds=5, requests=10, errors=0, p50_ms=3.0, p99_ms=4.0),
    )
    rate, p50, p99, errors = traffic_charts(buckets, until=heartbeat)
    assert (rate.label, rate.latest, rate.peak) == ("requests/s", "2", "5")
    assert (p50.latest, p99.latest, p99.peak) == ("3 ms", "4 ms", "8 ms")
    assert (errors.latest, errors.peak) == ("0", "5")
    assert len(p50.segments) == 2  # the interval between them had no requests


def report(worker_id: str, *rows: LoadedRow) -> WorkerReport:
    return WorkerReport(
        worker_id=worker_id, host="h", pid=1, device="cpu", provider="CPU", started_at=timezone.now(), loaded=rows
    )


def test_fleet_page_draws_each_versions_traffic():
    now = timezone.now().timestamp() // 10 * 10
    traffic = (TrafficBucket(start=now - 10, seconds=10, requests=120, errors=3, p50_ms=4.2, p99_ms=19.0),)
    serving.worker_heartbeat(
        report(
            "w1",
            LoadedRow(model="demo", version=2, state=LoadState.READY, aliases=("production",), traffic=traffic),
            LoadedRow(model="demo", version=3, state=LoadState.FAILED, error="HashMismatch: x", attempts=2),
        )
    )
    response = login_person("vic", Role.VIEWER).client.get("/ui/fleet")
    assert response.status_code == 200
    html = response.content.decode()
    assert "demo v2 (production)" in html
    assert 'aria-label="requests/s: now 12, peak 12"' in html
    assert 'aria-label="p99: now 19 ms, peak 19 ms"' in html
    assert 'aria-label="errors: now 3, peak 3"' in html
    assert "HashMismatch: x" in html and "2 failed attempts" in html
    assert html.count('class="traffic"') == 1  # a failed version has no traffic to draw
    assert 'data-refresh="10"' in html
    # Each chart has its axes: the unit above the value axis, its round top, minutes back to now.
    assert '<text class="unit" x="34" y="9">requests/s</text>' in html
    assert '<text class="unit" x="34" y="9">ms</text>' in html
    assert '<text class="unit" x="34" y="9">errors per 10 s</text>' in html
    assert '<text class="y" x="30" y="14.0">20</text>' in html  # p99's axis: 19 ms rounds up to 20
    assert (
        f'<text class="x" x="68.1" y="106">{MINUS}4 min</text>' in html
        and '<text class="x" x="232.0" y="106">now</text>' in html
    )


def test_fleet_page_shows_a_canarys_share_and_a_shadow():
    now = timezone.now().timestamp() // 10 * 10
    old = now - 600  # past the minute the share is measured over

    def buckets(*counts: tuple[float, int]) -> tuple[TrafficBucket, ...]:
        return tuple(
            TrafficBucket(start=s, seconds=10, requests=n, errors=0, p50_ms=1.0, p99_ms=2.0) for s, n in counts
        )

    serving.worker_heartbeat(
        report(
            "w1",
            LoadedRow(
                model="demo",
                version=2,
                state=LoadState.READY,
                aliases=("production",),
                traffic=buckets((old, 500), (now - 20, 270), (now - 10, 180)),
            ),
            LoadedRow(
                model="demo",
                version=3,
                state=LoadState.READY,
                splits={"production": 10},
                traffic=buckets((now - 20, 30), (now - 10, 20)),
            ),
            LoadedRow(model="demo", version=4, state=LoadState.READY, shadows=("production",)),
        )
    )
    html = login_person("vic", Role.VIEWER).client.get("/ui/fleet").content.decode()
    assert (
        '<div class="small" data-split="production">canary: 10% of production\'s requests '
        '<span class="muted">(measured 10.0% of the last minute&#x27;s 500 requests)</span></div>'
    ) in html
    assert '<div class="small muted" data-shadow="production">shadow of production</div>' in html


NO_CUDA = (
    "this ONNX Runtime build has no CUDA provider (onnxruntime 1.0, the CPU wheel, is installed; install "
    "modelyard[gpu])"
)


def test_fleet_page_says_a_hosts_notice_once_not_on_every_row():
    rows = (
        LoadedRow(model="a", version=1, state=LoadState.READY, note=NO_CUDA),
        LoadedRow(
            model="b", version=1, state=LoadState.READY, note=f"{NO_CUDA}; CUDA graphs are off for this model: x"
        ),
    )
    for worker_id, host in (("w1", "h"), ("w2", "h"), ("w3", "g")):
        serving.worker_heartbeat(
            WorkerReport(
                worker_id=worker_id,
                host=host,
                pid=1,
                device="cpu (no CUDA in this ONNX Runtime build)",
                provider="CPUExecutionProvider",
                started_at=timezone.now(),
                loaded=rows,
                notice=NO_CUDA,
            )
        )
    vic = login_person("vic", Role.VIEWER)
    assert [worker["notice"] for worker in vic.get("/api/v1/fleet").json()] == [NO_CUDA] * 3  # the API says it too
    response = vic.client.get("/ui/fleet")
    html = response.content.decode()
    assert [(host["host"], len(host["workers"]), host["notices"]) for host in response.context["hosts"]] == [
        ("g", 1, [NO_CUDA]),
        ("h", 2, [NO_CUDA]),
    ]
    assert html.count("no CUDA provider") == 2  # once per host, not on each of the six rows
    assert (
        html.count(f'<p class="flash warn wrap" data-notice>Serves on the CPU: {NO_CUDA}</p>'.replace("'", "&#x27;"))
        == 2
    )
    # What else a row's note says stays on the row.
    assert html.count('<div class="muted small wrap" data-note>CUDA graphs are off for this model: x</div>') == 3


def test_fleet_page_with_no_worker_says_how_to_start_one():
    response = login_person("vic", Role.VIEWER).client.get("/ui/fleet")
    assert b"No inference process has reported. Start one with" in response.content
    assert not InferenceWorker.objects.exists()


@pytest.fixture
def auditor():
    return login_person("aud", Role.AUDITOR)


def at(event: AuditEvent, when: datetime) -> None:
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE registry_auditevent DISABLE TRIGGER USER")
        AuditEvent.objects.filter(pk=event.pk).update(at=when)
        cursor.execute("ALTER TABLE registry_auditevent ENABLE TRIGGER USER")


def test_audit_time_range_is_read_in_the_viewers_zone(auditor):
    events = list(AuditEvent.objects.order_by("seq"))
    assert len(events) >= 3
    noon = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    for offset, event in enumerate(events):
        at(event, noon + timedelta(hours=offset))
    # 17:30 to 18:30 in Kolkata (UTC+5:30) is 12:00 to 13:00 UTC: the first event only.
    response = auditor.client.get(
        "/ui/audit", {"since": "2026-03-01T17:30", "until": "2026-03-01T18:30", "tz": "Asia/Kolkata"}
    )
    assert response.status_code == 200
    assert [e.seq for e in response.context["events"]] == [events[0].seq]
    export = response.context["export"]
    assert export == {"since": "2026-03-01T17:30:00+05:30", "until": "2026-03-01T18:30:00+05:30"}
    assert b"/api/v1/audit/export?format=csv&amp;since=2026-03-01T17%3A30%3A00%2B05%3A30" in response.content


def test_audit_filters_page_back_through_older_events(auditor):
    append_bulk_events(450)
    first = auditor.client.get("/ui/audit")
    seqs = [e.seq for e in first.context["events"]]
    assert len(seqs) == 200 and seqs == sorted(seqs, reverse=True)
    older = first.context["older"]
    assert older == seqs[-1]
    second = auditor.client.get("/ui/audit", {"before": older})
    assert second.context["events"][0].seq == older - 1
    assert second.context["newest"] is True
    assert b"Newest" in second.content


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ({"since": "soon"}, "'soon' is not a date and time such as 2026-01-31T14:30"),
        ({"before": "x"}, "'before' must be a whole number, got 'x'"),
    ],
)
def test_bad_audit_filters_are_400(auditor, query, error):
    response = auditor.client.get("/ui/audit", query)
    assert (response.status_code, response.context["error"]) == (400, error)


def test_audit_page_shows_before_and_after_and_names_the_first_bad_event(auditor):
    login_person("mia", Role.MAINTAINER).post("/api/v1/models", {"name": "demo", "description": "d"})
    page = auditor.client.get("/ui/audit", {"verify": "1", "action": "model.create"})
    last = AuditEvent.objects.order_by("-seq").first()
    assert f"verified up to #{last.seq}".encode() in page.content
    # The event's after, as the JSON the API and the exports give (not Python's repr of a dict).
    event = AuditEvent.objects.get(action="model.create")
    assert event.after["description"] == "d" and event.before is None
    shown = json.dumps(event.after, indent=2, sort_keys=True).replace('"', "&quot;")
    assert f'<div class="small muted">after</div><pre class="json">{shown}</pre>'.encode() in page.content
    assert b"&#x27;description&#x27;" not in page.content and b"None" not in page.content
    victim = AuditEvent.objects.get(action="model.create")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE registry_auditevent DISABLE TRIGGER USER")
        AuditEvent.objects.filter(pk=victim.pk).update(target="other")
        cursor.execute("ALTER TABLE registry_auditevent ENABLE TRIGGER USER")
    broken = auditor.client.get("/ui/audit", {"verify": "1"})
    assert f"first bad event #{victim.seq}".encode() in broken.content
    assert b"chain broken" in broken.content
