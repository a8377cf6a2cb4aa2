"""Benchmarks of versions on the hardware that serves them: the rows, their claims and records, and the
measuring in the sandbox under the settings' limits (``services``). The measuring itself is
``onnxkit.measure``."""
