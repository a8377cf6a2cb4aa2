"""Every write to the registry. Each top-level service owns its transaction."""

from __future__ import annotations

import logging
import secrets
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import is_password_usable
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.tokens import default_token_generator
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from onnxkit.validation import ValidationResult
from registry import webhooks
from registry.audit import SYSTEM, Actor, audit_record
from registry.auth import has_role
from registry.benchmarks import benchmarks_request
from registry.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from registry.models import (
    ApiToken,
    AuditEvent,
    DeriveJob,
    FileRole,
    JobStatus,
    ModelFile,
    ModelVersion,
    RegisteredModel,
    Role,
    VersionStatus,
    WebhookEvent,
)
from registry.promotions import alias_create_defaults
from registry.serving import fleet_providers

logger = logging.getLogger(__name__)


# --- Models ------------------------------------------------------------------------------------


@transaction.atomic(durable=True)
def model_create(*, name: str, description: str = "", tags: Sequence[str] = (), actor: Actor) -> RegisteredModel:
    if RegisteredModel.objects.filter(name=name).exists():
        raise Conflict(f"a model named '{name}' already exists")
    try:
        with transaction.atomic():
            model = RegisteredModel.objects.create(
                name=name, description=description, tags=list(tags), created_by=actor.user
            )
    except IntegrityError as exc:  # lost a race with a concurrent create of the same name
        raise Conflict(f"a model named '{name}' already exists") from exc
    alias_create_defaults(model=model)
    audit_record(
        actor=actor,
        action="model.create",
        target_type="model",
        target=name,
        model_name=name,
        after={"description": description, "tags": list(tags)},
    )
    return model


EDITABLE_MODEL_FIELDS = (
    "description",
    "tags",
    "serving_strategy",
    "batching",
    "max_batch_size",
    "max_queue_delay_us",
    "max_queue_size",
    "instances",
)


@transaction.atomic(durable=True)
def model_update(*, model: RegisteredModel, actor: Actor, **changes: Any) -> RegisteredModel:
    """Edit the description, tags and serving settings; unknown fields are a programming error."""
    unknown = set(changes) - set(EDITABLE_MODEL_FIELDS)
    if unknown:
        raise TypeError(f"model_update() got unexpected fields {sorted(unknown)}")
    model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
    before = {name: getattr(model, name) for name in changes}
    for name, value in changes.items():
        setattr(model, name, list(value) if name == "tags" else value)
    model.save(update_fields=[*changes, "updated_at"])
    audit_record(
        actor=actor,
        action="model.update",
        target_type="model",
        target=model.name,
        model_name=model.name,
        before=before,
        after={name: getattr(model, name) for name in changes},
    )
    return model


# --- Versions ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredFile:
    """A file already written to storage, about to be attached to a new version."""

    name: str
    storage_key: str
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class Derivation:
    """What makes an upload a derived version: its parent, how it was built, how far its outputs moved, its job."""

    parent: ModelVersion
    recipe: dict[str, Any]
    accuracy: dict[str, Any]
    job_id: int


@transaction.atomic(durable=True)
def version_create(
    *,
    model: RegisteredModel,
    files: Sequence[StoredFile],
    description: str = "",
    metadata: dict[str, Any] | None = None,
    actor: Actor,
    derivation: Derivation | None = None,
) -> ModelVersion:
    """Record an uploaded bundle as a new ``pending`` version: the inner, transactional step of an upload.

    Only the upload service (``registry.uploads.version_upload``) calls this: it has checked and
    stored the files (the first is the .onnx model), and it queues the validation once this commits.
    """
    if not files:
        raise ValueError("a version needs at least its .onnx file")
    model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
    model.last_version += 1
    model.save(update_fields=["last_version", "updated_at"])
    onnx_file = files[0]
    version = ModelVersion.objects.create(
        model=model,
        version=model.last_version,
        status=VersionStatus.PENDING,
        description=description,
        metadata=metadata or {},
        sha256=onnx_file.sha256,
        size_bytes=sum(f.size_bytes for f in files),
        created_by=actor.user,
        derived_from=derivation.parent if derivation else None,
        recipe=derivation.recipe if derivation else {},
        accuracy=derivation.accuracy if derivation else {},
    )
    ModelFile.objects.bulk_create(
        ModelFile(
            version=version,
            name=f.name,
            role=FileRole.MODEL if index == 0 else FileRole.EXTRA,
            storage_key=f.storage_key,
            sha256=f.sha256,
            size_bytes=f.size_bytes,
        )
        for index, f in enumerate(files)
    )
    after: dict[str, Any] = {
        "version": version.version,
        "sha256": version.sha256,
        "size_bytes": version.size_bytes,
        "files": [{"name": f.name, "sha256": f.sha256, "size_bytes": f.size_bytes} for f in files],
    }
    if derivation is not None:
        after.update(derived_from=derivation.parent.version, recipe=derivation.recipe, job=derivation.job_id)
        finished = DeriveJob.objects.filter(pk=derivation.job_id, status=JobStatus.RUNNING).update(
            status=JobStatus.SUCCEEDED, result=version, finished_at=timezone.now(), error=""
        )
        if not finished:
            raise Conflict(f"derive job {derivation.job_id} is no longer running; its result is not recorded")
    audit_record(
        actor=actor,
        action="version.derive" if derivation else "version.upload",
        target_type="version",
        target=f"{model.name}/{version.version}",
        model_name=model.name,
        after=after,
    )
    return version


EDITABLE_VERSION_FIELDS = ("description", "tags")


@transaction.atomic(durable=True)
def version_update(*, version: ModelVersion, actor: Actor, **changes: Any) -> ModelVersion:
    """Edit a version's description and tags; its files and metadata never change. Unknown fields are a bug.

    Only the fields whose value changes are written and audited (``version.update``, before and after);
    an edit that changes nothing writes nothing.
    """
    unknown = set(changes) - set(EDITABLE_VERSION_FIELDS)
    if unknown:
        raise TypeError(f"version_update() got unexpected fields {sorted(unknown)}")
    version = ModelVersion.objects.select_for_update().select_related("model").get(pk=version.pk)
    changed = {name: list(value) if name == "tags" else value for name, value in changes.items()}
    changed = {name: value for name, value in changed.items() if getattr(version, name) != value}
    if not changed:
        return version
    before = {name: getattr(version, name) for name in changed}
    for name, value in changed.items():
        setattr(version, name, value)
    version.save(update_fields=list(changed))
    audit_record(
        actor=actor,
        action="version.update",
        target_type="version",
        target=f"{version.model.name}/{version.version}",
        model_name=version.model.name,
        before=before,
        after=changed,
    )
    return version


def version_claim_for_validation(*, version_id: int, max_attempts: int) -> bool:
    """Move a version to ``validating`` if it is pending, or if its validator stopped heartbeating.

    Returns False when another live worker holds it or it is already decided, which makes a
    task that is delivered twice harmless. Each claim counts as an attempt. A version whose
    ``max_attempts`` are spent is not claimed again but ends ``failed``: an attempt that left it
    claimable never finished (its worker was killed, say), and a poison model would otherwise be
    redelivered and swept back for ever.
    """
    now = timezone.now()
    stale_before = now - timedelta(seconds=settings.VALIDATION_STALE_SECONDS)
    claimable = ModelVersion.objects.filter(
        Q(status=VersionStatus.PENDING) | Q(status=VersionStatus.VALIDATING, validation_heartbeat_at__lt=stale_before),
        pk=version_id,
    )
    claimed = claimable.filter(validation_attempts__lt=max_attempts).update(
        status=VersionStatus.VALIDATING,
        validation_started_at=now,
        validation_heartbeat_at=now,
        validation_attempts=F("validation_attempts") + 1,
    )
    if claimed:
        return True
    # Claimed once more only to record the end, so two deliveries cannot both record it.
    if claimable.update(status=VersionStatus.VALIDATING, validation_heartbeat_at=now):
        attempts = ModelVersion.objects.values_list("validation_attempts", flat=True).get(pk=version_id)
        error = (
            f"validation gave up after {attempts} attempts: the last one never finished, because the process "
            "validating it was lost (killed, or restarted)"
        )
        version_record_validation(version_id=version_id, result=ValidationResult(errors=[error]))
    return False


def version_release_claim(*, version_id: int, error: str, give_up: int) -> bool:
    """Hand a claimed version back after a transient error; returns False once it has failed for good.

    After ``give_up`` attempts the version ends ``failed`` instead, so none stays pending forever.
    """
    version = ModelVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).first()
    if version is None:
        return False
    if version.validation_attempts >= give_up:
        result = ValidationResult(errors=[f"validation gave up after {version.validation_attempts} attempts: {error}"])
        version_record_validation(version_id=version_id, result=result)
        return False
    ModelVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).update(status=VersionStatus.PENDING)
    return True


def version_validation_heartbeat(*, version_id: int) -> None:
    ModelVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).update(
        validation_heartbeat_at=timezone.now()
    )


@transaction.atomic(durable=True)
def version_record_validation(*, version_id: int, result: ValidationResult) -> ModelVersion | None:
    """Store the validation outcome; a version already decided is left alone."""
    version = (
        ModelVersion.objects.select_for_update()
        .select_related("model")
        .filter(pk=version_id, status=VersionStatus.VALIDATING)
        .first()
    )
    if version is None:
        return None
    version.status = VersionStatus.READY if result.ok else VersionStatus.FAILED
    version.errors = result.errors
    version.warnings = result.warnings
    version.signature = result.signature
    version.ir_version = result.ir_version
    version.opset = result.opset
    version.producer = result.producer
    version.batch_check = result.batch_check
    version.batch_note = result.batch_note
    version.validated_at = timezone.now()
    version.save()
    if result.ok:  # benchmarked on the serving hardware: inference processes take these rows
        benchmarks_request(version, providers=fleet_providers())
    if result.external_data_files:
        version.files.filter(name__in=result.external_data_files, role=FileRole.EXTRA).update(
            role=FileRole.EXTERNAL_DATA
        )
    audit_record(
        actor=SYSTEM,
        action="version.validate",
        target_type="version",
        target=f"{version.model.name}/{version.version}",
        model_name=version.model.name,
        before={"status": VersionStatus.VALIDATING},
        after={"status": version.status, "errors": result.errors},
    )
    webhooks.emit(
        WebhookEvent.VERSION_READY if result.ok else WebhookEvent.VERSION_FAILED,
        model=version.model,
        version=version.version,
        details={
            "status": version.status,
            "sha256": version.sha256,
            "size_bytes": version.size_bytes,
            "signature": version.signature,
            "errors": version.errors,
            "warnings": version.warnings,
        },
    )
    return version


# --- Users and tokens -----------------------------------------------------------------------------


@transaction.atomic(durable=True)
def token_create(
    *,
    username: str,
    create_user: bool = False,
    roles: Sequence[str] = (),
    name: str = "",
    expires_in: timedelta | None = None,
    actor: Actor = SYSTEM,
) -> tuple[ApiToken, str]:
    """Create an API token (and optionally its user); returns the row and the only copy of the secret.

    With ``expires_in`` the token stops authenticating after that long; without, it lasts until revoked.
    """
    if expires_in is not None and expires_in <= timedelta(0):
        raise InvalidInput("a token's lifetime must be positive")
    unknown = sorted(set(roles) - set(Role.values))
    if unknown:
        raise InvalidInput(f"unknown role(s) {', '.join(unknown)}; roles are {', '.join(Role.values)}")
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is None:
        if not create_user:
            raise NotFound(f"no user named '{username}' (pass --create-user to create it)")
        _check_new_username(username)
        user = User.objects.create_user(username=username)
        user.set_unusable_password()
        user.save()
        audit_record(actor=actor, action="user.create", target_type="user", target=username)
    added = []
    for role in roles:
        group, _ = Group.objects.get_or_create(name=role)
        if not user.groups.filter(pk=group.pk).exists():
            user.groups.add(group)
            added.append(role)
    if added:
        _user_event(actor, "user.roles.grant", username, after=_grant(added))
    prefix = secrets.token_hex(6)
    raw = f"my_{prefix}_{secrets.token_urlsafe(32)}"
    expires_at = timezone.now() + expires_in if expires_in is not None else None
    token = ApiToken.objects.create(
        user=user, name=name, prefix=prefix, key_hash=ApiToken.hash_key(raw), expires_at=expires_at
    )
    after = {"user": username, "name": name}
    if expires_at is not None:  # kept out otherwise, so events of tokens without expiry look as they always did
        after["expires_at"] = expires_at.isoformat()
    audit_record(actor=actor, action="token.create", target_type="token", target=prefix, after=after)
    return token, raw


@transaction.atomic(durable=True)
def token_revoke(*, token: ApiToken, actor: Actor) -> ApiToken:
    """Revoke a token; it stops authenticating at once (``/v2`` within its token cache's lifetime).

    Revoking a revoked token changes nothing and records nothing.
    """
    token = ApiToken.objects.select_for_update(of=("self",)).select_related("user").get(pk=token.pk)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record(
            actor=actor,
            action="token.revoke",
            target_type="token",
            target=token.prefix,
            after={"user": token.user.get_username(), "name": token.name},
        )
    return token


# --- Changes to users made by Django's own forms (the admin) ------------------------------------------


@dataclass(frozen=True)
class UserAccess:
    """What decides a user's access, compared before and after a change to audit the difference."""

    username: str
    is_active: bool
    is_staff: bool
    is_superuser: bool
    roles: frozenset[str]
    groups: frozenset[str]  # groups that are not roles: they carry Django admin permissions
    permissions: frozenset[str]
    password: str  # the hash: compared, never recorded

    def effective_roles(self) -> frozenset[str]:
        return self.roles | {Role.ADMIN} if self.is_superuser else self.roles

    def recorded(self) -> dict[str, Any]:
        return {
            "username": self.username,
            "is_active": self.is_active,
            "is_staff": self.is_staff,
            "is_superuser": self.is_superuser,
            "roles": sorted(self.roles),
            "groups": sorted(self.groups),
            "permissions": sorted(self.permissions),
            "usable_password": is_password_usable(self.password),
        }


# Recorded in one user.update event when they change; roles and the password have events of their own.
USER_UPDATE_FIELDS = ("username", "is_active", "is_staff", "is_superuser", "groups", "permissions")


def user_access_snapshot(*, user_id: int) -> UserAccess | None:
    """Lock the user and read its access; runs inside the transaction that will change it."""
    user = get_user_model().objects.select_for_update().filter(pk=user_id).first()
    return None if user is None else _user_access(user)


def user_access_record(*, user_id: int, before: UserAccess | None, actor: Actor) -> list[AuditEvent]:
    """Append an audit event for each way the user's access differs from ``before``, in the change's transaction.

    Django's forms (the admin's user pages) make the change; this records it. ``before`` None means
    the user was just created. Events: ``user.create`` and ``user.delete`` with the whole access,
    ``user.roles.grant`` and ``user.roles.revoke``, ``user.update`` with the changed fields before
    and after, and ``user.password.change`` (whether a usable password is set, never the hash).
    """
    user = get_user_model().objects.filter(pk=user_id).first()
    after = None if user is None else _user_access(user)
    if after is None:
        if before is None:
            return []
        return [_user_event(actor, "user.delete", before.username, before=before.recorded())]
    if before is None:
        created = after.recorded()
        if privileged := _privileged(after.effective_roles()):
            created["privileged"] = privileged
        return [_user_event(actor, "user.create", after.username, after=created)]
    events = []
    if granted := sorted(after.roles - before.roles):
        events.append(_user_event(actor, "user.roles.grant", after.username, after=_grant(granted)))
    if revoked := sorted(before.roles - after.roles):
        events.append(_user_event(actor, "user.roles.revoke", after.username, after={"roles": revoked}))
    old, new = before.recorded(), after.recorded()
    if changed := [field for field in USER_UPDATE_FIELDS if old[field] != new[field]]:
        updated = {field: new[field] for field in changed}
        if not before.is_superuser and after.is_superuser:
            updated["privileged"] = [Role.ADMIN.value]  # a superuser holds every role
        events.append(
            _user_event(
                actor, "user.update", after.username, before={field: old[field] for field in changed}, after=updated
            )
        )
    if before.password != after.password:
        events.append(
            _user_event(actor, "user.password.change", after.username, after={"usable": new["usable_password"]})
        )
    return events


def _user_access(user: Any) -> UserAccess:
    groups = set(user.groups.values_list("name", flat=True))
    permissions = user.user_permissions.values_list("content_type__app_label", "codename")
    return UserAccess(
        username=user.get_username(),
        is_active=user.is_active,
        is_staff=user.is_staff,
        is_superuser=user.is_superuser,
        roles=frozenset(groups & set(Role.values)),
        groups=frozenset(groups - set(Role.values)),
        permissions=frozenset(f"{app}.{codename}" for app, codename in permissions),
        password=user.password,
    )


def _user_event(actor: Actor, action: str, username: str, **values: Any) -> AuditEvent:
    return audit_record(actor=actor, action=action, target_type="user", target=username, **values)


# Roles that let their holder decide others' promotions (an admin holds every role). One admin grants
# them alone, so each grant says so in its event (``privileged``), and promotion reviews list them.
PRIVILEGED_ROLES = frozenset({Role.ADMIN.value, Role.APPROVER.value})


def _privileged(roles: Iterable[str]) -> list[str]:
    return sorted(str(role) for role in set(roles) if role in PRIVILEGED_ROLES)


def _grant(roles: Sequence[str]) -> dict[str, Any]:
    """A ``user.roles.grant`` event's ``after``: the roles, and which of them are privileged."""
    after: dict[str, Any] = {"roles": sorted(roles)}
    if privileged := _privileged(roles):
        after["privileged"] = privileged
    return after


# --- New usernames ------------------------------------------------------------------------------------
#
# A name that looks like another person's would put that person's name on someone else's decisions in
# the audit log and on review pages: "\u0430da", with a Cyrillic a, reads as "ada". Letters from two scripts
# in one name are refused (Unicode TS #39's "highly restrictive" level: one script, or Latin with the
# scripts Chinese, Japanese and Korean write with), as is a name that differs from another's only in case.

_SCRIPT_SETS = (
    frozenset({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}),
    frozenset({"LATIN", "HAN", "BOPOMOFO"}),
    frozenset({"LATIN", "HAN", "HANGUL"}),
)


def _script(char: str) -> str | None:
    """The script of a letter, from its Unicode name ("CYRILLIC SMALL LETTER A"); None for anything else."""
    if not char.isalpha():
        return None
    name = unicodedata.name(char, "")
    if name.startswith("CJK "):
        return "HAN"
    return name.split(" ", 1)[0] or "UNKNOWN"


def username_script_refusal(username: str) -> str | None:
    """Why ``username`` is refused for mixing the letters of different scripts, or None."""
    scripts = {script for char in username if (script := _script(char)) is not None}
    if len(scripts) > 1 and not any(scripts <= allowed for allowed in _SCRIPT_SETS):
        return (
            f"'{username}' mixes letters of different scripts ({', '.join(sorted(scripts)).lower()}), "
            "which lets a name pass for another's; use one script"
        )
    return None


def _check_new_username(username: str) -> None:
    """Refuse a new user's name that mixes scripts or is taken, in any case."""
    refusal = username_script_refusal(username)
    if refusal is not None:
        raise InvalidInput(f"username: {refusal}")
    taken = get_user_model().objects.filter(username__iexact=username).values_list("username", flat=True).first()
    if taken == username:
        raise Conflict(f"a user named '{username}' already exists")
    if taken is not None:
        raise InvalidInput(f"username: '{username}' differs from the existing user '{taken}' only in case")


# --- Users and roles, from the web UI's users page ------------------------------------------------------
#
# The same events as the admin's user pages (user_access_record compares the access before and after),
# so the audit log reads alike whichever way an admin changed someone.


def _require_admin(actor: Actor, what: str) -> None:
    if not has_role(actor.user, Role.ADMIN):
        raise PermissionDenied(f"{what} needs the admin role")


def _require_may_manage(actor: Actor, user: Any, what: str) -> None:
    """Staff and superuser accounts reach past the roles (the Django admin): only a superuser manages them here."""
    if (user.is_staff or user.is_superuser) and not getattr(actor.user, "is_superuser", False):
        kind = "a superuser" if user.is_superuser else "a staff"
        raise PermissionDenied(f"'{user.get_username()}' is {kind} account: {what} needs a superuser")


def _checked_roles(roles: Sequence[str]) -> list[str]:
    unknown = sorted(set(roles) - set(Role.values))
    if unknown:
        raise InvalidInput(f"unknown role(s) {', '.join(unknown)}; roles are {', '.join(Role.values)}")
    return sorted(set(roles))


def _set_roles(user: Any, roles: Sequence[str]) -> None:
    """Make the user's role groups exactly ``roles``; groups that are not roles stay as they are."""
    user.groups.remove(*user.groups.filter(name__in=set(Role.values) - set(roles)))
    user.groups.add(*(Group.objects.get_or_create(name=role)[0] for role in roles))


@transaction.atomic(durable=True)
def user_invite(*, username: str, roles: Sequence[str] = (), password: str | None = None, actor: Actor) -> Any:
    """Create a user with roles, and an initial password or none (then they set one with a link, see below).

    Audited as ``user.create`` with the new user's whole access. The password must pass the
    configured validators; it is never recorded.
    """
    _require_admin(actor, "inviting a user")
    User = get_user_model()
    username = User.normalize_username(username.strip())
    try:
        User.username_validator(username)
    except ValidationError as exc:
        raise InvalidInput(f"username: {' '.join(exc.messages)}") from exc
    if not username or len(username) > 150:
        raise InvalidInput("username: use 1-150 characters")
    chosen = _checked_roles(roles)
    _check_new_username(username)
    user = User(username=username)
    if password:
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise InvalidInput(f"password: {' '.join(exc.messages)}") from exc
        user.set_password(password)
    else:
        user.set_unusable_password()
    user.save()
    _set_roles(user, chosen)
    user_access_record(user_id=user.pk, before=None, actor=actor)
    return user


@transaction.atomic(durable=True)
def user_update_access(
    *, username: str, actor: Actor, roles: Sequence[str] | None = None, is_active: bool | None = None
) -> Any:
    """Grant and revoke roles (``roles`` is the whole new set) and activate or deactivate a user.

    An admin cannot take the admin role from themselves nor deactivate themselves, so a slip of the
    mouse cannot lock the last admin out. Audited as ``user.roles.grant``, ``user.roles.revoke`` and
    ``user.update`` (``is_active``).
    """
    _require_admin(actor, "changing a user's roles")
    found = get_user_model().objects.filter(username=username).values_list("pk", flat=True).first()
    if found is None:
        raise NotFound(f"no user named '{username}'")
    before = user_access_snapshot(user_id=found)
    assert before is not None
    user = get_user_model().objects.get(pk=found)
    _require_may_manage(actor, user, "changing its roles or access")
    own = actor.user is not None and actor.user.pk == user.pk
    if roles is not None:
        chosen = _checked_roles(roles)
        if own and Role.ADMIN in before.roles and Role.ADMIN not in chosen:
            raise InvalidInput("you cannot take the admin role from yourself; ask another admin")
        _set_roles(user, chosen)
    if is_active is not None and is_active != user.is_active:
        if own and not is_active:
            raise InvalidInput("you cannot deactivate yourself; ask another admin")
        user.is_active = is_active
        user.save(update_fields=["is_active"])
    user_access_record(user_id=user.pk, before=before, actor=actor)
    return user


@transaction.atomic(durable=True)
def user_password_link(*, username: str, actor: Actor) -> tuple[str, str]:
    """The (uidb64, token) of a set-password link for the user (Django's password-reset tokens).

    The link works once, until the password changes, for ``PASSWORD_RESET_TIMEOUT``. Modelyard sends
    no mail: the admin hands the link over. Audited as ``user.password.link``, without the token.

    Only for a user who has never signed in or has no usable password: a link for anyone else would
    let one admin take over their account (an approver's, say, to approve their own promotion). Such
    a user changes their own password; a superuser can still reset it in the Django admin, audited.
    """
    _require_admin(actor, "making a set-password link")
    user = get_user_model().objects.select_for_update().filter(username=username).first()
    if user is None:
        raise NotFound(f"no user named '{username}'")
    _require_may_manage(actor, user, "making a set-password link for it")
    if user.last_login is not None and user.has_usable_password():
        raise PermissionDenied(
            f"'{username}' has signed in with a password of their own: a set-password link is only for a user "
            "who never signed in or has no password; they change it themselves"
        )
    audit_record(
        actor=actor,
        action="user.password.link",
        target_type="user",
        target=username,
        after={"valid_seconds": settings.PASSWORD_RESET_TIMEOUT},
    )
    return urlsafe_base64_encode(force_bytes(user.pk)), default_token_generator.make_token(user)


@transaction.atomic(durable=True)
def user_password_set(*, user: Any, password: str, actor: Actor) -> None:
    """Set a password that Django's form has validated: a user's own change, or one made with a set-password link.

    Audited as ``user.password.change``, as the admin's password form is.
    """
    before = user_access_snapshot(user_id=user.pk)
    user.set_password(password)
    user.save(update_fields=["password"])
    user_access_record(user_id=user.pk, before=before, actor=actor)


# --- Derive jobs ------------------------------------------------------------------------------------


def derive_claim(*, job_id: int) -> bool:
    """Take a pending derive job; False when another delivery of the task already took it."""
    return bool(
        DeriveJob.objects.filter(pk=job_id, status=JobStatus.PENDING).update(
            status=JobStatus.RUNNING, started_at=timezone.now()
        )
    )


@transaction.atomic(durable=True)
def derive_fail(*, job_id: int, error: str) -> None:
    """Record why a running derive job produced no version."""
    job = DeriveJob.objects.select_related("source__model").filter(pk=job_id, status=JobStatus.RUNNING).first()
    if job is None:
        return
    job.status, job.error, job.finished_at = JobStatus.FAILED, error, timezone.now()
    job.save(update_fields=["status", "error", "finished_at"])
    model = job.source.model
    audit_record(
        actor=SYSTEM,
        action="version.derive.fail",
        target_type="version",
        target=f"{model.name}/{job.source.version}",
        model_name=model.name,
        after={"job": job.pk, "recipe": job.recipe, "error": error},
    )


def derive_jobs_fail_lost(*, older_than: timedelta) -> list[int]:
    """Fail the derive jobs still ``running`` long past their limit: the worker running them was lost."""
    before = timezone.now() - older_than
    lost = list(DeriveJob.objects.filter(status=JobStatus.RUNNING, started_at__lt=before).values_list("pk", flat=True))
    for job_id in lost:
        derive_fail(
            job_id=job_id,
            error="the derivation was lost: the worker running it stopped before it finished; derive again",
        )
    return lost
