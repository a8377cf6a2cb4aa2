"""``GET /api/v1/models/{m}/versions/{n}/card``: the version's model card as a Markdown file (any signed-in user).

The card is built by ``registry.lifecycle.card``; a deleted version's card is its tombstone.
"""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.views import APIView

from registry.lifecycle.card import card_filename, card_markdown, version_card
from registry.models import RegisteredModel


class VersionCard(APIView):
    @extend_schema(responses={(200, "text/markdown"): OpenApiTypes.STR})
    def get(self, request: Request, name: str, version: int) -> HttpResponse:
        """The card in Markdown: summary, signature, validation, benchmarks, accuracy deltas, provenance, lineage,
        promotion history and when it served, each under its own heading."""
        model = get_object_or_404(RegisteredModel, name=name)
        card = version_card(model=model, number=version, base_url=request.build_absolute_uri("/"))
        response = HttpResponse(card_markdown(card), content_type="text/markdown; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="{card_filename(card)}"'
        return response
