"""Retention rules: which old versions of a model a periodic job archives or deletes, and which it spares, and why.

A model's rule (``RegisteredModel.retention``) is ``{"keep_last": N, "keep_days": D, "then": "archive"}``
(or ``"delete"``). A version is a *candidate* when it is outside both windows: not among the N
highest-numbered versions that are not deleted (archived ones count), and created more than D days
ago. A candidate is *spared*, and listed with its reasons, when

- its validation has not finished (pending or validating): its outcome is not known yet;
- it is under legal hold;
- an alias points at it, or pointed at it at any moment of the last D days (``AliasMove``: a version
  an alias moved away from at time t was aliased until t);
- an inference process served it in the last D days (``ModelVersion.last_served_at``);
- anything else the archive or delete service would refuse it for: a live rollout, a running shadow,
  a pending promotion request, and, for deletion, a process that still loads it
  (``registry.lifecycle.services.archive_refusals`` and ``delete_refusals``, the services' own words).

Every other candidate is archived (``then: archive``; one archived already is left alone, so it is not
listed) or deleted (``then: delete``, archived or not; its files are removed after the commit, as any
deletion's) by :func:`retention_apply`, acting as the registry itself (``SYSTEM``). Tombstones are never
candidates, and failed versions are candidates like any other: they are clutter too.

:func:`retention_plan` is the preview: it changes nothing, and when nothing changes in between
:func:`retention_apply` does exactly what it lists. The services re-check each version under its row
lock as the job acts on it; a version refused meanwhile is reported as refused and the run goes on.

Setting a rule needs the maintainer role; a rule that deletes needs an admin, as deleting a version does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from registry.access.auth import has_role
from registry.audit.chain import SYSTEM, Actor, audit_record
from registry.errors import Conflict, InvalidInput, PermissionDenied, RegistryError
from registry.lifecycle.services import (
    Uses,
    archive_refusals,
    delete_refusals,
    uses_of,
    version_archive,
    version_delete,
)
from registry.models import AliasMove, ModelVersion, RegisteredModel, Role, VersionStatus

__all__ = [
    "RetentionAction",
    "RetentionPlan",
    "retention_apply",
    "retention_apply_all",
    "retention_plan",
    "retention_set",
    "rule_check",
]

logger = logging.getLogger(__name__)

ARCHIVE, DELETE, KEEP = "archive", "delete", "keep"
KEYS = ("keep_last", "keep_days", "then")
MAX_KEEP_LAST = 10_000
MAX_KEEP_DAYS = 36_500  # a hundred years: more is no rule

NOT_AN_OBJECT = 'a retention rule is a JSON object: {"keep_last": N, "keep_days": D, "then": "archive" or "delete"}'
BAD_THEN = 'then must be "archive" or "delete"'
NEEDS_MAINTAINER = "setting a model's retention rule needs the maintainer or admin role"
NEEDS_ADMIN = "a retention rule that deletes versions needs the admin role"
_UNFINISHED = (VersionStatus.PENDING, VersionStatus.VALIDATING)


# --- The rule ---------------------------------------------------------------------------------------


def _whole(rule: dict[str, Any], key: str, maximum: int) -> int:
    if key not in rule:
        raise InvalidInput(f"a retention rule needs {key}", detail={"field": key})
    value = rule[key]
    # JSON true is a Python int; 10.0 is not a whole number of versions.
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidInput(f"{key} must be a whole number from 1 to {maximum}", detail={"field": key})
    return value


def rule_check(rule: object) -> dict[str, Any]:
    """The rule as it is stored, ``{"keep_last", "keep_days", "then"}`` (``then`` defaults to archive).

    Raises :class:`InvalidInput` naming the first thing wrong: not an object, an unknown key, a
    missing or out-of-range number, a ``then`` that is neither archive nor delete.
    """
    if not isinstance(rule, dict):
        raise InvalidInput(NOT_AN_OBJECT)
    unknown = sorted(str(key) for key in rule if key not in KEYS)
    if unknown:
        raise InvalidInput(
            f"unknown key(s) in the retention rule: {', '.join(map(repr, unknown))} "
            "(a rule has keep_last, keep_days and then)",
            detail={"unknown": unknown},
        )
    keep_last = _whole(rule, "keep_last", MAX_KEEP_LAST)
    keep_days = _whole(rule, "keep_days", MAX_KEEP_DAYS)
    then = rule.get("then", ARCHIVE)
    if then not in (ARCHIVE, DELETE):
        raise InvalidInput(BAD_THEN, detail={"field": "then"})
    return {"keep_last": keep_last, "keep_days": keep_days, "then": then}


@transaction.atomic(durable=True)
def retention_set(*, model: RegisteredModel, rule: object, actor: Actor) -> RegisteredModel:
    """Set the model's retention rule (``None`` removes it): maintainer, or admin for a rule that deletes.

    Setting the rule it has already changes nothing and writes no audit event.
    """
    if not has_role(actor.user, Role.MAINTAINER):
        raise PermissionDenied(NEEDS_MAINTAINER)
    checked = None if rule is None else rule_check(rule)
    if checked is not None and checked["then"] == DELETE and not has_role(actor.user, Role.ADMIN):
        raise PermissionDenied(NEEDS_ADMIN)
    model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
    before = model.retention
    if before == checked:
        return model
    model.retention = checked
    model.save(update_fields=["retention", "updated_at"])
    audit_record(
        actor=actor,
        action="model.retention",
        target_type="model",
        target=model.name,
        model_name=model.name,
        before={"retention": before},
        after={"retention": checked},
    )
    return model


# --- The plan ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetentionAction:
    """What a rule does to one version (archive, delete), or why it spares one outside both windows (keep)."""

    version: int
    action: str
    why: str
    refused: str = ""  # a run only: the service refused it when the job came to it, so nothing was done

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"version": self.version, "action": self.action, "why": self.why}
        if self.refused:
            body["refused"] = self.refused
        return body


@dataclass(frozen=True)
class RetentionPlan:
    """What the rule would do now: the versions it archives or deletes, and those it spares, oldest first."""

    model: str
    rule: dict[str, Any]
    as_of: datetime
    actions: list[RetentionAction]
    kept: list[RetentionAction]

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "rule": self.rule,
            "as_of": self.as_of.isoformat(),
            "actions": [action.as_json() for action in self.actions],
            "kept": [action.as_json() for action in self.kept],
        }


def _at(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def _aliased_within(
    model: RegisteredModel, versions: list[ModelVersion], since: datetime, days: int
) -> dict[int, list[str]]:
    """For each version an alias pointed at during the window (but points at no more), a phrase per alias."""
    ids = {version.pk for version in versions}
    moves = (
        AliasMove.objects.filter(alias__model=model, moved_at__gte=since)
        .filter(Q(from_version__in=ids) | Q(to_version__in=ids))
        .select_related("alias")
        .order_by("moved_at", "pk")
    )
    latest: dict[tuple[int, int], tuple[AliasMove, bool]] = {}  # (version, alias) -> its last move, and if away
    for move in moves:
        for version_id, away in ((move.from_version_id, True), (move.to_version_id, False)):
            if version_id in ids:
                latest[(version_id, move.alias_id)] = (move, away)
    phrases: dict[int, list[str]] = {}
    for (version_id, _), (move, away) in sorted(latest.items(), key=lambda item: item[1][0].alias.name):
        if move.alias.version_id == version_id:
            continue  # it points at it now: the services' refusals say so
        verb = "pointed at it until" if away else "was set to it at"
        phrases.setdefault(version_id, []).append(
            f"alias '{move.alias.name}' {verb} {_at(move.moved_at)}, within the last {days} days"
        )
    return phrases


def _spared(version: ModelVersion, rule: dict[str, Any], since: datetime, aliased: list[str], uses: Uses) -> list[str]:
    """Why the rule keeps a candidate (empty when it does not)."""
    reasons = []
    if version.status in _UNFINISHED:
        reasons.append(f"its validation has not finished ({version.status})")
    if rule["then"] == DELETE:
        reasons += delete_refusals(version, uses)  # a legal hold first, then what uses it
    else:
        if version.held_at is not None:
            by = version.held_by.username if version.held_by else "someone"
            reasons.append(f"it is under legal hold (by {by} since {_at(version.held_at)}: {version.hold_reason})")
        reasons += archive_refusals(version, uses)
    reasons += aliased
    if version.last_served_at is not None and version.last_served_at >= since:
        reasons.append(
            f"an inference process served it at {_at(version.last_served_at)}, within the last {rule['keep_days']} days"
        )
    return reasons


def _why(version: ModelVersion, rule: dict[str, Any]) -> str:
    # Nothing here depends on the clock, so a preview and the run that follows it say the same.
    newest = "the newest version" if rule["keep_last"] == 1 else f"the {rule['keep_last']} newest versions"
    why = (
        f"not among {newest}, created {_at(version.created_at)} (more than {rule['keep_days']} days ago), "
        "and neither aliased nor served since then"
    )
    if rule["then"] == DELETE and version.archived_at is not None:
        why += f"; archived since {_at(version.archived_at)}"
    return why


def _no_rule(model: RegisteredModel) -> Conflict:
    return Conflict(
        f"model '{model.name}' has no retention rule; set one, or send a rule to preview",
        detail={"retention": None},
    )


def retention_plan(*, model: RegisteredModel, rule: object = None, now: datetime | None = None) -> RetentionPlan:
    """What ``rule`` (default: the model's own) would do at ``now`` (default: now); changes nothing.

    Raises :class:`InvalidInput` for a rule that is not one, :class:`Conflict` when neither is given.
    """
    if rule is None:
        rule = model.retention
        if rule is None:
            raise _no_rule(model)
    checked = rule_check(rule)
    now = now or timezone.now()
    since = now - timedelta(days=checked["keep_days"])
    live = list(model.versions.filter(deleted_at__isnull=True).select_related("model", "held_by").order_by("-version"))
    candidates = [version for version in live[checked["keep_last"] :] if version.created_at < since]
    if checked["then"] == ARCHIVE:
        candidates = [version for version in candidates if version.archived_at is None]
    candidates.sort(key=lambda version: version.version)
    aliased = _aliased_within(model, candidates, since, checked["keep_days"])
    uses = uses_of(model)
    actions, kept = [], []
    for version in candidates:
        reasons = _spared(version, checked, since, aliased.get(version.pk, []), uses)
        if reasons:
            kept.append(RetentionAction(version.version, KEEP, "; ".join(reasons)))
        else:
            actions.append(RetentionAction(version.version, checked["then"], _why(version, checked)))
    return RetentionPlan(model=model.name, rule=checked, as_of=now, actions=actions, kept=kept)


# --- The run ----------------------------------------------------------------------------------------


def _carry_out(model: RegisteredModel, action: RetentionAction, reason: str) -> RetentionAction:
    version = model.versions.select_related("model").get(version=action.version)
    try:
        if action.action == DELETE:
            version_delete(version=version, actor=SYSTEM, reason=reason)
        else:
            # The archive service allows a held version (a hold only forbids deletion); a rule spares it.
            if version.held_at is not None:
                raise Conflict(f"version {version.version} of model '{model.name}' is under legal hold")
            version_archive(version=version, actor=SYSTEM, reason=reason)
    except RegistryError as exc:
        logger.info("retention left version %s of '%s' alone: %s", version.version, model.name, exc.message)
        return replace(action, refused=exc.message)
    return action


def retention_apply(*, model: RegisteredModel, now: datetime | None = None) -> list[RetentionAction]:
    """Carry out the model's rule as its plan says, as the registry (``SYSTEM``); what it did, oldest first.

    Runs outside any transaction: each version is archived or deleted in its own. A version the
    services refuse by then (a hold placed, an alias moved to it) is returned with ``refused`` set.
    """
    model = RegisteredModel.objects.get(pk=model.pk)  # the rule as it is now
    if model.retention is None:
        return []
    plan = retention_plan(model=model, now=now)
    reason = f"retention rule: keep_last {plan.rule['keep_last']}, keep_days {plan.rule['keep_days']}"
    return [_carry_out(model, action, reason) for action in plan.actions]


def retention_apply_all(*, now: datetime | None = None) -> dict[str, list[RetentionAction]]:
    """Apply every model's rule (the periodic ``apply-retention`` job); what each did, by model name."""
    done: dict[str, list[RetentionAction]] = {}
    for model in RegisteredModel.objects.filter(retention__isnull=False).order_by("name"):
        try:
            done[model.name] = retention_apply(model=model, now=now)
        except Exception:  # one model's failure (deleted meanwhile, a database error) must not stop the others
            logger.exception("could not apply the retention rule of model '%s'", model.name)
    return done
