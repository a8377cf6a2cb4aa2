"""Validation of an uploaded version in the registry: claiming it and recording the outcome (``services``),
and the job that fetches its files and runs ``onnxkit.validation`` in the sandbox under the settings'
limits while it keeps the claim alive (``job``)."""
