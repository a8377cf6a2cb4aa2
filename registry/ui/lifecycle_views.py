"""The web UI for a version's life after release: archive, legal hold, delete, a model's deletion and its retention.

Each form posts to one service of ``registry.lifecycle`` and each view checks the role before it reads the
form (a 403, audited, shown on the page the form came from); the service checks it again. Deleting is
confirmed on a page of its own that names exactly what goes (each file with its size and sha256, the
signature bundles, the total), or says why it cannot go now (``delete_refusals``) and offers no button.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from registry.access.auth import has_role
from registry.access.clients import actor_from_request
from registry.errors import PermissionDenied, RegistryError
from registry.lifecycle import retention
from registry.lifecycle import services as lifecycle
from registry.models import ModelVersion, RegisteredModel, Role
from registry.ui.errors import error_page
from registry.ui.forms import ReasonForm, RetentionForm
from registry.ui.views import form_refusal, refusal, version_or_404, version_page_context

# --- Archive and legal hold, from the version page ----------------------------------------------------

_ROLES = {
    "archive": (Role.MAINTAINER, lifecycle.NEEDS_MAINTAINER),
    "hold": (Role.AUDITOR, lifecycle.NEEDS_HOLD_ROLE),  # auditors, and admins (who hold every role)
    "delete": (Role.ADMIN, lifecycle.NEEDS_ADMIN),
    "delete-model": (Role.ADMIN, lifecycle.NEEDS_ADMIN_MODEL),
    "retention": (Role.MAINTAINER, retention.NEEDS_MAINTAINER),
}


def _may(request: HttpRequest, what: str) -> None:
    """Refuse a viewer without the role before reading the form (the service checks the role again)."""
    role, message = _ROLES[what]
    if not has_role(request.user, role):
        raise PermissionDenied(message)


def _version_change(request: HttpRequest, name: str, number: int, what: str, change: Any, done: str) -> HttpResponse:
    """Archive, unarchive, hold or release the version with the reason given; ``done`` words the outcome."""
    model = get_object_or_404(RegisteredModel, name=name)
    version = version_or_404(model, number)
    form = ReasonForm(request.POST)
    try:
        _may(request, what)
        if not form.is_valid():
            raise form_refusal(form)
        change(version=version, actor=actor_from_request(request), reason=form.cleaned_data["reason"])
    except RegistryError as exc:
        version.refresh_from_db()
        return version_page_context(request, model, version, error=exc.message, status=refusal(request, exc))
    messages.success(request, done.format(number=version.version))
    return redirect("ui:version", name=model.name, number=version.version)


@login_required
@require_POST
def version_archive(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """POST: hide the version from lists and from promotion, keeping its files (maintainers)."""
    done = "Version {number} archived: hidden from the list of versions and from promotion; its files are kept."
    return _version_change(request, name, number, "archive", lifecycle.version_archive, done)


@login_required
@require_POST
def version_unarchive(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """POST: bring an archived version back to lists and promotion (maintainers)."""
    done = "Version {number} unarchived: listed again, and it can be promoted."
    return _version_change(request, name, number, "archive", lifecycle.version_unarchive, done)


@login_required
@require_POST
def version_hold(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """POST: place a legal hold, with a reason (admins and auditors): nobody may delete it until released."""
    done = "Version {number} is under legal hold: nobody and no retention rule can delete it until it is released."
    return _version_change(request, name, number, "hold", lifecycle.version_hold, done)


@login_required
@require_POST
def version_release(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """POST: release the legal hold, with a reason (admins and auditors)."""
    done = "The legal hold on version {number} was released."
    return _version_change(request, name, number, "hold", lifecycle.version_release, done)


# --- Deleting a version: the confirmation page ---------------------------------------------------------


def _delete_page(
    request: HttpRequest,
    model: RegisteredModel,
    version: ModelVersion,
    *,
    form: ReasonForm | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    files = list(version.files.order_by("pk"))
    context = {
        "model": model,
        "version": version,
        "files": files,
        "total_bytes": sum(f.size_bytes for f in files),
        "signatures": list(version.signatures.order_by("pk")),
        "refusals": lifecycle.delete_refusals(version),
        "form": form or ReasonForm(),
        "error": error,
    }
    return render(request, "modelyard/ui/version_delete.html", context, status=status)


@login_required
def version_delete(request: HttpRequest, name: str, number: int) -> HttpResponse:
    """GET: what deleting the version removes, or why it cannot be deleted now; POST: delete it (admins).

    The row stays as a tombstone and the files are removed from the store after the commit.
    """
    model = get_object_or_404(RegisteredModel, name=name)
    version = version_or_404(model, number)
    if request.method != "POST":
        try:
            _may(request, "delete")
        except PermissionDenied as exc:
            return error_page(request, refusal(request, exc), exc.message)
        return _delete_page(request, model, version)
    form = ReasonForm(request.POST)
    try:
        _may(request, "delete")
        if not form.is_valid():
            raise form_refusal(form)
        lifecycle.version_delete(version=version, actor=actor_from_request(request), reason=form.cleaned_data["reason"])
    except RegistryError as exc:
        status = refusal(request, exc)
        if isinstance(exc, PermissionDenied):
            return error_page(request, status, exc.message)
        version.refresh_from_db()
        return _delete_page(request, model, version, form=form, error=exc.message, status=status)
    messages.success(
        request,
        f"Version {version.version} deleted. Its files are removed from the store; its row stays as a tombstone, "
        "and its number is never used again.",
    )
    return redirect("ui:version", name=model.name, number=version.version)


# --- Deleting a model ---------------------------------------------------------------------------------


def _model_delete_page(
    request: HttpRequest, model: RegisteredModel, *, form: ReasonForm | None = None, error: str = "", status: int = 200
) -> HttpResponse:
    versions = list(model.versions.select_related("deleted_by").order_by("version"))
    context = {
        "model": model,
        "tombstones": [v for v in versions if v.deleted_at is not None],
        "live": [v.version for v in versions if v.deleted_at is None],
        "form": form or ReasonForm(),
        "error": error,
    }
    return render(request, "modelyard/ui/model_delete.html", context, status=status)


@login_required
def model_delete(request: HttpRequest, name: str) -> HttpResponse:
    """GET: what deleting the model removes, or which versions are not deleted yet; POST: delete it (admins)."""
    model = get_object_or_404(RegisteredModel, name=name)
    if request.method != "POST":
        try:
            _may(request, "delete-model")
        except PermissionDenied as exc:
            return error_page(request, refusal(request, exc), exc.message)
        return _model_delete_page(request, model)
    form = ReasonForm(request.POST)
    try:
        _may(request, "delete-model")
        if not form.is_valid():
            raise form_refusal(form)
        lifecycle.model_delete(model=model, actor=actor_from_request(request), reason=form.cleaned_data["reason"])
    except RegistryError as exc:
        status = refusal(request, exc)
        if isinstance(exc, PermissionDenied):
            return error_page(request, status, exc.message)
        return _model_delete_page(request, model, form=form, error=exc.message, status=status)
    messages.success(request, f"Model '{name}' deleted. The audit log keeps its versions' numbers and digests.")
    return redirect("ui:models")


# --- Retention ----------------------------------------------------------------------------------------


def _plan(model: RegisteredModel, rule: dict[str, Any] | None) -> tuple[retention.RetentionPlan | None, str]:
    """What ``rule`` (None: the model's own) would do now, or why it cannot say (no rule, a rule that is not one)."""
    if rule is None and model.retention is None:
        return None, ""
    try:
        return retention.retention_plan(model=model, rule=rule), ""
    except RegistryError as exc:
        return None, exc.message


def _retention_page(
    request: HttpRequest,
    model: RegisteredModel,
    *,
    form: RetentionForm | None = None,
    preview: retention.RetentionPlan | None = None,
    previewed: bool = False,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    rule = model.retention or {}
    plan, plan_error = _plan(model, None)
    initial = {"keep_last": rule.get("keep_last"), "keep_days": rule.get("keep_days"), "then": rule.get("then")}
    context = {
        "model": model,
        "rule": model.retention,
        "plan": plan,
        "plan_error": plan_error,
        "form": form or RetentionForm(initial=initial),
        "preview": preview,
        "previewed": previewed,
        "error": error,
    }
    return render(request, "modelyard/ui/retention.html", context, status=status)


@login_required
def model_retention(request: HttpRequest, name: str) -> HttpResponse:
    """GET: the model's retention rule and what its next run would do; POST: set or remove the rule (maintainers;
    a rule that deletes, admins)."""
    model = get_object_or_404(RegisteredModel, name=name)
    if request.method != "POST":
        return _retention_page(request, model)
    form = RetentionForm(request.POST)
    try:
        _may(request, "retention")
        if not form.is_valid():
            raise form_refusal(form)
        rule = form.cleaned_data["rule"]
        retention.retention_set(model=model, rule=rule, actor=actor_from_request(request))
    except RegistryError as exc:
        return _retention_page(request, model, form=form, error=exc.message, status=refusal(request, exc))
    if rule is None:
        messages.success(request, f"'{model.name}' has no retention rule: no version is archived or deleted by one.")
    else:
        messages.success(
            request, f"Retention rule of '{model.name}' saved; the periodic job applies it on its next run."
        )
    return redirect("ui:model-retention", name=model.name)


@login_required
@require_POST
def model_retention_preview(request: HttpRequest, name: str) -> HttpResponse:
    """POST: what the rule in the form would do now, without saving it (maintainers)."""
    model = get_object_or_404(RegisteredModel, name=name)
    form = RetentionForm(request.POST)
    try:
        _may(request, "retention")
        if not form.is_valid():
            raise form_refusal(form)
        rule = form.cleaned_data["rule"]
        preview = retention.retention_plan(model=model, rule=rule) if rule is not None else None
    except RegistryError as exc:
        return _retention_page(request, model, form=form, error=exc.message, status=refusal(request, exc))
    return _retention_page(request, model, form=form, preview=preview, previewed=True)
