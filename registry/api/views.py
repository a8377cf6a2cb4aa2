"""Registry REST API: thin views over selectors (reads) and services (writes)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import Http404, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors, services
from registry.access.clients import actor_from_request
from registry.access.scopes import model_in_scope, model_scope_q, out_of_scope_message, token_patterns
from registry.api import lifecycle_views
from registry.api.responses import StreamingFileResponse
from registry.api.serializers import (
    ModelCreateInput,
    ModelSerializer,
    ModelUpdateInput,
    VersionSerializer,
    VersionUpdateInput,
)
from registry.errors import Gone, InvalidInput, NotFound, PayloadTooLarge, PermissionDenied
from registry.http import MultipartUpload
from registry.lifecycle.lineage import LINEAGE_FIELDS
from registry.models import ModelVersion, RegisteredModel
from registry.provenance import services as provenance
from registry.uploads import version_upload
from storage import get_storage


class ModelListCreate(generics.ListAPIView[RegisteredModel]):
    serializer_class = ModelSerializer

    @extend_schema(
        parameters=[
            OpenApiParameter("q", str, description="substring of the name or description"),
            OpenApiParameter("tag", str, description="only models with this tag"),
        ]
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> Any:
        params = self.request.query_params
        models = selectors.model_list(query=params.get("q", ""), tag=params.get("tag", ""))
        return models.filter(model_scope_q(token_patterns(self.request)))  # a limited token sees its models only

    @extend_schema(request=ModelCreateInput, responses={201: ModelSerializer})
    def post(self, request: Request) -> Response:
        data = ModelCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        patterns = token_patterns(request)
        if not model_in_scope(data.validated_data["name"], patterns):
            raise PermissionDenied(out_of_scope_message(data.validated_data["name"], patterns))
        model = services.model_create(**data.validated_data, actor=actor_from_request(request))
        return Response(ModelSerializer(model).data, status=status.HTTP_201_CREATED)


class ModelDetail(APIView):
    def get_permissions(self) -> Any:
        # Deleting is the admin's, and the service says so; the other writes are the maintainer's.
        return [IsAuthenticated()] if self.request.method == "DELETE" else super().get_permissions()

    @extend_schema(responses=ModelSerializer)
    def get(self, request: Request, name: str) -> Response:
        return Response(ModelSerializer(get_object_or_404(RegisteredModel, name=name)).data)

    @extend_schema(request=ModelUpdateInput, responses=ModelSerializer)
    def patch(self, request: Request, name: str) -> Response:
        model = get_object_or_404(RegisteredModel, name=name)
        data = ModelUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        model = services.model_update(model=model, **data.validated_data, actor=actor_from_request(request))
        return Response(ModelSerializer(model).data)

    @extend_schema(
        parameters=[OpenApiParameter("reason", str, required=True, description="why (recorded); or in a JSON body")],
        responses={204: None},
    )
    def delete(self, request: Request, name: str) -> Response:
        """Delete a model whose versions are all deleted, or that has none (admin, with a reason)."""
        lifecycle_views.model_delete(request, name)
        return Response(status=status.HTTP_204_NO_CONTENT)


class VersionListUpload(generics.ListAPIView[ModelVersion]):
    serializer_class = VersionSerializer
    parser_classes = [MultiPartParser]

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, description="only versions with this validation status"),
            OpenApiParameter(
                "lifecycle",
                str,
                enum=list(selectors.LIFECYCLES),
                description="active (the default), archived, deleted (tombstones) or all",
            ),
        ]
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> Any:
        model = get_object_or_404(RegisteredModel, name=self.kwargs["name"])
        params = self.request.query_params
        lifecycle = params.get("lifecycle") or "active"
        if lifecycle not in selectors.LIFECYCLES:
            raise InvalidInput(
                f"lifecycle must be one of {', '.join(selectors.LIFECYCLES)}, not '{lifecycle}'",
                detail={"field": "lifecycle"},
            )
        return selectors.version_list(model=model, status=params.get("status", ""), lifecycle=lifecycle)

    @extend_schema(
        request={
            "multipart/form-data": {
                "type": "object",
                "properties": {
                    "file": {"type": "array", "items": {"type": "string", "format": "binary"}},
                    "description": {"type": "string"},
                    "metadata": {"type": "string", "description": "a JSON object"},
                    "source_run_url": {"type": "string", "description": "the training run: an http or https URL"},
                    "source_commit": {"type": "string", "description": "the code's commit: 7 to 64 hex characters"},
                    "source_datasets": {
                        "type": "string",
                        "description": 'a JSON list of {"name": ..., "digest": ...}, the datasets it was trained on',
                    },
                    "parent": {"type": "string", "description": "the number of the version of this model it came from"},
                },
                "required": ["file"],
            }
        },
        parameters=[
            OpenApiParameter(
                "allow_duplicate",
                bool,
                description="store files byte for byte those of a version of the model (else 409 naming it)",
            )
        ],
        responses={201: VersionSerializer},
    )
    def post(self, request: Request, name: str) -> Response:
        model = get_object_or_404(RegisteredModel, name=name)
        allow_duplicate = _flag(request, "allow_duplicate")  # before the body: a bad value stores nothing
        if not request.content_type.startswith("multipart/form-data"):
            raise InvalidInput("send the files as multipart/form-data with one 'file' part per file")
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > settings.MAX_UPLOAD_BYTES:
            raise PayloadTooLarge(f"the upload is larger than the limit of {settings.MAX_UPLOAD_BYTES} bytes")
        with MultipartUpload(request) as body:
            version = version_upload(
                model=model, source=body, actor=actor_from_request(request), allow_duplicate=allow_duplicate
            )
        # From here on the version exists: its files stay, and the answer is 201 whatever happens.
        version.refresh_from_db()  # in-process validation may already have finished
        return Response(VersionSerializer(version).data, status=status.HTTP_201_CREATED)


def _flag(request: Request, name: str) -> bool:
    """A true/false query parameter; sent empty (as a form sends a box left empty) or not at all, it is false."""
    text = request.query_params.get(name, "").strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("", "false", "0", "no"):
        return False
    raise InvalidInput(f"{name}: must be true or false, got {request.query_params[name]!r}", {"field": name})


def _get_version(name: str, version: int) -> ModelVersion:
    found = selectors.version_list(model=get_object_or_404(RegisteredModel, name=name)).filter(version=version).first()
    if found is None:
        raise Http404(f"model '{name}' has no version {version}")
    return found


class VersionDetail(APIView):
    def get_permissions(self) -> Any:
        # Deleting is the admin's, and the service says so; editing is the maintainer's.
        return [IsAuthenticated()] if self.request.method == "DELETE" else super().get_permissions()

    @extend_schema(responses=VersionSerializer)
    def get(self, request: Request, name: str, version: int) -> Response:
        return Response(VersionSerializer(_get_version(name, version)).data)

    @extend_schema(request=VersionUpdateInput, responses=VersionSerializer)
    def patch(self, request: Request, name: str, version: int) -> Response:
        found = _get_version(name, version)
        data = VersionUpdateInput(data=request.data)
        data.is_valid(raise_exception=True)
        changes = dict(data.validated_data)
        lineage = {field: changes.pop(field) for field in LINEAGE_FIELDS if field in changes}
        services.version_update(version=found, lineage=lineage, **changes, actor=actor_from_request(request))
        return Response(VersionSerializer(_get_version(name, version)).data)

    @extend_schema(
        parameters=[OpenApiParameter("reason", str, required=True, description="why (recorded); or in a JSON body")],
        responses={200: VersionSerializer},
    )
    def delete(self, request: Request, name: str, version: int) -> Response:
        """Delete a version (admin, with a reason): its files go, its row stays as a tombstone."""
        return lifecycle_views.version_delete(request, name, version)


class VersionDownload(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "file",
                str,
                description="one of the version's files by name (default: the .onnx model); or a signature bundle: "
                "model.sig (the registry's, over every file), uploader.sig (the uploader's), derivation.sig",
            )
        ],
        responses={
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
            (200, "application/json"): OpenApiTypes.OBJECT,
        },
    )
    def get(self, request: Request, name: str, version: int) -> HttpResponseBase:
        found = _get_version(name, version)
        if found.deleted_at is not None:
            by = found.deleted_by.username if found.deleted_by else "someone"
            raise Gone(
                f"version {found.version} of model '{name}' was deleted by {by} on "
                f"{found.deleted_at:%Y-%m-%d %H:%M} UTC ({found.delete_reason}); its files are gone"
            )
        file_name = request.query_params.get("file") or None  # sent empty: the model, as when not sent
        # Each file of a bundle on its own (?file=NAME), so that clients fetch external data file by file.
        model_file = found.model_file if file_name is None else found.files.filter(name=file_name).first()
        if model_file is None and file_name in provenance.DOWNLOAD_NAME:
            return _bundle_response(found, file_name)
        if model_file is None:
            raise NotFound(f"version {found.version} of model '{name}' has no file '{file_name}'")
        stream = get_storage().open(model_file.storage_key)
        response = StreamingFileResponse(stream, as_attachment=True, filename=model_file.name)
        response["Content-Length"] = str(model_file.size_bytes)
        response["ETag"] = f'"{model_file.sha256}"'
        response["X-Content-SHA256"] = model_file.sha256
        return response


def _bundle_response(version: ModelVersion, file_name: str) -> HttpResponse:
    """A signature bundle (a few kilobytes of JSON), as stored; its recorded sha256 as for any file."""
    signature = provenance.bundle_download(version, file_name)
    data = provenance.bundle_read(signature)  # a StorageError is a 503, as for any download
    response = HttpResponse(data, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{file_name}"'
    response["ETag"] = f'"{signature.sha256}"'
    response["X-Content-SHA256"] = signature.sha256
    return response
