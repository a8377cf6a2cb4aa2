"""Writes to users and tokens: API tokens, and users and their roles from the CLI, the API, the web UI
and the Django admin. Each top-level service owns its transaction and writes its audit events in it."""

from __future__ import annotations

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
from django.db import transaction
from django.db.models import ProtectedError
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from registry.access.auth import has_role, user_roles
from registry.access.scopes import model_patterns_problem
from registry.audit.chain import SYSTEM, Actor, audit_record
from registry.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from registry.models import ApiToken, AuditEvent, PriorityClass, Role, ServiceAccount

PRIORITY_NEEDS_ADMIN = "a token's priority class other than normal needs the admin role"


@transaction.atomic(durable=True)
def token_create(
    *,
    username: str,
    create_user: bool = False,
    roles: Sequence[str] = (),
    name: str = "",
    expires_in: timedelta | None = None,
    only_roles: Sequence[str] | None = None,
    model_patterns: Sequence[str] = (),
    priority: str = PriorityClass.NORMAL,
    actor: Actor = SYSTEM,
) -> tuple[ApiToken, str]:
    """Create an API token (and optionally its user); returns the row and the only copy of the secret.

    ``roles`` are granted to the user. ``only_roles`` limits the token to some of the user's roles
    (None: all of them, as they are at each request); asking for a role the user lacks is refused.
    ``model_patterns`` limits it to models whose names match one of them (fnmatch; none: every model).
    With ``expires_in`` the token stops authenticating after that long; without, it lasts until revoked.
    ``priority`` is its class on the data plane (high, normal, low: the batcher serves a higher class
    first); only an admin (or the command line) gives a token another class than normal.
    """
    if expires_in is not None and expires_in <= timedelta(0):
        raise InvalidInput("a token's lifetime must be positive")
    _check_priority(priority, actor)
    unknown = sorted(set(roles) - set(Role.values))
    if unknown:
        raise InvalidInput(f"unknown role(s) {', '.join(unknown)}; roles are {', '.join(Role.values)}")
    token_scope = _checked_scope(only_roles, model_patterns)
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
    _check_user_holds(user, token_scope[0])
    return _token_issue(user=user, name=name, expires_in=expires_in, scope=token_scope, priority=priority, actor=actor)


def _check_priority(priority: str, actor: Actor) -> None:
    """A known class; above or below normal only from an admin or the command line (SYSTEM)."""
    if priority not in PriorityClass.values:
        raise InvalidInput(f"unknown priority class '{priority}'; the classes are {', '.join(PriorityClass.values)}")
    if priority != PriorityClass.NORMAL and actor.user is not None and not has_role(actor.user, Role.ADMIN):
        raise PermissionDenied(PRIORITY_NEEDS_ADMIN)


def _checked_scope(
    only_roles: Sequence[str] | None, model_patterns: Sequence[str]
) -> tuple[list[str] | None, list[str]]:
    """A token's roles (None: all of its user's) and model patterns, checked; both sorted, without repeats."""
    chosen = None
    if only_roles is not None:
        chosen = _checked_roles(only_roles)
        if not chosen:
            raise InvalidInput("a token limited to roles needs at least one role")
    problem = model_patterns_problem(list(model_patterns))
    if problem is not None:
        raise InvalidInput(problem)
    return chosen, sorted(set(model_patterns))


def _check_user_holds(user: Any, roles: Sequence[str] | None) -> None:
    """A token never has more than its user: refuse roles the user does not hold (an admin holds every role)."""
    if roles is None:
        return
    user.__dict__.pop("_modelyard_roles", None)  # the roles may have been granted just now
    held = user_roles(user)
    missing = [] if Role.ADMIN in held else sorted(set(roles) - held)
    if missing:
        raise InvalidInput(
            f"'{user.get_username()}' does not hold the role(s) {', '.join(missing)}, and a token carries only "
            f"roles its user holds (theirs: {', '.join(sorted(held)) or 'none'}); grant the role to the user first"
        )


def _token_issue(
    *,
    user: Any,
    name: str,
    expires_in: timedelta | None,
    scope: tuple[list[str] | None, list[str]],
    priority: str,
    actor: Actor,
    rotated_from: ApiToken | None = None,
) -> tuple[ApiToken, str]:
    """Make the token row and its secret, and audit ``token.create``; inside the caller's transaction."""
    prefix = secrets.token_hex(6)
    raw = f"my_{prefix}_{secrets.token_urlsafe(32)}"
    expires_at = timezone.now() + expires_in if expires_in is not None else None
    only_roles, patterns = scope
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=prefix,
        key_hash=ApiToken.hash_key(raw),
        expires_at=expires_at,
        roles=only_roles,
        model_patterns=patterns,
        priority=priority,
        rotated_from=rotated_from,
    )
    after: dict[str, Any] = {"user": user.get_username(), "name": name}
    # Each kept out when unset, so events of unlimited tokens without expiry look as they always did.
    if expires_at is not None:
        after["expires_at"] = expires_at.isoformat()
    if only_roles is not None:
        after["roles"] = only_roles
    if patterns:
        after["models"] = patterns
    if priority != PriorityClass.NORMAL:
        after["priority"] = priority
    if rotated_from is not None:
        after["rotated_from"] = rotated_from.prefix
    audit_record(actor=actor, action="token.create", target_type="token", target=prefix, after=after)
    return token, raw


@transaction.atomic(durable=True)
def token_rotate(
    *, token: ApiToken, overlap: timedelta, expires_in: timedelta | None = None, actor: Actor
) -> tuple[ApiToken, str]:
    """Replace a token with a new one of the same user, name, roles, models and priority class; the old one works
    ``overlap`` more.

    The new token lasts ``expires_in``, or as long as the old one was made to last (none: until revoked).
    The old one's ``expires_at`` becomes now + ``overlap`` (never later than it was), so a pipeline
    can switch to the new secret meanwhile. Audited as ``token.create`` (with ``rotated_from``) and
    ``token.rotate`` on the old token. A revoked or expired token is not rotated: create a new one.
    """
    if overlap < timedelta(0):
        raise InvalidInput("the overlap must be zero or more hours")
    if expires_in is not None and expires_in <= timedelta(0):
        raise InvalidInput("a token's lifetime must be positive")
    old = ApiToken.objects.select_for_update(of=("self",)).select_related("user").get(pk=token.pk)
    now = timezone.now()
    if old.revoked_at is not None:
        raise Conflict(f"API token {old.prefix} is revoked: create a new token instead of rotating it")
    if old.expires_at is not None and old.expires_at <= now:
        raise Conflict(f"API token {old.prefix} expired at {old.expires_at.isoformat()}: create a new token instead")
    if not old.user.is_active:
        raise Conflict(f"'{old.user.get_username()}' is deactivated: its tokens are not rotated")
    if expires_in is None and old.expires_at is not None:
        expires_in = old.expires_at - old.created_at
    # The roles it names must still be the user's, as for any new token.
    _check_user_holds(old.user, old.roles)
    new, raw = _token_issue(
        user=old.user,
        name=old.name,
        expires_in=expires_in,
        scope=(old.roles, list(old.model_patterns or [])),
        priority=old.priority,  # the class an admin gave it stays, whoever rotates it
        actor=actor,
        rotated_from=old,
    )
    before = {"expires_at": old.expires_at.isoformat() if old.expires_at else None}
    ends = now + overlap
    old.expires_at = ends if old.expires_at is None else min(old.expires_at, ends)
    old.save(update_fields=["expires_at"])
    audit_record(
        actor=actor,
        action="token.rotate",
        target_type="token",
        target=old.prefix,
        before=before,
        after={
            "user": old.user.get_username(),
            "name": old.name,
            "replaced_by": new.prefix,
            "expires_at": old.expires_at.isoformat(),
            "overlap_seconds": int(overlap.total_seconds()),
        },
    )
    return new, raw


@transaction.atomic(durable=True)
def token_set_priority(*, token: ApiToken, priority: str, actor: Actor) -> ApiToken:
    """Change a live token's priority class (admins, or the command line); audited as ``token.priority``.

    The inference processes follow within their token cache's lifetime. The same class again changes
    nothing and records nothing; a revoked token is not changed (409).
    """
    if actor.user is not None and not has_role(actor.user, Role.ADMIN):
        raise PermissionDenied(PRIORITY_NEEDS_ADMIN)
    _check_priority(priority, actor)
    token = ApiToken.objects.select_for_update(of=("self",)).select_related("user").get(pk=token.pk)
    if token.revoked_at is not None:
        raise Conflict(f"API token {token.prefix} is revoked: its priority class no longer matters")
    if token.priority == priority:
        return token
    before = {"priority": token.priority}
    token.priority = priority
    token.save(update_fields=["priority"])
    audit_record(
        actor=actor,
        action="token.priority",
        target_type="token",
        target=token.prefix,
        before=before,
        after={"user": token.user.get_username(), "name": token.name, "priority": priority},
    )
    return token


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
    username = _checked_new_username(username)
    chosen = _checked_roles(roles)
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


# --- Service accounts -------------------------------------------------------------------------------
#
# A pipeline's user: no password (it cannot sign in), owned by an admin who answers for it, and used
# only through API tokens, which can expire and be rotated with an overlap (token_rotate).


def _require_admin_or_system(actor: Actor, what: str) -> None:
    if actor.user is not None:  # the command line (SYSTEM) acts for the operator
        _require_admin(actor, what)


def _checked_new_username(username: str) -> str:
    User = get_user_model()
    username = User.normalize_username(username.strip())
    try:
        User.username_validator(username)
    except ValidationError as exc:
        raise InvalidInput(f"username: {' '.join(exc.messages)}") from exc
    if not username or len(username) > 150:
        raise InvalidInput("username: use 1-150 characters")
    _check_new_username(username)
    return username


@transaction.atomic(durable=True)
def service_account_create(
    *, username: str, owner: str = "", roles: Sequence[str] = (), description: str = "", actor: Actor
) -> ServiceAccount:
    """Create a service account: a user with ``roles`` and no password, owned by the admin ``owner``.

    ``owner`` defaults to the acting admin. Audited as ``user.create`` (the user's whole access) and
    ``service_account.create`` (its owner and description).
    """
    _require_admin_or_system(actor, "creating a service account")
    owner = owner or (actor.user.get_username() if actor.user is not None else "")
    if not owner:
        raise InvalidInput("a service account needs an owner: name an admin (--owner ADMIN)")
    User = get_user_model()
    owner_user = User.objects.filter(username=owner).first()
    if owner_user is None:
        raise NotFound(f"no user named '{owner}' to own the service account")
    if not owner_user.is_active or not has_role(owner_user, Role.ADMIN):
        raise InvalidInput(f"the owner of a service account must be an active admin; '{owner}' is not")
    if len(description) > 200:
        raise InvalidInput("description: at most 200 characters")
    chosen = _checked_roles(roles)
    username = _checked_new_username(username)
    user = User(username=username)
    user.set_unusable_password()
    user.save()
    _set_roles(user, chosen)
    account = ServiceAccount.objects.create(user=user, owner=owner_user, description=description)
    user_access_record(user_id=user.pk, before=None, actor=actor)
    audit_record(
        actor=actor,
        action="service_account.create",
        target_type="user",
        target=username,
        after={"owner": owner, "roles": chosen, "description": description},
    )
    return account


@transaction.atomic(durable=True)
def service_account_delete(*, username: str, actor: Actor) -> None:
    """Delete a service account, its user and its tokens (which stop working at once; ``/v2`` within seconds).

    Audited as ``service_account.delete`` (with the prefixes of the tokens it still had) and ``user.delete``.
    """
    _require_admin_or_system(actor, "deleting a service account")
    account = ServiceAccount.objects.select_related("user", "owner").filter(user__username=username).first()
    if account is None:
        raise NotFound(f"no service account named '{username}'")
    user_id = account.user_id
    before = user_access_snapshot(user_id=user_id)
    live = ApiToken.objects.filter(user_id=user_id, revoked_at__isnull=True).order_by("id")
    audit_record(
        actor=actor,
        action="service_account.delete",
        target_type="user",
        target=username,
        after={
            "owner": account.owner.get_username() if account.owner is not None else None,
            "tokens": list(live.values_list("prefix", flat=True)),
        },
    )
    try:
        with transaction.atomic():
            account.user.delete()
    except ProtectedError as exc:
        raise Conflict(
            f"'{username}' is named by records that are kept (a promotion it requested, say): deactivate it "
            "instead, on the users page, which stops its tokens too"
        ) from exc
    user_access_record(user_id=user_id, before=before, actor=actor)
