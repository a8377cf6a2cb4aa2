"""Modelyard: a model registry and serving control plane for ONNX.

This package's root imports nothing: ``modelyard.client`` (the Python client, and the user commands
built on it) must import without Django or Celery. The Celery app is made the current one by
``modelyard.settings``, which every process that runs Django loads.
"""
