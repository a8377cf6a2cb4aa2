"""The Python client of Modelyard: push, promote, pull and infer from pipelines and applications.

    from modelyard.client import Client

    client = Client()  # MODELYARD_URL and MODELYARD_TOKEN, else the profile `modelyard login` saved
    version = client.push("minilm", "model.onnx", ["model.onnx.data"], metadata={"run": 42})
    client.wait_ready("minilm", version.version)
    client.promote("minilm", "production", version.version, reason="better recall")  # a pending request
    outputs = client.infer("minilm", {"input_ids": ids, "attention_mask": mask})

It needs only ``requests`` and numpy: it imports nothing of the server (no Django, no Celery, no
ONNX). Refusals raise :class:`ApiError` subclasses carrying the server's ``error`` and ``detail``.
"""

from modelyard.client.config import config_path, read_profiles, save_profile
from modelyard.client.core import Client, token_from_password
from modelyard.client.errors import (
    ApiError,
    BadRequest,
    ChecksumMismatch,
    ConfigError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    GatewayTimeout,
    ModelyardError,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    Unauthorized,
    Unavailable,
    ValidationFailed,
    WaitTimeout,
)
from modelyard.client.types import (
    Alias,
    AliasAt,
    AliasMove,
    AsyncRequest,
    AuditEvent,
    AuditVerdict,
    Benchmark,
    Delivery,
    DeriveJob,
    File,
    InferenceJob,
    Model,
    Policy,
    PolicyCheck,
    PolicyRule,
    Promotion,
    RetentionAction,
    RetentionPlan,
    RetentionRule,
    RuleResult,
    Shadow,
    ShadowOutput,
    ShadowSide,
    Version,
    Webhook,
)

__all__ = [
    "Alias",
    "AliasAt",
    "AliasMove",
    "ApiError",
    "AsyncRequest",
    "AuditEvent",
    "AuditVerdict",
    "BadRequest",
    "Benchmark",
    "ChecksumMismatch",
    "Client",
    "ConfigError",
    "Conflict",
    "ConnectionFailed",
    "Delivery",
    "DeriveJob",
    "File",
    "Forbidden",
    "GatewayTimeout",
    "InferenceJob",
    "Model",
    "ModelyardError",
    "NotFound",
    "PayloadTooLarge",
    "Policy",
    "PolicyCheck",
    "PolicyRule",
    "Promotion",
    "RateLimited",
    "RetentionAction",
    "RetentionPlan",
    "RetentionRule",
    "RuleResult",
    "ServerError",
    "Shadow",
    "ShadowOutput",
    "ShadowSide",
    "Unauthorized",
    "Unavailable",
    "ValidationFailed",
    "Version",
    "WaitTimeout",
    "Webhook",
    "config_path",
    "read_profiles",
    "save_profile",
    "token_from_password",
]
