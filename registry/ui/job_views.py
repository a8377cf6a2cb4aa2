"""The web UI's inference jobs: the list, a job's page with its progress, the submit form, cancelling.

They read through ``registry.jobs.services.visible_jobs`` and write through ``job_submit`` and
``job_cancel``, as the REST API does (``registry/api/job_views.py``); the result downloads from the
API's own URL, which a signed-in browser may read. The submit form streams its input file to the
store as the upload page does (``registry.http.MultipartInput``): the form's fields, its CSRF token
first, come before the file, so the token is checked before a byte of the file is stored.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestAborted
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, QueryDict
from django.middleware.csrf import CsrfViewMiddleware
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from registry.access.auth import has_role
from registry.access.clients import actor_from_request
from registry.errors import InvalidInput, NotFound, RegistryError
from registry.http import MultipartInput, body_refusal
from registry.jobs import services as jobs
from registry.models import (
    PRODUCTION,
    InferenceJob,
    InferenceJobFormat,
    InferenceJobKind,
    InferenceJobState,
    RegisteredModel,
    Role,
)
from registry.ui.errors import error_page
from registry.ui.forms import UiForm
from registry.ui.views import form_refusal, refusal, require_role

JOBS_PAGE_SIZE = 50
REFRESH_SECONDS = 2  # a queued or running job's page reloads itself this often
ENDED = (InferenceJobState.SUCCEEDED, InferenceJobState.FAILED, InferenceJobState.CANCELLED)
FORM_FIELDS = ("csrfmiddlewaretoken", "model", "alias", "version", "format", "outputs", "result_format")


class JobSubmitForm(UiForm):
    """The submit form's fields; the service checks the model, the version and the input."""

    model = forms.CharField(max_length=64)
    alias = forms.CharField(required=False, max_length=64)
    version = forms.IntegerField(required=False, min_value=1)
    format = forms.ChoiceField(
        required=False,
        choices=[("", "from the file's suffix")]
        + [(value, value) for value in InferenceJobFormat.values if value != InferenceJobFormat.V2],
    )
    outputs = forms.CharField(required=False, max_length=4000)  # names, separated by commas or spaces
    result_format = forms.ChoiceField(required=False, choices=[("", "default"), ("jsonl", "jsonl"), ("npz", "npz")])

    def clean_outputs(self) -> list[str]:
        text = self.cleaned_data.get("outputs") or ""
        return [name for name in text.replace(",", " ").split() if name]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("alias") and data.get("version") is not None:
            raise forms.ValidationError("give an alias or a version, not both")
        return data


def _visible(request: HttpRequest) -> Any:
    return jobs.visible_jobs(request.user).select_related("model", "version", "created_by")


def _job_or_404(request: HttpRequest, job_id: str) -> InferenceJob:
    job = _visible(request).filter(public_id=job_id).first()
    if job is None:
        raise NotFound(f"no inference job '{job_id}'")
    return job


def _percent(job: InferenceJob) -> int:
    return int(100 * job.rows_done / job.rows) if job.rows else (100 if job.state == InferenceJobState.SUCCEEDED else 0)


@login_required
def job_index(request: HttpRequest) -> HttpResponse:
    """Your inference jobs (an admin's or auditor's: everyone's), newest first, filtered by state or model."""
    state = request.GET.get("state", "").strip()
    model = request.GET.get("model", "").strip()
    found = _visible(request)
    if state in InferenceJobState.values:
        found = found.filter(state=state)
    if model:
        found = found.filter(model__name=model)
    page = Paginator(found, JOBS_PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "jobs": [(job, _percent(job)) for job in page.object_list],
        "page": page,
        "state": state,
        "model": model,
        "states": InferenceJobState.values,
        "may_submit": has_role(request.user, Role.INFERENCE),
        "refresh": REFRESH_SECONDS if any(job.state not in ENDED for job in page.object_list) else 0,
    }
    return render(request, "modelyard/ui/jobs.html", context)


def _job_page(request: HttpRequest, job: InferenceJob, *, error: str = "", status: int = 200) -> HttpResponse:
    running = job.state not in ENDED
    context = {
        "job": job,
        "percent": _percent(job),
        "running": running,
        "refresh": REFRESH_SECONDS if running and not error else 0,
        "may_cancel": running and has_role(request.user, Role.INFERENCE),
        "downloadable": job.state == InferenceJobState.SUCCEEDED and job.kind == InferenceJobKind.BATCH,
        "error": error,
    }
    return render(request, "modelyard/ui/job.html", context, status=status)


@login_required
def job_detail(request: HttpRequest, job_id: str) -> HttpResponse:
    """A job: its version, its progress (reloading while it runs), its errors, the result's link, Cancel."""
    try:
        job = _job_or_404(request, job_id)
    except NotFound as exc:
        return error_page(request, 404, exc.message)
    return _job_page(request, job)


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: str) -> HttpResponse:
    """POST: stop a queued or running job (inference role)."""
    try:
        job = _job_or_404(request, job_id)
    except NotFound as exc:
        return error_page(request, 404, exc.message)
    try:
        require_role(request, Role.INFERENCE, what="cancelling an inference job")
        job = jobs.job_cancel(job, actor=actor_from_request(request))
    except RegistryError as exc:
        job.refresh_from_db()
        return _job_page(request, job, error=exc.message, status=refusal(request, exc))
    messages.success(request, f"Job {job.public_id} cancelled.")
    return redirect("ui:job", job_id=job.public_id)


class _FieldsOnly:
    """The request as the CSRF check sees it: the form's fields sent before the file, not the file."""

    def __init__(self, request: HttpRequest, fields: QueryDict) -> None:
        self._request = request
        self.POST = fields

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


def _submit_page(
    request: HttpRequest, *, form: JobSubmitForm | None = None, error: str = "", status: int = 200
) -> HttpResponse:
    initial = {"model": request.GET.get("model", ""), "alias": request.GET.get("alias", "")}
    context = {
        "form": form or JobSubmitForm(initial=initial),
        "models": RegisteredModel.objects.order_by("name").values_list("name", flat=True),
        "may_submit": has_role(request.user, Role.INFERENCE),
        "max_bytes": settings.INFERENCE_JOB_MAX_BYTES,
        "max_rows": settings.INFERENCE_JOB_MAX_ROWS,
        "error": error,
    }
    return render(request, "modelyard/ui/job_submit.html", context, status=status)


class _CsrfRefused(Exception):
    def __init__(self, response: HttpResponse) -> None:
        super().__init__("CSRF check failed")
        self.response = response


def _submit(request: HttpRequest, upload: MultipartInput, shown: dict[str, JobSubmitForm]) -> InferenceJob:
    fields, filename, stream = upload.start()
    check = CsrfViewMiddleware(lambda _request: HttpResponse())
    refused = check.process_view(_FieldsOnly(request, fields), None, (), {})  # type: ignore[arg-type]
    if refused is not None:
        raise _CsrfRefused(refused)
    form = shown["form"] = JobSubmitForm(fields)
    require_role(request, Role.INFERENCE, what="submitting an inference job")
    if not form.is_valid():
        raise form_refusal(form)
    if stream is None or not filename:
        raise InvalidInput("choose the input file: an .npz, a .jsonl of v2 requests, or a .txt of texts")
    data = form.cleaned_data
    model = RegisteredModel.objects.filter(name=data["model"]).first()
    if model is None:
        raise NotFound(f"no model named '{data['model']}'")
    ref = str(data["version"]) if data["version"] is not None else (data["alias"] or PRODUCTION)
    job = jobs.job_submit(
        model=model,
        ref=ref,
        fmt=data["format"] or None,
        filename=filename,
        stream=stream,
        input_url="",
        outputs=data["outputs"],
        result_format=data["result_format"],
        user=request.user,
        token=None,
        actor=actor_from_request(request),
    )
    return job


@csrf_exempt  # checked in _submit on the fields sent before the file, before the file is read
@login_required
def job_submit(request: HttpRequest) -> HttpResponse:
    """GET: the form. POST: the job, its input streamed to the store; then its page."""
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    if request.method != "POST":
        return _submit_page(request)
    shown: dict[str, JobSubmitForm] = {}  # the form as sent, to show again with a refusal
    try:
        if not (request.content_type or "").startswith("multipart/form-data"):
            raise InvalidInput("send the form as multipart/form-data, its input file last")
        with MultipartInput(request, job_fields=FORM_FIELDS) as upload:
            job = _submit(request, upload, shown)
    except _CsrfRefused as exc:
        exc.response["Connection"] = "close"
        return exc.response
    except RegistryError as exc:
        status = refusal(request, exc)
        answer = _submit_page(request, form=shown.get("form"), error=exc.message, status=status)
        answer["Connection"] = "close"
        return answer
    except RequestAborted:
        raise
    except Exception as exc:
        refused = body_refusal(exc)  # limits hit while the body arrived, worded as the API words them
        if refused is None:
            raise
        answer = _submit_page(request, error=str(refused.data["error"]), status=refused.status_code)
        answer["Connection"] = "close"
        return answer
    messages.success(request, f"Job {job.public_id} submitted: version {job.version.version} of {job.model.name}.")
    return redirect("ui:job", job_id=job.public_id)
