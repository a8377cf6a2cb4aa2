"""The server-rendered UI for release owners and auditors.

Every write calls one service from ``registry.promotions``; a refusal is shown with the
service's own message and the status the API's error table gives it (``registry.api.errors.STATUS``),
so the rules live in one place. Refusals (403) write an ``access.denied`` audit event, as the API's do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from registry import promotions, selectors, serving
from registry.api.errors import status_for
from registry.audit import actor_from_request, audit_access_denied, audit_event_list
from registry.audit_verify import audit_verify
from registry.auth import has_role
from registry.errors import PermissionDenied, RegistryError
from registry.models import PromotionState, RegisteredModel, Role

AUDIT_PAGE_SIZE = 200
DECIDED_SHOWN = 50


class ReasonForm(forms.Form):
    """The reason given with a decision or rollback: the API's limits, and no NUL (PostgreSQL refuses it)."""

    reason = forms.CharField(required=False, max_length=2000)

    def error_text(self) -> str:
        return "; ".join(
            f"{field}: {' '.join(str(error) for error in errors)}" for field, errors in self.errors.items()
        )


@login_required
def model_index(request: HttpRequest) -> HttpResponse:
    models = selectors.model_list_with_versions(query=request.GET.get("q", "").strip())
    return render(request, "modelyard/ui/models.html", {"models": models, "q": request.GET.get("q", "")})


def _model_detail(request: HttpRequest, model: RegisteredModel, *, error: str = "", status: int = 200) -> HttpResponse:
    context = {
        "model": model,
        "versions": selectors.version_list(model=model),
        "aliases": selectors.alias_list(model=model),
        "history": selectors.model_alias_history(model=model),
        "error": error,
    }
    return render(request, "modelyard/ui/model.html", context, status=status)


@login_required
def model_detail(request: HttpRequest, name: str) -> HttpResponse:
    return _model_detail(request, get_object_or_404(RegisteredModel, name=name))


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
        _audit_refusal(request, exc)
        return _model_detail(request, model, error=exc.message, status=status_for(exc) or 400)
    messages.success(request, f"'{alias}' rolled back to version {move.to_version.version}.")
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


_DECISIONS: dict[str, Callable[..., Any]] = {
    "approve": promotions.promotion_approve,
    "reject": promotions.promotion_reject,
}


@login_required
@require_POST
def promotion_decide(request: HttpRequest, promotion_id: int, decision: str) -> HttpResponse:
    service = _DECISIONS.get(decision)
    if service is None:
        raise Http404(f"unknown decision '{decision}'")
    form = ReasonForm(request.POST)
    if not form.is_valid():
        return _promotion_index(request, error=form.error_text(), status=400)
    try:
        promotion = service(
            promotion_id=promotion_id, actor=actor_from_request(request), reason=form.cleaned_data["reason"]
        )
    except RegistryError as exc:
        _audit_refusal(request, exc)
        return _promotion_index(request, error=exc.message, status=status_for(exc) or 400)
    messages.success(request, f"Promotion request {promotion.pk} {promotion.state}.")
    return redirect("ui:promotions")


@login_required
def audit_index(request: HttpRequest) -> HttpResponse:
    if not has_role(request.user, Role.AUDITOR):
        audit_access_denied(request=request, reason="reading the audit log needs the auditor or admin role")
        return render(request, "modelyard/ui/forbidden.html", {"needed": "auditor"}, status=403)
    filters = {key: request.GET.get(key, "").strip() for key in ("actor", "action", "model")}
    events = audit_event_list(actor=filters["actor"], action=filters["action"], model=filters["model"])
    events = events.order_by("-seq")[:AUDIT_PAGE_SIZE]
    verified = audit_verify() if request.GET.get("verify") else None
    return render(request, "modelyard/ui/audit.html", {"events": events, "filters": filters, "verified": verified})


def _audit_refusal(request: HttpRequest, exc: RegistryError) -> None:
    """A refusal for lack of a role (403) is audited; a 404 or 409 is not."""
    if isinstance(exc, PermissionDenied):
        audit_access_denied(request=request, reason=exc.message)


@login_required
def fleet_index(request: HttpRequest) -> HttpResponse:
    workers = [{"worker": worker, "online": worker.online} for worker in serving.fleet_list()]
    return render(request, "modelyard/ui/fleet.html", {"workers": workers})
