"""What the registry refuses, as plain exceptions that know nothing of HTTP.

Services, selectors and the upload service raise these; each transport maps them to its own
answer in one place (the REST API and the UI through ``registry.http.STATUS``, the command
line through an exit code). The message is written for the person who made the request and is safe
to show them; ``detail`` is optional structured data (a limit, the offending field).
"""

from __future__ import annotations


class RegistryError(Exception):
    """Base class: a request the registry refuses, with a message for its sender."""

    def __init__(self, message: str, detail: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class InvalidInput(RegistryError):
    """A value breaks a rule: a name, a parameter, a form field, a file of an upload."""


class TooManyFiles(InvalidInput):
    """An upload has more files than MODELYARD_MAX_UPLOAD_FILES allows."""

    def __init__(self, limit: int) -> None:
        message = f"too many files: an upload may have at most {limit} (MODELYARD_MAX_UPLOAD_FILES)"
        super().__init__(message, {"limit": limit})


class NotAnOnnxModel(InvalidInput):
    """The first file of an upload is not a well-formed ONNX model (empty, not protobuf, truncated)."""


class UnsupportedModel(InvalidInput):
    """The model needs a newer IR version or opset than the installed ONNX Runtime loads."""


class PermissionDenied(RegistryError):
    """The actor lacks the role, or is the wrong person, for this change."""


class NotFound(RegistryError):
    """What the request names does not exist (or is not the caller's to see)."""


class Conflict(RegistryError):
    """The change clashes with the current state: a name taken, an alias that moved meanwhile."""


class ForceRequired(Conflict):
    """A change refused unless forced with a reason: a breaking signature, a candidate past the alias's policy.

    ``refusal`` says what is wrong; the message adds how the API forces it. A form words that part its own
    way (its Force checkbox).
    """

    def __init__(self, refusal: str, detail: object = None) -> None:
        super().__init__(f"{refusal} Send force=true with a reason to set it anyway.", detail)
        self.refusal = refusal


class ForceNeedsReason(InvalidInput):
    """Forcing a change was asked for without a reason to record."""

    def __init__(self) -> None:
        super().__init__("force=true needs a reason")


class Gone(RegistryError):
    """What the request names existed but was deleted: a deleted version's files."""


class PayloadTooLarge(RegistryError):
    """An upload, or its form fields, passed a size limit."""


class FormTooLarge(PayloadTooLarge):
    """The text fields of an upload passed MODELYARD_MAX_FORM_BYTES."""

    def __init__(self, limit: int) -> None:
        message = f"the form fields are larger than the limit of {limit} bytes (MODELYARD_MAX_FORM_BYTES)"
        super().__init__(message, {"limit": limit})


class StorageDown(RegistryError):
    """Artifact storage could not be reached, or refused a write."""


class SignatureInvalid(InvalidInput):
    """An uploaded signature bundle that does not verify, or does not sign the files uploaded with it."""


class SignatureRequired(Conflict):
    """An alias that requires a signature refuses a version without one it accepts."""


class QueueFull(Conflict):
    """Too many inference jobs wait already (``MODELYARD_INFERENCE_JOB_MAX_QUEUED``, ``..._PER_TOKEN``); try later."""
