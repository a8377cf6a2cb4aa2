"""Registry REST API: thin views over selectors (reads) and services (writes)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import FileResponse, Http404
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import selectors, services
from registry.api.multipart import MultipartUpload
from registry.api.serializers import ModelCreateInput, ModelSerializer, ModelUpdateInput, VersionSerializer
from registry.audit import actor_from_request
from registry.errors import InvalidInput, NotFound, PayloadTooLarge
from registry.models import ModelFile, ModelVersion, RegisteredModel
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
        return selectors.model_list(query=params.get("q", ""), tag=params.get("tag", ""))

    @extend_schema(request=ModelCreateInput, responses={201: ModelSerializer})
    def post(self, request: Request) -> Response:
        data = ModelCreateInput(data=request.data)
        data.is_valid(raise_exception=True)
        model = services.model_create(**data.validated_data, actor=actor_from_request(request))
        return Response(ModelSerializer(model).data, status=status.HTTP_201_CREATED)


class ModelDetail(APIView):
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


class VersionListUpload(generics.ListAPIView[ModelVersion]):
    serializer_class = VersionSerializer
    parser_classes = [MultiPartParser]

    def get_queryset(self) -> Any:
        model = get_object_or_404(RegisteredModel, name=self.kwargs["name"])
        return selectors.version_list(model=model, status=self.request.query_params.get("status", ""))

    @extend_schema(
        request={
            "multipart/form-data": {
                "type": "object",
                "properties": {
                    "file": {"type": "array", "items": {"type": "string", "format": "binary"}},
                    "description": {"type": "string"},
                    "metadata": {"type": "string", "description": "a JSON object"},
                },
                "required": ["file"],
            }
        },
        responses={201: VersionSerializer},
    )
    def post(self, request: Request, name: str) -> Response:
        model = get_object_or_404(RegisteredModel, name=name)
        if not request.content_type.startswith("multipart/form-data"):
            raise InvalidInput("send the files as multipart/form-data with one 'file' part per file")
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > settings.MAX_UPLOAD_BYTES:
            raise PayloadTooLarge(f"the upload is larger than the limit of {settings.MAX_UPLOAD_BYTES} bytes")
        with MultipartUpload(request) as body:
            version = version_upload(model=model, source=body, actor=actor_from_request(request))
        # From here on the version exists: its files stay, and the answer is 201 whatever happens.
        version.refresh_from_db()  # in-process validation may already have finished
        return Response(VersionSerializer(version).data, status=status.HTTP_201_CREATED)


def _get_version(name: str, version: int) -> ModelVersion:
    found = selectors.version_list(model=get_object_or_404(RegisteredModel, name=name)).filter(version=version).first()
    if found is None:
        raise Http404(f"model '{name}' has no version {version}")
    return found


class VersionDetail(APIView):
    @extend_schema(responses=VersionSerializer)
    def get(self, request: Request, name: str, version: int) -> Response:
        return Response(VersionSerializer(_get_version(name, version)).data)


def _file_named(version: ModelVersion, name: str) -> ModelFile:
    # The files are prefetched with the version; an unknown name is a 404, as an unknown version is.
    found = next((f for f in version.files.all() if f.name == name), None)
    if found is None:
        raise NotFound(f"version {version.version} of '{version.model.name}' has no file '{name}'")
    return found


class VersionDownload(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("file", str, description="which file of the version (its name); the .onnx model if absent")
        ],
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
    )
    def get(self, request: Request, name: str, version: int) -> FileResponse:
        found = _get_version(name, version)
        wanted = request.query_params.get("file")
        stored = found.model_file if wanted is None else _file_named(found, wanted)
        stream = get_storage().open(stored.storage_key)
        response = FileResponse(stream, as_attachment=True, filename=stored.name)
        response["Content-Length"] = str(stored.size_bytes)
        response["ETag"] = f'"{stored.sha256}"'
        response["X-Content-SHA256"] = stored.sha256
        return response
