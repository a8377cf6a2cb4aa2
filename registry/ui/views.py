"""The server-rendered UI: models, versions, uploads, comparisons, promotions, the audit log and the fleet.

Pages read through ``registry.selectors`` and write through one service each (``registry.services``,
``registry.promotions``, and ``registry.uploads.version_upload`` for uploads, fed from the browser's
multipart request as the API feeds it). A refusal is shown with the service's own message and the
status the API's error table gives it (``registry.http.status_for``), so the rules live in
one place; every permission is checked here or in the service, whatever the page shows. Refusals
for lack of a role (403) write an ``access.denied`` audit event, as the API's do.

Tokens, users and passwords are in ``registry.ui.account_views``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestAborted
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse, QueryDict
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from modelyard.error_body import error_body
from onnxkit.signatures import signature_compare
from registry import promotions, selectors, services, serving
from registry.access import selectors as access_selectors
from registry.access.auth import has_role
from registry.access.clients import actor_from_request
from registry.access.refusals import audit_access_denied
from registry.audit.chain import audit_event_list
from registry.audit.verify import audit_verify
from registry.comparison import compare, file_changes, policy_violations
from registry.errors import (
    ForceNeedsReason,
    ForceRequired,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RegistryError,
)
from registry.http import MultipartUpload, body_refusal, status_for
from registry.lifecycle import services as lifecycle
from registry.models import (
    PRODUCTION,
    ROLLOUT_LIVE,
    Alias,
    AliasPolicy,
    AliasRollout,
    ModelVersion,
    PromotionKind,
    PromotionRequest,
    PromotionState,
    RegisteredModel,
    Role,
    RolloutState,
    VersionStatus,
)
from registry.policy.rules import PolicyCheck, policy_check, policy_in_force
from registry.provenance import services as provenance
from registry.rollout import services as rollouts
from registry.shadow import services as shadows
from registry.ui.charts import traffic_charts
from registry.ui.errors import error_page
from registry.ui.forms import (
    AliasCacheForm,
    AliasSignatureForm,
    ModelBatchingForm,
    ModelCreateForm,
    ModelEditForm,
    PromotionRequestForm,
    ReasonForm,
    RolloutStartForm,
    ShadowStartForm,
    UiForm,
    VersionEditForm,
    local_time,
)
from registry.ui.lineage_views import lineage_display
from registry.uploads import version_upload

MODELS_PAGE_SIZE = 25
AUDIT_PAGE_SIZE = 200
DECIDED_SHOWN = 50


# --- Shared -------------------------------------------------------------------------------------------


def home(request: HttpRequest) -> HttpResponse:
    """The front page at ``/``: how many models and versions this server holds, and the role it runs."""
    context = {
        "models": RegisteredModel.objects.count(),
        "versions": ModelVersion.objects.count(),
        "role": settings.ROLE,
    }
    return render(request, "modelyard/home.html", context)


def require_role(request: HttpRequest, *roles: str, what: str) -> None:
    """Raise the domain's PermissionDenied (a 403, audited by the caller) unless the user has one of ``roles``."""
    if not has_role(request.user, *roles):
        needed = " or ".join(roles)
        raise PermissionDenied(f"{what} needs the {needed} role")


def refusal(request: HttpRequest, exc: RegistryError) -> int:
    """The status for a refused change; a refusal for lack of a role (403) is audited, a 404 or 409 is not."""
    if isinstance(exc, PermissionDenied):
        audit_access_denied(request=request, reason=exc.message)
    return status_for(exc) or 400


def _form_wording(exc: RegistryError) -> str:
    """The service's message, with what it tells an API client to send worded for the page's own controls."""
    if isinstance(exc, ForceRequired):
        return f"{exc.refusal} Tick Force and give a reason to set it anyway."
    if isinstance(exc, ForceNeedsReason):
        return "Force needs a reason: write it in the Reason box."
    return exc.message


def form_refusal(form: UiForm) -> InvalidInput:
    return InvalidInput(form.error_text())


def _int_param(request: HttpRequest, key: str) -> int | None:
    text = request.GET.get(key, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise InvalidInput(f"'{key}' must be a whole number, got {text!r}")
    return int(text)


# --- Models -------------------------------------------------------------------------------------------


def _model_index(
    request: HttpRequest, *, form: ModelCreateForm | None = None, error: str = "", status: int = 200
) -> HttpResponse:
    query, tag = request.GET.get("q", "").strip(), request.GET.get("tag", "").strip()
    page = Paginator(selectors.model_list_with_versions(query=query, tag=tag), MODELS_PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    context = {
        "models": page.object_list,
        "page": page,
        "q": query,
        "tag": tag,
        "form": form or ModelCreateForm(),
        "error": error,
    }
    return render(request, "modelyard/ui/models.html", context, status=status)


@login_required
def model_index(request: HttpRequest) -> HttpResponse:
    """GET: search and browse; POST: create a model (maintainers)."""
    if request.method != "POST":
        return _model_index(request)
    form = ModelCreateForm(request.POST)
    try:
        require_role(request, Role.MAINTAINER, what="creating a model")
        if not form.is_valid():
            raise form_refusal(form)
        model = services.model_create(
            name=form.cleaned_data["name"],
            description=form.cleaned_data["description"],
            tags=form.cleaned_data["tags"],
            actor=actor_from_request(request),
        )
    except RegistryError as exc:
        return _model_index(request, form=form, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"Model '{model.name}' created. Upload its first version.")
    return redirect("ui:upload", name=model.name)


def _served_at(request: HttpRequest, model: RegisteredModel) -> tuple[datetime | None, list[Any], str]:
    """The "what served at" picker: the time asked for (in the viewer's zone) and each alias's move then."""
    text = request.GET.get("at", "").strip()
    if not text:
        return None, [], ""
    try:
        at = local_time(text, request.GET.get("tz", ""))
    except ValueError as exc:
        return None, [], f"at: {exc}"
    return at, selectors.aliases_at(model=model, at=at), ""


def _model_detail(
    request: HttpRequest,
    model: RegisteredModel,
    *,
    form: ModelEditForm | None = None,
    batching_form: ModelBatchingForm | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    at, served_at, at_error = _served_at(request, model)
    history = list(selectors.model_alias_history(model=model))
    aliases = list(selectors.alias_list(model=model))
    versions = list(selectors.version_list(model=model))
    shown, lifecycle_error = _versions_shown(request, versions)
    # Archived and deleted versions cannot be shadowed or rolled out.
    ready = [v.version for v in versions if v.status == VersionStatus.READY and v.lifecycle == "active"]
    for alias in aliases:
        # What a rollback would go back to: where its last move came from (newest first in the history).
        last = next((move for move in history if move.alias_id == alias.pk), None)
        alias.previous = last.from_version if last is not None else None  # type: ignore[attr-defined]
        # Its running shadow, else its last one, with the report; and what could shadow it (ready, not served).
        alias.shadow = _alias_shadow(model, alias)  # type: ignore[attr-defined]
        serving_number = alias.version.version if alias.version is not None else None
        alias.shadow_candidates = [n for n in ready if n != serving_number]  # type: ignore[attr-defined]
        # Its live rollout, else its last one; a rollout's candidates are the same: ready, not the one served.
        alias.rollout = _alias_rollout(model, alias)  # type: ignore[attr-defined]
        alias.rollout_candidates = alias.shadow_candidates  # type: ignore[attr-defined]
    context = {
        "model": model,
        "versions": shown["versions"],
        "lifecycle": shown,
        # An admin may delete the model once every version of it is a tombstone (or it has none).
        "model_deletable": all(v.deleted_at is not None for v in versions),
        "retention": model.retention,
        "aliases": aliases,
        "history": history,
        "at": at,
        "served_at": served_at,
        "form": form or ModelEditForm(initial={"description": model.description, "tags": " ".join(model.tags)}),
        "batching_form": batching_form
        or ModelBatchingForm(initial={"batching": model.batching, "max_batch_size": model.max_batch_size}),
        "error": error or at_error or lifecycle_error,
        # Who an alias may require a signature by (MODELYARD_TRUSTED_SIGNERS), for the admins' form.
        "trusted_signer_names": [name for name, _ in settings.TRUSTED_SIGNERS],
    }
    refused = (at_error or lifecycle_error) and status == 200
    return render(request, "modelyard/ui/model.html", context, status=400 if refused else status)


# The model page's version filters, as its links read.
LIFECYCLE_LABELS = {"active": "active", "archived": "archived", "deleted": "deleted (tombstones)", "all": "all"}


def _versions_shown(request: HttpRequest, versions: list[ModelVersion]) -> tuple[dict[str, Any], str]:
    """The versions the model page lists by ``?lifecycle=`` (active ones by default), with how many each choice has."""
    chosen = request.GET.get("lifecycle", "").strip() or "active"
    error = ""
    if chosen not in selectors.LIFECYCLES:
        error = f"lifecycle must be one of {', '.join(selectors.LIFECYCLES)}, not {chosen!r}"
        chosen = "active"
    counts = {name: sum(1 for v in versions if name in ("all", v.lifecycle)) for name in selectors.LIFECYCLES}
    choices = [(name, LIFECYCLE_LABELS[name], counts[name]) for name in selectors.LIFECYCLES]
    listed = [v for v in versions if chosen in ("all", v.lifecycle)]
    return {"chosen": chosen, "counts": counts, "choices": choices, "versions": listed}, error


@login_required
def model_detail(request: HttpRequest, name: str) -> HttpResponse:
    """GET: versions, aliases, history; POST: edit the description and tags (maintainers)."""
    model = get_object_or_404(RegisteredModel, name=name)
    if request.method != "POST":
        return _model_detail(request, model)
    form = ModelEditForm(request.POST)
    try:
        require_role(request, Role.MAINTAINER, what="editing a model")
        if not form.is_valid():
            raise form_refusal(form)
        services.model_update(
            model=model,
            description=form.cleaned_data["description"],
            tags=form.cleaned_data["tags"],
            actor=actor_from_request(request),
        )
    except RegistryError as exc:
        return _model_detail(request, model, form=form, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"Model '{model.name}' saved.")
    return redirect("ui:model", name=model.name)


@login_required
@require_POST
def model_batching(request: HttpRequest, name: str) -> HttpResponse:
    """POST: whether the model's concurrent requests are merged (auto, on, off) and its max_batch_size (maintainers)."""
    model = get_object_or_404(RegisteredModel, name=name)
    form = ModelBatchingForm(request.POST)
    try:
        require_role(request, Role.MAINTAINER, what="changing a model's batching")
        if not form.is_valid():
            raise form_refusal(form)
        changes = {"batching": form.cleaned_data["batching"]}
        if form.cleaned_data["max_batch_size"] is not None:
            changes["max_batch_size"] = form.cleaned_data["max_batch_size"]
        services.model_update(model=model, actor=actor_from_request(request), **changes)
    except RegistryError as exc:
        return _model_detail(request, model, batching_form=form, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"Batching of '{model.name}' saved; inference processes take it on their next pass.")
    return redirect("ui:model", name=model.name)


@login_required
@require_POST
def alias_rollback(request: HttpRequest, name: str, alias: str) -> HttpResponse:
    model = get_object_or_404(RegisteredModel, name=name)
    form = ReasonForm(request.POST)
    if not form.is_valid():
        return _model_detail(request, model, error=form.error_text(), status=400)
    try:
        move = promotions.alias_rollback(
            model=model, alias_name=alias, actor=actor_from_request(request), reason=form.cleaned_data["reason"]
        )
    except RegistryError as exc:
        return _model_detail(request, model, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"'{alias}' rolled back to version {move.to_version.version}.")
    return redirect("ui:model", name=model.name)


@login_required
@require_POST
def alias_signature(request: HttpRequest, name: str, alias: str) -> HttpResponse:
    """POST: whether the alias requires an uploader's signature, and by which trusted signers (admins)."""
    model = get_object_or_404(RegisteredModel, name=name)
    get_object_or_404(Alias, model=model, name=alias)  # the page sets existing aliases; the API may create one
    form = AliasSignatureForm(request.POST)
    try:
        if not form.is_valid():
            raise form_refusal(form)
        signers = form.cleaned_data["trusted_signers"]
        changed = promotions.alias_set_provenance(
            model=model,
            alias_name=alias,
            actor=actor_from_request(request),
            # Naming signers is requiring a signature, ticked or not.
            require_signature=form.cleaned_data["require_signature"] or bool(signers),
            trusted_signers=signers,
        )
    except RegistryError as exc:
        return _model_detail(request, model, error=exc.message, status=refusal(request, exc))
    if not changed.require_signature:
        messages.success(request, f"'{alias}' no longer requires a signature.")
    else:
        by = ", ".join(changed.trusted_signers) if changed.trusted_signers else "any trusted signer"
        messages.success(request, f"'{alias}' now requires a signature by {by}.")
    return redirect("ui:model", name=model.name)


@login_required
@require_POST
def alias_cache(request: HttpRequest, name: str, alias: str) -> HttpResponse:
    """POST: the alias's response cache, its bytes and TTL, or off with both empty (admins)."""
    model = get_object_or_404(RegisteredModel, name=name)
    get_object_or_404(Alias, model=model, name=alias)
    form = AliasCacheForm(request.POST)
    try:
        if not form.is_valid():
            raise form_refusal(form)
        changed = promotions.alias_set_cache(
            model=model,
            alias_name=alias,
            actor=actor_from_request(request),
            max_bytes=form.cleaned_data["max_bytes"],
            ttl_seconds=form.cleaned_data["ttl_seconds"],
        )
    except RegistryError as exc:
        return _model_detail(request, model, error=exc.message, status=refusal(request, exc))
    if changed.cache is None:
        messages.success(request, f"'{alias}' caches no responses.")
    else:
        messages.success(
            request,
            f"'{alias}' caches responses: up to {changed.cache_max_bytes} bytes per process, "
            f"each for {changed.cache_ttl_seconds} s.",
        )
    return redirect("ui:model", name=model.name)


# --- Shadow traffic -----------------------------------------------------------------------------------

NOT_CLASS_SCORES = "n/a"


def _number(value: Any, spec: str = ".9g", suffix: str = "") -> str | None:
    """A measured number as the page shows it; None when nothing was measured (the page says so)."""
    if value is None:
        return None
    try:
        return f"{float(value):{spec}}{suffix}"
    except (TypeError, ValueError):
        return str(value)


def _percent(value: Any) -> str | None:
    return _number(value * 100 if isinstance(value, int | float) else value, ".3g", "%")


def _when(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _shadow_side(label: str, side: Mapping[str, Any] | None) -> dict[str, Any]:
    side = side or {}
    errors = side.get("errors") or 0
    return {
        "label": label,
        "answered": side.get("answered") or 0,
        "errors": errors,
        "error_rate": _percent(side.get("error_rate")),
        "p50_ms": _number(side.get("p50_ms"), "g", " ms"),
        "p99_ms": _number(side.get("p99_ms"), "g", " ms"),
        "last_error": side.get("last_error") or "",
    }


def _shadow_output(name: str, output: Mapping[str, Any] | None) -> dict[str, Any]:
    output = output or {}
    rows = output.get("rows") or 0
    top1 = _percent(output.get("top1_agreement"))
    if top1 is None and rows:
        top1 = NOT_CLASS_SCORES  # compared, but not class scores (2-D, more than one column)
    return {
        "name": name,
        "rows": rows,
        # The columns after Rows, in the table's order; None: not measured yet.
        "cells": [
            _number(output.get("cosine_p1")),
            _number(output.get("cosine_p50")),
            _number(output.get("cosine_min")),
            _number(output.get("max_abs_diff"), ".6g"),
            _number(output.get("mean_abs_diff"), ".6g"),
            top1,
            _number(output.get("psi"), ".4g"),
        ],
        "mismatched": output.get("mismatched") or 0,
        "mismatch": output.get("mismatch") or "",
    }


def shadow_display(data: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A shadow as ``ShadowState.as_json()`` (or a promotion's ``shadow_report``) gives it, ready for a page.

    Stored reports are read as they are: any value may be missing or null (nothing measured yet).
    """
    if not data:
        return None
    report = data.get("report") or {}
    outputs = [_shadow_output(str(name), output) for name, output in sorted((report.get("outputs") or {}).items())]
    lowest = [
        float(o["cosine_p1"]) for o in (report.get("outputs") or {}).values() if (o or {}).get("cosine_p1") is not None
    ]
    serving, version = data.get("serving"), data.get("version")
    dropped_by_reason = report.get("dropped_by_reason") or {}
    return {
        "id": data.get("id"),
        "alias": data.get("alias") or "",
        "version": version,
        "serving": serving,
        "sample": _number(data.get("sample"), "g"),
        "sample_percent": _percent(data.get("sample")),
        "running": bool(data.get("running")),
        "started_by": data.get("started_by") or "",
        "started_at": _when(data.get("started_at")),
        "ended_at": _when(data.get("ended_at")),
        "ended_by": data.get("ended_by") or "",
        "end_reason": data.get("end_reason") or "",
        "workers": data.get("workers") or 0,
        "as_of": _when(data.get("as_of")),
        "requests": report.get("requests") or 0,
        "compared": report.get("compared") or 0,
        "dropped": report.get("dropped") or 0,
        "dropped_by_reason": ", ".join(f"{reason} {count}" for reason, count in sorted(dropped_by_reason.items())),
        "sides": [
            _shadow_side(f"v{serving} (serving)" if serving is not None else "serving", report.get("primary")),
            _shadow_side(f"v{version} (candidate)" if version is not None else "candidate", report.get("candidate")),
        ],
        "outputs": outputs,
        "worst_cosine_p1": _number(min(lowest)) if lowest else None,
    }


def _alias_shadow(model: RegisteredModel, alias: Alias) -> dict[str, Any] | None:
    """The alias's running shadow, else its last one, ready for the model page; None if it was never shadowed."""
    try:
        state = shadows.shadow_current(model, alias.name)
    except NotFound:
        return None
    return shadow_display(state.as_json())


def _may_shadow(request: HttpRequest) -> None:
    """Refuse a viewer before reading the form (the service checks the role again)."""
    if not has_role(request.user, Role.MAINTAINER):
        raise PermissionDenied(shadows.NEEDS_ROLE)


@login_required
@require_POST
def alias_shadow_start(request: HttpRequest, name: str, alias: str) -> HttpResponse:
    """POST: mirror a share of the alias's requests to a candidate version (maintainers); ends a running shadow."""
    model = get_object_or_404(RegisteredModel, name=name)
    form = ShadowStartForm(request.POST)
    try:
        _may_shadow(request)
        if not form.is_valid():
            raise form_refusal(form)
        shadow = shadows.shadow_start(
            model=model,
            alias_name=alias,
            version_number=form.cleaned_data["version"],
            sample=form.cleaned_data["sample"],
            actor=actor_from_request(request),
        )
    except RegistryError as exc:
        return _model_detail(request, model, error=exc.message, status=refusal(request, exc))
    messages.success(
        request,
        f"v{shadow.version.version} now shadows '{alias}' on {shadow.sample * 100:g}% of its requests; "
        "inference processes start mirroring on their next pass.",
    )
    return redirect(f"{reverse('ui:model', args=[model.name])}#shadow-{alias}")


@login_required
@require_POST
def alias_shadow_stop(request: HttpRequest, name: str, alias: str) -> HttpResponse:
    """POST: end the alias's running shadow (maintainers); its report stays on the page."""
    model = get_object_or_404(RegisteredModel, name=name)
    form = ReasonForm(request.POST)
    try:
        _may_shadow(request)
        if not form.is_valid():
            raise form_refusal(form)
        shadow = shadows.shadow_stop(
            model=model, alias_name=alias, actor=actor_from_request(request), reason=form.cleaned_data["reason"]
        )
    except RegistryError as exc:
        return _model_detail(request, model, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"The shadow of v{shadow.version.version} on '{alias}' stopped.")
    return redirect(f"{reverse('ui:model', args=[model.name])}#shadow-{alias}")


# --- Stepped rollouts --------------------------------------------------------------------------------

# The badge each state wears (the colours ui.css has).
ROLLOUT_BADGES = {
    RolloutState.PENDING: "pending",
    RolloutState.RUNNING: "ok",
    RolloutState.PAUSED: "warn",
    RolloutState.COMPLETED: "approved",
    RolloutState.ROLLED_BACK: "bad",
    RolloutState.ABORTED: "neutral",
    RolloutState.REJECTED: "rejected",
}


def _duration(seconds: Any) -> str:
    """Seconds as a person reads them: "42 s", "5 min", "4 min 2 s", "2 h 5 min"."""
    total = int(seconds) if isinstance(seconds, int | float) else 0
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    if minutes:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    return f"{secs} s"


def _rollout_side(label: str, side: Mapping[str, Any] | None) -> dict[str, Any]:
    side = side or {}
    return {
        "label": label,
        "requests": side.get("requests") or 0,
        "errors": side.get("errors") or 0,
        "error_rate": _percent(side.get("error_rate")),
        "p99_ms": _number(side.get("p99_ms"), "g", " ms"),
    }


def rollout_display(rollout: AliasRollout) -> dict[str, Any]:
    """A rollout as ``rollout_json`` gives it, ready for a page; its last check's figures may be missing."""
    data = rollouts.rollout_json(rollout)
    steps = [int(step) for step in data["steps"]]
    step = min(int(data["step"]), len(steps) - 1) if steps else 0
    check = data.get("last_check") or {}
    version, base = data["version"], data["base_version"]
    return {
        "id": data["id"],
        "alias": data["alias"],
        "version": version,
        "base_version": base,
        "state": data["state"],
        "badge": ROLLOUT_BADGES.get(data["state"], "neutral"),
        "live": data["state"] in ROLLOUT_LIVE,
        "pending": data["state"] == RolloutState.PENDING,
        "running": data["state"] == RolloutState.RUNNING,
        "paused": data["state"] == RolloutState.PAUSED,
        "steps": steps,
        "steps_text": ", ".join(f"{s}%" for s in steps),
        "step_number": step + 1,
        "step_count": len(steps),
        "step_percent": steps[step] if steps else 0,
        "percent": data["percent"],
        "step_seconds": data["step_seconds"],
        "step_duration": _duration(data["step_seconds"]),
        "step_elapsed": _duration(data["step_elapsed"]),
        "max_error_rate": _percent(data["max_error_rate"]),
        "max_p99_ratio": _number(data["max_p99_ratio"], "g", "x"),
        "min_requests": data["min_requests"],
        "promotion": data["promotion"],
        "started_by": data["started_by"],
        "created_at": _when(data["created_at"]),
        "ended_at": _when(data["ended_at"]),
        "end_reason": data["end_reason"],
        "check": {
            "checked_at": _when(check.get("checked_at")),
            "step_number": int(check.get("step") or 0) + 1,
            "elapsed": _duration(check.get("elapsed")),
            "sides": [
                _rollout_side(f"v{version} (candidate)", check.get("candidate")),
                _rollout_side(f"v{base} (current)", check.get("current")),
            ],
            "waiting": check.get("waiting") or "",
        }
        if check
        else None,
    }


def _alias_rollout(model: RegisteredModel, alias: Alias) -> dict[str, Any] | None:
    """The alias's live rollout, else its last one, ready for the model page; None if it never had one."""
    try:
        return rollout_display(rollouts.rollout_current(model, alias.name))
    except NotFound:
        return None


def _may_roll_out(request: HttpRequest) -> None:
    """Refuse a viewer before reading the form (the service checks the role again)."""
    if not has_role(request.user, Role.MAINTAINER):
        raise PermissionDenied(rollouts.NEEDS_ROLE)


def _rollout_anchor(model: RegisteredModel, alias: str) -> str:
    return f"{reverse('ui:model', args=[model.name])}#rollout-{alias}"


@login_required
@require_POST
def alias_rollout_start(request: HttpRequest, name: str, alias: str) -> HttpResponse:
    """POST: start a stepped rollout of a candidate on the alias (maintainers); a protected alias asks for approval.

    An empty optional box stands for the service's default.
    """
    model = get_object_or_404(RegisteredModel, name=name)
    form = RolloutStartForm(request.POST)
    try:
        _may_roll_out(request)
        if not form.is_valid():
            raise form_refusal(form)
        data = form.cleaned_data
        rollout = rollouts.rollout_start(
            model=model,
            alias_name=alias,
            version_number=data["version"],
            actor=actor_from_request(request),
            steps=data["steps"],
            step_seconds=data["step_seconds"],
            max_error_rate=data["max_error_rate"],
            max_p99_ratio=data["max_p99_ratio"],
            min_requests=data["min_requests"],
            reason=data["reason"],
        )
    except RegistryError as exc:
        return _model_detail(request, model, error=exc.message, status=refusal(request, exc))
    number = rollout.version.version
    if rollout.promotion is not None:
        messages.success(
            request,
            format_html(
                '<a href="{}">Promotion request {}</a> opened: the stepped rollout of v{} on {} waits for another '
                "approver to approve it, and starts then.",
                reverse("ui:promotion", args=[rollout.promotion.pk]),
                rollout.promotion.pk,
                number,
                f"'{alias}'",
            ),
        )
    else:
        messages.success(
            request,
            f"The rollout of v{number} on '{alias}' started: step 1 of {len(rollout.steps)}, {rollout.percent}% of "
            "its requests; inference processes start splitting on their next pass.",
        )
    return redirect(_rollout_anchor(model, alias))


def _rollout_change(
    request: HttpRequest,
    name: str,
    alias: str,
    change: Callable[..., AliasRollout],
    done: Callable[[AliasRollout], str],
) -> HttpResponse:
    """Pause, resume or abort the alias's rollout (maintainers) with the reason given; ``done`` words the outcome."""
    model = get_object_or_404(RegisteredModel, name=name)
    form = ReasonForm(request.POST)
    try:
        _may_roll_out(request)
        if not form.is_valid():
            raise form_refusal(form)
        rollout = change(
            model=model, alias_name=alias, actor=actor_from_request(request), reason=form.cleaned_data["reason"]
        )
    except RegistryError as exc:
        return _model_detail(request, model, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"The rollout of v{rollout.version.version} on '{alias}' {done(rollout)}")
    return redirect(_rollout_anchor(model, alias))


def _paused(rollout: AliasRollout) -> str:
    return (
        f"is paused at {rollout.percent}% of its requests (step {rollout.step + 1} of {len(rollout.steps)}); "
        "the step's clock stopped."
    )


def _resumed(rollout: AliasRollout) -> str:
    return f"runs on: step {rollout.step + 1} of {len(rollout.steps)}, {rollout.percent}% of its requests."


def _aborted(rollout: AliasRollout) -> str:
    if rollout.promotion_id is not None and rollout.step_started_at is None:
        return f"was aborted before it started; its promotion request {rollout.promotion_id} was cancelled."
    return f"was aborted: every request goes to v{rollout.base_version.version} again."


@login_required
@require_POST
def alias_rollout_pause(request: HttpRequest, name: str, alias: str) -> HttpResponse:
    """POST: hold the candidate's share; the step's clock stops until resumed (maintainers)."""
    return _rollout_change(request, name, alias, rollouts.rollout_pause, _paused)


@login_required
@require_POST
def alias_rollout_resume(request: HttpRequest, name: str, alias: str) -> HttpResponse:
    """POST: the paused step runs on from where it was (maintainers)."""
    return _rollout_change(request, name, alias, rollouts.rollout_resume, _resumed)


@login_required
@require_POST
def alias_rollout_abort(request: HttpRequest, name: str, alias: str) -> HttpResponse:
    """POST: end the rollout, every request back to the current version; a pending one's request is cancelled."""
    return _rollout_change(request, name, alias, rollouts.rollout_abort, _aborted)


# --- Versions -----------------------------------------------------------------------------------------


def version_or_404(model: RegisteredModel, number: int) -> ModelVersion:
    version = selectors.version_get(model=model, number=number)
    if version is None:
        raise Http404(f"model '{model.name}' has no version {number}")
    return version


_FAILED_UPLOAD = "Version {} uploaded, validation failed."


def _upload_tag(version: ModelVersion) -> str:
    return f"upload-{version.pk}"


def _settle_upload_banner(request: HttpRequest, version: ModelVersion) -> None:
    """The upload's banner, written when the upload was answered, says so if validation has failed since.

    Without a broker validation ends before the answer; with one it runs after it, and may end before the
    version's page is shown.
    """
    if version.status != VersionStatus.FAILED:
        return
    for message in messages.get_messages(request):
        if message.extra_tags == _upload_tag(version):
            message.level, message.message = messages.ERROR, _FAILED_UPLOAD.format(version.version)


def version_page_context(
    request: HttpRequest,
    model: RegisteredModel,
    version: ModelVersion,
    *,
    form: VersionEditForm | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    fleet = selectors.version_fleet_state(model=model.name, version=version.version)
    context = {
        "model": model,
        "version": version,
        "files": list(version.files.all()),
        "aliases": [alias for alias in selectors.alias_list(model=model) if alias.version_id == version.pk],
        # Why a host serves on the CPU is said once per host above the table, not on each of its rows.
        "fleet": [(worker, row, _without_notice(row.note, worker.notice) if row else "") for worker, row in fleet],
        # A tombstone's bundles are gone (or going) from the store with its files: nothing to check.
        "provenance": provenance.version_provenance(version) if version.deleted_at is None else {},
        "fleet_checks": [(worker, _bytes_check(row)) for worker, row in fleet],
        "fleet_notices": sorted({(worker.host, worker.notice) for worker, _ in fleet if worker.notice}),
        "others": [v.version for v in selectors.version_list(model=model) if v.pk != version.pk],
        "metadata": json.dumps(version.metadata, indent=2, sort_keys=True) if version.metadata else "",
        "settled": version.status in (VersionStatus.READY, VersionStatus.FAILED),
        "version_benchmarks": [(version, list(selectors.benchmark_list(version=version)))],
        "derive_jobs": list(selectors.derive_job_list(source=version)[:10]),
        # Built by a derive job from this one (a child its uploader named is in the lineage box instead).
        "derived": [
            v.version for v in selectors.version_list(model=model) if v.derived_from_id == version.pk and v.recipe
        ],
        "lineage": lineage_display(model, version),
        "form": form or VersionEditForm(initial={"description": version.description, "tags": " ".join(version.tags)}),
        "error": error,
        "batching": version.batching_decision(model),
        # Why its Archive button is missing (an alias, rollout, shadow or request still uses it).
        "archive_refusals": lifecycle.archive_refusals(version) if version.lifecycle == "active" else [],
    }
    return render(request, "modelyard/ui/version.html", context, status=status)


# What an inference process's load error starts with when the bytes it fetched did not verify.
REFUSED_LOADS = ("VerificationFailed: ", "HashMismatch: ")


def _bytes_check(row: serving.LoadedRow | None) -> str:
    """What one inference process found of the version's bytes: verified (it loads only what verifies), refused
    with the reason, or "" when it has not checked them."""
    if row is None:
        return ""
    if row.state in (serving.LoadState.READY, serving.LoadState.DRAINING):
        return "verified"
    for prefix in REFUSED_LOADS:
        if row.state == serving.LoadState.FAILED and row.error.startswith(prefix):
            return f"refused: {row.error[len(prefix) :]}"
    return ""


@login_required
def version_detail(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """GET: the version's signature, files, derivation, benchmarks; POST: edit description and tags (maintainers)."""
    model = get_object_or_404(RegisteredModel, name=name)
    version = version_or_404(model, number)
    if request.method != "POST":
        _settle_upload_banner(request, version)
        return version_page_context(request, model, version)
    form = VersionEditForm(request.POST)
    try:
        require_role(request, Role.MAINTAINER, what="editing a version")
        if not form.is_valid():
            raise form_refusal(form)
        services.version_update(
            version=version,
            description=form.cleaned_data["description"],
            tags=form.cleaned_data["tags"],
            actor=actor_from_request(request),
        )
    except RegistryError as exc:
        return version_page_context(request, model, version, form=form, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"Version {version.version} saved.")
    return redirect("ui:version", name=model.name, number=version.version)


class _WithoutBody:
    """The request as the CSRF check sees it before the body is read: the token must come in ``X-CSRFToken``."""

    def __init__(self, request: HttpRequest) -> None:
        self._request = request
        self.POST = QueryDict()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


def _csrf_refusal(request: HttpRequest) -> HttpResponse | None:
    """Django's own CSRF check, made without reading the body, so that the body can stream to storage.

    The middleware's check reads ``request.POST``, which would parse the whole upload (to temporary
    files) before the view runs; the upload page's script sends the token as a header instead.
    """
    check = CsrfViewMiddleware(lambda _request: HttpResponse())
    return check.process_view(_WithoutBody(request), None, (), {})  # type: ignore[arg-type]


def _content_length(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0  # the parser finds out what the body really holds, under the same limits


def _upload_page(request: HttpRequest, model: RegisteredModel) -> HttpResponse:
    return render(request, "modelyard/ui/upload.html", {"model": model, "max_bytes": settings.MAX_UPLOAD_BYTES})


@csrf_exempt  # checked by _csrf_refusal, before the body is read
@login_required
def version_upload_page(request: HttpRequest, name: str) -> HttpResponse:
    """GET: the drop zone. POST (from its script): the multipart upload, streamed to ``version_upload``.

    The POST answers as the API does, in JSON: 201 with the new version's page, or the error with
    its status, which the page shows in place.
    """
    model = get_object_or_404(RegisteredModel, name=name)
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    if request.method != "POST":
        return _upload_page(request, model)
    refused = _csrf_refusal(request)
    if refused is not None:
        return refused
    try:
        require_role(request, Role.MAINTAINER, what="uploading a version")
        if not (request.content_type or "").startswith("multipart/form-data"):
            raise InvalidInput("send the files as multipart/form-data with one 'file' part per file")
        if _content_length(request) > settings.MAX_UPLOAD_BYTES:
            raise PayloadTooLarge(f"the upload is larger than the limit of {settings.MAX_UPLOAD_BYTES} bytes")
        with MultipartUpload(request) as body:
            version = version_upload(model=model, source=body, actor=actor_from_request(request))
    except RegistryError as exc:
        return JsonResponse(error_body(exc.message, exc.detail), status=refusal(request, exc))
    except RequestAborted:
        raise  # the client is gone: nobody reads an answer
    except Exception as exc:
        # Limits hit while the body arrived (size, an idle client, too many parts), worded as the API words them.
        answer = body_refusal(exc)
        if answer is None:
            raise
        return JsonResponse(answer.data, status=answer.status_code)
    version.refresh_from_db()  # in-process validation may already have finished
    url = reverse("ui:version", kwargs={"name": model.name, "number": version.version})
    if version.status == VersionStatus.FAILED:
        messages.error(request, _FAILED_UPLOAD.format(version.version), extra_tags=_upload_tag(version))
    else:
        messages.success(request, f"Version {version.version} uploaded.", extra_tags=_upload_tag(version))
    return JsonResponse({"version": version.version, "status": version.status, "url": url}, status=201)


# --- Compare ------------------------------------------------------------------------------------------


def _metadata_diff(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key), new.get(key)
        rows.append(
            {
                "key": key,
                "before": json.dumps(before) if key in old else None,
                "after": json.dumps(after) if key in new else None,
                "changed": key not in old or key not in new or before != after,
            }
        )
    return rows


def comparison(old: ModelVersion, new: ModelVersion, alias: Alias | None = None) -> dict[str, Any]:
    """What a reviewer reads when ``new`` replaces ``old``: speed and accuracy measured, signature, metadata, files.

    With the alias the move is for, its policy (``registry.promotions``) is checked too, as the service will.
    """
    changes = signature_compare(old.signature, new.signature)
    measured = compare(new, old, alias.name if alias is not None else "")
    # The alias's settings are its policy only while it has none written (then its rules say, rule by rule).
    policy = promotions.alias_policy(alias) if alias is not None and policy_in_force(alias).builtin else {}
    derived = new if new.derived_from_id == old.pk else (old if old.derived_from_id == new.pk else None)
    return {
        "measured": measured,
        "benchmarks": [(v, list(selectors.benchmark_list(version=v))) for v in (old, new)],
        "derived": derived,
        "policy": {name: value for name, value in policy.items() if value is not None},
        "policy_violations": policy_violations(measured, policy) if policy else [],
        "old": old,
        "new": new,
        "signature": changes,
        "breaking": [problem for change in changes for problem in change.breaking],
        "metadata": _metadata_diff(old.metadata or {}, new.metadata or {}),
        "files": file_changes(list(old.files.all()), list(new.files.all())),
        "size_change": new.size_bytes - old.size_bytes,
    }


@login_required
def version_compare(request: HttpRequest, name: str) -> HttpResponse:
    model = get_object_or_404(RegisteredModel, name=name)
    numbers = [v.version for v in selectors.version_list(model=model)]
    context: dict[str, Any] = {"model": model, "numbers": numbers}
    try:
        a, b = _int_param(request, "a"), _int_param(request, "b")
    except InvalidInput as exc:
        return render(request, "modelyard/ui/compare.html", {**context, "error": exc.message}, status=400)
    context |= {"a": a, "b": b}
    if a is not None and b is not None:
        context["diff"] = comparison(version_or_404(model, a), version_or_404(model, b))
    return render(request, "modelyard/ui/compare.html", context)


# --- Promotion requests -------------------------------------------------------------------------------

# How a rule's result reads on a page, in words (never only a colour): the text and the badge's class.
_RULE_MARKS = {
    "passed": ("passed", "ok"),
    "failed": ("failed", "bad"),
    "waiting": ("waiting for approval", "warn"),
}


def policy_display(data: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A policy's results, as ``PolicyCheck.as_json()`` (or a request's ``policy_results``) gives them, for a page.

    None: not checked (a request made before promotion policies existed has no results).
    """
    if not data:
        return None
    rules = []
    for rule in data.get("rules") or []:
        result = "passed" if rule.get("passed") else "waiting" if rule.get("waiting") else "failed"
        mark, badge = _RULE_MARKS[result]
        rules.append(
            {
                "name": str(rule.get("name") or ""),
                "why": str(rule.get("why") or ""),
                "result": result,
                "mark": mark,
                "badge": badge,
            }
        )
    return {
        "number": data.get("policy"),
        "builtin": bool(data.get("builtin")),
        "rules": rules,
        "failing": [r["name"] for r in rules if r["result"] == "failed"],
        "waiting": [r["name"] for r in rules if r["result"] == "waiting"],
    }


def _rule_rows(
    rules: Sequence[Mapping[str, Any]], other: Sequence[Mapping[str, Any]], gone: str
) -> list[dict[str, Any]]:
    """Rules with how each differs from ``other`` (by name): ``same``, ``changed``, or ``gone`` if it has none."""
    by_name = {str(r.get("name")): r for r in other}
    rows = []
    for rule in rules:
        name = str(rule.get("name") or "")
        expr, message = str(rule.get("expr") or ""), str(rule.get("message") or "")
        match = by_name.get(name)
        if match is None:
            change = gone
        elif (str(match.get("expr") or ""), str(match.get("message") or "")) == (expr, message):
            change = "same"
        else:
            change = "changed"
        rows.append({"name": name, "expr": expr, "message": message, "change": change})
    return rows


def policy_change_display(promotion: PromotionRequest) -> dict[str, Any]:
    """What a ``policy`` request proposes, beside the alias's policy in force now, rule by rule."""
    record: AliasPolicy | None = promotion.policies.first()
    in_force = policy_in_force(promotion.alias)
    current = [{"name": r.name, "expr": r.expr, "message": r.message} for r in in_force.rules]
    proposed = list(record.rules) if record is not None else []
    return {
        "number": record.number if record is not None else None,
        "state": record.state if record is not None else None,
        "rules": _rule_rows(proposed, current, "added"),
        "current": {
            "number": in_force.number,
            "builtin": in_force.builtin,
            # The proposed policy itself, once approved: nothing to compare it with any more.
            "is_proposed": record is not None and in_force.record is not None and in_force.record.pk == record.pk,
            "rules": _rule_rows(current, proposed, "removed"),
        },
    }


def _promote_page(
    request: HttpRequest, model: RegisteredModel, form: PromotionRequestForm, *, error: str = "", status: int = 200
) -> HttpResponse:
    """The request form, with what the request would change: the diff against the version behind the alias now."""
    # Archived and deleted versions cannot be promoted: they are not offered.
    ready = [v for v in selectors.version_list(model=model, lifecycle="active") if v.status == VersionStatus.READY]
    data = form.data if form.is_bound else form.initial
    alias_name = str(data.get("alias") or PRODUCTION)
    alias = next((a for a in selectors.alias_list(model=model) if a.name == alias_name), None)
    try:
        number = int(data.get("version") or 0)
    except (TypeError, ValueError):
        number = 0
    candidate = next((v for v in ready if v.version == number), None)
    current = alias.version if alias is not None else None
    diff = comparison(current, candidate, alias) if current is not None and candidate is not None else None
    # What the alias's policy says of the candidate now, rule by rule, as the request will record it. A new
    # alias has the built-in policy of an alias with default settings (it is made so when the request is).
    check: PolicyCheck | None = None
    if candidate is not None and current != candidate:
        check = policy_check(alias or Alias(model=model, name=alias_name), candidate, requester=request.user)
    if check is not None and not check.policy.builtin:
        # A written policy replaces the alias's settings and the signature check: its failing rules need force.
        needs_force = bool(check.failing)
    else:
        needs_force = diff is not None and bool(diff["breaking"] or diff["policy_violations"])
    note = f"what it says of v{candidate.version} now" if candidate is not None else ""
    if alias is not None and alias.protected:
        note += "; the request records it, and it is checked again at approval"
    context = {
        "model": model,
        "form": form,
        "ready": ready,
        "aliases": selectors.alias_list(model=model),
        "alias_name": alias_name,
        "alias": alias,
        "current": current,
        "candidate": candidate,
        "diff": diff,
        "policy": policy_display(check.as_json()) if check is not None else None,
        "policy_note": note,
        "needs_force": needs_force,
        "needs_approval": alias is not None and alias.protected,
        "signature_problem": provenance.signature_problem(alias, candidate) if alias and candidate else None,
        "waiting": selectors.promotion_list(state=PromotionState.PENDING, model_name=model.name).filter(
            alias__name=alias_name
        ),
        "error": error,
    }
    return render(request, "modelyard/ui/promote.html", context, status=status)


@login_required
def promotion_request(request: HttpRequest, name: str) -> HttpResponse:
    """GET: choose an alias and a ready version and see the diff; POST: set the alias or open a request."""
    model = get_object_or_404(RegisteredModel, name=name)
    if request.method != "POST":
        active = selectors.version_list(model=model, lifecycle="active")
        latest = next((v.version for v in active if v.status == VersionStatus.READY), "")
        initial = {"alias": request.GET.get("alias") or PRODUCTION, "version": request.GET.get("version") or latest}
        return _promote_page(request, model, PromotionRequestForm(initial=initial))
    form = PromotionRequestForm(request.POST)
    try:
        require_role(request, Role.MAINTAINER, what="requesting a promotion")
        if not form.is_valid():
            raise form_refusal(form)
        outcome = promotions.alias_set(
            model=model,
            alias_name=form.cleaned_data["alias"],
            version_number=form.cleaned_data["version"],
            reason=form.cleaned_data["reason"],
            force=form.cleaned_data["force"],
            actor=actor_from_request(request),
        )
    except RegistryError as exc:
        return _promote_page(request, model, form, error=_form_wording(exc), status=refusal(request, exc))
    alias, number = form.cleaned_data["alias"], form.cleaned_data["version"]
    if outcome.promotion is not None:
        messages.success(
            request,
            f"Promotion request {outcome.promotion.pk} opened: '{alias}' moves to version {number} once another "
            "approver approves it.",
        )
        return redirect("ui:promotion", promotion_id=outcome.promotion.pk)
    if outcome.move is None:
        messages.success(request, f"'{alias}' already points to version {number}.")
    else:
        messages.success(request, f"'{alias}' now points to version {number}.")
    return redirect("ui:model", name=model.name)


def _promotion_index(request: HttpRequest, *, error: str = "", status: int = 200) -> HttpResponse:
    context = {
        "pending": selectors.promotion_list(state=PromotionState.PENDING),
        "decided": selectors.promotion_list().exclude(state=PromotionState.PENDING)[:DECIDED_SHOWN],
        "error": error,
    }
    return render(request, "modelyard/ui/promotions.html", context, status=status)


@login_required
def promotion_index(request: HttpRequest) -> HttpResponse:
    return _promotion_index(request)


def _why_not(request: HttpRequest, promotion: PromotionRequest) -> str:
    """Why this viewer cannot decide the request, or "" if they can (the service checks it again)."""
    if promotion.state != PromotionState.PENDING:
        return f"This request is {promotion.state}."
    if promotion.expires_at <= timezone.now():
        return "This request has expired."
    if promotion.requested_by_id == request.user.pk:
        return "You requested this promotion; another approver must approve it. You can cancel it."
    if not has_role(request.user, Role.APPROVER):
        return "Approving and rejecting need the approver role."
    conflict = promotions.reviewer_conflict(promotion, request.user)
    if conflict:
        return f"You cannot be the second person here: {conflict}. Another approver must decide it."
    return ""


def _promotion_review(
    request: HttpRequest, promotion: PromotionRequest, *, error: str = "", status: int = 200
) -> HttpResponse:
    diff = None
    # A stepped rollout's last step moves the alias too: its candidate is reviewed as a move's is.
    moves = promotion.kind in (PromotionKind.MOVE, PromotionKind.ROLLOUT)
    if moves and promotion.version is not None and promotion.base_version is not None:
        diff = comparison(promotion.base_version, promotion.version, promotion.alias)
    since = promotions.review_window_start(promotion)
    grants = access_selectors.privileged_grant_list(since=since)
    candidate = promotion.version if moves else None
    rollout = None
    if promotion.kind == PromotionKind.ROLLOUT:
        rollout = promotion.rollouts.select_related("alias__model", "version", "base_version", "started_by").first()
    context = {
        "promotion": promotion,
        "diff": diff,
        # The policy's results on the candidate, rule by rule, as recorded when it was requested and approved
        # (None: not checked then); a policy change shows instead the rules it proposes beside those in force.
        "policy_at_request": policy_display(promotion.policy_results) if moves else None,
        "policy_at_approval": policy_display(promotion.policy_results_at_approval) if moves else None,
        "policy_change": policy_change_display(promotion) if promotion.kind == PromotionKind.POLICY else None,
        "policy_request_note": "as checked when the request was made"
        + ("; the requester forced it, with the reason above" if promotion.force else ""),
        "policy_approval_note": "as checked again when it was approved, with the approval",
        # The rollout the request would start, with its steps and limits (None: not a rollout's request).
        "rollout": rollout_display(rollout) if rollout is not None else None,
        "provenance": provenance.version_provenance(candidate) if candidate is not None else None,
        "signature_problem": provenance.signature_problem(promotion.alias, candidate)
        if candidate is not None
        else None,
        # The candidate's live comparison on the alias when the request was made (None: never shadowed there).
        "shadow": shadow_display(promotion.shadow_report) if promotion.kind == PromotionKind.MOVE else None,
        "why_not": _why_not(request, promotion),
        "own": promotion.requested_by_id == request.user.pk,
        "grants": grants[: access_selectors.PRIVILEGED_GRANTS_SHOWN],
        "grants_more": max(0, grants.count() - access_selectors.PRIVILEGED_GRANTS_SHOWN),
        "grants_since": since,
        "error": error,
    }
    return render(request, "modelyard/ui/promotion.html", context, status=status)


def _promotion_or_404(promotion_id: int) -> PromotionRequest:
    return get_object_or_404(
        selectors.promotion_list().prefetch_related("version__files", "base_version__files"), pk=promotion_id
    )


@login_required
def promotion_detail(request: HttpRequest, promotion_id: int) -> HttpResponse:
    return _promotion_review(request, _promotion_or_404(promotion_id))


_DECISIONS: dict[str, Callable[..., PromotionRequest]] = {
    "approve": promotions.promotion_approve,
    "reject": promotions.promotion_reject,
    "cancel": promotions.promotion_cancel,
}


@login_required
@require_POST
def promotion_decide(request: HttpRequest, promotion_id: int, decision: str) -> HttpResponse:
    service = _DECISIONS.get(decision)
    if service is None:
        raise Http404(f"unknown decision '{decision}'")
    promotion = _promotion_or_404(promotion_id)
    form = ReasonForm(request.POST)
    if not form.is_valid():
        return _promotion_review(request, promotion, error=form.error_text(), status=400)
    try:
        decided = service(
            promotion_id=promotion_id, actor=actor_from_request(request), reason=form.cleaned_data["reason"]
        )
    except RegistryError as exc:
        return _promotion_review(request, promotion, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"Promotion request {decided.pk} {decided.state}.")
    return redirect("ui:promotions")


# --- Audit --------------------------------------------------------------------------------------------

AUDIT_FILTERS = ("actor", "action", "model")


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@login_required
def audit_index(request: HttpRequest) -> HttpResponse:
    if not has_role(request.user, Role.AUDITOR):
        reason = "reading the audit log needs the auditor or admin role"
        audit_access_denied(request=request, reason=reason)
        return error_page(request, 403, reason[0].upper() + reason[1:] + ".")
    filters = {key: request.GET.get(key, "").strip() for key in AUDIT_FILTERS}
    times = {key: request.GET.get(key, "").strip() for key in ("since", "until")}
    zone = request.GET.get("tz", "")
    bounds: dict[str, datetime | None] = {"since": None, "until": None}
    try:
        for key, text in times.items():
            bounds[key] = local_time(text, zone) if text else None
        before = _int_param(request, "before")
    except (ValueError, InvalidInput) as exc:
        message = exc.message if isinstance(exc, InvalidInput) else str(exc)
        refused = {"events": [], "filters": filters, "times": times, "zone": zone, "export": {}, "error": message}
        return render(request, "modelyard/ui/audit.html", refused, status=400)
    events = audit_event_list(
        actor=filters["actor"],
        action=filters["action"],
        model=filters["model"],
        since=bounds["since"],
        until=bounds["until"],
    ).order_by("-seq")
    if before is not None:
        events = events.filter(seq__lt=before)
    page = list(events[: AUDIT_PAGE_SIZE + 1])
    older = page[AUDIT_PAGE_SIZE - 1].seq if len(page) > AUDIT_PAGE_SIZE else None
    for event in page:
        # Shown as the JSON the API and the exports give, not as Python's repr of it.
        event.before_json = _json_text(event.before)  # type: ignore[attr-defined]
        event.after_json = _json_text(event.after)  # type: ignore[attr-defined]
    query = {key: value for key, value in {**filters, **times, "tz": zone}.items() if value}
    export = {**filters, **{key: value.isoformat() for key, value in bounds.items() if value is not None}}
    context: dict[str, Any] = {
        "events": page[:AUDIT_PAGE_SIZE],
        "filters": filters,
        "times": times,
        "zone": zone,
        "older": older,
        "newest": before is not None,
        "query": query,
        "export": {key: value for key, value in export.items() if value},
        "verified": audit_verify() if request.GET.get("verify") else None,
    }
    return render(request, "modelyard/ui/audit.html", context)


# --- Fleet --------------------------------------------------------------------------------------------


def _without_notice(note: str, notice: str) -> str:
    """A loaded version's note less the host's notice (its first part), which the page says once for the host."""
    if notice and note == notice:
        return ""
    if notice and note.startswith(f"{notice}; "):
        return note[len(notice) + 2 :]
    return note


SHARE_WINDOW_SECONDS = 60


def split_shares(item: serving.LoadedRow, worker: serving.FleetWorker) -> list[tuple[str, int, str]]:
    """(alias, percent, measured) for each rollout split a version takes part in on this worker.

    ``measured`` is the candidate's share of the requests the two versions answered in the last minute
    of the worker's figures (both count every request they answered, through the alias or not).
    """
    shares = []
    since = worker.heartbeat_at.timestamp() - SHARE_WINDOW_SECONDS

    def recent(row: serving.LoadedRow) -> int:
        return sum(b.requests for b in row.traffic if b.start + b.seconds > since)

    for alias, percent in sorted(item.splits.items()):
        current = next((r for r in worker.loaded if r.model == item.model and alias in r.aliases), None)
        mine, theirs = recent(item), recent(current) if current is not None else 0
        measured = (
            f"measured {mine / (mine + theirs):.1%} of the last minute's {mine + theirs} requests"
            if mine + theirs
            else "no requests in the last minute"
        )
        shares.append((alias, percent, measured))
    return shares


@login_required
def fleet_index(request: HttpRequest) -> HttpResponse:
    hosts: dict[str, dict[str, Any]] = {}
    workers = []
    for worker in serving.fleet_list():
        host = hosts.setdefault(worker.host, {"host": worker.host, "notices": [], "workers": []})
        if worker.notice and worker.notice not in host["notices"]:
            host["notices"].append(worker.notice)
        row = {
            "worker": worker,
            "online": worker.online,
            "rows": [
                (
                    item,
                    _without_notice(item.note, worker.notice),
                    traffic_charts(item.traffic, until=worker.heartbeat_at),
                    split_shares(item, worker),
                )
                for item in worker.loaded
            ],
        }
        host["workers"].append(row)
        workers.append(row)
    context = {"hosts": [hosts[name] for name in sorted(hosts)], "workers": workers}
    return render(request, "modelyard/ui/fleet.html", context)
