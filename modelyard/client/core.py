"""The Modelyard client: the registry's REST API and ``/v2`` inference as typed Python methods.

It needs ``requests`` and numpy, nothing of the server: no Django, no Celery, no ONNX. numpy is imported
with the tensors, by the calls that send or receive them (:meth:`Client.infer`), so that the command line's
other commands start without it.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import ssl
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar, overload
from urllib.parse import parse_qsl, quote, urlsplit

import requests

from modelyard.client.config import resolve
from modelyard.client.errors import (
    ApiError,
    ChecksumMismatch,
    ConfigError,
    ConnectionFailed,
    ModelyardError,
    NotFound,
    Unauthorized,
    ValidationFailed,
    WaitTimeout,
    api_error,
)
from modelyard.client.multipart import MultipartBody, Progress
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
    InferenceJob,
    Model,
    Policy,
    PolicyCheck,
    PolicyRule,
    Promotion,
    RetentionPlan,
    RetentionRule,
    Shadow,
    Version,
    Webhook,
)

if TYPE_CHECKING:
    import numpy as np

CONNECT_TIMEOUT = 10.0
E = TypeVar("E", bound=BaseException)
DOWNLOAD_BLOCK = 1 << 20
SAFE_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")  # what the registry accepts as a file name
BUNDLE = "model.sig"  # a signature bundle's name, in an upload and in a pulled folder (model-signing's default)


def file_digests(paths: Iterable[str | os.PathLike[str]]) -> dict[str, str]:
    """Each file's sha256 (hex) by its name, as the registry records them and a signature bundle lists them."""
    digests = {}
    for path in map(Path, paths):
        digest = hashlib.sha256()
        with path.open("rb") as stream:
            while block := stream.read(DOWNLOAD_BLOCK):
                digest.update(block)
        digests[path.name] = digest.hexdigest()
    return digests


def _user_agent() -> str:
    try:
        return f"modelyard-client/{package_version('modelyard')}"
    except PackageNotFoundError:
        return "modelyard-client"


def _error_of(response: requests.Response) -> ApiError:
    """The typed exception for a refusal, with the server's ``error`` and ``detail`` (``/v2`` sends no detail)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        error, detail = body["error"], body.get("detail")
    else:
        text = response.text.strip()[:200]
        error, detail = f"{response.status_code} {response.reason}" + (f": {text}" if text else ""), None
    retry = response.headers.get("Retry-After", "")
    retry_after = float(retry) if retry.replace(".", "", 1).isdigit() else None
    return api_error(response.status_code, error, detail, retry_after=retry_after)


def tls_options(
    ca_bundle: str | os.PathLike[str] | None = None,
    client_cert: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """``requests``' ``verify`` and ``cert`` from the arguments, else ``MODELYARD_CA_BUNDLE``, ``MODELYARD_CLIENT_CERT``
    and ``MODELYARD_CLIENT_KEY``; empty when none is set (then the system's CAs are trusted, as ``requests`` does).

    Given on every request rather than set on the session: ``requests`` lets ``REQUESTS_CA_BUNDLE`` override
    a session's ``verify``, and the CA named here must win.
    """
    ca = ca_bundle or os.environ.get("MODELYARD_CA_BUNDLE") or None
    cert = client_cert or os.environ.get("MODELYARD_CLIENT_CERT") or None
    key = client_key or os.environ.get("MODELYARD_CLIENT_KEY") or None
    options: dict[str, Any] = {}
    for path, what in (
        (ca, "--ca-bundle (MODELYARD_CA_BUNDLE)"),
        (cert, "--client-cert (MODELYARD_CLIENT_CERT)"),
        (key, "--client-key (MODELYARD_CLIENT_KEY)"),
    ):
        if path is not None and not os.path.exists(path):
            raise ConfigError(f"{what} {os.fspath(path)}: no such file")
    if key is not None and cert is None:
        raise ConfigError(
            "--client-key (MODELYARD_CLIENT_KEY) goes with --client-cert CERT.pem (MODELYARD_CLIENT_CERT)"
        )
    if ca is not None:
        options["verify"] = os.fspath(ca)
    if cert is not None:
        options["cert"] = (os.fspath(cert), os.fspath(key)) if key is not None else os.fspath(cert)
    return options


def _inner(exc: BaseException, kind: type[E]) -> E | None:
    """The ``kind`` of error somewhere inside what ``requests`` raised (it wraps it in urllib3's errors), or None."""
    seen: set[int] = set()
    pending: list[Any] = [exc]
    while pending:
        item = pending.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, kind):
            return item
        pending += [*item.args, getattr(item, "reason", None), item.__cause__, item.__context__]
    return None


CLIENT_CERTIFICATE = (
    "pass --client-cert CERT.pem and --client-key KEY.pem (MODELYARD_CLIENT_CERT, MODELYARD_CLIENT_KEY)"
)


def connection_failed(url: str, exc: requests.RequestException, *, client_certificate: bool) -> ConnectionFailed:
    """``cannot reach URL: ...``, saying what to do when TLS was the trouble: a CA to trust, a client certificate.

    A server that requires client certificates may refuse one without saying why: with TLS 1.3 the
    client's handshake is over before the server checks, and the server then just closes the connection.
    """
    found = _inner(exc, ssl.SSLError)
    if isinstance(found, ssl.SSLCertVerificationError):
        return ConnectionFailed(
            f"cannot reach {url}: its TLS certificate is not trusted ({found.verify_message}); pass --ca-bundle "
            "CA.pem (MODELYARD_CA_BUNDLE, Client(ca_bundle=...)) with the certificate authority that signed it"
        )
    if found is not None and "CERTIFICATE_REQUIRED" in str(found).upper().replace(" ", "_"):
        return ConnectionFailed(f"cannot reach {url}: the server requires a client certificate; {CLIENT_CERTIFICATE}")
    closed = isinstance(found, ssl.SSLEOFError | ssl.SSLZeroReturnError) or (
        found is None and _inner(exc, ConnectionResetError) is not None
    )
    if closed and url.startswith("https://") and not client_certificate:
        return ConnectionFailed(
            f"cannot reach {url}: the server closed the connection without answering (a server that requires "
            f"client certificates does so to callers without one: {CLIENT_CERTIFICATE})"
        )
    if found is not None:
        return ConnectionFailed(f"cannot reach {url}: TLS failed ({found.reason or found})")
    return ConnectionFailed(f"cannot reach {url}: {exc}")


def _q(part: str | int) -> str:
    return quote(str(part), safe="")


def _rule(keep_last: int | None, keep_days: int | None, then: str | None) -> dict[str, Any]:
    """A retention rule's JSON: the values given (the server names any that is missing or wrong)."""
    rule = {"keep_last": keep_last, "keep_days": keep_days, "then": then}
    return {key: value for key, value in rule.items() if value is not None}


class Client:
    """One server and one identity. ``url`` and ``token`` default to ``MODELYARD_URL`` and ``MODELYARD_TOKEN``,
    then to the saved profile (``profile``, else ``MODELYARD_PROFILE``, else ``default``; see ``modelyard login``).

    Every refusal raises a subclass of :class:`~modelyard.client.errors.ApiError` carrying the server's
    ``error`` and ``detail``.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        profile: str | None = None,
        timeout: float = 300.0,
        session: requests.Session | None = None,
        ca_bundle: str | os.PathLike[str] | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
    ) -> None:
        files = {"ca_bundle": ca_bundle, "client_cert": client_cert, "client_key": client_key}
        target = resolve(url=url, token=token, profile=profile, tls=files)
        self.url = target.url
        self.profile = target.profile
        self.timeout = timeout
        self.tls = tls_options(**target.tls)
        self.session = session or requests.Session()
        self.session.headers["User-Agent"] = _user_agent()
        if target.token:
            self.session.headers["Authorization"] = f"Bearer {target.token}"

    def __repr__(self) -> str:  # never the token
        return f"Client(url={self.url!r}, profile={self.profile!r})"

    # --- HTTP ---------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
        stream: bool = False,
        timeout: float | None = None,
    ) -> requests.Response:
        """One request to ``path`` (under the server's URL); raises the typed error of a 4xx or 5xx answer."""
        try:
            response = self.session.request(
                method,
                self.url + path,
                params={k: v for k, v in (params or {}).items() if v is not None and v != ""},
                json=json_body,
                data=data,
                headers=dict(headers or {}),
                stream=stream,
                timeout=(CONNECT_TIMEOUT, timeout or self.timeout),
                allow_redirects=False,
                **self.tls,
            )
        except requests.RequestException as exc:
            raise connection_failed(self.url, exc, client_certificate="cert" in self.tls) from exc
        if response.status_code >= 400:
            with response:
                raise _error_of(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        return response.json() if response.content else None

    def _pages(self, path: str, params: Mapping[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Every item of a paginated list, following ``next`` (page numbers or audit cursors) to the end."""
        query: dict[str, Any] = dict(params or {})
        while True:
            body = self._json("GET", path, params=query)
            if isinstance(body, list):  # an unpaginated list
                yield from body
                return
            yield from body["results"]
            if not body.get("next"):
                return
            query = dict(parse_qsl(urlsplit(body["next"]).query))  # same path: the server's host may differ

    # --- Models and versions -------------------------------------------------------------------------

    def list_models(self, *, query: str = "", tag: str = "") -> list[Model]:
        return [Model.from_json(item) for item in self._pages("/api/v1/models", {"q": query, "tag": tag})]

    def get_model(self, name: str) -> Model:
        return Model.from_json(self._json("GET", f"/api/v1/models/{_q(name)}"))

    def create_model(self, name: str, *, description: str = "", tags: Sequence[str] = ()) -> Model:
        body = {"name": name, "description": description, "tags": list(tags)}
        return Model.from_json(self._json("POST", "/api/v1/models", json_body=body))

    def update_model(self, name: str, **changes: Any) -> Model:
        """Change ``description``, ``tags``, ``serving_strategy``, ``max_batch_size``, ``instances``..."""
        return Model.from_json(self._json("PATCH", f"/api/v1/models/{_q(name)}", json_body=changes))

    def list_versions(self, name: str, *, status: str = "", lifecycle: str = "") -> list[Version]:
        """A model's versions, newest first; ``lifecycle``: active (the default), archived, deleted or all."""
        path = f"/api/v1/models/{_q(name)}/versions"
        return [Version.from_json(item) for item in self._pages(path, {"status": status, "lifecycle": lifecycle})]

    def resolve_version(self, name: str, version_or_alias: int | str) -> int:
        """A version number, or the version an alias points to now."""
        text = str(version_or_alias)
        if text.isdigit():
            return int(text)
        alias = self.get_alias(name, text)
        if alias.version is None:
            raise NotFound(f"alias '{text}' of model '{name}' points to no version yet", status=404)
        return alias.version

    def get_version(self, name: str, version: int | str) -> Version:
        number = self.resolve_version(name, version)
        return Version.from_json(self._json("GET", f"/api/v1/models/{_q(name)}/versions/{number}"))

    def update_version(
        self, name: str, version: int | str, *, description: str | None = None, tags: Sequence[str] | None = None
    ) -> Version:
        """Change a version's ``description`` or ``tags`` (None leaves it as it is); needs the maintainer role.

        The files and metadata of a version never change. The server audits the change.
        """
        number = self.resolve_version(name, version)
        changes: dict[str, Any] = {}
        if description is not None:
            changes["description"] = description
        if tags is not None:
            changes["tags"] = list(tags)
        path = f"/api/v1/models/{_q(name)}/versions/{number}"
        return Version.from_json(self._json("PATCH", path, json_body=changes))

    def push(
        self,
        name: str,
        path: str | os.PathLike[str],
        extra_files: Iterable[str | os.PathLike[str]] = (),
        *,
        description: str = "",
        metadata: Mapping[str, Any] | str | None = None,
        progress: Progress | None = None,
        create_model: bool = True,
        signature: bytes | None = None,
        source_run_url: str = "",
        source_commit: str = "",
        source_datasets: Sequence[Mapping[str, str]] = (),
        parent: int | None = None,
        allow_duplicate: bool = False,
    ) -> Version:
        """Upload a new version: the ``.onnx`` file, then its external data and extras, streamed from disk.

        ``progress(sent, total)`` is called as bytes go out. The model is created first when it does
        not exist (unless ``create_model`` is false). The answer comes once the server has stored and
        recorded the files: the version is ``pending`` (a worker validates it) or already ``ready``
        or ``failed`` (validated in the upload request); :meth:`wait_ready` waits for the outcome.

        ``signature`` is the uploader's OpenSSF Model Signing bundle over the files (by name and
        sha256; :func:`file_digests`), sent as a ``model.sig`` part after them. The server refuses
        the upload (400, naming why) unless it verifies with a key of ``MODELYARD_TRUSTED_SIGNERS``
        and signs exactly the files sent.

        The lineage: ``source_run_url`` (the training run), ``source_commit`` (the code's commit, 7 to 64
        hex characters), ``source_datasets`` (``{"name", "digest"}`` each) and ``parent`` (the number of the
        version of this model it came from); :meth:`set_lineage` changes them later. Files byte for byte
        those of a version of the model are refused (:class:`~modelyard.client.errors.Conflict`, its
        ``detail["version"]`` naming it) unless ``allow_duplicate``.
        """
        files = [Path(path), *(Path(extra) for extra in extra_files)]
        for file in files:
            if not file.is_file():
                raise ModelyardError(f"{file}: no such file")
        if signature is not None and BUNDLE in {file.name for file in files}:
            raise ModelyardError(f"{BUNDLE} is the signature sent with the files: leave the file out, or sign none")
        if create_model:
            try:
                self.get_model(name)
            except NotFound:
                try:
                    self.create_model(name)
                except ApiError as exc:
                    if exc.status != 409:  # someone created it meanwhile: fine
                        raise
        fields: list[tuple[str, str]] = []
        if description:
            fields.append(("description", description))
        if metadata is not None:
            fields.append(("metadata", metadata if isinstance(metadata, str) else json.dumps(metadata)))
        if source_run_url:
            fields.append(("source_run_url", source_run_url))
        if source_commit:
            fields.append(("source_commit", source_commit))
        if source_datasets:
            fields.append(("source_datasets", json.dumps([dict(item) for item in source_datasets])))
        if parent is not None:
            fields.append(("parent", str(parent)))
        parts: list[tuple[str, Path | bytes]] = [(file.name, file) for file in files]
        if signature is not None:
            parts.append((BUNDLE, signature))
        body = MultipartBody(fields, parts, progress=progress)
        answer = self._json(
            "POST",
            f"/api/v1/models/{_q(name)}/versions",
            params={"allow_duplicate": "true" if allow_duplicate else None},
            data=body,
            headers={"Content-Type": body.content_type},
        )
        return Version.from_json(answer)

    def set_lineage(
        self,
        name: str,
        version: int | str,
        *,
        source_run_url: str | None = None,
        source_commit: str | None = None,
        source_datasets: Sequence[Mapping[str, str]] | None = None,
        parent: int | None = None,
        clear_parent: bool = False,
    ) -> Version:
        """Change a version's lineage: None leaves a field as it is, ``""`` clears a text, ``[]`` the datasets,
        ``clear_parent`` the parent. Only the version's uploader or an admin may; the server audits it
        (``version.lineage``). A parent is an earlier, not deleted version of the same model."""
        if clear_parent and parent is not None:
            raise ModelyardError("give a parent or clear_parent, not both")
        number = self.resolve_version(name, version)
        changes: dict[str, Any] = {}
        if source_run_url is not None:
            changes["source_run_url"] = source_run_url
        if source_commit is not None:
            changes["source_commit"] = source_commit
        if source_datasets is not None:
            changes["source_datasets"] = [dict(item) for item in source_datasets]
        if parent is not None or clear_parent:
            changes["parent"] = parent
        path = f"/api/v1/models/{_q(name)}/versions/{number}"
        return Version.from_json(self._json("PATCH", path, json_body=changes))

    def card(self, name: str, version: int | str) -> str:
        """The version's model card, in Markdown: summary, signature, validation, benchmarks, accuracy deltas,
        provenance, lineage, promotion history and when it served (a deleted version's: its tombstone)."""
        number = self.resolve_version(name, version)
        response = self.request("GET", f"/api/v1/models/{_q(name)}/versions/{number}/card")
        response.encoding = "utf-8"
        return response.text

    def wait_ready(self, name: str, version: int, *, timeout: float = 600.0, interval: float = 0.5) -> Version:
        """Poll until validation has decided; returns the ready version, raises :class:`ValidationFailed`."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.get_version(name, version)
            if found.status == "ready":
                return found
            if found.status == "failed":
                raise ValidationFailed(name, found.version, list(found.errors))
            if time.monotonic() >= deadline:
                raise WaitTimeout(f"version {version} of '{name}' is still {found.status} after {timeout:g} s")
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
            interval = min(interval * 1.5, 5.0)

    def pull(
        self, name: str, version_or_alias: int | str, dest: str | os.PathLike[str], *, progress: Progress | None = None
    ) -> Path:
        """Download every file of a version into ``dest`` and check each sha256; returns the ``.onnx`` file's path.

        External-data files land next to the ``.onnx`` under the names it refers to, so ONNX Runtime
        loads the model from there. A file whose sha256 does not match is deleted and raises
        :class:`ChecksumMismatch`.
        """
        version = self.get_version(name, version_or_alias)
        folder = Path(dest)
        folder.mkdir(parents=True, exist_ok=True)
        files = version.files
        total, done = sum(f.size_bytes for f in files), 0
        for file in files:
            if not SAFE_FILE_NAME.match(file.name):
                raise ModelyardError(f"refusing to write a file named {file.name!r} outside {folder}")
            partial = folder / f".{file.name}.part"
            digest = hashlib.sha256()
            path = f"/api/v1/models/{_q(name)}/versions/{version.version}/download"
            with (
                self.request("GET", path, params={"file": file.name}, stream=True) as response,
                partial.open("wb") as out,
            ):
                for block in response.iter_content(DOWNLOAD_BLOCK):
                    digest.update(block)
                    out.write(block)
                    done += len(block)
                    if progress is not None:
                        progress(done, total)
            if digest.hexdigest() != file.sha256:
                partial.unlink()
                raise ChecksumMismatch(
                    f"{file.name} of '{name}' version {version.version}: sha256 {digest.hexdigest()}, "
                    f"expected {file.sha256}; the file was not kept"
                )
            partial.replace(folder / file.name)
        return folder / version.model_file.name

    # --- Provenance ----------------------------------------------------------------------------------

    def signing_keys(self) -> dict[str, Any]:
        """The registry's public keys (``keys``: id, name, current, pem) and the uploaders it trusts.

        Keys fetched from the server prove only that the server signed: pin a key you got elsewhere
        to check that the registry you trust did.
        """
        return dict(self._json("GET", "/api/v1/signing-keys"))

    def provenance(self, name: str, version: int | str) -> dict[str, Any]:
        """Who signed the version, its derivation statement, each bundle checked by the server now."""
        number = self.resolve_version(name, version)
        return dict(self._json("GET", f"/api/v1/models/{_q(name)}/versions/{number}/provenance"))

    def signature_bundle(self, name: str, version: int | str, file: str = BUNDLE) -> bytes:
        """A signature bundle of the version: ``model.sig`` (the registry's, over every file), ``uploader.sig``,
        ``derivation.sig``; :class:`NotFound` when the version has none."""
        number = self.resolve_version(name, version)
        path = f"/api/v1/models/{_q(name)}/versions/{number}/download"
        return self.request("GET", path, params={"file": file}).content

    # --- Aliases and promotions ------------------------------------------------------------------------

    def list_aliases(self, name: str) -> list[Alias]:
        return [Alias.from_json(item) for item in self._json("GET", f"/api/v1/models/{_q(name)}/aliases")]

    def get_alias(self, name: str, alias: str) -> Alias:
        return Alias.from_json(self._json("GET", f"/api/v1/models/{_q(name)}/aliases/{_q(alias)}"))

    def update_alias(self, name: str, alias: str, **changes: Any) -> Alias:
        """Change an alias's settings (admins): ``require_signature``, ``trusted_signers``, the policy
        (``max_slowdown_percent``, ``min_cosine``, ``max_abs_diff``), or ``protected`` and ``served`` on their own."""
        return Alias.from_json(self._json("PATCH", f"/api/v1/models/{_q(name)}/aliases/{_q(alias)}", json_body=changes))

    def promote(
        self,
        name: str,
        alias: str,
        version: int,
        *,
        reason: str = "",
        force: bool = False,
        wait: float | None = None,
    ) -> AliasMove | Promotion | None:
        """Point ``alias`` at ``version``: the move, the pending request of a protected alias, or None if already there.

        With ``wait`` (seconds), a move returns once every live inference process serves it, or raises
        :class:`~modelyard.client.errors.GatewayTimeout` naming the laggards (the alias has moved).
        """
        response = self.request(
            "PUT",
            f"/api/v1/models/{_q(name)}/aliases/{_q(alias)}",
            params={"wait": wait},
            json_body={"version": version, "reason": reason, "force": force},
            timeout=self.timeout + (wait or 0),
        )
        body = response.json()
        if response.status_code == 202:
            return Promotion.from_json(body)
        return AliasMove.from_json(body["move"]) if body.get("move") else None

    def list_promotions(self, *, state: str = "", model: str = "", kind: str = "") -> list[Promotion]:
        params = {"state": state, "model": model, "kind": kind}
        return [Promotion.from_json(item) for item in self._pages("/api/v1/promotions", params)]

    def get_promotion(self, promotion_id: int) -> Promotion:
        return Promotion.from_json(self._json("GET", f"/api/v1/promotions/{int(promotion_id)}"))

    def approve(self, promotion_id: int, *, reason: str = "", wait: float | None = None) -> Promotion:
        """Approve another person's request (the approver role); with ``wait``, until the fleet serves the version."""
        body = self._json(
            "POST",
            f"/api/v1/promotions/{int(promotion_id)}/approve",
            params={"wait": wait},
            json_body={"reason": reason},
            timeout=self.timeout + (wait or 0),
        )
        return Promotion.from_json(body)

    def reject(self, promotion_id: int, *, reason: str = "") -> Promotion:
        path = f"/api/v1/promotions/{int(promotion_id)}/reject"
        return Promotion.from_json(self._json("POST", path, json_body={"reason": reason}))

    def cancel(self, promotion_id: int, *, reason: str = "") -> Promotion:
        path = f"/api/v1/promotions/{int(promotion_id)}/cancel"
        return Promotion.from_json(self._json("POST", path, json_body={"reason": reason}))

    def rollback(self, name: str, alias: str, *, reason: str = "") -> AliasMove:
        path = f"/api/v1/models/{_q(name)}/aliases/{_q(alias)}/rollback"
        return AliasMove.from_json(self._json("POST", path, json_body={"reason": reason}))

    @overload
    def history(self, name: str, alias: str) -> list[AliasMove]: ...

    @overload
    def history(self, name: str, alias: str, *, at: datetime | str) -> AliasAt: ...

    def history(self, name: str, alias: str, *, at: datetime | str | None = None) -> list[AliasMove] | AliasAt:
        """Every move of an alias, oldest first; with ``at`` (aware datetime or ISO text), the version served then."""
        path = f"/api/v1/models/{_q(name)}/aliases/{_q(alias)}/history"
        if at is None:
            return [AliasMove.from_json(item) for item in self._json("GET", path)]
        when = at.isoformat() if isinstance(at, datetime) else at
        return AliasAt.from_json(self._json("GET", path, params={"at": when}))

    # --- Shadow traffic ------------------------------------------------------------------------------------

    def _shadow_path(self, name: str, alias: str) -> str:
        return f"/api/v1/models/{_q(name)}/aliases/{_q(alias)}/shadow"

    def shadow_start(self, name: str, alias: str, version: int, *, sample: float | None = None) -> Shadow:
        """Mirror a ``sample`` of a served alias's requests (the server's default: 0.1) to ``version`` (maintainers).

        The inference processes run the candidate after the serving version has answered and count
        how the two agree; a shadow already running on the alias ends. Refused with
        :class:`~modelyard.client.errors.Conflict` when the version is not ready, or the alias is not
        served, points to no version, or serves ``version`` already.
        """
        body: dict[str, Any] = {"version": int(version)}
        if sample is not None:
            body["sample"] = sample
        return Shadow.from_json(self._json("PUT", self._shadow_path(name, alias), json_body=body))

    # --- A version's life after release ------------------------------------------------------------------

    def _version_action(self, name: str, version: int | str, action: str, reason: str) -> Version:
        number = self.resolve_version(name, version)
        path = f"/api/v1/models/{_q(name)}/versions/{number}/{action}"
        return Version.from_json(self._json("POST", path, json_body={"reason": reason}))

    def archive(self, name: str, version: int | str, *, reason: str = "") -> Version:
        """Hide a version from lists and from promotion, keeping its bytes (maintainers)."""
        return self._version_action(name, version, "archive", reason)

    def unarchive(self, name: str, version: int | str, *, reason: str = "") -> Version:
        return self._version_action(name, version, "unarchive", reason)

    def hold(self, name: str, version: int | str, *, reason: str) -> Version:
        """Place a legal hold: nobody and no retention rule may delete the version (admins and auditors)."""
        return self._version_action(name, version, "hold", reason)

    def release(self, name: str, version: int | str, *, reason: str) -> Version:
        """Release a legal hold (admins and auditors)."""
        return self._version_action(name, version, "release", reason)

    def delete_version(self, name: str, version: int, *, reason: str) -> Version:
        """Delete a version (admins): its files go, its row stays a tombstone; :class:`Conflict` says what uses it."""
        path = f"/api/v1/models/{_q(name)}/versions/{int(version)}"
        return Version.from_json(self._json("DELETE", path, json_body={"reason": reason}))

    def delete_model(self, name: str, *, reason: str) -> None:
        """Delete a model whose versions are all deleted, or that has none (admins)."""
        self.request("DELETE", f"/api/v1/models/{_q(name)}", json_body={"reason": reason})

    def clear_alias(self, name: str, alias: str, *, reason: str = "") -> Alias:
        """Point an unprotected alias at nothing (maintainers); its history stays."""
        path = f"/api/v1/models/{_q(name)}/aliases/{_q(alias)}"
        return Alias.from_json(self._json("DELETE", path, json_body={"reason": reason}))

    def shadow(self, name: str, alias: str) -> Shadow:
        """The alias's running shadow and its report, else its last one (:class:`NotFound` if never shadowed)."""
        return Shadow.from_json(self._json("GET", self._shadow_path(name, alias)))

    def shadow_stop(self, name: str, alias: str, *, reason: str = "") -> Shadow:
        """End the alias's running shadow (maintainers): the shadow with its final report; :class:`NotFound` if none."""
        return Shadow.from_json(self._json("DELETE", self._shadow_path(name, alias), json_body={"reason": reason}))

    # --- Promotion policies ----------------------------------------------------------------------------------

    def _policy_path(self, name: str, alias: str) -> str:
        return f"/api/v1/models/{_q(name)}/aliases/{_q(alias)}/policy"

    def policy(self, name: str, alias: str) -> Policy:
        """The alias's promotion policy in force (its built-in one, number 0, until one is written) and a change
        waiting for approval; :class:`NotFound` for an alias the model lacks."""
        return Policy.from_json(self._json("GET", self._policy_path(name, alias)))

    def policy_set(
        self, name: str, alias: str, rules: Iterable[Mapping[str, Any] | PolicyRule], *, reason: str = ""
    ) -> Policy:
        """Write a new version of the alias's policy (maintainers): ``rules`` of ``name``, ``expr`` and ``message``.

        On an unprotected alias it is in force at once: the new policy. On a protected one it waits for
        a second person's approval: the policy still in force, with ``promotion`` the request's id and
        ``pending`` the new one. A rule that does not compile raises
        :class:`~modelyard.client.errors.BadRequest` whose ``detail`` names the ``rule``, ``line`` and
        ``column``. Rules read with :meth:`policy` may be sent back as they are (built-in ones too).
        """
        body = {
            "rules": [
                {"name": rule.name, "expr": rule.expr, "message": rule.message}
                if isinstance(rule, PolicyRule)
                else dict(rule)
                for rule in rules
            ],
            "reason": reason,
        }
        return Policy.from_json(self._json("PUT", self._policy_path(name, alias), json_body=body))

    def policy_evaluate(self, name: str, alias: str, version: int) -> PolicyCheck:
        """What the alias's policy says now of promoting ``version`` there, with you as the requester; changes nothing.

        Rules that refer to ``approvals`` are ``waiting`` (decided at approval), so such a policy never
        ``passed`` here.
        """
        path = self._policy_path(name, alias) + "/evaluate"
        return PolicyCheck.from_json(self._json("POST", path, json_body={"version": int(version)}))

    # --- Retention rules ---------------------------------------------------------------------------------

    def _retention_path(self, name: str) -> str:
        return f"/api/v1/models/{_q(name)}/retention"

    def retention(self, name: str) -> RetentionRule | None:
        """The model's retention rule, or None when it has none."""
        rule = self._json("GET", self._retention_path(name))["rule"]
        return None if rule is None else RetentionRule.from_json(rule)

    def retention_set(self, name: str, *, keep_last: int, keep_days: int, then: str | None = None) -> RetentionRule:
        """Set the model's retention rule (maintainers; ``then="delete"``: admins); ``then`` defaults to archive.

        A rule that is not one raises :class:`~modelyard.client.errors.BadRequest` whose ``detail`` names the
        ``field``. The periodic job applies it; :meth:`retention_preview` says what it would do first.
        """
        answer = self._json("PUT", self._retention_path(name), json_body=_rule(keep_last, keep_days, then))
        return RetentionRule.from_json(answer["rule"])

    def retention_clear(self, name: str) -> None:
        """Remove the model's retention rule (maintainers): no rule archives or deletes its versions any more."""
        self.request("DELETE", self._retention_path(name))

    def retention_preview(
        self, name: str, *, keep_last: int | None = None, keep_days: int | None = None, then: str | None = None
    ) -> RetentionPlan:
        """What the model's rule, or the rule given here (``keep_last`` and ``keep_days``, not saved), would do now:
        the versions it archives or deletes and those it spares, each with why. Changes nothing.

        Without a rule given, the model's own; :class:`~modelyard.client.errors.Conflict` if it has none.
        """
        given = keep_last is not None or keep_days is not None or then is not None
        body = _rule(keep_last, keep_days, then) if given else None
        return RetentionPlan.from_json(self._json("POST", self._retention_path(name) + "/preview", json_body=body))

    # --- Audit -------------------------------------------------------------------------------------------

    def audit(
        self,
        *,
        actor: str = "",
        action: str = "",
        model: str = "",
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        order: str = "-seq",
        page_size: int = 500,
    ) -> Iterator[AuditEvent]:
        """Every audit event that matches, across all pages (the auditor or admin role); newest first by default."""
        params = {
            "actor": actor,
            "action": action,
            "model": model,
            "since": since.isoformat() if isinstance(since, datetime) else since,
            "until": until.isoformat() if isinstance(until, datetime) else until,
            "order": order,
            "page_size": page_size,
        }
        for item in self._pages("/api/v1/audit", params):
            yield AuditEvent.from_json(item)

    def export_audit(self, out: IO[bytes], *, format: str = "jsonl", **filters: Any) -> int:
        """Stream the matching events in seq order as ``csv`` or ``jsonl`` into ``out``; returns the bytes written."""
        params = {key: value.isoformat() if isinstance(value, datetime) else value for key, value in filters.items()}
        written = 0
        with self.request("GET", "/api/v1/audit/export", params={**params, "format": format}, stream=True) as response:
            for block in response.iter_content(DOWNLOAD_BLOCK):
                out.write(block)
                written += len(block)
        return written

    def verify_audit(self) -> AuditVerdict:
        """Recompute the hash chain on the server: ``ok``, events ``checked``, and the first bad one."""
        return AuditVerdict.from_json(self._json("GET", "/api/v1/audit/verify"))

    # --- Inference (/v2) ---------------------------------------------------------------------------------

    def _v2_path(self, name: str, version: int | str | None) -> str:
        path = f"/v2/models/{_q(name)}"
        return path if version is None else f"{path}/versions/{_q(version)}"

    def model_metadata(self, name: str, version: int | str | None = None) -> dict[str, Any]:
        """``GET /v2/models/{name}``: its inputs and outputs (datatype, shape with -1 for dynamic dimensions)."""
        return dict(self._json("GET", self._v2_path(name, version)))

    def infer(
        self,
        name: str,
        inputs: Mapping[str, Any],
        *,
        version: int | str | None = None,
        outputs: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the model (its ``production`` alias, or ``version``: a number or a served alias) on numpy inputs.

        Inputs and outputs travel as binary tensors; each array's dtype must be the input's datatype
        (float32 for FP32, and so on; strings or bytes for BYTES).
        """
        from modelyard.client import tensors

        body, header_length = tensors.encode_request(inputs, outputs)
        response = self.request(
            "POST",
            self._v2_path(name, version) + "/infer",
            data=body,
            headers={"Content-Type": "application/octet-stream", tensors.HEADER_LENGTH: str(header_length)},
        )
        return tensors.decode_response(response.content, response.headers.get(tensors.HEADER_LENGTH))

    # --- Webhooks (admins) ----------------------------------------------------------------------------------

    def list_webhooks(self) -> list[Webhook]:
        return [Webhook.from_json(item) for item in self._pages("/api/v1/webhooks")]

    def create_webhook(
        self,
        url: str,
        events: Sequence[str],
        *,
        model: str | None = None,
        secret: str | None = None,
        active: bool = True,
    ) -> tuple[Webhook, str | None]:
        """Register an endpoint; returns it and the generated secret (None when ``secret`` was given)."""
        body: dict[str, Any] = {"url": url, "events": list(events), "model": model, "active": active}
        if secret is not None:
            body["secret"] = secret
        answer = self._json("POST", "/api/v1/webhooks", json_body=body)
        return Webhook.from_json(answer), answer.get("secret")

    def update_webhook(self, webhook_id: int, **changes: Any) -> Webhook:
        """Change ``url``, ``events``, ``model``, ``active`` or ``secret``."""
        return Webhook.from_json(self._json("PATCH", f"/api/v1/webhooks/{int(webhook_id)}", json_body=changes))

    def delete_webhook(self, webhook_id: int) -> None:
        self.request("DELETE", f"/api/v1/webhooks/{int(webhook_id)}")

    def webhook_deliveries(self, webhook_id: int, *, status: str = "") -> list[Delivery]:
        path = f"/api/v1/webhooks/{int(webhook_id)}/deliveries"
        return [Delivery.from_json(item) for item in self._pages(path, {"status": status})]

    # --- Derived versions and benchmarks ------------------------------------------------------------------

    def derive(
        self,
        name: str,
        version: int | str,
        recipe: str,
        *,
        options: Mapping[str, Any] | None = None,
        wait: float | None = None,
        interval: float = 0.5,
    ) -> DeriveJob:
        """Ask for a derived version (``fp16``, ``int8-dynamic``, ``ort-optimized``; the maintainer role).

        Returns the job; with ``wait`` (seconds), once it has finished and its new version has been
        validated. A failed job is returned as it is (``status`` and ``error``); raises
        :class:`~modelyard.client.errors.WaitTimeout` when ``wait`` runs out first.
        """
        number = self.resolve_version(name, version)
        path = f"/api/v1/models/{_q(name)}/versions/{number}/derive"
        job = DeriveJob.from_json(
            self._json("POST", path, json_body={"recipe": recipe, "options": dict(options or {})})
        )
        if wait is None:
            return job
        deadline = time.monotonic() + wait
        while job.status in ("pending", "running"):
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"deriving {recipe} from version {number} of '{name}' is still {job.status} after {wait:g} s"
                )
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
            interval = min(interval * 1.5, 5.0)
            job = self.get_derive_job(job.id)
        if job.status == "succeeded" and job.version is not None:
            self.wait_ready(name, job.version, timeout=max(0.0, deadline - time.monotonic()))
        return job

    def get_derive_job(self, job_id: int) -> DeriveJob:
        return DeriveJob.from_json(self._json("GET", f"/api/v1/derive-jobs/{int(job_id)}"))

    def list_derive_jobs(self, name: str, version: int | str) -> list[DeriveJob]:
        number = self.resolve_version(name, version)
        answer = self._json("GET", f"/api/v1/models/{_q(name)}/versions/{number}/derive")
        return [DeriveJob.from_json(item) for item in answer]

    def benchmarks(self, name: str, version: int | str) -> list[Benchmark]:
        """A version's benchmark runs, one per provider the fleet serves it with."""
        number = self.resolve_version(name, version)
        answer = self._json("GET", f"/api/v1/models/{_q(name)}/versions/{number}/benchmarks")
        return [Benchmark.from_json(item) for item in answer]

    def rerun_benchmarks(self, name: str, version: int | str) -> list[Benchmark]:
        """Queue the version's benchmarks again (the maintainer role); the inference processes take them."""
        number = self.resolve_version(name, version)
        answer = self._json("POST", f"/api/v1/models/{_q(name)}/versions/{number}/benchmarks")
        return [Benchmark.from_json(item) for item in answer]

    # --- Asynchronous inference ------------------------------------------------------------------------------

    def submit_job(
        self,
        model: str,
        input: str | os.PathLike[str] | None = None,
        *,
        alias: str | None = None,
        version: int | None = None,
        format: str | None = None,
        outputs: Sequence[str] = (),
        result_format: str | None = None,
        input_url: str | None = None,
        progress: Progress | None = None,
    ) -> InferenceJob:
        """Run ``model`` over every row of a file, asynchronously (the inference role); returns the queued job.

        ``input`` is a local file, streamed up (``progress(sent, total)`` as it goes): an ``.npz`` with one
        array per model input (first dimension: rows), a ``.jsonl`` of v2 request bodies, or a ``.txt`` of
        texts, one a line (a model with a tokenizer); ``format`` names it when the suffix does not.
        ``input_url`` names a key of the server's artifact store instead. The version (``alias``,
        default ``production``, or ``version``) is fixed when the server accepts the job.
        """
        if (input is None) == (input_url is None):
            raise ModelyardError("give an input file or an input_url (a key of the server's store), one of them")
        fields: list[tuple[str, str]] = [("model", model)]
        for name, value in (("alias", alias), ("version", version), ("format", format)):
            if value is not None and value != "":
                fields.append((name, str(value)))
        fields += [("outputs", output) for output in outputs]
        if result_format:
            fields.append(("result_format", result_format))
        if input_url is not None:
            return InferenceJob.from_json(
                self._json(
                    "POST",
                    "/api/v1/inference-jobs",
                    json_body={**dict(fields), "outputs": list(outputs), "input_url": input_url},
                )
            )
        path = Path(input)  # type: ignore[arg-type]  # not None: checked above
        if not path.is_file():
            raise ModelyardError(f"{path}: no such file")
        # The fields go first: the server reads them before it stores the input.
        body = MultipartBody(fields, [(path.name, path)], file_field="input", progress=progress)
        answer = self._json("POST", "/api/v1/inference-jobs", data=body, headers={"Content-Type": body.content_type})
        return InferenceJob.from_json(answer)

    def job(self, job_id: str) -> InferenceJob:
        """An inference job, as it is now."""
        return InferenceJob.from_json(self._json("GET", f"/api/v1/inference-jobs/{_q(job_id)}"))

    def jobs(self, *, state: str = "", model: str = "") -> list[InferenceJob]:
        """Your inference jobs, newest first (an admin's or auditor's: everyone's); filtered by state or model."""
        pages = self._pages("/api/v1/inference-jobs", {"state": state, "model": model})
        return [InferenceJob.from_json(item) for item in pages]

    def wait_job(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
        interval: float = 0.5,
        progress: Callable[[InferenceJob], None] | None = None,
    ) -> InferenceJob:
        """Poll until the job has ended (succeeded, failed or cancelled) and return it; ``progress(job)`` on each look.

        A failed or cancelled job is returned as it is; :class:`WaitTimeout` when ``timeout`` seconds pass first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            found = self.job(job_id)
            if progress is not None:
                progress(found)
            if found.ended:
                return found
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"inference job {job_id} is still {found.state} after {timeout:g} s")
            pause = interval if deadline is None else min(interval, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            interval = min(interval * 1.5, 5.0)

    def fetch_job_result(self, job_id: str, dest: str | os.PathLike[str], *, progress: Progress | None = None) -> Path:
        """Download a succeeded job's result (an ``.npz`` or JSON Lines) to ``dest``; returns its path.

        The file is written beside ``dest`` first and moved there once whole.
        """
        target = Path(dest)
        partial = target.with_name(f".{target.name}.part")
        with (
            self.request("GET", f"/api/v1/inference-jobs/{_q(job_id)}/result", stream=True) as response,
            partial.open("wb") as out,
        ):
            total, done = int(response.headers.get("Content-Length") or 0), 0
            for block in response.iter_content(DOWNLOAD_BLOCK):
                out.write(block)
                done += len(block)
                if progress is not None:
                    progress(done, total or done)
        partial.replace(target)
        return target

    def cancel_job(self, job_id: str) -> InferenceJob:
        """Stop a queued or running job (:class:`~modelyard.client.errors.Conflict` once it has ended)."""
        return InferenceJob.from_json(self._json("POST", f"/api/v1/inference-jobs/{_q(job_id)}/cancel"))

    def infer_async(
        self,
        name: str,
        body: Mapping[str, Any],
        *,
        alias: str | None = None,
        version: int | None = None,
    ) -> AsyncRequest:
        """Queue one v2 request (``{"inputs": [...]}``, JSON tensors) for ``name``; read its answer with
        :meth:`async_result`. The server keeps the answer ``MODELYARD_ASYNC_RESULT_TTL_SECONDS``."""
        response = self.request(
            "POST",
            f"/api/v1/models/{_q(name)}/infer-async",
            params={"alias": alias, "version": version},
            json_body=dict(body),
        )
        answer = response.json()
        return AsyncRequest(id=answer["id"], state=answer["state"], location=response.headers.get("Location", ""))

    def async_result(
        self, name: str, request_id: str, *, wait: float | None = None, interval: float = 0.25
    ) -> dict[str, Any] | None:
        """The v2 answer of an infer-async request; None while it waits (with ``wait`` seconds, polls that long
        first). A request the model refused raises the error it got, as ``/v2`` would have answered it."""
        deadline = time.monotonic() + (wait or 0.0)
        path = f"/api/v1/models/{_q(name)}/infer-async/{_q(request_id)}"
        while True:
            response = self.request("GET", path)
            if response.status_code == 200:
                return dict(response.json())
            if time.monotonic() >= deadline:
                return None
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
            interval = min(interval * 1.5, 2.0)

    # --- Identity -----------------------------------------------------------------------------------------

    def whoami(self) -> dict[str, Any]:
        """``GET /api/v1/me``: the caller's ``username``, ``roles``, and the ``token`` used (never its secret)."""
        return dict(self._json("GET", "/api/v1/me"))


def _login_error(page: str) -> str:
    """The refusal the login page shows (a lockout names until when); otherwise the usual words."""
    found = re.search(r'role="alert"[^>]*>(.*?)</', page, re.DOTALL)
    text = html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip() if found else ""
    return text or "Wrong username or password."


def token_from_password(
    url: str,
    username: str,
    password: str,
    *,
    name: str = "modelyard login",
    expires_days: int | None = None,
    roles: list[str] | None = None,
    models: list[str] | None = None,
    timeout: float = 60.0,
    ca_bundle: str | os.PathLike[str] | None = None,
    client_cert: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
) -> str:
    """Sign in with a password the way a browser does, create an API token, and sign out; returns the token.

    Tokens can only be created from a signed-in session (a token cannot mint tokens), so this uses
    the web login (``/accounts/login/``, with its CSRF token): its lockout, rate and audit rules
    apply, and the password never goes anywhere else. ``roles`` limits the token to some of the
    user's roles, ``models`` to models whose names match one of these fnmatch patterns.
    """
    base = url.rstrip("/")
    login_url = f"{base}/accounts/login/"
    tls = tls_options(ca_bundle, client_cert, client_key)
    session = requests.Session()
    session.headers["User-Agent"] = _user_agent()
    try:
        form = session.get(login_url, timeout=(CONNECT_TIMEOUT, timeout), **tls)
        csrf = session.cookies.get("csrftoken")
        if form.status_code != 200 or not csrf:
            raise ModelyardError(f"{login_url} offers no login form (status {form.status_code})")
        answer = session.post(
            login_url,
            data={"username": username, "password": password, "csrfmiddlewaretoken": csrf, "next": "/"},
            headers={"Referer": login_url},
            allow_redirects=False,
            timeout=(CONNECT_TIMEOUT, timeout),
            **tls,
        )
        if answer.status_code != 302:
            raise Unauthorized(f"login failed: {_login_error(answer.text)}", status=401)
        csrf = session.cookies.get("csrftoken") or csrf  # Django rotates it at login
        created = session.post(
            f"{base}/api/v1/tokens",
            json={"name": name, "expires_days": expires_days, "roles": roles or None, "models": models or []},
            headers={"X-CSRFToken": csrf, "Referer": f"{base}/"},
            timeout=(CONNECT_TIMEOUT, timeout),
            **tls,
        )
        if created.status_code != 201:
            raise _error_of(created)
        token = str(created.json()["token"])
        session.post(
            f"{base}/accounts/logout/",
            data={"csrfmiddlewaretoken": session.cookies.get("csrftoken") or csrf},
            headers={"Referer": f"{base}/"},
            allow_redirects=False,
            timeout=(CONNECT_TIMEOUT, timeout),
            **tls,
        )
        return token
    except requests.RequestException as exc:
        raise connection_failed(base, exc, client_certificate="cert" in tls) from exc
