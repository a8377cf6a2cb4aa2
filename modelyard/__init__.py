"""Modelyard: a model registry and serving control plane for ONNX."""

from modelyard.celery import app as celery_app

__all__ = ["celery_app"]
