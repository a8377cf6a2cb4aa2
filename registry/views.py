"""Server-rendered pages."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from registry.models import ModelVersion, RegisteredModel


def home(request: HttpRequest) -> HttpResponse:
    context = {
        "models": RegisteredModel.objects.count(),
        "versions": ModelVersion.objects.count(),
        "role": settings.ROLE,
    }
    return render(request, "modelyard/home.html", context)
