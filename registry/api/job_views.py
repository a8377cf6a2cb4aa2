"""Asynchronous inference: batch jobs over a stored input file, and single v2 requests answered later.

Thin views over ``registry.jobs.services``: a job is submitted (202), read, listed, cancelled and its
result downloaded; ``infer-async`` takes one ``/v2`` request body and answers it on a later GET. The
input file of a batch job streams from the request to the artifact store as a version's files do
(``registry.http.MultipartInput``): its text fields come before the ``input`` part.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, serializers, status
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.access.auth import has_role
from registry.access.clients import actor_from_request
from registry.access.scopes import model_in_scope, model_scope_q, out_of_scope_message, token_patterns
from registry.api.responses import StreamingFileResponse
from registry.api.serializers import FormListField
from registry.errors import InvalidInput, NotFound, PayloadTooLarge, PermissionDenied
from registry.http import MultipartInput
from registry.jobs import services as jobs
from registry.models import (
    PRODUCTION,
    ApiToken,
    InferenceJob,
    InferenceJobFormat,
    InferenceJobKind,
    InferenceJobState,
    RegisteredModel,
    Role,
)

# The formats a batch job's input may have (an infer-async request is "v2", never sent as a job's format).
BATCH_FORMATS = [InferenceJobFormat.NPZ, InferenceJobFormat.JSONL, InferenceJobFormat.TEXT]
RESULT_FORMATS = ["jsonl", "npz"]
# The text fields of a submission, read before its input file part.
JOB_FIELDS = ("model", "alias", "version", "format", "outputs", "result_format", "input_url")


class InferenceRole(BasePermission):
    """Any signed-in user reads their jobs; submitting and cancelling need the inference (or admin) role."""

    message = "asynchronous inference needs the inference or admin role"

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in SAFE_METHODS or has_role(request.user, Role.INFERENCE)


class InferenceJobSerializer(serializers.ModelSerializer[InferenceJob]):
    id = serializers.CharField(source="public_id", help_text="the job's id, as its URLs name it")
    model = serializers.CharField(source="model.name")
    version = serializers.IntegerField(source="version.version", help_text="fixed when the job was accepted")
    ref = serializers.CharField(help_text="the alias or version number asked for")
    created_by = serializers.CharField(source="created_by.username", default=None, allow_null=True)
    result = serializers.SerializerMethodField(help_text="where to download the result; null until it succeeded")

    class Meta:
        model = InferenceJob
        fields = [
            "id",
            "kind",
            "model",
            "version",
            "ref",
            "format",
            "state",
            "rows",
            "rows_done",
            "errors",
            "input_bytes",
            "result_bytes",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
            "expires_at",
            "result",
        ]

    def get_result(self, job: InferenceJob) -> str | None:
        if job.state != InferenceJobState.SUCCEEDED or job.kind != InferenceJobKind.BATCH:
            return None
        return reverse("inference-job-result", kwargs={"job_id": job.public_id})


class JobSubmitInput(serializers.Serializer[Any]):
    model = serializers.CharField(max_length=64)
    alias = serializers.CharField(required=False, allow_blank=True, default="", max_length=64)
    version = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1)
    format = serializers.ChoiceField(
        choices=BATCH_FORMATS,
        required=False,
        allow_blank=True,
        default="",
        help_text="npz, jsonl or text; empty: from the input file's suffix (.npz, .jsonl, .txt)",
    )
    outputs = FormListField(
        child=serializers.CharField(max_length=256),
        required=False,
        default=list,
        help_text="the outputs to keep (repeatable); none: all of them",
    )
    result_format = serializers.ChoiceField(
        choices=RESULT_FORMATS,
        required=False,
        allow_blank=True,
        default="",
        help_text="for text input: jsonl (the default) or npz",
    )
    input_url = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=1024,
        help_text="a key of the configured artifact store holding the input, instead of an 'input' file part",
    )


class JobSubmitJSON(JobSubmitInput):
    """A submission in JSON (or a urlencoded form): the input is named in the store, never sent in it."""

    input_url = serializers.CharField(
        max_length=1024, help_text="a key of the configured artifact store holding the input, e.g. inputs/rows.npz"
    )


def _ref(alias: str, version: int | None) -> str:
    """What the job is for: a version number or an alias; neither given, the production alias (as ``/v2``)."""
    if alias and version is not None:
        raise InvalidInput("give an alias or a version, not both", {"field": "alias"})
    return str(version) if version is not None else (alias or PRODUCTION)


def _scoped(request: Request, name: str) -> RegisteredModel:
    """The model a submission names, refused (403) outside the token's model patterns; 404 if there is none."""
    patterns = token_patterns(request)
    if not model_in_scope(name, patterns):
        raise PermissionDenied(out_of_scope_message(name, patterns))
    model = RegisteredModel.objects.filter(name=name).first()
    if model is None:
        raise NotFound(f"no model named '{name}'")
    return model


def _token(request: Request) -> ApiToken | None:
    return request.auth if isinstance(request.auth, ApiToken) else None


def _answer(job: InferenceJob) -> Response:
    job.refresh_from_db()  # an in-process queue may have moved it on already
    return Response(InferenceJobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


def _visible(request: Request) -> Any:
    jobs_seen = jobs.visible_jobs(request.user).select_related("model", "version", "created_by")
    return jobs_seen.filter(model_scope_q(token_patterns(request), field="model__name"))


def _job_or_404(request: Request, job_id: str) -> InferenceJob:
    job = _visible(request).filter(public_id=job_id).first()
    if job is None:
        raise NotFound(f"no inference job '{job_id}'")
    return job


def _job_model(kwargs: dict[str, Any]) -> str | None:
    """The model of the job a URL names, for the token's model scope (``registry.access.scopes``)."""
    found = InferenceJob.objects.filter(public_id=str(kwargs.get("job_id", "")))
    return found.values_list("model__name", flat=True).first()


_SUBMIT_FORM = {
    "type": "object",
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {"type": "string", "format": "binary", "description": "the input file, after the other fields"},
        "alias": {"type": "string", "description": "the alias whose version runs the job (default production)"},
        "version": {"type": "string", "description": "a version number, instead of an alias"},
        "format": {"type": "string", "description": "npz, jsonl or text; empty: from the file's suffix"},
        "outputs": {"type": "array", "items": {"type": "string"}, "description": "outputs to keep; none: all"},
        "result_format": {"type": "string", "description": "for text input: jsonl (the default) or npz"},
        "input_url": {"type": "string", "description": "a key of the configured store, instead of the input part"},
    },
    "required": ["model", "input"],
}


class InferenceJobListSubmit(generics.ListAPIView[InferenceJob]):
    serializer_class = InferenceJobSerializer
    permission_classes = [InferenceRole]

    @extend_schema(
        parameters=[
            OpenApiParameter("state", str, enum=list(InferenceJobState.values), description="only jobs in this state"),
            OpenApiParameter("model", str, description="only this model's jobs"),
        ]
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Your jobs, newest first (an admin's or auditor's: everyone's)."""
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> Any:
        params = self.request.query_params
        found = _visible(self.request)
        state = params.get("state", "")
        if state:
            if state not in InferenceJobState.values:
                raise InvalidInput(
                    f"state must be one of {', '.join(InferenceJobState.values)}, not '{state}'", {"field": "state"}
                )
            found = found.filter(state=state)
        if model := params.get("model", ""):
            found = found.filter(model__name=model)
        return found

    @extend_schema(
        request={"multipart/form-data": _SUBMIT_FORM, "application/json": JobSubmitJSON},
        responses={202: InferenceJobSerializer},
    )
    def post(self, request: Request) -> Response:
        """Run a model over many rows: an .npz, JSON Lines of v2 requests, or lines of text (inference role).

        Send the input as a multipart ``input`` part after the other fields, or name it in the artifact
        store with ``input_url``. The version is fixed now; the job runs in chunks at the lowest priority.
        """
        actor = actor_from_request(request)
        if not (request.content_type or "").startswith("multipart/form-data"):
            length = int(request.META.get("CONTENT_LENGTH") or 0)
            if length > settings.MAX_REQUEST_BODY_BYTES:
                raise PayloadTooLarge(
                    f"the request body is larger than the limit of {settings.MAX_REQUEST_BODY_BYTES} bytes; "
                    "send the input as a multipart 'input' part"
                )
            return self._submit(request, request.data, None, None, actor)
        with MultipartInput(request, job_fields=JOB_FIELDS) as upload:
            fields, filename, stream = upload.start()
            return self._submit(request, fields, filename, stream, actor)

    def _submit(self, request: Request, fields: Any, filename: str | None, stream: Any, actor: Any) -> Response:
        data = JobSubmitInput(data=fields)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        if stream is None and not values["input_url"]:
            raise InvalidInput(
                "send the input as a multipart 'input' file part, or name it in the store with input_url",
                {"field": "input"},
            )
        if stream is not None and values["input_url"]:
            raise InvalidInput("send an 'input' file part or input_url, not both", {"field": "input_url"})
        ref = _ref(values["alias"], values["version"])
        model = _scoped(request, values["model"])
        job = jobs.job_submit(
            model=model,
            ref=ref,
            fmt=values["format"] or None,
            filename=filename or values["input_url"].rsplit("/", 1)[-1],
            stream=stream,
            input_url=values["input_url"],
            outputs=values["outputs"],
            result_format=values["result_format"],
            user=request.user,
            token=_token(request),
            actor=actor,
        )
        return _answer(job)


class InferenceJobDetail(APIView):
    permission_classes = [InferenceRole]
    scoped_model = staticmethod(_job_model)

    @extend_schema(responses=InferenceJobSerializer)
    def get(self, request: Request, job_id: str) -> Response:
        return Response(InferenceJobSerializer(_job_or_404(request, job_id)).data)


class InferenceJobCancel(APIView):
    permission_classes = [InferenceRole]
    scoped_model = staticmethod(_job_model)

    @extend_schema(request=None, responses=InferenceJobSerializer)
    def post(self, request: Request, job_id: str) -> Response:
        """Stop a queued or running job; the chunks done are dropped with it (409 once it ended)."""
        job = jobs.job_cancel(_job_or_404(request, job_id), actor=actor_from_request(request))
        job.refresh_from_db()
        return Response(InferenceJobSerializer(job).data)


class InferenceJobResult(APIView):
    permission_classes = [InferenceRole]
    scoped_model = staticmethod(_job_model)

    @extend_schema(
        responses={
            (200, "application/zip"): OpenApiTypes.BINARY,  # an .npz (registry/jobs/formats.py's CONTENT_TYPES)
            (200, "application/jsonl"): OpenApiTypes.BINARY,
            410: OpenApiResponse(
                description="the result was deleted (MODELYARD_INFERENCE_JOB_RESULT_TTL_SECONDS after the job ended)"
            ),
        },
    )
    def get(self, request: Request, job_id: str) -> HttpResponseBase:
        """The result of a job that succeeded, streamed: an .npz or JSON Lines (409 before it succeeded)."""
        stream, content_type, filename, size = jobs.job_result(_job_or_404(request, job_id))
        response = StreamingFileResponse(stream, as_attachment=True, filename=filename, content_type=content_type)
        response["Content-Length"] = str(size)
        return response


class _V2Request(serializers.Serializer[Any]):
    """A ``/v2`` inference request body (JSON tensors), as ``POST /v2/models/{m}/infer`` takes it."""

    inputs = serializers.ListField(child=serializers.DictField())
    id = serializers.CharField(required=False)
    outputs = serializers.ListField(child=serializers.DictField(), required=False)
    parameters = serializers.DictField(required=False)


class _Accepted(serializers.Serializer[Any]):
    id = serializers.CharField()
    state = serializers.CharField()


_REF_PARAMETERS = [
    OpenApiParameter("alias", str, description="the alias whose version answers (default production)"),
    OpenApiParameter("version", str, description="a version number, instead of an alias"),
]


def _query_ref(request: Request) -> str:
    alias = request.query_params.get("alias", "").strip()
    text = request.query_params.get("version", "").strip()
    if text and not text.isdigit():
        raise InvalidInput(f"version must be a whole number, got {text!r}", {"field": "version"})
    return _ref(alias, int(text) if text else None)


class InferAsync(APIView):
    permission_classes = [InferenceRole]

    @extend_schema(
        request={"application/json": _V2Request},
        parameters=_REF_PARAMETERS,
        responses={202: _Accepted},
    )
    def post(self, request: Request, name: str) -> Response:
        """Queue one v2 request; GET the URL in ``Location`` for its answer (inference role)."""
        model = get_object_or_404(RegisteredModel, name=name)
        ref = _query_ref(request)
        job = jobs.request_submit(
            model=model,
            ref=ref,
            body=request.body,
            user=request.user,
            token=_token(request),
            actor=actor_from_request(request),
        )
        location = reverse("infer-async-answer", kwargs={"name": name, "job_id": job.public_id})
        job.refresh_from_db()
        return Response({"id": job.public_id, "state": job.state}, status=202, headers={"Location": location})


class InferAsyncAnswer(APIView):
    permission_classes = [InferenceRole]

    @extend_schema(
        responses={
            200: OpenApiResponse(OpenApiTypes.OBJECT, description="the v2 answer, as /v2 would have sent it"),
            202: OpenApiResponse(_Accepted, description="still queued or running"),
        }
    )
    def get(self, request: Request, name: str, job_id: str) -> HttpResponse:
        """The request's answer: 202 while it waits, then the v2 body, kept ``MODELYARD_ASYNC_RESULT_TTL_SECONDS``."""
        job = _job_or_404(request, job_id)
        if job.model.name != name or job.kind != InferenceJobKind.REQUEST:
            raise NotFound(f"model '{name}' has no asynchronous request '{job_id}'")
        code, body = jobs.request_answer(job)
        return HttpResponse(body, status=code, content_type="application/json")
