"""Weighted canaries and stepped rollouts: a candidate takes a growing share of an alias's requests.

``PUT .../rollout`` (:func:`rollout_start`) names the candidate, its steps (shares of the alias's
requests, in percent) and the limits each step is checked against. On a protected alias it opens a
promotion request of kind ``rollout`` and waits for a second person's approval
(``registry/promotions.py`` begins it then); elsewhere it begins at once.

The inference processes split the alias's requests from the desired state (``registry.serving``:
``SplitSpec``), stable per ``Modelyard-Routing-Key``. The periodic check (:func:`rollouts_advance`,
every ``MODELYARD_ROLLOUT_CHECK_SECONDS``) reads the fleet's figures for the candidate and the
current version since the step began and:

- rolls back at once when the candidate breaches a limit: its error rate above ``max_error_rate``
  (as soon as its errors alone make that certain at ``min_requests``), or its p99 latency above
  ``max_p99_ratio`` times the current version's, once both have ``min_requests``;
- otherwise, once the step has run ``step_seconds`` with at least ``min_requests`` on the candidate,
  passes it: the next step begins, or after the last one the alias moves to the candidate, as an
  approved promotion (its request, on a protected alias).

Every start, step, pause, resume, breach, abort and completion is an audit event and a webhook event.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from registry.access.auth import has_role
from registry.audit.chain import Actor, audit_record
from registry.errors import Conflict, InvalidInput, NotFound, PermissionDenied, RegistryError
from registry.models import (
    ROLLOUT_LIVE,
    Alias,
    AliasMoveKind,
    AliasRollout,
    ModelVersion,
    PromotionKind,
    PromotionRequest,
    PromotionState,
    RegisteredModel,
    Role,
    RolloutState,
    VersionStatus,
    WebhookEvent,
)
from registry.promotions import check_candidate, emit_promotion, move_alias, promotion_ttl, promotion_withdrawn
from registry.provenance.services import check_alias_signature
from registry.rollout.state import (
    ROLLOUT_ACTOR,
    fleet_totals,
    rollout_begin,
    rollout_finish,
    rollout_json,
    rollout_record,
    rollout_step,
)
from registry.serving import TrafficTotals

__all__ = [
    "DEFAULTS",
    "rollout_abort",
    "rollout_current",
    "rollout_json",
    "rollout_pause",
    "rollout_resume",
    "rollout_start",
    "rollouts_advance",
]

logger = logging.getLogger(__name__)

# What a rollout that names only its version gets (the example of the design: four steps of five minutes).
DEFAULTS: dict[str, Any] = {
    "steps": [5, 25, 50, 100],
    "step_seconds": 300,
    "max_error_rate": 0.005,
    "max_p99_ratio": 1.2,
    "min_requests": 200,
}
MAX_STEPS = 20
NEEDS_ROLE = "starting, pausing, resuming or aborting a rollout needs the maintainer or admin role"
_RELATED = ("alias__model", "alias__version", "version", "base_version", "started_by")


def _check_role(actor: Actor) -> None:
    if not has_role(actor.user, Role.MAINTAINER):
        raise PermissionDenied(NEEDS_ROLE)


def check_steps(steps: Any) -> list[int]:
    """Steps are 1 to 20 whole percentages, each above the last, none above 100."""
    if not isinstance(steps, list) or not steps:
        raise InvalidInput("steps must be a list of percentages, e.g. [5, 25, 50, 100]")
    if len(steps) > MAX_STEPS:
        raise InvalidInput(f"a rollout has at most {MAX_STEPS} steps, not {len(steps)}")
    if any(isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 100 for s in steps):
        raise InvalidInput(f"each step is a whole percentage from 1 to 100: {steps}")
    if any(b <= a for a, b in itertools.pairwise(steps)):
        raise InvalidInput(f"each step must be larger than the one before: {steps}")
    return list(steps)


def _alias(model: RegisteredModel, name: str) -> Alias:
    alias = (
        Alias.objects.select_for_update(of=("self",))
        .select_related("model", "version")
        .filter(model=model, name=name)
        .first()
    )
    if alias is None:
        raise NotFound(f"model '{model.name}' has no alias '{name}'")
    return alias


@transaction.atomic(durable=True)
def rollout_start(
    *,
    model: RegisteredModel,
    alias_name: str,
    version_number: int,
    actor: Actor,
    steps: list[int] | None = None,
    step_seconds: int | None = None,
    max_error_rate: float | None = None,
    max_p99_ratio: float | None = None,
    min_requests: int | None = None,
    reason: str = "",
    force: bool = False,
) -> AliasRollout:
    """Start a stepped rollout of a version on an alias, or ask for it when the alias is protected."""
    _check_role(actor)
    model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
    alias = _alias(model, alias_name)
    version = ModelVersion.objects.filter(model=model, version=version_number).first()
    if version is None:
        raise NotFound(f"model '{model.name}' has no version {version_number}")
    if refusal := version.lifecycle_refusal("rolled out"):
        raise Conflict(refusal)
    if version.status != VersionStatus.READY:
        raise Conflict(f"version {version.version} is {version.status}; only a ready version can be rolled out")
    if not alias.served:
        raise Conflict(f"alias '{alias.name}' is not served, so there are no requests to split; serve it first")
    if alias.version is None:
        raise Conflict(f"alias '{alias.name}' points to no version yet: set it directly, there is nothing to compare")
    if alias.version_id == version.pk:
        raise Conflict(f"alias '{alias.name}' serves version {version.version} already")
    live = AliasRollout.objects.filter(alias=alias, state__in=ROLLOUT_LIVE).first()
    if live is not None:
        raise Conflict(
            f"alias '{alias.name}' has a rollout of version {live.version.version} {live.state} already "
            f"(rollout {live.pk}); abort it first",
            detail={"rollout": live.pk},
        )
    check_alias_signature(alias, version)  # provenance holds for every way onto the alias
    # A breaking signature change and the alias's policy are refused as a direct set refuses them, unless forced.
    forced, check = check_candidate(alias, version, force=force, reason=reason, requester=actor.user)
    rollout = AliasRollout(
        alias=alias,
        version=version,
        base_version=alias.version,
        steps=check_steps(DEFAULTS["steps"] if steps is None else steps),
        step_seconds=DEFAULTS["step_seconds"] if step_seconds is None else step_seconds,
        max_error_rate=DEFAULTS["max_error_rate"] if max_error_rate is None else max_error_rate,
        max_p99_ratio=DEFAULTS["max_p99_ratio"] if max_p99_ratio is None else max_p99_ratio,
        min_requests=DEFAULTS["min_requests"] if min_requests is None else min_requests,
        state=RolloutState.PENDING,
        started_by=actor.user,
    )
    if alias.protected:
        rollout.promotion = PromotionRequest.objects.create(
            alias=alias,
            kind=PromotionKind.ROLLOUT,
            version=version,
            base_version=alias.version,
            reason=reason,
            force=forced,
            requested_by=actor.user,
            expires_at=promotion_ttl(),
            policy_results=check.as_json(),
        )
    rollout.save()
    if rollout.promotion is not None:
        promotion = rollout.promotion
        audit_record(
            actor=actor,
            action="promotion.request",
            target_type="promotion",
            target=str(promotion.pk),
            model_name=model.name,
            before={"version": alias.version.version},
            after={
                "alias": alias.name,
                "kind": PromotionKind.ROLLOUT,
                "version": version.version,
                "rollout": rollout.pk,
            },
        )
        emit_promotion(
            WebhookEvent.PROMOTION_REQUESTED,
            promotion,
            reason=reason,
            forced=False,
            base_version=alias.version.version,
            expires_at=promotion.expires_at.isoformat(),
            rollout=rollout.pk,
        )
    else:
        rollout_begin(rollout, actor)
    return rollout


def _live(model: RegisteredModel, alias_name: str, states: tuple[str, ...]) -> AliasRollout:
    # The model row first, as rollout_start, alias_set and every promotion decision lock it: an abort
    # that locked the rollout before the model would deadlock with an approval or a rejection of its
    # request (which hold the model and the request, and then lock the rollout).
    model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
    alias = _alias(model, alias_name)
    rollout = (
        AliasRollout.objects.select_for_update(of=("self",))
        .select_related(*_RELATED)
        .filter(alias=alias, state__in=states)
        .first()
    )
    if rollout is None:
        wanted = " or ".join(states)
        raise Conflict(f"alias '{alias.name}' of model '{model.name}' has no {wanted} rollout")
    return rollout


@transaction.atomic(durable=True)
def rollout_pause(*, model: RegisteredModel, alias_name: str, actor: Actor, reason: str = "") -> AliasRollout:
    """Hold the candidate's current share; the step's clock stops until :func:`rollout_resume`."""
    _check_role(actor)
    rollout = _live(model, alias_name, (RolloutState.RUNNING,))
    assert rollout.step_started_at is not None
    rollout.step_elapsed += (timezone.now() - rollout.step_started_at).total_seconds()
    rollout.state = RolloutState.PAUSED
    rollout.save(update_fields=["state", "step_elapsed"])
    rollout_record(rollout, "rollout.pause", actor, {"state": RolloutState.RUNNING}, {"reason": reason})
    return rollout


@transaction.atomic(durable=True)
def rollout_resume(*, model: RegisteredModel, alias_name: str, actor: Actor, reason: str = "") -> AliasRollout:
    _check_role(actor)
    rollout = _live(model, alias_name, (RolloutState.PAUSED,))
    rollout.state = RolloutState.RUNNING
    rollout.step_started_at = timezone.now()
    rollout.save(update_fields=["state", "step_started_at"])
    rollout_record(rollout, "rollout.resume", actor, {"state": RolloutState.PAUSED}, {"reason": reason})
    return rollout


@transaction.atomic(durable=True)
def rollout_abort(*, model: RegisteredModel, alias_name: str, actor: Actor, reason: str = "") -> AliasRollout:
    """Stop the rollout: every request goes to the current version at once. A pending one withdraws its request."""
    _check_role(actor)
    rollout = _live(model, alias_name, ROLLOUT_LIVE)
    rollout_finish(rollout, RolloutState.ABORTED, actor, reason or "aborted", "rollout.abort")
    if rollout.promotion is not None and rollout.promotion.state == PromotionState.PENDING:
        promotion_withdrawn(rollout.promotion, actor, "the rollout was aborted")
    return rollout


def rollout_current(model: RegisteredModel, alias_name: str) -> AliasRollout:
    """The alias's live rollout, else its last one; :class:`NotFound` when it never had one."""
    alias = Alias.objects.filter(model=model, name=alias_name).first()
    if alias is None:
        raise NotFound(f"model '{model.name}' has no alias '{alias_name}'")
    rollouts = AliasRollout.objects.select_related(*_RELATED).filter(alias=alias)
    rollout = rollouts.filter(state__in=ROLLOUT_LIVE).first() or rollouts.order_by("-created_at", "-id").first()
    if rollout is None:
        raise NotFound(f"alias '{alias.name}' of model '{model.name}' has never had a rollout")
    return rollout


# --- The periodic check ------------------------------------------------------------------------------------


def _side(totals: TrafficTotals) -> dict[str, Any]:
    return {
        "requests": totals.requests,
        "errors": totals.errors,
        "error_rate": round(totals.errors / totals.requests, 6) if totals.requests else None,
        "p99_ms": totals.quantile_ms(0.99),
    }


def step_figures(rollout: AliasRollout) -> tuple[TrafficTotals, TrafficTotals]:
    """(candidate, current) since the step began, summed over every process that reports them."""
    candidate, current = TrafficTotals(), TrafficTotals()
    now = fleet_totals(rollout.alias.model.name, {rollout.version.version, rollout.base_version.version})
    for worker_id, versions in now.items():
        before = (rollout.baseline or {}).get(worker_id, {})
        for number, totals in versions.items():
            delta = TrafficTotals.from_json(totals).minus(TrafficTotals.from_json(before.get(number)))
            if int(number) == rollout.version.version:
                candidate = candidate.plus(delta)
            else:
                current = current.plus(delta)
    return candidate, current


def breach(rollout: AliasRollout, candidate: TrafficTotals, current: TrafficTotals) -> str:
    """Why the candidate fails its step now, or ""."""
    needed = rollout.min_requests
    if candidate.errors and candidate.errors > rollout.max_error_rate * max(needed, candidate.requests):
        rate = candidate.errors / candidate.requests
        return (
            f"error rate {rate:.2%} ({candidate.errors} of {candidate.requests} requests) is above the limit "
            f"of {rollout.max_error_rate:.2%}"
        )
    if candidate.requests >= needed and current.requests >= needed:
        mine, theirs = candidate.quantile_ms(0.99), current.quantile_ms(0.99)
        if mine is not None and theirs and mine / theirs > rollout.max_p99_ratio:
            return (
                f"p99 latency {mine:g} ms is {mine / theirs:.2f}x the current version's {theirs:g} ms, above the "
                f"limit of {rollout.max_p99_ratio:g}x"
            )
    return ""


def _advance(rollout_id: int) -> str:
    """One check of one rollout, in its own transaction; returns what happened."""
    with transaction.atomic(durable=True):
        # The alias too: a move of it (alias_set) or a pause or abort holding it is left to finish, and
        # the check of where it points below stays true until the last step moves it.
        rollout = (
            AliasRollout.objects.select_for_update(of=("self", "alias"), skip_locked=True)
            .select_related(*_RELATED)
            .filter(pk=rollout_id, state__in=(RolloutState.RUNNING, RolloutState.PAUSED))
            .first()
        )
        if rollout is None:
            return "skipped"
        paused = rollout.state == RolloutState.PAUSED
        alias = rollout.alias
        if alias.version_id != rollout.base_version_id:
            now = alias.version.version if alias.version else None
            reason = f"alias '{alias.name}' was moved to version {now} meanwhile"
            rollout_finish(rollout, RolloutState.ABORTED, ROLLOUT_ACTOR, reason, "rollout.abort")
            return "aborted"
        if rollout.version.status != VersionStatus.READY or not alias.served:
            reason = (
                f"version {rollout.version.version} is {rollout.version.status}"
                if alias.served
                else (f"alias '{alias.name}' is no longer served")
            )
            rollout_finish(rollout, RolloutState.ABORTED, ROLLOUT_ACTOR, reason, "rollout.abort")
            return "aborted"
        candidate, current = step_figures(rollout)
        assert rollout.step_started_at is not None
        elapsed = rollout.step_elapsed
        if not paused:
            elapsed += (timezone.now() - rollout.step_started_at).total_seconds()
        rollout.last_check = {
            "checked_at": timezone.now().isoformat(),
            "step": rollout.step,
            "elapsed": round(elapsed, 3),
            "candidate": _side(candidate),
            "current": _side(current),
        }
        why = breach(rollout, candidate, current)
        if why:
            rollout_finish(rollout, RolloutState.ROLLED_BACK, ROLLOUT_ACTOR, why, "rollout.rolled_back")
            return "rolled_back"
        if paused:  # it holds its share, so a breach still rolls it back; it only does not move on
            rollout.save(update_fields=["last_check"])
            return "checked"
        if elapsed < rollout.step_seconds or candidate.requests < rollout.min_requests:
            if elapsed >= rollout.step_seconds:
                rollout.last_check["waiting"] = (
                    f"{candidate.requests} of the {rollout.min_requests} requests a step needs so far"
                )
            rollout.save(update_fields=["last_check"])
            return "checked"
        if rollout.step + 1 < len(rollout.steps):
            rollout_step(rollout, ROLLOUT_ACTOR, rollout.last_check)
            return "stepped"
        try:
            kind = AliasMoveKind.APPROVAL if rollout.promotion is not None else AliasMoveKind.SET
            reason = f"rollout {rollout.pk} passed its {len(rollout.steps)} steps"
            move_alias(alias, rollout.version, ROLLOUT_ACTOR, kind, reason, rollout.promotion)
        except RegistryError as exc:  # e.g. the alias now requires a signature the candidate lacks
            rollout_finish(
                rollout, RolloutState.ROLLED_BACK, ROLLOUT_ACTOR, f"the alias cannot move: {exc}", "rollout.rolled_back"
            )
            return "rolled_back"
        rollout_finish(rollout, RolloutState.COMPLETED, ROLLOUT_ACTOR, "passed every step", "rollout.complete")
        return "completed"


def rollouts_advance() -> dict[int, str]:
    """Check every running or paused rollout once (the periodic task); returns rollout id -> what happened.

    A paused rollout is checked for breaches (it still splits traffic) but does not move on.
    """
    outcomes = {}
    splitting = (RolloutState.RUNNING, RolloutState.PAUSED)
    for rollout_id in AliasRollout.objects.filter(state__in=splitting).values_list("pk", flat=True):
        try:
            outcomes[rollout_id] = _advance(rollout_id)
        except Exception:  # one broken rollout must not stop the others' checks
            logger.exception("checking rollout %s failed", rollout_id)
            outcomes[rollout_id] = "failed"
    return outcomes
