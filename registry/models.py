"""Registry rows: models, their versions and files, API tokens, the audit chain, and webhooks with their deliveries."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from modelyard.auditfile import event_hash
from modelyard.crypto import EncryptedTextField
from onnxkit.signatures import batch_dimension_problem

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
name_validator = RegexValidator(
    NAME_PATTERN,
    "Use 1-64 characters: lowercase letters, digits, '.', '_' or '-', starting with a letter or digit.",
)


# A tag of a model or a version: letters, digits and . _ : / -, within MODELYARD_MAX_TAG_CHARS.
TAG_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")


def tags_problem(tags: Sequence[str]) -> str | None:
    """What is wrong with a model's or a version's tags, or None: each is written to the audit chain for good.

    At most ``MODELYARD_MAX_TAGS`` of them, each at most ``MODELYARD_MAX_TAG_CHARS`` long.
    """
    most, longest = settings.MAX_TAGS, settings.MAX_TAG_CHARS
    if len(tags) > most:
        return f"at most {most} tags (MODELYARD_MAX_TAGS), got {len(tags)}"
    for tag in tags:
        if not TAG_PATTERN.fullmatch(tag) or len(tag) > longest:
            shown = tag if len(tag) <= 80 else tag[:80] + "..."
            return (
                f"bad tag {shown!r}: use letters, digits and . _ : / -, "
                f"at most {longest} characters (MODELYARD_MAX_TAG_CHARS)"
            )
    return None


# The alias every model starts with: protected (a move needs a second person) and served; it is what
# ``/v2/models/{name}`` answers with when no version or alias is named.
PRODUCTION = "production"


class Role(models.TextChoices):
    VIEWER = "viewer"
    MAINTAINER = "maintainer"
    APPROVER = "approver"
    AUDITOR = "auditor"
    INFERENCE = "inference"
    ADMIN = "admin"


class ServingStrategy(models.TextChoices):
    """How inference processes swap versions of a model."""

    BLUE_GREEN = "blue-green", "blue-green"  # load the new version beside the old, then switch
    REPLACE = "replace", "replace"  # unload first: for models too large to hold twice


class Batching(models.TextChoices):
    """Whether inference processes merge concurrent requests to a model into one run (its ``batching`` setting)."""

    AUTO = "auto"  # as validation found: merged only when two samples run together gave each one's outputs alone
    ON = "on"  # merged whenever the shapes allow, whatever validation found
    OFF = "off"  # never merged


class BatchCheck(models.TextChoices):
    """What validation found when it ran two samples of a version together and each alone."""

    SAFE = "safe"  # each sample's outputs were the same run together as alone: the first dimension is a batch
    UNSAFE = "unsafe"  # they differed, or the run together failed: merging would change answers
    NO_BATCH_DIMENSION = "no-batch-dimension"  # an input or output has no dynamic first dimension: never merged
    UNCHECKED = "unchecked"  # the check could not run (or the version was validated before it existed)


@dataclass(frozen=True)
class BatchingDecision:
    """Whether a served version's concurrent requests are merged, and why, in a sentence."""

    merges: bool
    reason: str


class RegisteredModel(models.Model):
    """A named model: the parent of its numbered versions."""

    name = models.CharField(max_length=64, unique=True, validators=[name_validator])
    description = models.TextField(blank=True, default="")
    tags = models.JSONField(default=list, blank=True)
    # How inference processes swap versions: both copies briefly, or unload first (huge models).
    serving_strategy = models.CharField(
        max_length=16, choices=ServingStrategy.choices, default=ServingStrategy.BLUE_GREEN
    )
    # Dynamic batching on /v2 (used when every input and output has a dynamic first dimension, and
    # ModelVersion.batching_decision says so). With no queue delay (the default, as in Triton) requests
    # still merge while the previous batch runs. max_batch_size 0 is Triton's "this model does not batch".
    batching = models.CharField(max_length=8, choices=Batching.choices, default=Batching.AUTO)
    max_batch_size = models.PositiveIntegerField(default=32)
    max_queue_delay_us = models.PositiveIntegerField(default=0)
    max_queue_size = models.PositiveIntegerField(default=1024)
    # Batches in flight at once per loaded version (Triton's instance_group.count), sharing one session.
    # Unset means by provider: 1 on the CPU (ORT already uses every core), 2 on a GPU.
    instances = models.PositiveSmallIntegerField(null=True, blank=True, default=None)
    # The last version number handed out; bumped under a row lock so numbers never repeat.
    last_version = models.PositiveIntegerField(default=0)
    # Its retention rule, {"keep_last", "keep_days", "then": "archive"|"delete"}, or null for none
    # (registry/lifecycle/retention.py applies it periodically).
    retention = models.JSONField(null=True, blank=True, default=None)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class VersionStatus(models.TextChoices):
    PENDING = "pending"
    VALIDATING = "validating"
    READY = "ready"
    FAILED = "failed"


class ModelVersion(models.Model):
    """One uploaded artifact bundle of a model (its files never change), and what validation found in it."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=VersionStatus.choices, default=VersionStatus.PENDING)
    # Edited after the upload too (services.version_update, audited); the metadata stays as uploaded.
    description = models.TextField(blank=True, default="")
    tags = models.JSONField(default=list, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # sha256 and size of the .onnx file itself; size_bytes counts every file of the version.
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()
    signature = models.JSONField(default=dict, blank=True)
    ir_version = models.PositiveIntegerField(null=True, blank=True)
    opset = models.JSONField(default=list, blank=True)
    producer = models.JSONField(default=dict, blank=True)
    errors = models.JSONField(default=list, blank=True)
    warnings = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    validation_started_at = models.DateTimeField(null=True, blank=True)
    validation_heartbeat_at = models.DateTimeField(null=True, blank=True)
    validation_attempts = models.PositiveIntegerField(default=0)
    validated_at = models.DateTimeField(null=True, blank=True)
    # A derived version (fp16, int8, ORT-optimised): the version it was built from, how (recipe, options,
    # library versions), and how far its outputs moved from the parent's (onnxkit/derive.py).
    derived_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="derived_versions"
    )
    recipe = models.JSONField(default=dict, blank=True)
    accuracy = models.JSONField(default=dict, blank=True)
    # Whether concurrent requests may be merged along the first dimension (onnxkit/validation.py), and why.
    batch_check = models.CharField(max_length=24, choices=BatchCheck.choices, default=BatchCheck.UNCHECKED)
    batch_note = models.TextField(blank=True, default="")
    # Where it came from (set on upload or later by its uploader, audited): the training run, the code's
    # commit, and the datasets it was trained on, [{"name", "digest"}]. The parent is ``derived_from``.
    source_run_url = models.CharField(max_length=2048, blank=True, default="", db_default="")
    source_commit = models.CharField(max_length=64, blank=True, default="", db_default="")
    source_datasets = models.JSONField(default=list, blank=True, db_default=[])
    # Its life after release (registry/lifecycle/): archived versions keep their bytes but are hidden from
    # lists and cannot be promoted; a held one cannot be deleted by anyone or any retention rule.
    archived_at = models.DateTimeField(null=True, blank=True)
    archived_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    held_at = models.DateTimeField(null=True, blank=True)
    held_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    hold_reason = models.TextField(blank=True, default="", db_default="")
    # A deleted version is a tombstone: the row (number, digests, who, when, why) stays forever and the
    # number is never reused. Deleting is two-phase: ``deleted_at`` is set first; the files are removed
    # from the store afterwards by a job that retries until ``purged_at`` is set.
    deleted_at = models.DateTimeField(null=True, blank=True, db_index=True)
    deleted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    delete_reason = models.TextField(blank=True, default="", db_default="")
    purged_at = models.DateTimeField(null=True, blank=True)
    purge_attempts = models.PositiveIntegerField(default=0, db_default=0)
    purge_error = models.TextField(blank=True, default="", db_default="")
    # Database defaults on the columns that are not null: a registry of the previous release, during a
    # rolling upgrade, inserts versions without them.
    # The last time an inference process reported it loaded (heartbeats; at most once a minute), so that
    # retention keeps what was served recently.
    last_served_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["model_id", "-version"]
        constraints = [models.UniqueConstraint(fields=["model", "version"], name="unique_model_version")]
        indexes = [models.Index(fields=["status", "validation_heartbeat_at"])]

    def __str__(self) -> str:
        return f"{self.model.name} v{self.version}"

    @property
    def lifecycle(self) -> str:
        """``deleted`` (a tombstone), ``archived`` or ``active``; a hold is separate (``held_at``)."""
        if self.deleted_at is not None:
            return "deleted"
        return "archived" if self.archived_at is not None else "active"

    def lifecycle_refusal(self, use: str) -> str | None:
        """Why an archived or deleted version may not be put to ``use`` ("set on an alias"); None when active."""
        if self.deleted_at is not None:
            return f"version {self.version} is deleted; it cannot be {use}"
        if self.archived_at is not None:
            return f"version {self.version} is archived; unarchive it before it can be {use}"
        return None

    @property
    def model_file(self) -> ModelFile:
        return self.files.get(role=FileRole.MODEL)

    @property
    def problems(self) -> list[tuple[str, str]]:
        """Each validation error as its reason (the first line) and the detail after it ("" when none)."""
        return [reason_and_detail(str(error)) for error in self.errors]

    def batching_decision(self, model: RegisteredModel | None = None) -> BatchingDecision:
        """Whether inference processes merge this version's concurrent requests: the model's setting over the check.

        ``model`` is this version's model, when the caller already holds it. Unchecked is the safe side:
        not merged, unless the model's setting says on.
        """
        if self.status != VersionStatus.READY:
            return BatchingDecision(False, f"the version is {self.status}, not ready: it is not served")
        model = model or self.model
        finding = self.batch_note or "validated before Modelyard checked whether requests may be merged"
        if self.batch_check == BatchCheck.NO_BATCH_DIMENSION:
            return BatchingDecision(False, finding)
        problem = batch_dimension_problem(self.signature)
        if problem:  # validated before the check existed, or a signature the check never saw
            return BatchingDecision(False, problem)
        if model.max_batch_size == 0:
            return BatchingDecision(False, "the model's max_batch_size is 0: it does not batch")
        if model.batching == Batching.OFF:
            return BatchingDecision(False, "the model's batching is off")
        if model.batching == Batching.ON:
            found = "" if self.batch_check == BatchCheck.SAFE else f" (validation: {finding})"
            return BatchingDecision(True, f"the model's batching is on{found}")
        if self.batch_check == BatchCheck.SAFE:
            return BatchingDecision(True, finding)
        if self.batch_check == BatchCheck.UNSAFE:
            return BatchingDecision(False, finding)
        return BatchingDecision(
            False, f"{finding}; unchecked, it is served without merging (set the model's batching to on to merge)"
        )


def reason_and_detail(text: str) -> tuple[str, str]:
    """A message's first line, the reason, and the lines after it, the detail (a library's context)."""
    reason, _, detail = text.strip().partition("\n")
    return reason, detail.strip()


class FileRole(models.TextChoices):
    MODEL = "model"
    EXTERNAL_DATA = "external_data"
    EXTRA = "extra"


class ModelFile(models.Model):
    """One stored object of a version: the .onnx file, an external-data file or an extra."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="files")
    name = models.CharField(max_length=255)
    role = models.CharField(max_length=16, choices=FileRole.choices)
    storage_key = models.CharField(max_length=1024, unique=True)
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["version", "name"], name="unique_file_name_per_version")]

    def __str__(self) -> str:
        return f"{self.version} {self.name}"


class SignatureKind(models.TextChoices):
    REGISTRY = "registry"  # the registry's key, once validation passed: every ready version has one
    UPLOADER = "uploader"  # the bundle uploaded with the version, verified against MODELYARD_TRUSTED_SIGNERS
    DERIVATION = "derivation"  # the registry's statement of a derived version: parent, recipe, libraries


class VersionSignature(models.Model):
    """One signed bundle of a version, kept in storage beside its files (``storage_key``).

    The row says where the bundle is and who signed it when it verified; the bundle itself is what
    every check reads, never this row's word.
    """

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="signatures")
    kind = models.CharField(max_length=16, choices=SignatureKind.choices)
    signer = models.CharField(max_length=150)
    key_id = models.CharField(max_length=64)
    storage_key = models.CharField(max_length=1024, unique=True)
    sha256 = models.CharField(max_length=64)
    # The derivation document the statement signs (kind "derivation"); its sha256 is in the bundle.
    document = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["version", "kind"], name="one_signature_per_kind")]

    def __str__(self) -> str:
        return f"{self.version} {self.kind} by {self.signer}"


class PriorityClass(models.TextChoices):
    """A token's priority class on the data plane (``inference/batcher.py`` orders by it first)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class ApiToken(models.Model):
    """A bearer token for the API; only its sha256 is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    # Refreshed at most once a minute, so most authentications write nothing.
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Least privilege: the roles this token carries (null: all of its user's roles; either way never
    # more than the user holds at the time of each request), and the models it reaches, as fnmatch
    # patterns on their names (empty: every model). See registry/access/scopes.py.
    roles = models.JSONField(null=True, blank=True, default=None)
    model_patterns = models.JSONField(default=list, blank=True)
    # The token this one replaced by rotation (which then expires after an overlap), if any.
    rotated_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The batcher's order on /v2 and gRPC: a high token's requests go before normal ones, normal before
    # low, and every class before asynchronous inference jobs. Set only by an admin, and audited.
    priority = models.CharField(max_length=8, choices=PriorityClass.choices, default=PriorityClass.NORMAL)

    def __str__(self) -> str:
        return f"token {self.prefix} of {self.user}"

    @staticmethod
    def hash_key(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()


class ServiceAccount(models.Model):
    """A user that is a pipeline, not a person: it cannot sign in, works only through API tokens, and has an owner."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="service_account")
    # The admin who answers for it; kept (as null) if that admin is deleted, so the account is not lost.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    description = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user__username"]

    def __str__(self) -> str:
        return f"service account {self.user}"


class AuditEvent(models.Model):
    """One recorded change; events form a sha256 hash chain ordered by ``seq``."""

    seq = models.PositiveBigIntegerField(unique=True)
    at = models.DateTimeField()
    actor = models.CharField(max_length=150)
    # A plain id, not a foreign key: deleting a user must never touch (UPDATE) the append-only log.
    actor_id = models.BigIntegerField(null=True, blank=True)
    token_id = models.BigIntegerField(null=True, blank=True)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=32)
    target = models.CharField(max_length=255)
    model_name = models.CharField(max_length=64, blank=True, default="", db_index=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    ip = models.CharField(max_length=64, blank=True, default="")
    user_agent = models.CharField(max_length=512, blank=True, default="")
    request_id = models.CharField(max_length=64, blank=True, default="")
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["seq"]
        indexes = [models.Index(fields=["action", "at"]), models.Index(fields=["actor", "at"])]

    def __str__(self) -> str:
        return f"#{self.seq} {self.actor} {self.action} {self.target}"

    def canonical(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at.isoformat(),
            "actor": self.actor,
            "actor_id": self.actor_id,
            "token_id": self.token_id,
            "action": self.action,
            "target_type": self.target_type,
            "target": self.target,
            "model": self.model_name,
            "before": self.before,
            "after": self.after,
            "ip": self.ip,
            "user_agent": self.user_agent,
            "request_id": self.request_id,
        }

    def compute_hash(self) -> str:
        return event_hash(self.prev_hash, self.canonical())


class AuditChainHead(models.Model):
    """The single row locked while appending, so the chain stays linear under concurrency."""

    last_seq = models.PositiveBigIntegerField(default=0)
    last_hash = models.CharField(max_length=64, default="0" * 64)

    def __str__(self) -> str:
        return f"audit head #{self.last_seq}"


class AuditChainCheck(models.Model):
    """The single row recording how far the periodic verification has checked the audit chain, and its verdict.

    The periodic task (``registry.tasks.verify_audit_chain``) checks only the events appended since
    the last run, anchored on the hash it verified last; ``/metrics`` reports the verdict.
    """

    verified_seq = models.PositiveBigIntegerField(default=0)
    verified_hash = models.CharField(max_length=64, default="0" * 64)
    ok = models.BooleanField(default=True)
    first_bad_seq = models.PositiveBigIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    checked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"audit chain {'ok' if self.ok else 'broken'} up to #{self.verified_seq}"


class AuditHeadSignature(models.Model):
    """One signature by the registry's key over the audit chain's hash at ``seq`` (``registry/audit/heads.py``).

    ``bundle`` is the model-signing bundle (JSON) over ``audit-head/<seq>``; exports carry it, so a
    copy of the log proves itself without this database (``modelyard audit verify-offline``).
    """

    seq = models.PositiveBigIntegerField()
    hash = models.CharField(max_length=64)
    key_id = models.CharField(max_length=64)
    bundle = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["seq", "id"]
        constraints = [models.UniqueConstraint(fields=["seq", "key_id"], name="one_head_signature_per_key")]

    def __str__(self) -> str:
        return f"audit head #{self.seq} signed by {self.key_id[:16]}"


class AuthFailureWindow(models.Model):
    """Failed authentications from one source address in one minute, counted outside the append-only chain."""

    source = models.CharField(max_length=64)
    window_start = models.DateTimeField()
    count = models.PositiveIntegerField(default=1)
    # The auth.failed event that the first failure appended; the summary event names it.
    first_seq = models.PositiveBigIntegerField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "window_start"], name="unique_auth_failure_window"),
        ]
        indexes = [models.Index(fields=["window_start"])]

    def __str__(self) -> str:
        return f"{self.count} failed authentications from {self.source or '?'} at {self.window_start:%H:%M}"


class Alias(models.Model):
    """A named pointer (``production``, ``staging``, ...) from a model to one of its versions.

    Its policy (all optional) refuses a move, unless forced with a reason, to a candidate slower than
    the current version by more than ``max_slowdown_percent`` (throughput at the largest measured batch,
    same provider), or whose outputs moved from it by more than ``max_abs_diff`` or below ``min_cosine``.
    """

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="aliases")
    name = models.CharField(max_length=64, validators=[name_validator])
    version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    protected = models.BooleanField(default=False)
    served = models.BooleanField(default=False)
    max_slowdown_percent = models.FloatField(null=True, blank=True)
    min_cosine = models.FloatField(null=True, blank=True)
    max_abs_diff = models.FloatField(null=True, blank=True)
    # Provenance: a version moves here only with an uploader's signature that verified (or, for a derived
    # version, a signed derivation from such a parent), by one of ``trusted_signers`` when any are named.
    require_signature = models.BooleanField(default=False)
    trusted_signers = models.JSONField(default=list, blank=True)
    # The response cache (``inference/response_cache.py``), opt-in: both set, or neither (off). Its entries
    # are keyed by the served version's digests, so a move never answers from the old version's.
    cache_max_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    cache_ttl_seconds = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model_id", "name"]
        constraints = [models.UniqueConstraint(fields=["model", "name"], name="unique_alias_per_model")]

    def __str__(self) -> str:
        return f"{self.model.name}@{self.name}"

    @property
    def cache(self) -> dict[str, int] | None:
        """The response cache's setting, as the API shows it; None when off."""
        if self.cache_max_bytes is None or self.cache_ttl_seconds is None:
            return None
        return {"max_bytes": self.cache_max_bytes, "ttl_seconds": self.cache_ttl_seconds}


class PromotionState(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class PromotionKind(models.TextChoices):
    MOVE = "move"  # point the alias at ``version``
    UNPROTECT = "unprotect"  # clear the alias's protected flag
    ROLLOUT = "rollout"  # start a stepped rollout of ``version`` (``AliasRollout``); its last step moves the alias
    POLICY = "policy"  # make a new version of the alias's promotion policy (``AliasPolicy``) the one in force


class PromotionRequest(models.Model):
    """A four-eyes change to a protected alias (a move, or unprotecting it), waiting for a second person's decision."""

    alias = models.ForeignKey(Alias, on_delete=models.CASCADE, related_name="promotions")
    kind = models.CharField(max_length=16, choices=PromotionKind.choices, default=PromotionKind.MOVE)
    # The version a move asks for; an unprotect request names none.
    version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    # Where the alias pointed when the request was made; approval is refused if it moved since.
    base_version = models.ForeignKey(ModelVersion, null=True, on_delete=models.CASCADE, related_name="+")
    state = models.CharField(max_length=16, choices=PromotionState.choices, default=PromotionState.PENDING)
    reason = models.TextField(blank=True, default="")
    force = models.BooleanField(default=False)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    requested_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True, default="")
    # The shadow report of the requested version on this alias as it stood when the request was made
    # (``registry/shadow/services.py``); null when the version was not shadowed there.
    shadow_report = models.JSONField(null=True, blank=True)
    # The alias's policy, rule by rule, on the requested version when the request was made, and again
    # when it was approved (``registry/policy/``): {"policy": number, "builtin": bool, "rules": [...]}.
    policy_results = models.JSONField(null=True, blank=True)
    policy_results_at_approval = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [models.Index(fields=["state", "requested_at"])]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__in=[PromotionKind.UNPROTECT, PromotionKind.POLICY])
                | models.Q(version__isnull=False),
                name="move_request_names_a_version",
            )
        ]

    def __str__(self) -> str:
        change = f"-> v{self.version.version}" if self.version is not None else "unprotect"
        return f"promotion #{self.pk} {self.alias} {change} ({self.state})"


class PolicyState(models.TextChoices):
    ACTIVE = "active"  # the alias's policy in force
    PENDING = "pending"  # waiting for its promotion request's approval (a protected alias)
    SUPERSEDED = "superseded"  # was in force; a newer version replaced it
    REJECTED = "rejected"  # its request was rejected, cancelled or expired: never in force


class AliasPolicy(models.Model):
    """One version of an alias's promotion policy: named CEL rules a version must pass to be promoted there.

    Versions count up per alias and are never changed; at most one is active. An alias with none
    has the built-in policy made from its settings (``registry/policy/rules.py``).
    """

    alias = models.ForeignKey(Alias, on_delete=models.CASCADE, related_name="policies")
    number = models.PositiveIntegerField()
    rules = models.JSONField(default=list)  # [{"name", "expr", "message"}]
    state = models.CharField(max_length=16, choices=PolicyState.choices, default=PolicyState.ACTIVE)
    reason = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    # The four-eyes request a change to a protected alias waits for.
    promotion = models.ForeignKey(
        PromotionRequest, null=True, blank=True, on_delete=models.SET_NULL, related_name="policies"
    )

    class Meta:
        ordering = ["alias_id", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["alias", "number"], name="unique_policy_number_per_alias"),
            models.UniqueConstraint(
                fields=["alias"], condition=models.Q(state="active"), name="one_active_policy_per_alias"
            ),
        ]

    def __str__(self) -> str:
        return f"policy {self.number} of {self.alias} ({self.state})"


class AliasShadow(models.Model):
    """A candidate version answering a sample of an alias's live requests on the side, its answers compared.

    The inference processes serving the alias run the sampled requests on the candidate after the
    primary has answered, and report how the two agreed (``ShadowTally``); the client only ever sees
    the primary's answer. At most one shadow per alias runs at a time; an ended one keeps its report.
    """

    alias = models.ForeignKey(Alias, on_delete=models.CASCADE, related_name="shadows")
    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="+")
    sample = models.FloatField()  # the share of the alias's requests mirrored, 0 < sample <= 1
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    ended_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    end_reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["alias"], condition=models.Q(ended_at__isnull=True), name="one_running_shadow_per_alias"
            ),
            models.CheckConstraint(
                condition=models.Q(sample__gt=0) & models.Q(sample__lte=1), name="shadow_sample_in_range"
            ),
        ]

    def __str__(self) -> str:
        return f"shadow #{self.pk} {self.alias} <- v{self.version.version}"


class ShadowTally(models.Model):
    """What one inference process counted for one shadow so far (``onnxkit/agreement.py``), from its heartbeat.

    Kept after the process leaves, so that a restart loses no comparisons; the report merges every row.
    """

    shadow = models.ForeignKey(AliasShadow, on_delete=models.CASCADE, related_name="tallies")
    worker_id = models.CharField(max_length=128)
    tally = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["shadow", "worker_id"], name="one_tally_per_shadow_worker")]

    def __str__(self) -> str:
        return f"{self.shadow_id}@{self.worker_id}"


class RolloutState(models.TextChoices):
    """Where a stepped rollout stands. Only ``running`` and ``paused`` split traffic; the rest have ended."""

    PENDING = "pending"  # waiting for a second person's approval (a protected alias)
    RUNNING = "running"
    PAUSED = "paused"  # holds its current share; the step's clock stops
    COMPLETED = "completed"  # passed its last step: the alias moved to the candidate
    ROLLED_BACK = "rolled_back"  # a step breached a limit: all traffic back to the current version
    ABORTED = "aborted"  # stopped by a person: all traffic back to the current version
    REJECTED = "rejected"  # its approval was refused, cancelled or expired


ROLLOUT_LIVE = (RolloutState.PENDING, RolloutState.RUNNING, RolloutState.PAUSED)


class AliasRollout(models.Model):
    """A candidate taking a growing share of an alias's requests, step by step, checked against the current version.

    ``registry/rollout/services.py`` starts it (after approval on a protected alias), and its periodic
    check moves it on: each step's figures come from the fleet's reports, counted since the step began
    (``baseline``). A breach sends all traffic back to ``base_version``; passing the last step moves
    the alias to ``version``. At most one rollout per alias is pending, running or paused.
    """

    alias = models.ForeignKey(Alias, on_delete=models.CASCADE, related_name="rollouts")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    # What the alias served when the rollout was asked for; it must still when a step begins.
    base_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    steps = models.JSONField()  # percentages of the alias's requests, increasing, each 1-100
    step_seconds = models.PositiveIntegerField()
    max_error_rate = models.FloatField()
    max_p99_ratio = models.FloatField()
    min_requests = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=RolloutState.choices)
    step = models.PositiveSmallIntegerField(default=0)  # index into ``steps``
    step_started_at = models.DateTimeField(null=True, blank=True)
    step_elapsed = models.FloatField(default=0.0)  # seconds of the step run before a pause
    # Each worker's cumulative figures when the step began: {worker_id: {version: totals}}.
    baseline = models.JSONField(default=dict)
    last_check = models.JSONField(default=dict, blank=True)  # the figures the last check saw, for people
    promotion = models.ForeignKey(
        "PromotionRequest", null=True, blank=True, on_delete=models.SET_NULL, related_name="rollouts"
    )
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["alias"],
                condition=models.Q(state__in=["pending", "running", "paused"]),
                name="one_live_rollout_per_alias",
            )
        ]

    def __str__(self) -> str:
        return f"rollout #{self.pk} {self.alias} -> v{self.version.version} ({self.state})"

    @property
    def percent(self) -> int:
        """The candidate's share of the alias's requests now (0 once the rollout has ended or before it runs)."""
        if self.state not in (RolloutState.RUNNING, RolloutState.PAUSED):
            return 0
        return int(self.steps[self.step])


class AliasMoveKind(models.TextChoices):
    """How an alias came to move."""

    SET = "set"  # set directly (an unprotected alias, or a forced change)
    ROLLBACK = "rollback"  # back to the version before
    APPROVAL = "approval"  # a promotion request was approved


class AliasMove(models.Model):
    """One append-only entry of an alias's history: from, to, who, when, why, and via which request."""

    alias = models.ForeignKey(Alias, on_delete=models.CASCADE, related_name="moves")
    from_version = models.ForeignKey(ModelVersion, null=True, on_delete=models.PROTECT, related_name="+")
    to_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=16, choices=AliasMoveKind.choices)
    reason = models.TextField(blank=True, default="")
    forced = models.BooleanField(default=False)
    moved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+")
    moved_at = models.DateTimeField(db_index=True)
    promotion = models.ForeignKey(PromotionRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta:
        ordering = ["moved_at", "id"]

    def __str__(self) -> str:
        return f"{self.alias}: {self.from_version_id} -> {self.to_version_id}"


class LoginFailure(models.Model):
    """Recent failed password logins for one username or one client address, and the lockout they caused."""

    kind = models.CharField(max_length=8)  # "user" or "ip"
    value = models.CharField(max_length=150)
    failures = models.PositiveIntegerField(default=0)
    # Failures count within a window that starts at the first one; an older window starts again at zero.
    window_started_at = models.DateTimeField(db_index=True)
    locked_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "value"], name="unique_login_failure_key")]

    def __str__(self) -> str:
        return f"{self.kind} {self.value}: {self.failures} failed logins"


class InferenceWorker(models.Model):
    """One inference process's last reported state, refreshed by its heartbeat."""

    worker_id = models.CharField(max_length=128, unique=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    device = models.CharField(max_length=64)
    provider = models.CharField(max_length=64)
    # [{model, version, aliases, state, error, attempts, note, load_seconds, memory_bytes, provider}]
    loaded = models.JSONField(default=list)
    errors = models.JSONField(default=list)
    # [{index, name, memory_used_bytes, memory_total_bytes}]: the GPUs it sees, read through NVML. Null
    # in rows that a process of the previous release writes during a rolling upgrade (it knows no such column).
    devices = models.JSONField(default=list, null=True, blank=True)
    # Why it serves on the CPU though a GPU was asked for: the same for every version it loads, so the fleet
    # page says it once per host. A database default, for rows a process of the previous release writes.
    notice = models.TextField(blank=True, default="", db_default="")
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["worker_id"]

    def __str__(self) -> str:
        return self.worker_id


class WebhookEvent(models.TextChoices):
    """What a webhook can be told about."""

    VERSION_READY = "version.ready"
    VERSION_FAILED = "version.failed"
    PROMOTION_REQUESTED = "promotion.requested"
    PROMOTION_APPROVED = "promotion.approved"
    PROMOTION_REJECTED = "promotion.rejected"
    ALIAS_MOVED = "alias.moved"
    ROLLOUT_STARTED = "rollout.started"
    ROLLOUT_STEP = "rollout.step"
    ROLLOUT_PAUSED = "rollout.paused"
    ROLLOUT_RESUMED = "rollout.resumed"
    ROLLOUT_ROLLED_BACK = "rollout.rolled_back"
    ROLLOUT_COMPLETED = "rollout.completed"
    ROLLOUT_ABORTED = "rollout.aborted"
    INFERENCE_JOB_FINISHED = "inference_job.finished"  # succeeded, failed or cancelled


class Webhook(models.Model):
    """An endpoint an admin registered: where to POST which events (of one model, or of all), signed with its secret."""

    url = models.CharField(max_length=2000)
    # Each delivery is signed with it (HMAC), so it is kept encrypted, not hashed (modelyard/crypto.py: the
    # column holds a Fernet token, the attribute the plain text). The API never shows it after creation.
    secret = EncryptedTextField()
    events = models.JSONField(default=list)
    # Only this model's events; null for every model's.
    model = models.ForeignKey(RegisteredModel, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"webhook {self.pk} -> {self.url}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # waiting for its first attempt, or for the next one (next_attempt_at)
    SENDING = "sending"  # claimed by a worker that is sending it now
    DELIVERED = "delivered"  # the endpoint answered 2xx
    FAILED = "failed"  # every attempt failed, or the webhook was disabled


class WebhookDelivery(models.Model):
    """One event for one webhook: the exact body sent, each attempt counted, and how the last one went."""

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    # Sent as Modelyard-Delivery and in the body, the same on every attempt, so receivers can drop repeats.
    uuid = models.UUIDField(unique=True)
    event = models.CharField(max_length=32, choices=WebhookEvent.choices)
    model_name = models.CharField(max_length=64)
    version = models.PositiveIntegerField(null=True, blank=True)
    body = models.TextField()  # the JSON signed and sent, byte for byte
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["status", "next_attempt_at"])]

    def __str__(self) -> str:
        return f"{self.event} for webhook {self.webhook_id} ({self.status})"


class JobStatus(models.TextChoices):
    """The life of a long job row (a derivation, a benchmark)."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class DeriveRecipe(models.TextChoices):
    FP16 = "fp16"
    INT8_DYNAMIC = "int8-dynamic"
    ORT_OPTIMIZED = "ort-optimized"


class DeriveJob(models.Model):
    """One request to build a derived version from a ready one; ``result`` is the version it created."""

    source = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="derive_jobs")
    recipe = models.CharField(max_length=32, choices=DeriveRecipe.choices)
    options = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING)
    error = models.TextField(blank=True, default="")
    result = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"derive #{self.pk} {self.recipe} of {self.source_id} ({self.status})"


class VersionBenchmark(models.Model):
    """One benchmark of a version on one execution provider, run by an inference process that has it."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="benchmarks")
    provider = models.CharField(max_length=64)
    # What ran it, once claimed: the device ("cpu", "NVIDIA H200") and the worker id.
    host_kind = models.CharField(max_length=128, blank=True, default="")
    worker_id = models.CharField(max_length=128, blank=True, default="")
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING)
    # {load_seconds, p50_ms, p99_ms, throughput: {"8": rows/s, "32": rows/s}, peak_memory_bytes, ort_version, ...}
    numbers = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    # Set when the process that ran it was serving traffic meanwhile: the numbers shared the device.
    note = models.TextField(blank=True, default="")
    requested_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["version_id", "provider"]
        constraints = [models.UniqueConstraint(fields=["version", "provider"], name="unique_benchmark_per_provider")]
        indexes = [models.Index(fields=["status", "provider"])]

    def __str__(self) -> str:
        return f"benchmark of {self.version_id} on {self.provider} ({self.status})"


class OidcIdentity(models.Model):
    """The account an OpenID Connect provider's subject signs in as: matched on (issuer, subject), never on a name.

    Made at the first sign-in with the user it creates (registry/access/oidc.py); the username it
    got then never moves it to another account, whatever the provider later says it is called.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities")
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="unique_oidc_subject")]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


class InferenceJobState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class InferenceJobKind(models.TextChoices):
    BATCH = "batch"  # POST /api/v1/inference-jobs: many rows from a stored input file
    REQUEST = "request"  # POST /api/v1/models/{m}/infer-async: one v2 request body


class InferenceJobFormat(models.TextChoices):
    NPZ = "npz"  # one array per model input, first dimension = rows
    JSONL = "jsonl"  # one v2 request body ({"inputs": [...]}) per line
    TEXT = "text"  # one text per line, for a model with a tokenizer
    V2 = "v2"  # an infer-async request: the v2 JSON body itself


class InferenceJob(models.Model):
    """Asynchronous inference over stored inputs, run in chunks by the inference processes at the lowest priority.

    The version is fixed when the job is accepted; a promotion meanwhile changes nothing in it.
    ``registry/jobs/`` has the services, ``inference/jobs.py`` the runner.
    """

    public_id = models.CharField(max_length=32, unique=True)
    kind = models.CharField(max_length=8, choices=InferenceJobKind.choices, default=InferenceJobKind.BATCH)
    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="inference_jobs")
    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="inference_jobs")
    ref = models.CharField(max_length=64, blank=True, default="")  # the alias or version number asked for
    format = models.CharField(max_length=8, choices=InferenceJobFormat.choices)
    state = models.CharField(
        max_length=10, choices=InferenceJobState.choices, default=InferenceJobState.QUEUED, db_index=True
    )
    rows = models.PositiveBigIntegerField(null=True, blank=True)  # known once the input is split
    rows_done = models.PositiveBigIntegerField(default=0)
    errors = models.JSONField(default=list, blank=True)  # messages, at most a few dozen
    input_key = models.CharField(max_length=512, blank=True, default="")
    input_bytes = models.PositiveBigIntegerField(default=0)
    input_sha256 = models.CharField(max_length=64, blank=True, default="")
    result_key = models.CharField(max_length=512, blank=True, default="")
    result_bytes = models.PositiveBigIntegerField(default=0)
    parameters = models.JSONField(default=dict, blank=True)  # v2 request parameters applied to every row
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # an infer-async answer is kept until then

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["kind", "state"])]

    def __str__(self) -> str:
        return f"inference job {self.public_id} ({self.state})"


class InferenceJobChunk(models.Model):
    """Rows ``[start, stop)`` of a job: claimed by one inference process under a lease, retried when it lapses."""

    job = models.ForeignKey(InferenceJob, on_delete=models.CASCADE, related_name="chunks")
    index = models.PositiveIntegerField()
    start = models.PositiveBigIntegerField()
    stop = models.PositiveBigIntegerField()
    state = models.CharField(max_length=10, choices=JobStatus.choices, default=JobStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    worker_id = models.CharField(max_length=128, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    input_key = models.CharField(max_length=512)
    output_key = models.CharField(max_length=512, blank=True, default="")
    error = models.TextField(blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="unique_chunk_index")]
        indexes = [models.Index(fields=["state", "lease_until"])]

    def __str__(self) -> str:
        return f"chunk {self.index} of job {self.job_id} ({self.state})"
