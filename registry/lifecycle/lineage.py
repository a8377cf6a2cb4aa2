"""Where a version came from: its training run, its code's commit, its datasets and its parent version.

The four fields are set on upload (``registry.uploads.version_upload`` reads them from the form) or later by
the version's uploader or an admin (``registry.services.version_update``, audited as ``version.lineage``
with only the fields that changed). The parent is ``ModelVersion.derived_from``, which holds two kinds of
parent: the version a derive job built this one from (it has a ``recipe``, and the registry signs a
derivation statement for it), or one its uploader named (no recipe, and nothing signed: the registry
did not see how it was made). A named parent is an earlier, not deleted version of the same model, so
following parents always ends, and the model's versions form a tree (:func:`lineage_tree`).

Also here: :func:`duplicate_of`, the version of a model whose files are byte for byte an upload's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from django.conf import settings

from registry.access.auth import has_role
from registry.audit.chain import Actor, audit_version
from registry.errors import Conflict, InvalidInput, PermissionDenied
from registry.jsondoc import JSONRefused, load_json
from registry.models import ModelVersion, RegisteredModel, Role

LINEAGE_FIELDS = ("source_run_url", "source_commit", "source_datasets", "parent")
RUN_URL_MAX_CHARS = 2048  # the column's length
COMMIT_PATTERN = re.compile(r"[0-9a-fA-F]{7,64}")
DATASET_TEXT_MAX_CHARS = 256

RUN_URL_PROBLEM = "must be an http or https URL"
COMMIT_PROBLEM = "must be a commit hash: 7 to 64 hexadecimal characters"
DATASETS_PROBLEM = 'must be a JSON list of objects {"name": ..., "digest": ...}'
PARENT_PROBLEM = "must be a version number"


class _Bad(ValueError):
    """One field's value breaks its rule; the message says how."""


# --- Checking what was sent ----------------------------------------------------------------------------


def _text(value: Any, problem: str) -> str:
    if not isinstance(value, str):
        raise _Bad(problem)
    return value.strip()


def _run_url(value: Any) -> str:
    url = _text(value, RUN_URL_PROBLEM)
    if not url:
        return ""
    if len(url) > RUN_URL_MAX_CHARS:
        raise _Bad(f"at most {RUN_URL_MAX_CHARS} characters, got {len(url)}")
    try:
        parts = urlsplit(url)
    except ValueError:
        raise _Bad(RUN_URL_PROBLEM) from None
    # No spaces or control characters: the URL is shown as a link, and a link carries none.
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or any(c <= " " for c in url):
        raise _Bad(RUN_URL_PROBLEM)
    return url


def _commit(value: Any) -> str:
    commit = _text(value, COMMIT_PROBLEM)
    if commit and not COMMIT_PATTERN.fullmatch(commit):
        raise _Bad(COMMIT_PROBLEM)
    return commit.lower()


def _datasets(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise _Bad(DATASETS_PROBLEM)
    most = settings.MAX_SOURCE_DATASETS
    if len(value) > most:
        raise _Bad(f"at most {most} datasets (MODELYARD_MAX_SOURCE_DATASETS), got {len(value)}")
    datasets = []
    for index, item in enumerate(value, start=1):
        if not (isinstance(item, dict) and set(item) == {"name", "digest"}):
            raise _Bad(f'item {index} must be an object with a "name" and a "digest", and nothing else')
        name, digest = item["name"], item["digest"]
        if not (isinstance(name, str) and isinstance(digest, str) and name.strip() and digest.strip()):
            raise _Bad(f'item {index}: its "name" and "digest" must be text, not empty')
        if max(len(name.strip()), len(digest.strip())) > DATASET_TEXT_MAX_CHARS:
            raise _Bad(f'item {index}: its "name" and "digest" may have at most {DATASET_TEXT_MAX_CHARS} characters')
        datasets.append({"name": name.strip(), "digest": digest.strip()})
    return datasets


def _json_text(text: str) -> Any:
    try:
        return load_json(text)
    except JSONRefused as exc:
        raise _Bad(f"not valid JSON: {exc}") from None


def _parent(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Bad(PARENT_PROBLEM)
    return value


_CHECKS = {"source_run_url": _run_url, "source_commit": _commit, "source_datasets": _datasets, "parent": _parent}


def lineage_problems(values: Mapping[str, Any], *, form: bool) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The lineage fields among ``values``, checked and tidied, and what is wrong with each refused one.

    ``form``: the values are an upload form's text, where a field sent empty is a field not sent (a
    browser sends every box). Otherwise (an edit) an empty text clears its field, ``[]`` the datasets,
    and ``None`` the parent. A commit is kept in lowercase; the parent is a number, checked against the
    model's versions by :func:`parent_for`.
    """
    checked: dict[str, Any] = {}
    problems: dict[str, list[str]] = {}
    for name in LINEAGE_FIELDS:
        if name not in values:
            continue
        value = values[name]
        if form and (value is None or (isinstance(value, str) and not value.strip())):
            continue
        try:
            if form and name == "source_datasets" and isinstance(value, str):
                value = _json_text(value)
            checked[name] = _CHECKS[name](value)
        except _Bad as exc:
            problems[name] = [str(exc)]
    if form:
        checked = {name: value for name, value in checked.items() if value not in ("", [])}
    return checked, problems


def refusal(problems: Mapping[str, Sequence[str]]) -> InvalidInput:
    """Problems by field as one refusal, worded as the API words its other fields ("field: problem; ...")."""
    message = "; ".join(f"{field}: {' '.join(texts)}" for field, texts in problems.items())
    return InvalidInput(message, dict(problems))


def lineage_checked(values: Mapping[str, Any], *, form: bool) -> dict[str, Any]:
    """:func:`lineage_problems`, raising InvalidInput naming each field that breaks a rule."""
    checked, problems = lineage_problems(values, form=form)
    if problems:
        raise refusal(problems)
    return checked


def parent_for(model: RegisteredModel, number: int, *, child: int | None = None) -> ModelVersion:
    """Version ``number`` of ``model`` as the parent of its version ``child`` (None: a version being uploaded).

    It must exist, not be deleted, and be older than the child: so a chain of parents never comes back.
    """
    if child is not None and number >= child:
        raise refusal({"parent": [f"must be an earlier version than {child}, got {number}"]})
    parent = ModelVersion.objects.filter(model=model, version=number).first()
    if parent is None:
        raise refusal({"parent": [f"model '{model.name}' has no version {number}"]})
    if parent.deleted_at is not None:
        raise refusal({"parent": [f"version {number} of model '{model.name}' is deleted"]})
    return parent


def lineage_of(version: ModelVersion) -> dict[str, Any]:
    """The version's lineage as the API and the audit log write it (the parent as its number)."""
    parent = version.derived_from.version if version.derived_from is not None else None
    return {
        "source_run_url": version.source_run_url,
        "source_commit": version.source_commit,
        "source_datasets": list(version.source_datasets or []),
        "parent": parent,
    }


# --- Changing it -------------------------------------------------------------------------------------------


def lineage_update(version: ModelVersion, values: Mapping[str, Any], *, actor: Actor) -> list[str]:
    """Set the lineage fields of ``values`` that change, and audit them as ``version.lineage``.

    The inner step of ``registry.services.version_update``, inside its transaction with the version's row
    locked; ``values`` are checked here (:func:`lineage_checked`). Only the uploader or an admin may change
    them; a derived version's parent is the registry's record of how it was built and never changes.
    Returns the model fields to save (none when nothing changes, and then nothing is audited).
    """
    checked = lineage_checked(values, form=False)
    before = lineage_of(version)
    changed = {name: value for name, value in checked.items() if before[name] != value}
    if not changed:
        return []
    where = f"version {version.version} of model '{version.model.name}'"
    if version.deleted_at is not None:
        raise Conflict(f"{where} is deleted: its lineage no longer changes")
    user = actor.user
    uploader = version.created_by
    if not (has_role(user, Role.ADMIN) or (uploader is not None and user is not None and user.pk == uploader.pk)):
        who = f"its uploader ({uploader.get_username()})" if uploader is not None else "its uploader"
        raise PermissionDenied(f"only {who} or an admin may change the lineage of {where}")
    fields = [name for name in changed if name != "parent"]
    for name in fields:
        setattr(version, name, changed[name])
    if "parent" in changed:
        if version.recipe:
            raise Conflict(
                f"{where} was derived from version {before['parent']} by the registry "
                f"({version.recipe.get('recipe', 'a recipe')}); its parent does not change"
            )
        number = changed["parent"]
        version.derived_from = None if number is None else parent_for(version.model, number, child=version.version)
        fields.append("derived_from")
    audit_version(
        version,
        actor=actor,
        action="version.lineage",
        before={name: before[name] for name in changed},
        after=changed,
    )
    return fields


# --- Reading it ----------------------------------------------------------------------------------------------


class _File(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def sha256(self) -> str: ...


def duplicate_of(model: RegisteredModel, files: Sequence[_File]) -> ModelVersion | None:
    """The oldest version of ``model``, not deleted, whose files are ``files``: the same names and the same bytes.

    Matched by the digests recorded at upload (the .onnx file's first, then every file's), never by reading
    the bytes again.
    """
    wanted = {(f.name, f.sha256) for f in files}
    candidates = ModelVersion.objects.filter(model=model, sha256=files[0].sha256, deleted_at__isnull=True)
    for candidate in candidates.prefetch_related("files").order_by("version"):
        if {(f.name, f.sha256) for f in candidate.files.all()} == wanted:
            return candidate
    return None


@dataclass(frozen=True)
class TreeNode:
    """One version in its model's derivation tree, ``depth`` parents below a root."""

    version: int
    depth: int
    status: str
    lifecycle: str
    derived: bool  # built by a derive job (it has a recipe), not named by its uploader
    recipe: str


def lineage_tree(model: RegisteredModel) -> list[TreeNode]:
    """Every version of ``model`` in the order of a nested list: each version after its parent, children oldest
    first; versions without a parent are the roots. Walked without recursion: a chain may be long."""
    rows = list(
        ModelVersion.objects.filter(model=model)
        .order_by("version")
        .values("pk", "version", "derived_from_id", "status", "recipe", "archived_at", "deleted_at")
    )
    known = {row["pk"] for row in rows}
    children: dict[int | None, list[Any]] = {}
    for row in rows:
        parent = row["derived_from_id"] if row["derived_from_id"] in known else None
        children.setdefault(parent, []).append(row)
    nodes = []
    stack = [(row, 0) for row in reversed(children.get(None, []))]
    while stack:
        row, depth = stack.pop()
        lifecycle = "deleted" if row["deleted_at"] else ("archived" if row["archived_at"] else "active")
        recipe = row["recipe"] or {}
        nodes.append(
            TreeNode(
                version=row["version"],
                depth=depth,
                status=row["status"],
                lifecycle=lifecycle,
                derived=bool(recipe),
                recipe=str(recipe.get("recipe", "")),
            )
        )
        stack.extend((child, depth + 1) for child in reversed(children.get(row["pk"], [])))
    return nodes
