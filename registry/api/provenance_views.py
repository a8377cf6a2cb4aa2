"""Signed provenance: the registry's public keys and a version's signatures, checked now (registry.provenance).

The bundles themselves are downloaded like a version's files (``GET .../download?file=model.sig``,
``registry.api.views.VersionDownload``).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from registry.api.views import _get_version
from registry.models import SignatureKind
from registry.provenance import services as provenance


class SigningKeySerializer(serializers.Serializer[Any]):
    id = serializers.CharField(help_text="sha256 of the PEM public key: the hint a bundle names its key by")
    name = serializers.CharField()
    current = serializers.BooleanField(help_text="the key new signatures are made with; the others verify old ones")
    pem = serializers.CharField()


class TrustedSignerSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=["key", "certificate"])
    id = serializers.CharField()


class SigningKeysSerializer(serializers.Serializer[Any]):
    keys = SigningKeySerializer(many=True, help_text="the registry's public keys, the current one first")
    trusted_signers = TrustedSignerSerializer(
        many=True, help_text="the uploaders whose bundles this registry accepts (MODELYARD_TRUSTED_SIGNERS)"
    )


class SignerSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    key_id = serializers.CharField()
    kind = serializers.ChoiceField(choices=[SignatureKind.REGISTRY, SignatureKind.UPLOADER])
    verified = serializers.BooleanField(help_text="whether the stored bundle verified just now")


class ProvenanceSerializer(serializers.Serializer[Any]):
    signed = serializers.BooleanField(help_text="the registry's signature verifies and no bundle has a problem")
    signers = SignerSerializer(many=True)
    derivation = serializers.JSONField(
        allow_null=True, help_text="a derived version's signed statement: parent, child, recipe, libraries, verified"
    )
    verified_at = serializers.DateTimeField()
    problems = serializers.ListField(child=serializers.CharField())


class SigningKeys(APIView):
    @extend_schema(responses=SigningKeysSerializer)
    def get(self, request: Request) -> Response:
        return Response(provenance.signing_keys())


class VersionProvenance(APIView):
    @extend_schema(responses=ProvenanceSerializer)
    def get(self, request: Request, name: str, version: int) -> Response:
        return Response(provenance.version_provenance(_get_version(name, version)))
