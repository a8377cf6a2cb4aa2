"""Derived versions in the registry: the request (``services``: check the recipe, record the job, queue
it) and the job (``job``: fetch the parent, build and measure in the sandbox, upload the result). The
recipes themselves, and the accuracy delta, are ``onnxkit.derive``."""
