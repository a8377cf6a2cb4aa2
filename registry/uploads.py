"""The one way a version is created: :func:`version_upload` streams an upload into storage, checks it, records it.

Every caller comes through here (the REST API's multipart upload, ``modelyard demo``, ``bench/``,
the tests, and the coming UI upload form), so every check applies on every path:

- each file's name (letters, digits, ``.``, ``_``, ``-``; sent once; the ``.onnx`` model first) and
  the number of files (``MODELYARD_MAX_UPLOAD_FILES``);
- the bytes of all the files together (``MODELYARD_MAX_UPLOAD_BYTES``), counted as they stream;
- the model file's structure, sniffed as it streams (empty, not ONNX, truncated), and its IR
  version and opset against what the installed ONNX Runtime loads;
- the description and metadata: a JSON object within ``MODELYARD_MAX_JSON_DEPTH``, together within
  ``MODELYARD_MAX_FORM_BYTES``; either one empty or blank, as a form sends a field left empty, means none;
- the lineage (``source_run_url``, ``source_commit``, ``source_datasets``, ``parent``;
  ``registry/lifecycle/lineage.py``), each empty one not set;
- files byte for byte those of a version of the model are refused, naming it, unless ``allow_duplicate``.

An upload is an :class:`UploadSource`: its files, each a readable stream, in order, then its text
fields, asked for only once every file is stored (a multipart form may send them last). The API
adapts a streamed multipart body to it (``registry/http.py``); :class:`LocalUpload` is
bytes or paths of this process. No file is held whole in memory: each stream is copied to storage
as it is read.

The files go under a fresh key prefix (``registry/artifacts.py``). Until the version's row is
committed, any failure deletes the objects written; from then on they belong to the version, and
its validation is queued.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from django.conf import settings
from django.db import transaction

from onnxkit.sniff import NotOnnx, OnnxSniffer
from registry import artifacts, metrics, queueing, services
from registry.audit.chain import Actor
from registry.errors import (
    FormTooLarge,
    InvalidInput,
    NotAnOnnxModel,
    PayloadTooLarge,
    RegistryError,
    SignatureInvalid,
    StorageDown,
    TooManyFiles,
    UnsupportedModel,
)
from registry.jsondoc import JSONRefused, check_json, load_json
from registry.lifecycle.lineage import lineage_problems
from registry.models import ModelVersion, RegisteredModel, SignatureKind
from registry.provenance import services as provenance
from storage import ArtifactStorage, StorageError, StorageUnavailable, WriteResult, get_storage

FILE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
DESCRIPTION_MAX_CHARS = 10_000
NO_FILES = "no files: send the .onnx model as a multipart 'file' part"


@dataclass(frozen=True)
class UploadFields:
    """The text sent with an upload."""

    description: str = ""
    # A JSON object: a mapping, or its text as a form sends it. None means {}.
    metadata: Mapping[str, Any] | str | None = None
    # The lineage fields sent (registry.lifecycle.lineage.LINEAGE_FIELDS), as text from a form or as values.
    lineage: Mapping[str, Any] = field(default_factory=dict)


class UploadSource(Protocol):
    """Where an upload comes from: a streamed multipart request, local files, a future client."""

    def files(self) -> Iterable[tuple[str, BinaryIO]]:
        """Each file as (name, readable stream), the .onnx model first; a stream is read to its end before the next."""
        ...

    def fields(self) -> UploadFields:
        """The text fields; asked for once every file is stored."""
        ...


@dataclass(frozen=True)
class LocalUpload:
    """An upload from this process; each file is bytes, a path (opened when its turn comes) or an open stream."""

    parts: Sequence[tuple[str, bytes | Path | BinaryIO]]
    description: str = ""
    metadata: Mapping[str, Any] | str | None = None
    lineage: Mapping[str, Any] = field(default_factory=dict)

    def files(self) -> Iterator[tuple[str, BinaryIO]]:
        for name, content in self.parts:
            if isinstance(content, bytes):
                yield name, io.BytesIO(content)
            elif isinstance(content, Path):
                with content.open("rb") as stream:
                    yield name, stream
            else:
                yield name, content

    def fields(self) -> UploadFields:
        return UploadFields(description=self.description, metadata=self.metadata, lineage=self.lineage)


@metrics.timed_upload
def version_upload(
    *,
    model: RegisteredModel,
    source: UploadSource,
    actor: Actor,
    derivation: services.Derivation | None = None,
    allow_duplicate: bool = False,
) -> ModelVersion:
    """Store, check and record one upload as a new ``pending`` version of ``model``; queue its validation.

    ``derivation`` marks a version built from another (``registry/derive/job.py``): it records the
    parent, the recipe and the accuracy delta, and finishes the derive job in the same transaction.
    Files byte for byte those of a version of ``model`` are refused unless ``allow_duplicate`` (a derived
    version is exempt: ``registry.services.version_create`` says why).

    Raises a :class:`~registry.errors.RegistryError` naming what was refused, and then leaves
    nothing behind: no row, and no stored object (short of storage refusing the deletes, when the
    orphan collector removes them later).
    """
    prefix = artifacts.new_upload_prefix(model.name)
    stored: list[services.StoredFile] = []
    bundles: list[tuple[bytes, str]] = []  # the uploader's signature bundle (model.sig), and where it is stored
    files = iter(source.files())
    try:
        _store_files(files, prefix=prefix, stored=stored, bundles=bundles)
        description, metadata, lineage = _checked_fields(source.fields())
        digests = {item.name: item.sha256 for item in stored}
        signatures = [provenance.uploaded_bundle_check(data, digests, key) for data, key in bundles]
        version = services.version_create(
            model=model,
            files=stored,
            description=description,
            metadata=metadata,
            actor=actor,
            derivation=derivation,
            signatures=signatures,
            lineage=lineage,
            allow_duplicate=allow_duplicate,
        )
    except BaseException:
        # Nothing was committed: version_create raised before its commit, or was never reached.
        # The objects written are no one's.
        artifacts.delete_quietly([item.storage_key for item in stored] + [key for _, key in bundles])
        raise
    finally:
        close = getattr(files, "close", None)
        if close is not None:
            close()  # a generator source (LocalUpload's paths) closes what it opened
    # version_create owns its transaction, so this runs at once, or when a test's block commits.
    transaction.on_commit(partial(queueing.validation_enqueue, version.pk))
    return version


# --- Files -------------------------------------------------------------------------------------------


class _ByteBudget:
    """The bytes all files of one upload may have together."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def spend(self, size: int) -> None:
        self.used += size
        if self.used > self.limit:
            raise PayloadTooLarge(f"the upload is larger than the limit of {self.limit} bytes")


class _CheckedReader:
    """A file's stream as storage reads it: counted against the upload's budget and, for the model, sniffed.

    Storage backends may wrap what a read raises (boto3 runs reads in its own threads); ``error``
    keeps the refusal itself, so the caller raises that.
    """

    def __init__(self, raw: BinaryIO, *, name: str, budget: _ByteBudget, sniffer: OnnxSniffer | None) -> None:
        self._raw = raw
        self._name = name
        self._budget = budget
        self._sniffer = sniffer
        self.error: RegistryError | None = None

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        if data:
            try:
                self._budget.spend(len(data))
                if self._sniffer is not None:
                    self._sniffer.feed(data)
            except PayloadTooLarge as exc:
                self.error = exc
                raise
            except NotOnnx as exc:
                self.error = NotAnOnnxModel(f"'{self._name}': {exc}")
                raise self.error from exc
        return data

    def readable(self) -> bool:
        return True

    def check_model(self) -> None:
        """Once the model file is stored: it is whole, and ONNX Runtime here can load its IR version and opsets."""
        assert self._sniffer is not None
        try:
            sniff = self._sniffer.finish()
        except NotOnnx as exc:
            raise NotAnOnnxModel(f"'{self._name}': {exc}") from exc
        # Here, not at the top: onnxkit.validation imports onnx (a second on a slow CPU), and every process
        # imports this module through registry.http's error pages, the inference ones too, which never upload.
        from onnxkit.validation import runtime_limit_errors

        problems = runtime_limit_errors(sniff.ir_version, sniff.opsets)
        if problems:
            raise UnsupportedModel(f"'{self._name}': {' '.join(problems)}")


def _store_files(
    files: Iterator[tuple[str, BinaryIO]],
    *,
    prefix: str,
    stored: list[services.StoredFile],
    bundles: list[tuple[bytes, str]],
) -> None:
    """Check and write each file in turn; ``stored`` and ``bundles`` list what is written, deleted on failure.

    A ``model.sig`` after the model is the uploader's signature bundle, not a file of the version: it
    is kept aside (``bundles``) to be verified once every file's digest is known.
    """
    storage = get_storage()
    max_files = settings.DATA_UPLOAD_MAX_NUMBER_FILES
    budget = _ByteBudget(settings.MAX_UPLOAD_BYTES)
    for name, stream in files:
        if max_files is not None and len(stored) + len(bundles) >= max_files:
            raise TooManyFiles(max_files)
        if name == provenance.UPLOADED_BUNDLE and stored:
            if bundles:
                raise InvalidInput(f"the file '{name}' was sent twice")
            data = stream.read(provenance.MAX_BUNDLE_BYTES + 1)
            if len(data) > provenance.MAX_BUNDLE_BYTES:
                raise SignatureInvalid(
                    f"{name}: larger than {provenance.MAX_BUNDLE_BYTES} bytes; not a signature bundle"
                )
            budget.spend(len(data))
            key = f"{prefix}/{provenance.STORED_NAME[SignatureKind.UPLOADER]}"
            written = _write(
                storage, key, _CheckedReader(io.BytesIO(data), name=name, budget=_ByteBudget(len(data)), sniffer=None)
            )
            bundles.append((data, written.key))
            continue
        _check_file_name(name, first=not stored, taken={item.name for item in stored})
        reader = _CheckedReader(stream, name=name, budget=budget, sniffer=OnnxSniffer() if not stored else None)
        written = _write(storage, f"{prefix}/{name}", reader)
        stored.append(
            services.StoredFile(name=name, storage_key=written.key, sha256=written.sha256, size_bytes=written.size)
        )
        if len(stored) == 1:
            reader.check_model()  # before any other file is sent on to storage
    if not stored:
        raise InvalidInput(NO_FILES)


def _check_file_name(name: str, *, first: bool, taken: set[str]) -> None:
    if not FILE_NAME_PATTERN.match(name):
        raise InvalidInput(
            f"invalid file name {name!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    if name in taken:
        raise InvalidInput(f"the file '{name}' was sent twice")
    if first and not name.lower().endswith(".onnx"):
        raise InvalidInput(f"the first file must be the .onnx model, got '{name}'")


def _write(storage: ArtifactStorage, key: str, reader: _CheckedReader) -> WriteResult:
    try:
        return storage.write(key, reader)  # type: ignore[arg-type]  # a readable stream is all write() needs
    except BaseException as exc:
        if reader.error is not None and reader.error is not exc:
            raise reader.error from None
        if isinstance(exc, StorageUnavailable):
            raise StorageDown(f"artifact storage is unavailable: {exc}") from exc
        if isinstance(exc, StorageError):
            raise StorageDown(f"artifact storage refused the write: {exc}") from exc
        raise


# --- Text fields -------------------------------------------------------------------------------------


def _checked_fields(fields: UploadFields) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The description (trimmed), metadata and lineage, or InvalidInput naming each field that breaks a rule.

    A form sends its fields left empty as empty text: blank metadata, like a blank description or a blank
    lineage field, means none.
    """
    metadata_text = fields.metadata if isinstance(fields.metadata, str) else None
    if metadata_text is not None and not metadata_text.strip():
        metadata_text = None
        fields = UploadFields(description=fields.description, metadata=None, lineage=fields.lineage)
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    sent = len(fields.description.encode()) + _json_size(fields.metadata)
    sent += sum(_json_size(value) for value in fields.lineage.values())
    if limit is not None and sent > limit:
        raise FormTooLarge(limit)
    problems: dict[str, list[str]] = {}
    description = fields.description.strip()
    if problem := _description_problems(description):
        problems["description"] = problem
    metadata: Any = {} if fields.metadata is None else fields.metadata
    try:
        if metadata_text is not None:
            metadata = load_json(metadata_text)
        else:
            check_json(metadata)
    except JSONRefused as exc:
        problems["metadata"] = [f"not valid JSON: {exc}"]
    else:
        if not isinstance(metadata, dict):
            problems["metadata"] = ["metadata must be a JSON object"]
    lineage, lineage_refused = lineage_problems(fields.lineage, form=True)
    problems.update(lineage_refused)
    if problems:
        message = "; ".join(f"{name}: {' '.join(texts)}" for name, texts in problems.items())
        raise InvalidInput(message, problems)
    return description, metadata, lineage


def _json_size(value: Any) -> int:
    """Bytes of a field (the metadata, a lineage field) as a form would send it."""
    if value is None:
        return 0
    return len((value if isinstance(value, str) else json.dumps(value, default=str)).encode())


def _description_problems(description: str) -> list[str]:
    # The wording of the API's other text fields (DRF's CharField), so every field reads alike.
    problems = []
    if len(description) > DESCRIPTION_MAX_CHARS:
        problems.append(f"Ensure this field has no more than {DESCRIPTION_MAX_CHARS} characters.")
    if "\x00" in description:
        problems.append("Null characters are not allowed.")
    surrogate = next((char for char in description if 0xD800 <= ord(char) <= 0xDFFF), None)
    if surrogate is not None:
        problems.append(f"Surrogate characters are not allowed: U+{ord(surrogate):X}.")
    return problems
