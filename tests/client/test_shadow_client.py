"""Shadow traffic through the Python client against a live server: start, read, stop, and the server's refusals.

No request reaches the alias here, so every count of the reports is zero and every measure is None.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

from modelyard.client import (
    BadRequest,
    Client,
    Conflict,
    Forbidden,
    NotFound,
    Promotion,
    Shadow,
    ShadowOutput,
    ShadowSide,
)
from tests.support.embedded import LiveServer
from tests.support.onnx_models import add_model


@pytest.fixture(scope="module")
def people(live: LiveServer) -> tuple[Client, Client]:
    owner = Client(live.url, live.createtoken("sasha", "maintainer"))
    approver = Client(live.url, live.createtoken("pia", "approver"))
    return owner, approver


def served_model(owner: Client, approver: Client, name: str, folder: Path) -> None:
    """``name`` with versions 1 and 2 (same signature, another bias), version 1 on its protected ``production``."""
    folder.mkdir(parents=True, exist_ok=True)
    for number, bias in ((1, 1.0), (2, 2.0)):
        path = folder / f"v{number}.onnx"
        onnx.save(add_model(bias=bias), path)
        assert owner.wait_ready(name, owner.push(name, path).version).version == number
    request = owner.promote(name, "production", 1, reason="launch")
    assert isinstance(request, Promotion) and request.shadow_report is None and request.shadow is None
    approver.approve(request.id, reason="ok")


def test_start_show_and_stop_a_shadow(live, people, tmp_path):
    owner, approver = people
    served_model(owner, approver, "shade", tmp_path)

    started = owner.shadow_start("shade", "production", 2)  # the version alone: the server's sample
    assert isinstance(started, Shadow)
    assert (started.model, started.alias, started.version, started.serving) == ("shade", "production", 2, 1)
    assert (started.sample, started.running, started.started_by) == (0.1, True, "sasha")
    assert (started.ended_at, started.ended_by, started.end_reason) == (None, None, "")
    assert started.started_at and started.raw["id"] == started.id
    # Nothing mirrored yet: the counts are zero, the measures None, no output compared.
    assert (started.requests, started.compared, started.dropped, started.dropped_by_reason) == (0, 0, 0, {})
    assert started.primary == ShadowSide(answered=0, errors=0, raw=started.report["primary"])
    assert (started.candidate.p50_ms, started.candidate.p99_ms, started.candidate.error_rate) == (None, None, None)
    assert started.outputs == {}

    shown = owner.shadow("shade", "production")
    assert (shown.id, shown.version, shown.sample, shown.running) == (started.id, 2, 0.1, True)
    assert approver.shadow("shade", "production").id == started.id  # reading needs no role

    stopped = owner.shadow_stop("shade", "production", reason="seen enough")
    assert (stopped.id, stopped.running, stopped.ended_by, stopped.end_reason) == (
        started.id,
        False,
        "sasha",
        "seen enough",
    )
    assert stopped.ended_at is not None
    after = owner.shadow("shade", "production")  # the last one, ended, stays readable
    assert (after.id, after.running, after.end_reason, after.ended_at) == (
        started.id,
        False,
        "seen enough",
        stopped.ended_at,
    )

    # A sample of one's own; a stop without a reason says "stopped".
    again = owner.shadow_start("shade", "production", 2, sample=0.5)
    assert (again.sample, again.running) == (0.5, True) and again.id != started.id
    assert owner.shadow_stop("shade", "production").end_reason == "stopped"


def test_refusals_carry_the_servers_message(live, people, tmp_path):
    owner, approver = people
    served_model(owner, approver, "refused", tmp_path)

    with pytest.raises(NotFound) as never:
        owner.shadow("refused", "production")
    assert (never.value.status, never.value.error) == (
        404,
        "alias 'production' of model 'refused' has never been shadowed",
    )
    with pytest.raises(NotFound) as nothing_runs:
        owner.shadow_stop("refused", "production")
    assert nothing_runs.value.error == "alias 'production' of model 'refused' has no running shadow"
    with pytest.raises(NotFound) as no_version:
        owner.shadow_start("refused", "production", 9)
    assert no_version.value.error == "model 'refused' has no version 9"
    with pytest.raises(NotFound) as no_alias:
        owner.shadow_start("refused", "canary", 2)
    assert no_alias.value.error == "model 'refused' has no alias 'canary'"
    with pytest.raises(NotFound) as no_model:
        owner.shadow("nothing", "production")
    assert no_model.value.error == "not found"

    with pytest.raises(Conflict) as same:
        owner.shadow_start("refused", "production", 1)
    assert (same.value.status, same.value.error) == (
        409,
        "alias 'production' serves version 1 already; shadow another version",
    )
    owner.promote("refused", "staging", 1)  # an alias nobody serves
    with pytest.raises(Conflict) as unserved:
        owner.shadow_start("refused", "staging", 2)
    assert unserved.value.error == "alias 'staging' is not served, so it has no requests to mirror; serve it first"

    with pytest.raises(BadRequest) as too_much:
        owner.shadow_start("refused", "production", 2, sample=1.5)
    assert too_much.value.status == 400 and "sample" in too_much.value.error
    with pytest.raises(Forbidden) as role:
        approver.shadow_start("refused", "production", 2)
    assert role.value.error == "this action needs the maintainer or admin role"
    with pytest.raises(NotFound):  # none of the refusals started one
        owner.shadow("refused", "production")


def test_a_promotion_request_carries_the_shadow_report(live, people, tmp_path):
    owner, approver = people
    served_model(owner, approver, "carried", tmp_path)
    started = owner.shadow_start("carried", "production", 2, sample=0.25)

    request = owner.promote("carried", "production", 2, reason="the shadow agrees")
    assert isinstance(request, Promotion)
    assert request.shadow_report is not None and request.shadow_report["as_of"]
    shadow = request.shadow
    assert isinstance(shadow, Shadow)
    assert (shadow.id, shadow.version, shadow.serving, shadow.sample, shadow.running) == (started.id, 2, 1, 0.25, True)
    assert shadow.outputs == {} and shadow.requests == 0
    assert owner.get_promotion(request.id).shadow_report == request.shadow_report

    approver.approve(request.id, reason="ok")  # the alias serves the candidate now: its shadow ends
    ended = owner.shadow("carried", "production")
    assert (ended.id, ended.running, ended.serving) == (started.id, False, 2)
    assert ended.end_reason == "promoted: the alias serves the candidate now"


def test_the_report_reads_as_typed_parts():
    report: dict[str, Any] = {
        "requests": 40,
        "compared": 38,
        "dropped": 3,
        "dropped_by_reason": {"busy": 2, "queue_full": 1},
        "primary": {
            "answered": 40,
            "errors": 0,
            "error_rate": 0.0,
            "p50_ms": 1.5,
            "p99_ms": 4.0,
            "last_error": "",
        },
        "candidate": {
            "answered": 38,
            "errors": 2,
            "error_rate": 0.05,
            "p50_ms": 2.5,
            "p99_ms": 8.0,
            "last_error": "boom",
        },
        "outputs": {
            "y": {
                "rows": 76,
                "cosine_p1": 0.9991,
                "cosine_p50": 0.99999,
                "cosine_min": 0.998,
                "max_abs_diff": 0.02,
                "mean_abs_diff": 0.001,
                "top1_agreement": None,
                "psi": 0.004,
                "mismatched": 0,
                "mismatch": "",
            }
        },
    }
    shadow = Shadow.from_json(
        {"id": 1, "model": "m", "alias": "production", "version": 2, "serving": 1, "sample": 0.1, "report": report}
    )
    assert (shadow.requests, shadow.compared, shadow.dropped) == (40, 38, 3)
    assert shadow.dropped_by_reason == {"busy": 2, "queue_full": 1}
    assert (shadow.candidate.errors, shadow.candidate.error_rate, shadow.candidate.last_error) == (2, 0.05, "boom")
    assert shadow.primary.p99_ms == 4.0
    [(name, output)] = shadow.outputs.items()
    assert name == "y" and isinstance(output, ShadowOutput)
    assert (output.rows, output.cosine_p1, output.top1_agreement, output.psi) == (76, 0.9991, None, 0.004)
    assert output.raw == report["outputs"]["y"]
