"""The moves of a stepped rollout that its approval needs too: begin it, end it, record each change.

``registry/promotions.py`` begins a rollout when its promotion request is approved and ends it when
the request is refused; ``registry/rollout/services.py`` does everything else (start, check, step,
complete). This module imports neither, so the two can both use it.

A step is measured from the fleet's reports: each inference process reports, per loaded version, every
request it answered since the load (``registry.serving.TrafficTotals``). A step keeps each process's
totals from when it began (``AliasRollout.baseline``); its figures are the differences.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from registry import notify
from registry.audit.chain import SYSTEM, Actor, audit_record
from registry.models import AliasRollout, InferenceWorker, RolloutState, WebhookEvent
from registry.serving import TrafficTotals
from registry.webhooks import services as webhooks

__all__ = ["ROLLOUT_ACTOR", "fleet_totals", "rollout_begin", "rollout_finish", "rollout_json", "rollout_record"]

# Who the registry's own rollout changes (a step, a breach, a completion) are recorded as.
ROLLOUT_ACTOR = replace(SYSTEM, label="rollout")

_EVENTS = {
    "rollout.start": WebhookEvent.ROLLOUT_STARTED,
    "rollout.step": WebhookEvent.ROLLOUT_STEP,
    "rollout.pause": WebhookEvent.ROLLOUT_PAUSED,
    "rollout.resume": WebhookEvent.ROLLOUT_RESUMED,
    "rollout.rolled_back": WebhookEvent.ROLLOUT_ROLLED_BACK,
    "rollout.complete": WebhookEvent.ROLLOUT_COMPLETED,
    "rollout.abort": WebhookEvent.ROLLOUT_ABORTED,
}


def fleet_totals(model: str, versions: set[int]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each reporting process's totals for ``versions`` of ``model``: {worker_id: {version: totals}}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for worker_id, loaded in InferenceWorker.objects.values_list("worker_id", "loaded"):
        for row in loaded or ():
            if row.get("model") == model and row.get("version") in versions:
                out.setdefault(worker_id, {})[str(row["version"])] = TrafficTotals.from_json(
                    row.get("totals")
                ).as_json()
    return out


def rollout_json(rollout: AliasRollout) -> dict[str, Any]:
    """What the API and the pages say about a rollout."""
    return {
        "id": rollout.pk,
        "model": rollout.alias.model.name,
        "alias": rollout.alias.name,
        "version": rollout.version.version,
        "base_version": rollout.base_version.version,
        "state": rollout.state,
        "steps": list(rollout.steps),
        "step": rollout.step,
        "percent": rollout.percent,
        "step_seconds": rollout.step_seconds,
        "step_elapsed": round(_elapsed(rollout), 3),
        "max_error_rate": rollout.max_error_rate,
        "max_p99_ratio": rollout.max_p99_ratio,
        "min_requests": rollout.min_requests,
        "promotion": rollout.promotion_id,
        "started_by": rollout.started_by.username,
        "created_at": rollout.created_at.isoformat(),
        "ended_at": rollout.ended_at.isoformat() if rollout.ended_at else None,
        "end_reason": rollout.end_reason,
        "last_check": rollout.last_check or None,
    }


def _elapsed(rollout: AliasRollout) -> float:
    """Seconds the current step has run, pauses left out."""
    if rollout.state == RolloutState.RUNNING and rollout.step_started_at is not None:
        return rollout.step_elapsed + (timezone.now() - rollout.step_started_at).total_seconds()
    return rollout.step_elapsed


def rollout_record(rollout: AliasRollout, action: str, actor: Actor, before: Any, after: dict[str, Any]) -> None:
    """Audit one change of the rollout, emit its webhook event, and wake the fleet (its split changed)."""
    alias = rollout.alias
    audit_record(
        actor=actor,
        action=action,
        target_type="alias",
        target=f"{alias.model.name}@{alias.name}",
        model_name=alias.model.name,
        before=before,
        after={"rollout": rollout.pk, **after},
    )
    event = _EVENTS.get(action)
    if event is not None:
        details = {
            "rollout": rollout.pk,
            "alias": alias.name,
            "base_version": rollout.base_version.version,
            "state": rollout.state,
            "percent": rollout.percent,
            "by": actor.name,
            **after,
        }
        webhooks.emit(event, model=alias.model, version=rollout.version.version, details=details)
    payload = {"model": alias.model.name, "alias": alias.name, "rollout": rollout.pk}
    transaction.on_commit(partial(notify.publish, payload))


def _step_begins(rollout: AliasRollout) -> None:
    rollout.step_started_at = timezone.now()
    rollout.step_elapsed = 0.0
    rollout.baseline = fleet_totals(rollout.alias.model.name, {rollout.version.version, rollout.base_version.version})


def rollout_begin(rollout: AliasRollout, actor: Actor) -> None:
    """Start splitting: the first step's share goes to the candidate (inside the caller's transaction)."""
    rollout.state = RolloutState.RUNNING
    rollout.step = 0
    _step_begins(rollout)
    rollout.save(update_fields=["state", "step", "step_started_at", "step_elapsed", "baseline"])
    rollout_record(
        rollout, "rollout.start", actor, None, {"version": rollout.version.version, "percent": rollout.percent}
    )


def rollout_step(rollout: AliasRollout, actor: Actor, figures: dict[str, Any]) -> None:
    """The step passed: the next one's share goes to the candidate, measured afresh."""
    before = {"step": rollout.step, "percent": rollout.percent}
    rollout.step += 1
    _step_begins(rollout)
    rollout.save(update_fields=["step", "step_started_at", "step_elapsed", "baseline", "last_check"])
    rollout_record(
        rollout, "rollout.step", actor, before, {"step": rollout.step, "percent": rollout.percent, "passed": figures}
    )


def rollout_finish(rollout: AliasRollout, state: RolloutState, actor: Actor, reason: str, action: str) -> None:
    """End the rollout: every request goes to one version again (the alias's, whichever it is now)."""
    before = {"state": rollout.state, "percent": rollout.percent}
    if rollout.state == RolloutState.RUNNING and rollout.step_started_at is not None:
        rollout.step_elapsed = _elapsed(rollout)
    rollout.state = state
    rollout.ended_at = timezone.now()
    rollout.end_reason = reason
    rollout.save(update_fields=["state", "ended_at", "end_reason", "step_elapsed", "last_check"])
    rollout_record(rollout, action, actor, before, {"state": state, "reason": reason})
