"""The user commands of ``modelyard`` (login, models, push, promote, approve, pull, verify, shadow, policy, audit, ...).

They run on :mod:`modelyard.client` alone, so they start fast and need no server code: no Django,
no database. Every command takes ``--url`` and ``--token`` (else ``MODELYARD_URL`` and
``MODELYARD_TOKEN``, else the saved profile; ``--profile`` names one and then wins over the
environment) and ``--json`` for scripts. On a refusal a command exits 1 with the server's message on
stderr (with ``--json``, also ``{"error", "detail", "status"}`` on stdout). No command prints a secret,
except ``webhooks add`` the secret it generated when asked to.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypedDict

from modelyard.client.config import DEFAULT_PROFILE, TLS_VARIABLES, save_profile
from modelyard.client.core import BUNDLE, Client, file_digests, token_from_password
from modelyard.client.errors import ApiError, BadRequest, ConfigError, ModelyardError, NotFound, ValidationFailed
from modelyard.client.types import (
    Alias,
    AliasMove,
    InferenceJob,
    Policy,
    PolicyRule,
    Promotion,
    RetentionPlan,
    RetentionRule,
    Shadow,
    ShadowSide,
    Version,
)

Handler = Callable[[argparse.Namespace, Client], int]


# --- Output ------------------------------------------------------------------------------------------


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def _clock(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class ProgressBar:
    """Bytes done of all, rate and time left, on stderr: redrawn in place on a terminal, a line every 2 s otherwise."""

    def __init__(self, label: str, stream: IO[str] | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.last = float("-inf")
        self.finished = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        final = done >= total
        if self.finished or (not final and now - self.last < (0.1 if self.tty else 2.0)):
            return
        self.last = now
        elapsed = max(now - self.started, 1e-6)
        rate = done / elapsed
        fraction = done / total if total else 1.0
        bar = "#" * int(24 * fraction) + "." * (24 - int(24 * fraction))
        when = f"in {_clock(elapsed)}" if final else f"ETA {_clock((total - done) / rate) if rate else '?'}"
        line = f"{self.label} [{bar}] {100 * fraction:5.1f}%  {_size(done)} / {_size(total)}  {_size(rate)}/s  {when}"
        if self.tty:
            self.stream.write("\r\x1b[K" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.finished = final


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> None:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _signature(version: Version) -> None:
    for kind in ("inputs", "outputs"):
        for spec in version.signature.get(kind) or []:
            print(f"  {kind[:-1]:<7} {spec['name']}  {spec['datatype']}  {spec['shape']}")
        text = version.signature.get("text")
        if kind == "inputs" and text:  # the version has a tokenizer.json: raw text instead of the token inputs
            print(f"  {'input':<7} {text['name']}  {text['datatype']}  {text['shape']}  (text, by {text['tokenizer']})")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _print_lines(prefix: str, text: str, *, file: IO[str] | None = None) -> None:
    """A message of several lines (its reason, then a library's detail), the later lines under the first."""
    first, *rest = text.splitlines() or [""]
    print(prefix + first, file=file)
    for line in rest:
        print(" " * len(prefix) + line, file=file)


# --- Commands ----------------------------------------------------------------------------------------


def cmd_models(args: argparse.Namespace, client: Client) -> int:
    models = client.list_models(query=args.query, tag=args.tag)
    if args.json:
        _print_json([m.raw for m in models])
        return 0
    rows = [(m.name, m.last_version, ",".join(m.tags), _one_line(m.description)[:60]) for m in models]
    _table(rows, ["NAME", "VERSIONS", "TAGS", "DESCRIPTION"])
    return 0


def _sign_upload(args: argparse.Namespace, files: Sequence[str]) -> bytes | None:
    """``push --sign-key``: the uploader's bundle over each file's sha256, computed here; None without a key."""
    if args.sign_key is None:
        if args.sign_cert or args.sign_chain:
            raise ConfigError("--sign-cert and --sign-chain go with --sign-key KEY.pem")
        return None
    if args.sign_chain and not args.sign_cert:
        raise ConfigError("--sign-chain goes with --sign-cert CERT.pem")
    if BUNDLE in {Path(file).name for file in files}:
        raise ConfigError(f"--sign-key makes the {BUNDLE} sent with the files: leave {BUNDLE} out")
    from modelyard.provenance import ProvenanceError, Signer

    key = Path(args.sign_key).read_bytes()
    certificate = Path(args.sign_cert).read_bytes() if args.sign_cert else None
    chain = Path(args.sign_chain).read_bytes() if args.sign_chain else b""
    try:
        return Signer(key, certificate=certificate, chain=chain).sign(file_digests(files), name=args.name)
    except ProvenanceError as exc:
        raise ModelyardError(f"--sign-key {args.sign_key}: {exc}") from None


def cmd_push(args: argparse.Namespace, client: Client) -> int:
    files = [args.model, *args.files]
    signature = _sign_upload(args, files)
    try:
        client.get_model(args.name)
    except NotFound:
        client.create_model(args.name)
        if not args.json:
            print(f"Created model '{args.name}'.", file=sys.stderr)
    label = Path(args.model).name + (f" + {len(args.files)} file(s)" if args.files else "")
    progress = None if args.quiet else ProgressBar(f"Uploading {label}")
    version = client.push(
        args.name,
        files[0],
        files[1:],
        description=args.description,
        metadata=args.metadata,
        progress=progress,
        create_model=False,
        signature=signature,
        source_run_url=args.source_run_url or "",
        source_commit=args.source_commit or "",
        source_datasets=args.dataset or (),
        parent=args.parent,
        allow_duplicate=args.allow_duplicate,
    )
    if not args.no_wait:
        try:
            version = client.wait_ready(args.name, version.version, timeout=args.timeout)
        except ValidationFailed:
            version = client.get_version(args.name, version.version)
    if args.json:
        _print_json(version.raw)
    elif version.status == "ready":
        print(f"Version {version.version} of '{args.name}' is ready (sha256 {version.sha256}).")
        _signature(version)
        if signature is not None:
            print(f"  signed   {BUNDLE} by {args.sign_key}, verified by the registry")
        for warning in version.warnings:
            _print_lines("  warning: ", warning)
    elif version.status == "failed":
        print(f"Version {version.version} of '{args.name}' failed validation:", file=sys.stderr)
        for error in version.errors:
            _print_lines("  - ", error, file=sys.stderr)
    else:
        print(f"Version {version.version} of '{args.name}' is uploaded and {version.status} validation.")
    return 1 if version.status == "failed" else 0


def _dataset(text: str) -> dict[str, str]:
    """``NAME=DIGEST`` of ``--dataset``; split at the first ``=``, so a digest may hold more (base64 padding)."""
    name, sep, digest = text.partition("=")
    if not sep or not name.strip() or not digest.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=DIGEST, got {text!r}")
    return {"name": name.strip(), "digest": digest.strip()}


def _lineage_lines(version: Version) -> list[str]:
    datasets = [f"{d.get('name')} {d.get('digest')}" for d in version.source_datasets]
    parent = "-" if version.derived_from is None else str(version.derived_from)
    if version.derived_from is not None:
        recipe = (version.raw.get("recipe") or {}).get("recipe")
        parent += f" (derived by the registry: {recipe})" if recipe else " (named by its uploader)"
    return [
        f"{version.model} version {version.version}",
        f"  run      {version.source_run_url or '-'}",
        f"  commit   {version.source_commit or '-'}",
        *[f"  dataset  {line}" for line in datasets or ["-"]],
        f"  parent   {parent}",
    ]


def cmd_lineage(args: argparse.Namespace, client: Client) -> int:
    changing = (
        args.source_run_url is not None
        or args.source_commit is not None
        or args.dataset is not None
        or args.no_datasets
        or args.parent is not None
        or args.no_parent
    )
    if args.dataset and args.no_datasets:
        raise ConfigError("--dataset and --no-datasets: give one")
    if args.parent is not None and args.no_parent:
        raise ConfigError("--parent and --no-parent: give one")
    if changing:
        version = client.set_lineage(
            args.name,
            args.version,
            source_run_url=args.source_run_url,
            source_commit=args.source_commit,
            source_datasets=[] if args.no_datasets else args.dataset,
            parent=args.parent,
            clear_parent=args.no_parent,
        )
    else:
        version = client.get_version(args.name, args.version)
    if args.json:
        _print_json(version.raw)
        return 0
    for line in _lineage_lines(version):
        print(line)
    return 0


def cmd_card(args: argparse.Namespace, client: Client) -> int:
    text = client.card(args.name, args.version)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    Path(args.output).write_text(text, encoding="utf-8")
    if not args.json:
        print(f"Wrote the model card of '{args.name}' version {args.version} to {args.output}.", file=sys.stderr)
    return 0


def _status_of(version: Version) -> str:
    """The validation status, and the lifecycle when it is not active (``ready, archived``, ``ready, deleted``)."""
    marks = [version.state] if version.state != "active" else []
    if version.lifecycle.get("hold"):
        marks.append("held")
    return ", ".join([version.status, *marks])


def cmd_versions(args: argparse.Namespace, client: Client) -> int:
    versions = client.list_versions(args.name, status=args.status, lifecycle=args.lifecycle)
    if args.json:
        _print_json([v.raw for v in versions])
        return 0
    rows = [
        (v.version, _status_of(v), _size(v.size_bytes), v.created_by, v.created_at[:19], _one_line(v.description)[:50])
        for v in versions
    ]
    _table(rows, ["VERSION", "STATUS", "SIZE", "BY", "CREATED", "DESCRIPTION"])
    return 0


def _lifecycle_line(version: Version) -> str:
    life = version.lifecycle
    line = f"Version {version.version} of '{version.model}' is {version.state}"
    if deleted := life.get("deleted"):
        removed = "its files are removed" if deleted.get("files_removed") else "its files are being removed"
        line += f" (by {deleted.get('by')}: {deleted.get('reason')}); {removed}"
    if hold := life.get("hold"):
        line += f"; under legal hold by {hold.get('by')} ({hold.get('reason')})"
    return line + "."


def _lifecycle_command(action: str) -> Handler:
    def run(args: argparse.Namespace, client: Client) -> int:
        version = getattr(client, action)(args.name, args.version, reason=args.reason)
        if args.json:
            _print_json(version.raw)
        else:
            print(_lifecycle_line(version))
        return 0

    return run


def _confirmed(args: argparse.Namespace, question: str) -> bool:
    """``--yes``, or a yes typed at a terminal; False (nothing done) otherwise."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        print("modelyard: not a terminal to confirm at; send --yes to delete", file=sys.stderr)
        return False
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def cmd_delete(args: argparse.Namespace, client: Client) -> int:
    version = client.get_version(args.name, args.version)
    files = version.files
    print(f"Deleting version {version.version} of '{version.model}' removes these files from the store:")
    for f in files:
        print(f"  {f.name}  {_size(f.size_bytes)}  sha256 {f.sha256}")
    print("Its row stays as a tombstone (number, digests, who, when, why); the number is never used again.")
    if not _confirmed(args, f"Delete version {version.version} of '{version.model}'?"):
        return 1
    deleted = client.delete_version(args.name, version.version, reason=args.reason)
    if args.json:
        _print_json(deleted.raw)
    else:
        print(_lifecycle_line(deleted))
    return 0


def cmd_delete_model(args: argparse.Namespace, client: Client) -> int:
    if not _confirmed(args, f"Delete model '{args.name}' and its tombstones?"):
        return 1
    client.delete_model(args.name, reason=args.reason)
    print(f"Deleted model '{args.name}'; the audit log keeps its history.")
    return 0


def cmd_clear_alias(args: argparse.Namespace, client: Client) -> int:
    alias = client.clear_alias(args.name, args.alias, reason=args.reason)
    if args.json:
        _print_json(alias.raw)
    else:
        print(f"Alias '{alias.alias}' of '{args.name}' points at no version now.")
    return 0


def cmd_show(args: argparse.Namespace, client: Client) -> int:
    version = client.get_version(args.name, args.version)
    if args.json:
        _print_json(version.raw)
        return 0
    print(f"{version.model} version {version.version}: {version.status}")
    print(f"  sha256   {version.sha256}")
    print(f"  size     {_size(version.size_bytes)}")
    print(f"  by       {version.created_by or '-'} at {version.created_at}")
    if version.description:
        print(f"  about    {_one_line(version.description)}")
    if version.metadata:
        print(f"  metadata {json.dumps(version.metadata, sort_keys=True)}")
    for file in version.files:
        print(f"  file     {file.name}  {file.role}  {_size(file.size_bytes)}  {file.sha256}")
    _signature(version)
    for error in version.errors:
        _print_lines("  error    ", error)
    for warning in version.warnings:
        _print_lines("  warning  ", warning)
    batching = version.raw.get("batching")
    if version.status == "ready" and batching:
        print(f"  batching {'merged' if batching.get('merges') else 'not merged'}: {batching.get('reason', '')}")
    return 0


def cmd_batching(args: argparse.Namespace, client: Client) -> int:
    changes: dict[str, Any] = {}
    if args.setting is not None:
        changes["batching"] = args.setting
    if args.max_batch_size is not None:
        changes["max_batch_size"] = args.max_batch_size
    model = client.update_model(args.name, **changes) if changes else client.get_model(args.name)
    versions = client.list_versions(args.name, status="ready")
    if args.json:
        _print_json({"model": model.raw, "versions": {v.version: v.raw.get("batching") for v in versions}})
        return 0
    size = model.raw.get("max_batch_size")
    print(
        f"{model.name}: batching {model.raw.get('batching')}, max_batch_size {size}"
        + (" (does not batch)" if size == 0 else "")
    )
    for version in versions:
        decision = version.raw.get("batching") or {}
        verdict = "merged" if decision.get("merges") else "not merged"
        print(f"  v{version.version}: {verdict}: {decision.get('reason', '')}")
    return 0


def _describe_promotion(promotion: Promotion) -> str:
    change = {"unprotect": "unprotect", "policy": "new policy"}.get(promotion.kind, f"version {promotion.version}")
    return f"promotion {promotion.id}: {promotion.alias} of '{promotion.model}' -> {change} ({promotion.state})"


def cmd_promote(args: argparse.Namespace, client: Client) -> int:
    outcome = client.promote(args.name, args.alias, args.version, reason=args.reason, force=args.force, wait=args.wait)
    if args.json:
        _print_json(outcome.raw if outcome is not None else None)
    elif isinstance(outcome, Promotion):
        print(f"'{args.alias}' is protected: promotion request {outcome.id} is pending.")
        print(f"Another approver runs: modelyard approve {outcome.id}")
    elif isinstance(outcome, AliasMove):
        print(f"Moved '{args.alias}' of '{args.name}' from version {outcome.from_version} to {outcome.to_version}.")
    else:
        print(f"'{args.alias}' of '{args.name}' already points to version {args.version}.")
    return 0


def cmd_promotions(args: argparse.Namespace, client: Client) -> int:
    found = client.list_promotions(state=args.state, model=args.model)
    if args.json:
        _print_json([p.raw for p in found])
        return 0
    rows = [
        (p.id, p.model, p.alias, p.kind, p.version, p.state, p.requested_by, _one_line(p.reason)[:40]) for p in found
    ]
    _table(rows, ["ID", "MODEL", "ALIAS", "KIND", "VERSION", "STATE", "BY", "REASON"])
    return 0


def cmd_approve(args: argparse.Namespace, client: Client) -> int:
    promotion = client.approve(args.id, reason=args.reason, wait=args.wait)
    if args.json:
        _print_json(promotion.raw)
    elif promotion.kind == "unprotect":
        print(f"Approved promotion {promotion.id}: '{promotion.alias}' of '{promotion.model}' is no longer protected.")
    elif promotion.kind == "policy":
        print(
            f"Approved promotion {promotion.id}: the new policy of '{promotion.alias}' of '{promotion.model}' "
            "is in force."
        )
    else:
        print(
            f"Approved promotion {promotion.id}: '{promotion.alias}' of '{promotion.model}' "
            f"now points to version {promotion.version}."
        )
    return 0


def cmd_reject(args: argparse.Namespace, client: Client) -> int:
    promotion = client.reject(args.id, reason=args.reason)
    if args.json:
        _print_json(promotion.raw)
    else:
        print(f"Rejected {_describe_promotion(promotion)}.")
    return 0


def cmd_cancel(args: argparse.Namespace, client: Client) -> int:
    promotion = client.cancel(args.id, reason=args.reason)
    if args.json:
        _print_json(promotion.raw)
    else:
        print(f"Cancelled {_describe_promotion(promotion)}.")
    return 0


def cmd_rollback(args: argparse.Namespace, client: Client) -> int:
    move = client.rollback(args.name, args.alias, reason=args.reason)
    if args.json:
        _print_json(move.raw)
    else:
        print(f"Rolled '{args.alias}' of '{args.name}' back from version {move.from_version} to {move.to_version}.")
    return 0


def cmd_history(args: argparse.Namespace, client: Client) -> int:
    if args.at:
        at = client.history(args.name, args.alias, at=args.at)
        if args.json:
            _print_json(at.raw)
        elif at.version is None:
            print(f"At {at.at}, '{args.alias}' of '{args.name}' pointed to no version.")
        else:
            print(f"At {at.at}, '{args.alias}' of '{args.name}' pointed to version {at.version} (since {at.since}).")
        return 0
    moves = client.history(args.name, args.alias)
    if args.json:
        _print_json([m.raw for m in moves])
        return 0
    rows = [
        (m.moved_at[:19], m.from_version, m.to_version, m.kind, m.moved_by, m.promotion, _one_line(m.reason)[:40])
        for m in moves
    ]
    _table(rows, ["WHEN", "FROM", "TO", "KIND", "BY", "REQUEST", "REASON"])
    return 0


def _trust(keys: Sequence[str]) -> Any:
    """A ``modelyard.provenance.Trust`` of the PEM public keys given with ``--key``, each named by its path."""
    from modelyard.provenance import ProvenanceError, Trust

    trust = Trust()
    for key in keys:
        try:
            trust.add_key(key, Path(key).read_bytes())
        except OSError as exc:
            raise ConfigError(f"--key {key}: {exc.strerror}") from None
        except ProvenanceError as exc:
            raise ConfigError(f"--key {exc}") from None
    return trust


def _check_registry_bundle(client: Client, version: Version, keys: Sequence[str]) -> tuple[bytes, dict[str, Any]]:
    """The version's ``model.sig``, checked against ``keys`` (else the keys the server lists) and its files' sha256.

    Returns the bundle and what it proved; raises ModelyardError naming why it does not verify.
    """
    from modelyard.provenance import REGISTRY_SIGNER, ProvenanceError, Trust, bundle_digests_match, verify_bundle

    if keys:
        trust = _trust(keys)
    else:
        trust = Trust()
        for key in client.signing_keys()["keys"]:
            trust.add_key(REGISTRY_SIGNER, key["pem"].encode())
    data = client.signature_bundle(version.model, version.version)
    try:
        verified = verify_bundle(data, trust)
        bundle_digests_match(verified.digests, {f.name: f.sha256 for f in version.files})
    except ProvenanceError as exc:
        raise ModelyardError(
            f"{BUNDLE} of '{version.model}' version {version.version} does not verify: {exc}"
        ) from None
    proof = {
        "verified": True,
        "signer": verified.signer,
        "key_id": verified.key_id,
        "keys": "given" if keys else "server",
    }
    return data, proof


def _proof_line(proof: dict[str, Any]) -> str:
    key = f"key {proof['key_id'][:16]}"
    if proof["keys"] == "given":
        return f"Signature OK: {BUNDLE} signs every file, with {proof['signer']} ({key})."
    return (
        f"Signature OK: {BUNDLE} is the registry's over every file ({key}), checked with the keys the server "
        "itself lists (/api/v1/signing-keys); pass --key REGISTRY.pub.pem to check against a key you trust."
    )


def cmd_pull(args: argparse.Namespace, client: Client) -> int:
    if args.no_verify and args.key:
        raise ConfigError("--key and --no-verify do not go together")
    version = client.get_version(args.name, args.version)
    progress = None if args.quiet else ProgressBar(f"Downloading {args.name} version {version.version}")
    model_path = client.pull(args.name, version.version, args.dir, progress=progress)
    proof = None
    if not args.no_verify:
        try:
            data, proof = _check_registry_bundle(client, version, args.key)
        except NotFound as exc:  # a version signed by no one yet (validated before signing existed)
            raise NotFound(f"{exc.error}: the files in {args.dir} are not checked", exc.detail, status=404) from None
        (Path(args.dir) / BUNDLE).write_bytes(data)
    if args.json:
        files = version.raw["files"]
        _print_json(
            {
                "model": args.name,
                "version": version.version,
                "path": str(model_path),
                "files": files,
                "signature": proof,
            }
        )
    else:
        count = len(version.files)
        print(f"Pulled '{args.name}' version {version.version} ({count} file(s), sha256 checked) into {args.dir}.")
        print(_proof_line(proof) if proof is not None else "Signature not checked (--no-verify).")
        print(f"Load {model_path}")
    return 0


def _folder_digests(folder: Path) -> dict[str, str]:
    """Every file of a pulled folder by name (not the dot files a download leaves while it runs)."""
    return file_digests(p for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith("."))


def cmd_verify_folder(args: argparse.Namespace) -> int:
    """``verify PATH --key PUB.pem``: PATH/model.sig verifies with the keys given and signs exactly the files there."""
    from modelyard.provenance import ProvenanceError, bundle_digests_match, verify_bundle

    folder = Path(args.target)
    if not folder.is_dir():
        raise ConfigError(
            f"{folder} is not a folder: check a pulled folder with `modelyard verify PATH --key PUB.pem`, "
            "or a version on the server with `modelyard verify MODEL VERSION`"
        )
    if not args.key:
        raise ConfigError("checking a folder needs --key PUB.pem: the registry's public key (or the uploader's)")
    trust = _trust(args.key)
    bundle = folder / BUNDLE
    try:
        data = bundle.read_bytes()
    except OSError as exc:
        raise ModelyardError(f"{bundle}: {exc.strerror}") from None
    try:
        verified = verify_bundle(data, trust)
    except ProvenanceError as exc:
        raise ModelyardError(f"{bundle}: {exc}") from None
    digests = _folder_digests(folder)
    # Other bundles beside the files (uploader.sig, say) are not the version's files, unless the bundle signs them.
    extra = [name for name in digests if name.endswith(".sig") and name not in verified.digests]
    try:
        bundle_digests_match(verified.digests, digests, ignore=extra)
    except ProvenanceError as exc:
        raise ModelyardError(f"{folder}: {exc}") from None
    if args.json:
        _print_json({"ok": True, "path": str(folder), "signer": verified.signer, "key_id": verified.key_id})
    else:
        count = len(verified.digests)
        print(f"{folder}: {count} file(s) match {BUNDLE}, signed with {verified.signer} (key {verified.key_id[:16]}).")
    return 0


def cmd_verify_version(args: argparse.Namespace, client: Client) -> int:
    """``verify MODEL VERSION``: the server checks each bundle of the version; with ``--key``, model.sig here too."""
    version = client.get_version(args.target, args.version)
    report = client.provenance(args.target, version.version)
    problems = list(report.get("problems") or [])
    proof = None
    if args.key:
        try:
            _, proof = _check_registry_bundle(client, version, args.key)
        except ModelyardError as exc:
            problems.append(str(exc))
    ok = bool(report.get("signed")) and not problems
    if args.json:
        _print_json({**report, "ok": ok, "local": proof})
    else:
        state = "signed" if ok else "NOT verified"
        print(f"'{version.model}' version {version.version}: {state}")
        for signer in report.get("signers") or []:
            checked = "verified" if signer["verified"] else "NOT verified"
            print(f"  {signer['kind']:<9} {signer['name']}  key {signer['key_id'][:16]}  {checked}")
        derivation = report.get("derivation")
        if derivation:
            parent, recipe = derivation.get("parent") or {}, (derivation.get("recipe") or {}).get("recipe", "")
            checked = "verified" if derivation.get("verified") else "NOT verified"
            print(f"  derived   from {parent.get('model')} version {parent.get('version')} by {recipe}  {checked}")
        if proof is not None:
            print(f"  {_proof_line(proof)}")
    if not ok:
        for problem in problems or [f"version {version.version} of '{version.model}' has no registry signature"]:
            print(f"modelyard verify: {problem}", file=sys.stderr)
    return 0 if ok else 1


def _alias_line(name: str, alias: Alias) -> str:
    if not alias.require_signature:
        signature = "no signature required"
    else:
        signature = f"requires a signature by {', '.join(alias.trusted_signers) or 'any trusted signer'}"
    flags = ", ".join(["protected" if alias.protected else "not protected", "served" if alias.served else "not served"])
    version = alias.version if alias.version is not None else "none"
    cache = ""
    if alias.cache:
        cache = f"; caches responses ({alias.cache['max_bytes']} bytes, {alias.cache['ttl_seconds']} s)"
    return f"'{alias.alias}' of '{name}': version {version}; {flags}; {signature}{cache}."


def _cache_setting(text: str) -> dict[str, int]:
    """``--cache BYTES:SECONDS``: the response cache's bound and TTL."""
    size, _, ttl = text.partition(":")
    try:
        return {"max_bytes": int(size), "ttl_seconds": int(ttl)}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BYTES:SECONDS, e.g. 67108864:300, not {text!r}") from None


def cmd_alias(args: argparse.Namespace, client: Client) -> int:
    changes: dict[str, Any] = {}
    if args.require_signature is not None:
        changes["require_signature"] = args.require_signature
    if args.trusted_signer:
        changes["trusted_signers"] = args.trusted_signer
    elif args.any_signer:
        changes["trusted_signers"] = []
    if args.cache is not None:
        changes["cache"] = args.cache
    elif args.no_cache:
        changes["cache"] = None
    alias = (
        client.update_alias(args.name, args.alias, **changes) if changes else client.get_alias(args.name, args.alias)
    )
    if args.json:
        _print_json(alias.raw)
    else:
        print(_alias_line(args.name, alias))
    return 0


def _moment(text: str | None) -> str:
    return (text or "")[:19].replace("T", " ")


def _share(sample: float) -> str:
    return f"{sample * 100:.4g}%"


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _side_line(label: str, version: int | None, side: ShadowSide) -> str:
    rate = f" ({side.error_rate:.2%})" if side.error_rate is not None and side.errors else ""
    line = (
        f"  {label:<9} v{version if version is not None else '?'}: {side.answered} answered, "
        f"{side.errors} errors{rate}, p50 {_ms(side.p50_ms)}, p99 {_ms(side.p99_ms)}"
    )
    return line + (f"; last error: {_one_line(side.last_error)}" if side.last_error else "")


def _shadow_lines(shadow: Shadow) -> list[str]:
    """What ``shadow show`` prints: the versions, the sample, whether it runs, the counts and each output."""
    serving = f"version {shadow.serving}" if shadow.serving is not None else "no version"
    lines = [
        f"Shadow {shadow.id} on '{shadow.alias}' of '{shadow.model}': candidate version {shadow.version}, "
        f"serving {serving}",
        f"  sample    {shadow.sample:g} ({_share(shadow.sample)} of the requests)",
    ]
    started = f"since {_moment(shadow.started_at)} (started by {shadow.started_by})"
    if shadow.running:
        lines.append(f"  state     running {started}")
    else:
        why = f": {_one_line(shadow.end_reason)}" if shadow.end_reason else ""
        lines.append(f"  state     ended {_moment(shadow.ended_at)} by {shadow.ended_by or '-'}{why}")
        lines.append(f"  started   {_moment(shadow.started_at)} by {shadow.started_by}")
    reasons = ", ".join(f"{reason} {count}" for reason, count in shadow.dropped_by_reason.items() if count)
    lines.append(
        f"  requests  {shadow.requests} mirrored, {shadow.compared} compared, {shadow.dropped} dropped"
        + (f" ({reasons})" if reasons else "")
        + f"; {shadow.workers} inference process(es) reported"
    )
    lines.append(_side_line("serving", shadow.serving, shadow.primary))
    lines.append(_side_line("candidate", shadow.version, shadow.candidate))
    outputs = shadow.outputs
    if not outputs:
        lines.append("  outputs   none compared yet")
    for name, output in outputs.items():
        parts = [f"{output.rows} rows"]
        if output.cosine_p1 is not None or output.cosine_p50 is not None:
            parts.append(f"cosine p1 {_number(output.cosine_p1, '.6f')} p50 {_number(output.cosine_p50, '.6f')}")
        if output.max_abs_diff is not None:
            parts.append(f"max abs diff {output.max_abs_diff:.3g}")
        if output.top1_agreement is not None:
            parts.append(f"top-1 agreement {output.top1_agreement:.2%}")
        if output.psi is not None:
            parts.append(f"psi {output.psi:.4f}")
        if output.mismatched:
            parts.append(f"{output.mismatched} mismatched: {_one_line(output.mismatch)}")
        lines.append(f"  output    {name}: " + ", ".join(parts))
    return lines


def cmd_shadow_start(args: argparse.Namespace, client: Client) -> int:
    shadow = client.shadow_start(args.name, args.alias, args.version, sample=args.sample)
    if args.json:
        _print_json(shadow.raw)
        return 0
    print(
        f"Version {shadow.version} of '{shadow.model}' now shadows '{shadow.alias}' (version {shadow.serving}) "
        f"on {_share(shadow.sample)} of its requests (shadow {shadow.id})."
    )
    print(f"Its report: modelyard shadow show {args.name} {args.alias}")
    return 0


def cmd_shadow_stop(args: argparse.Namespace, client: Client) -> int:
    shadow = client.shadow_stop(args.name, args.alias, reason=args.reason)
    if args.json:
        _print_json(shadow.raw)
        return 0
    print(f"Stopped the shadow of version {shadow.version} on '{shadow.alias}' of '{shadow.model}'. Its final report:")
    print("\n".join(_shadow_lines(shadow)))
    return 0


def cmd_shadow_show(args: argparse.Namespace, client: Client) -> int:
    shadow = client.shadow(args.name, args.alias)
    if args.json:
        _print_json(shadow.raw)
    else:
        print("\n".join(_shadow_lines(shadow)))
    return 0


RULE_KEYS = ("name", "expr", "message")


def _rule_lines(rules: Sequence[PolicyRule]) -> list[str]:
    """Each rule as ``name: expr`` (an expression of several lines goes on under its first), then its message."""
    if not rules:
        return ["  no rules: every version passes"]
    lines = []
    for rule in rules:
        prefix = f"  {rule.name}: "
        first, *rest = rule.expr.split("\n")
        lines.append((prefix + first).rstrip())
        lines.extend((" " * len(prefix) + line).rstrip() for line in rest)
        if rule.message:
            lines.append(f"    message: {_one_line(rule.message)}")
    return lines


def _policy_lines(policy: Policy) -> list[str]:
    """What ``policy show`` prints: the policy in force, who wrote it, its rules, and a change waiting for approval."""
    head = f"Policy {policy.number} of '{policy.alias}' of '{policy.model}': "
    if policy.builtin:
        head += "built-in, from the alias's settings (no policy written yet)"
    else:
        head += f"set by {policy.created_by or '-'} at {_moment(policy.created_at)}"
        head += f" ({_one_line(policy.reason)})" if policy.reason.strip() else ""
    lines = [head, *_rule_lines(policy.rules)]
    if policy.pending is not None:
        lines.append(
            f"Pending: policy {policy.pending.get('number')}, waiting for approval in promotion request "
            f"{policy.pending.get('promotion')}:"
        )
        lines.extend(_rule_lines(policy.pending_rules))
    return lines


def _read_rules(source: str) -> list[dict[str, Any]]:
    """``policy set``'s FILE (``-``: stdin): a JSON list of rules, or an object with ``rules`` (other keys ignored,
    so that ``policy show --json`` can be edited and sent back). A file that is not that is a usage error."""
    where = "stdin" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        why = f"{exc.msg} at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else exc
        raise ConfigError(f"{where}: not JSON: {why}") from None
    rules = data.get("rules") if isinstance(data, dict) else data
    if not isinstance(rules, list):
        raise ConfigError(f'{where}: expected a JSON list of rules, or an object {{"rules": [...]}}')
    for number, rule in enumerate(rules, 1):
        strings = isinstance(rule, dict) and all(isinstance(rule.get(key), str) for key in ("name", "expr"))
        if not strings or not isinstance(rule.get("message", ""), str):
            raise ConfigError(f'{where}: rule {number} is not an object of strings "name", "expr" and "message"')
        unknown = sorted(set(rule) - {*RULE_KEYS, "builtin"})  # builtin: as policy show --json has it
        if unknown:
            raise ConfigError(
                f"{where}: rule {number} has an unknown key {', '.join(map(repr, unknown))} "
                '(a rule has "name", "expr" and "message")'
            )
    return [{key: rule[key] for key in RULE_KEYS if key in rule} for rule in rules]


def _fault_excerpt(rules: Sequence[dict[str, Any]], detail: Any) -> list[str]:
    """The line of the rule a 400 names, with a caret under its column; nothing when it names no position."""
    if not isinstance(detail, dict):
        return []
    line, column = detail.get("line"), detail.get("column")
    rule = next((r for r in rules if r.get("name") == detail.get("rule")), None)
    if rule is None or not isinstance(line, int) or not isinstance(column, int) or column < 1:
        return []
    lines = str(rule.get("expr", "")).split("\n")
    if not 1 <= line <= len(lines):
        return []
    text = lines[line - 1].rstrip()
    pad = "".join(c if c == "\t" else " " for c in text[: column - 1]).ljust(column - 1)
    return [f"  {text}", f"  {pad}^"]


def cmd_policy_show(args: argparse.Namespace, client: Client) -> int:
    policy = client.policy(args.name, args.alias)
    if args.json:
        _print_json(policy.raw)
    else:
        print("\n".join(_policy_lines(policy)))
    return 0


def cmd_policy_set(args: argparse.Namespace, client: Client) -> int:
    rules = _read_rules(args.file)
    try:
        policy = client.policy_set(args.name, args.alias, rules, reason=args.reason)
    except BadRequest as exc:
        for line in _fault_excerpt(rules, exc.detail):
            exc.add_note(line)
        raise
    if args.json:
        _print_json(policy.raw)
    elif policy.promotion is not None:
        number = (policy.pending or {}).get("number")
        print(
            f"'{args.alias}' of '{args.name}' is protected: policy {number} is waiting for approval in promotion "
            f"request {policy.promotion}."
        )
        print(f"Another approver runs: modelyard approve {policy.promotion}")
    else:
        print(f"Policy {policy.number} of '{args.alias}' of '{args.name}' is in force ({len(policy.rules)} rule(s)).")
    return 0


def cmd_policy_check(args: argparse.Namespace, client: Client) -> int:
    check = client.policy_evaluate(args.name, args.alias, args.version)
    if args.json:
        _print_json(check.raw)
    else:
        for rule in check.rules:
            if rule.passed:
                print(f"PASS {rule.name}")
            else:
                word = "WAIT" if rule.waiting else "FAIL"
                why = _one_line(rule.why)
                print(f"{word} {rule.name}: {why}" if why else f"{word} {rule.name}")
    return 0 if check.passed else 1


def _retention_rule_line(rule: RetentionRule) -> str:
    """A rule in words: ``keep the 10 newest versions and any created, aliased or served within 90 days; ...``."""
    newest = "the newest version" if rule.keep_last == 1 else f"the {rule.keep_last} newest versions"
    days = "1 day" if rule.keep_days == 1 else f"{rule.keep_days} days"
    return f"keep {newest} and any created, aliased or served within {days}; {rule.then} the others"


def _retention_plan_lines(plan: RetentionPlan) -> list[str]:
    """What ``retention preview`` prints: the rule, then each version it archives or deletes, then those it spares."""
    rule = plan.rule
    lines = [
        f"Retention of '{plan.model}' (keep_last {rule.keep_last}, keep_days {rule.keep_days}, then {rule.then}) "
        f"as of {_moment(plan.as_of)}:"
    ]
    if not plan.actions:
        lines.append(f"  nothing to {rule.then}")
    width = max((len(action.action) for action in plan.actions), default=0)
    lines += [f"  {a.action:<{width}} version {a.version}: {_one_line(a.why)}" for a in plan.actions]
    if plan.kept:
        lines.append("Kept, though outside both windows:")
        lines += [f"  version {k.version}: {_one_line(k.why)}" for k in plan.kept]
    return lines


def cmd_retention_show(args: argparse.Namespace, client: Client) -> int:
    rule = client.retention(args.name)
    if args.json:
        _print_json({"model": args.name, "rule": rule.raw if rule else None})
    elif rule is None:
        print(f"'{args.name}' has no retention rule: no version is archived or deleted by one.")
    else:
        print(f"Retention of '{args.name}': {_retention_rule_line(rule)}.")
    return 0


def cmd_retention_set(args: argparse.Namespace, client: Client) -> int:
    rule = client.retention_set(args.name, keep_last=args.keep_last, keep_days=args.keep_days, then=args.then)
    if args.json:
        _print_json({"model": args.name, "rule": rule.raw})
        return 0
    print(f"Retention of '{args.name}' set: {_retention_rule_line(rule)}.")
    print(f"What the next run would do: modelyard retention preview {args.name}")
    return 0


def cmd_retention_clear(args: argparse.Namespace, client: Client) -> int:
    client.retention_clear(args.name)
    if args.json:
        _print_json({"model": args.name, "rule": None})
    else:
        print(f"Removed the retention rule of '{args.name}'.")
    return 0


def cmd_retention_preview(args: argparse.Namespace, client: Client) -> int:
    plan = client.retention_preview(args.name, keep_last=args.keep_last, keep_days=args.keep_days, then=args.then)
    if args.json:
        _print_json(plan.raw)
    else:
        print("\n".join(_retention_plan_lines(plan)))
    return 0


def _input_value(text: str, datatype: str | None) -> Any:
    """``NAME=VALUE``'s value: a .npy file, a .json file, or JSON inline, as the input's datatype."""
    import numpy as np

    from modelyard.client.tensors import NUMPY_OF

    target = NUMPY_OF.get(datatype or "")
    if text.endswith(".npy"):
        array = np.load(text, allow_pickle=False)
        if target is None or target is np.object_ or array.dtype == target:
            return array
        if not np.can_cast(array.dtype, target, casting="same_kind"):
            raise ModelyardError(f"{text} holds {array.dtype}; the input needs {datatype}")
        return array.astype(target)
    path = Path(text)
    try:
        data = json.loads(path.read_text() if path.is_file() else text)
    except ValueError:
        if target is not np.object_:
            raise
        data = text  # a BYTES input (a version's "text") takes a plain string as itself
    if target is np.object_:
        return np.array([data] if isinstance(data, str) else data, dtype=np.object_)
    return np.asarray(data, dtype=target)


def cmd_infer(args: argparse.Namespace, client: Client) -> int:
    import numpy as np

    specs = {spec["name"]: spec["datatype"] for spec in client.model_metadata(args.name, args.version)["inputs"]}
    inputs = {}
    for item in args.input:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ModelyardError(f"--input {item!r}: use NAME=FILE.npy, NAME=FILE.json or NAME='[json]'")
        if name not in specs:
            raise ModelyardError(f"model '{args.name}' has no input '{name}'; its inputs are {', '.join(specs)}")
        inputs[name] = _input_value(value, specs[name])
    outputs = client.infer(args.name, inputs, version=args.version, outputs=args.output or None)
    if args.save:
        folder = Path(args.save)
        folder.mkdir(parents=True, exist_ok=True)
        for name, array in outputs.items():
            np.save(folder / f"{name}.npy", array, allow_pickle=False)

    def plain(array: np.ndarray) -> Any:
        if array.dtype == np.object_:
            return [bytes(v).decode("utf-8", "replace") for v in array.reshape(-1)]
        return array.tolist()

    if args.json:
        _print_json({n: {"shape": list(a.shape), "dtype": str(a.dtype), "data": plain(a)} for n, a in outputs.items()})
        return 0
    for name, array in outputs.items():
        print(f"{name}  {array.dtype}  {list(array.shape)}")
        print(np.array2string(array, threshold=200))
    return 0


def cmd_audit(args: argparse.Namespace, client: Client) -> int:
    filters = {name: getattr(args, name) for name in ("actor", "action", "model", "since", "until")}
    if args.export:
        if args.output:
            with open(args.output, "wb") as out:
                written = client.export_audit(out, format=args.export, **filters)
            print(f"Exported {_size(written)} of audit events to {args.output}.", file=sys.stderr)
        else:
            client.export_audit(sys.stdout.buffer, format=args.export, **filters)
            sys.stdout.flush()
    elif not args.verify:
        events = []
        for event in client.audit(**filters):
            events.append(event)
            if len(events) >= args.limit:
                break
        if args.json:
            _print_json([e.raw for e in events])
        else:
            rows = [(e.seq, e.at[:19], e.actor, e.action, e.target) for e in events]
            _table(rows, ["SEQ", "AT", "ACTOR", "ACTION", "TARGET"])
    if not args.verify:
        return 0
    verdict = client.verify_audit()
    if args.json:
        _print_json(verdict.raw)
    elif verdict.ok:
        print(f"Audit chain OK: {verdict.checked} events checked.")
    else:
        print(f"Audit chain BROKEN at event {verdict.first_bad_seq}: {verdict.reason}", file=sys.stderr)
    return 0 if verdict.ok else 1


def cmd_audit_verify_offline(args: argparse.Namespace) -> int:
    """Check an exported JSONL audit log and its signed heads with the given public keys: no server, no database."""
    from modelyard.auditfile import AuditFileError, verify_export
    from modelyard.provenance import ProvenanceError, Trust

    try:
        trust = Trust()
        for key in args.key:
            trust.add_key(key, Path(key).read_bytes())
        report = verify_export(Path(args.file), trust)
    except (AuditFileError, ProvenanceError) as exc:
        problem = str(exc)
    except OSError as exc:
        problem = f"{exc.filename}: {exc.strerror}"
    else:
        if args.json:
            _print_json(report.as_dict())
        else:
            print("\n".join([report.summary, *report.notes]))
        return 0
    if args.json:
        _print_json({"ok": False, "error": problem})
    print(f"modelyard audit verify-offline: {problem}", file=sys.stderr)
    return 1


def _option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``derive --option``: the value as JSON when it parses (true, 3), else the text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def cmd_derive(args: argparse.Namespace, client: Client) -> int:
    job = client.derive(args.name, args.version, args.recipe, options=dict(args.option), wait=args.wait)
    if args.json:
        _print_json(job.raw)
    elif job.status == "failed":
        print(f"Deriving {job.recipe} from version {job.source_version} of '{job.model}' failed:", file=sys.stderr)
        print(f"  {job.error}", file=sys.stderr)
    elif job.status == "succeeded":
        version = client.get_version(args.name, job.version) if job.version is not None else None
        print(f"Version {job.version} of '{job.model}' is {job.recipe} of version {job.source_version}.")
        deltas = ((version.raw.get("accuracy") or {}).get("outputs") or {}) if version else {}
        for output, delta in sorted(deltas.items()):
            cosine = f", cosine {delta['cosine']:.6f}" if delta.get("cosine") is not None else ""
            print(f"  {output}: max abs diff {delta.get('max_abs_diff', 0):.3g}{cosine}")
    else:
        print(f"Derive job {job.id} is {job.status}: modelyard derive ... --wait, or GET /api/v1/derive-jobs/{job.id}")
    return 1 if job.status == "failed" else 0


def cmd_benchmarks(args: argparse.Namespace, client: Client) -> int:
    runs = client.rerun_benchmarks(args.name, args.version) if args.run else client.benchmarks(args.name, args.version)
    if args.json:
        _print_json([b.raw for b in runs])
        return 0
    rows = []
    for run in runs:
        numbers = run.numbers or {}
        throughput = ", ".join(f"b{k} {v:.0f}/s" for k, v in (numbers.get("throughput") or {}).items())
        p50 = f"{numbers['p50_ms']:.2f}" if "p50_ms" in numbers else ""
        p99 = f"{numbers['p99_ms']:.2f}" if "p99_ms" in numbers else ""
        rows.append((run.provider, run.status, p50, p99, throughput, _one_line(run.error or run.note)[:50]))
    _table(rows, ["PROVIDER", "STATUS", "P50 MS", "P99 MS", "THROUGHPUT", "NOTE"])
    return 0


def cmd_webhooks_list(args: argparse.Namespace, client: Client) -> int:
    hooks = client.list_webhooks()
    if args.json:
        _print_json([h.raw for h in hooks])
        return 0
    rows = [(h.id, h.url, ",".join(h.events), h.model or "*", h.active) for h in hooks]
    _table(rows, ["ID", "URL", "EVENTS", "MODEL", "ACTIVE"])
    return 0


def cmd_webhooks_add(args: argparse.Namespace, client: Client) -> int:
    secret = sys.stdin.readline().rstrip("\n") if args.secret_stdin else None
    hook, generated = client.create_webhook(args.endpoint, args.event, model=args.model, secret=secret)
    if args.json:
        _print_json({**hook.raw, "secret": generated})
        return 0
    print(f"Registered webhook {hook.id}: {', '.join(hook.events)} of {hook.model or 'every model'} -> {hook.url}")
    if generated:
        print("Its signing secret, shown only now (keep it with the receiver):", file=sys.stderr)
        print(generated)
    return 0


def cmd_webhooks_remove(args: argparse.Namespace, client: Client) -> int:
    client.delete_webhook(args.id)
    if args.json:
        _print_json({"deleted": args.id})
    else:
        print(f"Removed webhook {args.id}.")
    return 0


def cmd_webhooks_deliveries(args: argparse.Namespace, client: Client) -> int:
    deliveries = client.webhook_deliveries(args.id, status=args.status)
    if args.json:
        _print_json([d.raw for d in deliveries])
        return 0
    rows = [
        (d.raw["created_at"][:19], d.event, d.model, d.version, d.status, d.attempts, d.last_status_code, d.last_error)
        for d in deliveries
    ]
    _table(rows, ["CREATED", "EVENT", "MODEL", "VERSION", "STATUS", "ATTEMPTS", "CODE", "LAST ERROR"])
    return 0


def cmd_login(args: argparse.Namespace) -> int:
    url = args.server.rstrip("/")
    token = args.token
    if not token and args.username and args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
        token = token_from_password(
            url,
            args.username,
            password,
            name=args.token_name,
            expires_days=args.expires_days,
            roles=args.only_role,
            models=args.only_model,
            **_tls(args),
        )
    elif not token:
        if not sys.stdin.isatty():
            raise ConfigError("no token: pass --token, or --username with --password-stdin")
        token = getpass.getpass("API token (leave empty to sign in with a username and password): ").strip()
        if not token:
            username = args.username or input("Username: ").strip()
            password = getpass.getpass("Password: ")
            token = token_from_password(
                url,
                username,
                password,
                name=args.token_name,
                expires_days=args.expires_days,
                roles=args.only_role,
                models=args.only_model,
                **_tls(args),
            )
    me = Client(url=url, token=token, **_tls(args)).whoami()
    profile = args.profile or DEFAULT_PROFILE
    # The files this login used (options, else their variables) are saved with the profile, for the next commands.
    files = {key: getattr(args, key) or os.environ.get(variable) for key, variable in TLS_VARIABLES.items()}
    path = save_profile(profile, url=url, token=token, tls=files)
    if args.json:
        _print_json({"url": url, "user": me["username"], "roles": me["roles"], "profile": profile, "config": str(path)})
    else:
        roles = ", ".join(me["roles"]) or "no roles"
        print(f"Logged in to {url} as {me['username']} ({roles}); saved as profile '{profile}' in {path}.")
    return 0


# --- Inference jobs ------------------------------------------------------------------------------------------


class RowsBar:
    """A job's rows done of all, rate and time left, on stderr; redrawn in place on a terminal, a line every 2 s
    otherwise (and whenever the state changes)."""

    def __init__(self, label: str, stream: IO[str] | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.started = time.monotonic()
        self.first_done: int | None = None
        self.last = float("-inf")
        self.state = ""

    def __call__(self, job: InferenceJob) -> None:
        now = time.monotonic()
        changed = job.state != self.state
        if not changed and not job.ended and now - self.last < (0.1 if self.tty else 2.0):
            return
        self.last, self.state = now, job.state
        if self.first_done is None:
            self.first_done = job.rows_done
        total = job.rows or 0
        fraction = min(job.rows_done / total, 1.0) if total else (1.0 if job.state == "succeeded" else 0.0)
        rate = (job.rows_done - self.first_done) / max(now - self.started, 1e-6)
        bar = "#" * int(24 * fraction) + "." * (24 - int(24 * fraction))
        rows = f"{job.rows_done} / {total if job.rows is not None else '?'} rows"
        left = total - job.rows_done
        when = f"in {_clock(now - self.started)}" if job.ended else (f"ETA {_clock(left / rate)}" if rate > 0 else "")
        line = f"{self.label} {job.state:<9} [{bar}] {100 * fraction:5.1f}%  {rows}  {rate:.0f} rows/s  {when}".rstrip()
        if self.tty:
            self.stream.write("\r\x1b[K" + line + ("\n" if job.ended else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _job_lines(job: InferenceJob) -> list[str]:
    rows = f"{job.rows_done} of {job.rows}" if job.rows is not None else f"{job.rows_done} of ?"
    asked = f" ({job.ref})" if job.ref and job.ref != str(job.version) else ""
    lines = [
        f"Job {job.id}: {job.state}",
        f"  model    {job.model} version {job.version}{asked}",
        f"  format   {job.format} ({_size(job.input_bytes)} in)",
        f"  rows     {rows}",
        f"  by       {job.created_by or '-'} at {job.created_at}",
    ]
    if job.finished_at:
        lines.append(f"  ended    {job.finished_at}")
    lines += [f"  error    {_one_line(error)}" for error in job.errors]
    if job.result:
        lines.append(f"  result   {_size(job.result_bytes)}: modelyard job fetch {job.id} -o FILE")
    return lines


def _job_outcome(args: argparse.Namespace, job: InferenceJob) -> int:
    """Print the job (or its JSON); 0 when it succeeded or is still on its way, 1 when it failed or was cancelled."""
    if args.json:
        _print_json(job.raw)
    else:
        stream = sys.stderr if job.state in ("failed", "cancelled") else sys.stdout
        for line in _job_lines(job):
            print(line, file=stream)
    return 1 if job.state in ("failed", "cancelled") else 0


def _wait_for_job(args: argparse.Namespace, client: Client, job_id: str) -> InferenceJob:
    bar = None if args.quiet else RowsBar(f"Job {job_id}")
    return client.wait_job(job_id, timeout=args.timeout, progress=bar)


def cmd_job_submit(args: argparse.Namespace, client: Client) -> int:
    if args.alias and args.version is not None:
        raise ConfigError("give --alias or --version, not both")
    progress = None if args.quiet else ProgressBar(f"Uploading {Path(args.input).name}")
    job = client.submit_job(
        args.model,
        args.input,
        alias=args.alias,
        version=args.version,
        format=args.format,
        outputs=args.output,
        result_format=args.result_format,
        progress=progress,
    )
    if not args.json:
        rows = f", {job.rows} rows" if job.rows is not None else ""
        print(f"Job {job.id} {job.state}: version {job.version} of '{job.model}'{rows}.", file=sys.stderr)
    if args.wait:
        job = _wait_for_job(args, client, job.id)
        return _job_outcome(args, job)
    if args.json:
        _print_json(job.raw)
    else:
        print(job.id)
    return 0


def cmd_job_show(args: argparse.Namespace, client: Client) -> int:
    return _job_outcome(args, client.job(args.id))


def cmd_job_list(args: argparse.Namespace, client: Client) -> int:
    found = client.jobs(state=args.state, model=args.model)
    if args.json:
        _print_json([job.raw for job in found])
        return 0
    rows = [
        (
            job.id,
            job.model,
            job.version,
            job.format,
            job.state,
            f"{job.rows_done}/{job.rows if job.rows is not None else '?'}",
            job.created_at,
        )
        for job in found
    ]
    _table(rows, ["ID", "MODEL", "VERSION", "FORMAT", "STATE", "ROWS", "SUBMITTED"])
    return 0


def cmd_job_wait(args: argparse.Namespace, client: Client) -> int:
    return _job_outcome(args, _wait_for_job(args, client, args.id))


def cmd_job_fetch(args: argparse.Namespace, client: Client) -> int:
    progress = None if args.quiet else ProgressBar(f"Downloading the result of job {args.id}")
    path = client.fetch_job_result(args.id, args.output, progress=progress)
    if args.json:
        _print_json({"id": args.id, "path": str(path), "size_bytes": path.stat().st_size})
    else:
        print(f"Wrote {path} ({_size(path.stat().st_size)}).")
    return 0


def cmd_job_cancel(args: argparse.Namespace, client: Client) -> int:
    job = client.cancel_job(args.id)
    if args.json:
        _print_json(job.raw)
    else:
        print(f"Job {job.id} cancelled ({job.rows_done} rows had been done).")
    return 0


# --- Running a command ---------------------------------------------------------------------------------


def _report(args: argparse.Namespace, exc: ModelyardError) -> None:
    print(f"modelyard {args.command}: {exc}", file=sys.stderr)
    for note in getattr(exc, "__notes__", ()):  # what the command added (policy set: the faulty rule's line)
        print(note, file=sys.stderr)
    if isinstance(exc, ApiError):
        detail = exc.detail
        if isinstance(detail, dict) and detail.get("breaking"):
            for item in detail["breaking"]:
                print(f"  - {item}", file=sys.stderr)
        elif isinstance(detail, dict) and detail.get("laggards"):
            for laggard in detail["laggards"]:
                why = f"{laggard.get('state')} {laggard.get('error') or ''}".strip()
                print(f"  - {laggard.get('worker_id')}: {why}", file=sys.stderr)
        if args.json:
            _print_json({"error": exc.error, "detail": exc.detail, "status": exc.status})
    elif args.json:
        _print_json({"error": str(exc), "detail": None, "status": None})


class TLSFiles(TypedDict):
    ca_bundle: str | None
    client_cert: str | None
    client_key: str | None


def _tls(args: argparse.Namespace) -> TLSFiles:
    return {"ca_bundle": args.ca_bundle, "client_cert": args.client_cert, "client_key": args.client_key}


def _tls_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ca-bundle",
        default=None,
        metavar="CA.pem",
        help="trust the server's certificate if signed by these CAs (default: $MODELYARD_CA_BUNDLE, else the system's)",
    )
    parser.add_argument(
        "--client-cert",
        default=None,
        metavar="CERT.pem",
        help="a client certificate, for a server that requires one (default: $MODELYARD_CLIENT_CERT)",
    )
    parser.add_argument(
        "--client-key", default=None, metavar="KEY.pem", help="its private key (default: $MODELYARD_CLIENT_KEY)"
    )


def _runner(handler: Handler) -> Callable[[argparse.Namespace], int]:
    def with_client(args: argparse.Namespace) -> int:
        return handler(args, Client(url=args.url, token=args.token, profile=args.profile, **_tls(args)))

    reported = _reporting(with_client)

    def run(args: argparse.Namespace) -> int:
        try:
            return reported(args)
        except OSError as exc:  # a local file: the model to push, the folder to pull into
            print(f"modelyard {args.command}: {exc}", file=sys.stderr)
            return 1

    return run


def _reporting(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a command with its errors reported: a usage error exits 2, a failure 1 (no server needed for that)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ConfigError as exc:
            _report(args, exc)
            return 2
        except ModelyardError as exc:
            _report(args, exc)
            return 1

    return run


def _verify_runner(args: argparse.Namespace) -> int:
    """``verify MODEL VERSION`` asks a server; ``verify PATH --key`` needs none, so no server need be configured."""
    if args.version is not None:
        return _runner(cmd_verify_version)(args)
    return _reporting(cmd_verify_folder)(args)


_login_runner = _reporting(cmd_login)


def _wait_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--wait",
        nargs="?",
        type=float,
        const=60.0,
        default=None,
        metavar="SECONDS",
        help=f"{what}, until every live inference process serves the version (default 60 s)",
    )


def _lineage_options(parser: argparse.ArgumentParser, *, editing: bool = False) -> None:
    clears = ' ("" clears it)' if editing else ""
    parser.add_argument(
        "--source-run-url", default=None, metavar="URL", help=f"the training run, an http(s) URL{clears}"
    )
    parser.add_argument(
        "--source-commit", default=None, metavar="SHA", help=f"the code's commit, 7 to 64 hex characters{clears}"
    )
    parser.add_argument(
        "--dataset",
        action="append",
        type=_dataset,
        default=None,
        metavar="NAME=DIGEST",
        help="a dataset it was trained on (repeatable)" + ("; replaces those recorded" if editing else ""),
    )
    parser.add_argument(
        "--parent", type=int, default=None, metavar="N", help="the version of this model it came from (an earlier one)"
    )
    if editing:
        parser.add_argument("--no-datasets", action="store_true", help="clear the datasets")
        parser.add_argument("--no-parent", action="store_true", help="clear the parent")


def add_commands(sub: Any) -> None:
    """Add the user commands to ``modelyard``'s subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None, help="the server (default: $MODELYARD_URL, else the profile)")
    common.add_argument("--token", default=None, help="an API token (default: $MODELYARD_TOKEN, else the profile)")
    common.add_argument("--profile", default=None, help="a saved profile (default: $MODELYARD_PROFILE, else default)")
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    _tls_options(common)

    def command(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, parents=[common], help=help, description=help)
        parser.set_defaults(func=_runner(handler))
        return parser

    p = sub.add_parser("login", help="save a server and token as a profile (asks for a token or a password)")
    p.add_argument("server", metavar="URL")
    p.add_argument("--token", default=None, help="the API token to save (else one is asked for, or made)")
    p.add_argument("--username", default=None, help="sign in with this user's password and create a token")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    p.add_argument("--profile", default=None, help="the profile to save (default: default)")
    p.add_argument("--token-name", default="modelyard login", help="the label of a token made from a password")
    p.add_argument("--expires-days", type=int, default=None, help="a token made from a password expires after N days")
    p.add_argument(
        "--only-role",
        action="append",
        default=[],
        help="a token made from a password carries only this of your roles (repeatable)",
    )
    p.add_argument(
        "--only-model",
        action="append",
        default=[],
        metavar="PATTERN",
        help="a token made from a password reaches only models matching this pattern, e.g. 'fraud-*' (repeatable)",
    )
    p.add_argument("--json", action="store_true")
    _tls_options(p)
    p.set_defaults(func=_login_runner)

    p = command("models", cmd_models, "list models")
    p.add_argument("--query", default="", help="a substring of the name or description")
    p.add_argument("--tag", default="")

    p = command("push", cmd_push, "upload a new version (creating the model), wait for validation, print its signature")
    p.add_argument("name")
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("files", nargs="*", metavar="FILE", help="external-data files and extras (tokenizer.json, ...)")
    p.add_argument("--description", default="")
    p.add_argument("--metadata", default=None, metavar="JSON", help="a JSON object stored with the version")
    p.add_argument("--no-wait", action="store_true", help="do not wait for validation")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for validation")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--sign-key",
        default=None,
        metavar="KEY.pem",
        help=f"sign the files with this private key (sha256 of each, computed here) and send the bundle as {BUNDLE}",
    )
    p.add_argument("--sign-cert", default=None, metavar="CERT.pem", help="the key's certificate (with --sign-key)")
    p.add_argument(
        "--sign-chain", default=None, metavar="CHAIN.pem", help="the certificates above it (with --sign-cert)"
    )
    _lineage_options(p)
    p.add_argument(
        "--allow-duplicate",
        action="store_true",
        help="upload files byte for byte those of a version of the model (else refused, naming it)",
    )

    p = command(
        "lineage",
        cmd_lineage,
        "a version's lineage (training run, commit, datasets, parent); with options, change it (its uploader or an "
        "admin)",
    )
    p.add_argument("name")
    p.add_argument("version", help="a number or an alias")
    _lineage_options(p, editing=True)

    p = command("card", cmd_card, "a version's model card, in Markdown (printed, or written with -o)")
    p.add_argument("name")
    p.add_argument("version", help="a number or an alias")
    p.add_argument("-o", "--output", default=None, metavar="FILE", help="write it to FILE instead of printing it")

    p = command("versions", cmd_versions, "list a model's versions, newest first")
    p.add_argument("name")
    p.add_argument("--status", default="", choices=["", "pending", "validating", "ready", "failed"])
    p.add_argument(
        "--lifecycle",
        default="",
        choices=["", "active", "archived", "deleted", "all"],
        help="active (the default), archived, deleted (tombstones) or all",
    )

    for action, text in (
        ("archive", "hide a version from lists and from promotion, keeping its bytes (maintainer role)"),
        ("unarchive", "bring an archived version back (maintainer role)"),
        ("hold", "place a legal hold: nobody and no retention rule may delete the version (admin or auditor)"),
        ("release", "release a legal hold (admin or auditor)"),
    ):
        p = command(action, _lifecycle_command(action), text)
        p.add_argument("name", metavar="MODEL")
        p.add_argument("version", metavar="VERSION", help="a number or an alias")
        p.add_argument("--reason", required=action in ("hold", "release"), default="", help="why (recorded)")

    p = command("delete", cmd_delete, "delete a version: its files go, its row stays as a tombstone (admin role)")
    p.add_argument("name", metavar="MODEL")
    p.add_argument("version", metavar="VERSION", type=int)
    p.add_argument("--reason", required=True, help="why (recorded)")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p = command("delete-model", cmd_delete_model, "delete a model whose versions are all deleted (admin role)")
    p.add_argument("name", metavar="MODEL")
    p.add_argument("--reason", required=True, help="why (recorded)")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p = command("clear-alias", cmd_clear_alias, "point an unprotected alias at no version (maintainer role)")
    p.add_argument("name", metavar="MODEL")
    p.add_argument("alias", metavar="ALIAS")
    p.add_argument("--reason", default="", help="why (recorded)")

    p = command("show", cmd_show, "a version's files, signature, validation errors and metadata")
    p.add_argument("name")
    p.add_argument("version", help="a number or an alias")

    p = command(
        "batching",
        cmd_batching,
        "whether a model's concurrent requests are merged (auto: as validation found), and each ready version's",
    )
    p.add_argument("name")
    p.add_argument("setting", nargs="?", choices=["auto", "on", "off"], help="change it (maintainer role)")
    p.add_argument(
        "--max-batch-size", type=int, default=None, metavar="N", help="rows per merged run; 0: the model does not batch"
    )

    p = command("promote", cmd_promote, "point an alias at a version (a request when the alias is protected)")
    p.add_argument("name")
    p.add_argument("alias")
    p.add_argument("version", type=int)
    p.add_argument("--reason", default="")
    p.add_argument("--force", action="store_true", help="accept a breaking signature change (give a reason)")
    _wait_option(p, "after a move")

    p = command("promotions", cmd_promotions, "list promotion requests")
    p.add_argument("--state", default="", choices=["", "pending", "approved", "rejected", "cancelled", "expired"])
    p.add_argument("--model", default="")

    for name, handler, text in (
        ("approve", cmd_approve, "approve someone else's promotion request (approver role)"),
        ("reject", cmd_reject, "reject someone else's promotion request (approver role)"),
        ("cancel", cmd_cancel, "withdraw your own promotion request"),
    ):
        p = command(name, handler, text)
        p.add_argument("id", type=int)
        p.add_argument("--reason", default="")
        if name == "approve":
            _wait_option(p, "after approving")

    p = command("rollback", cmd_rollback, "move an alias back to the version before its last move")
    p.add_argument("name")
    p.add_argument("alias")
    p.add_argument("--reason", default="")

    p = command("history", cmd_history, "an alias's moves, or with --at the version it pointed to then")
    p.add_argument("name")
    p.add_argument("alias")
    p.add_argument("--at", default=None, metavar="ISO-TIME", help="e.g. 2026-01-31T12:00:00Z")

    p = command(
        "pull",
        cmd_pull,
        f"download every file of a version into a folder, checking each sha256 and the registry's signature ({BUNDLE})",
    )
    p.add_argument("name")
    p.add_argument("version", help="a number or an alias")
    p.add_argument("dir")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="PUB.pem",
        help="check the signature with this public key of the registry (repeatable); without it, with the keys the "
        "server lists, which proves less",
    )
    p.add_argument("--no-verify", action="store_true", help=f"do not check the signature (no {BUNDLE} is written)")

    p = sub.add_parser(
        "verify",
        parents=[common],
        help="check a pulled folder against its model.sig (PATH --key PUB.pem), or a version's signatures on the "
        "server (MODEL VERSION)",
        description="Check a pulled folder: PATH/model.sig must verify with the keys given and sign exactly the "
        "files in PATH. Or ask the server to check every signature of MODEL VERSION now (with --key, model.sig is "
        "also checked here). Exit 0 when it holds, 1 when it does not, 2 for a usage error.",
    )
    p.add_argument("target", metavar="PATH|MODEL")
    p.add_argument("version", nargs="?", default=None, metavar="VERSION", help="a number or an alias")
    p.add_argument("--key", action="append", default=[], metavar="PUB.pem", help="a trusted public key (repeatable)")
    p.set_defaults(func=_verify_runner)

    p = command(
        "alias",
        cmd_alias,
        "an alias's settings; admins set the signature it requires (and whose), and its response cache",
    )
    p.add_argument("name")
    p.add_argument("alias")
    p.add_argument(
        "--require-signature",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only a version its uploader signed with a trusted key (or derived from one) can be set",
    )
    signers = p.add_mutually_exclusive_group()
    signers.add_argument(
        "--trusted-signer",
        action="append",
        default=[],
        metavar="NAME",
        help="accept only this signer of MODELYARD_TRUSTED_SIGNERS (repeatable; implies --require-signature)",
    )
    signers.add_argument("--any-signer", action="store_true", help="accept any trusted signer again")
    caching = p.add_mutually_exclusive_group()
    caching.add_argument(
        "--cache",
        type=_cache_setting,
        default=None,
        metavar="BYTES:SECONDS",
        help="answer repeated requests from a response cache of BYTES per inference process, each kept SECONDS",
    )
    caching.add_argument("--no-cache", action="store_true", help="turn the alias's response cache off")

    shadow = sub.add_parser(
        "shadow",
        help="shadow traffic: a candidate version answers a sample of a served alias's requests on the side",
        description="A candidate version answers a sample of a served alias's requests after the serving version "
        "has answered (never delaying or changing that answer); the inference processes count how the two agree.",
    )
    actions = shadow.add_subparsers(dest="shadow_command", required=True)
    p = actions.add_parser(
        "start", parents=[common], help="mirror a sample of the alias's requests to a version (maintainer role)"
    )
    p.add_argument("name", metavar="MODEL")
    p.add_argument("alias", metavar="ALIAS")
    p.add_argument("--version", type=int, required=True, metavar="N", help="the candidate version")
    p.add_argument(
        "--sample", type=float, default=None, metavar="F", help="the share of the requests mirrored (default 0.1)"
    )
    p.set_defaults(func=_runner(cmd_shadow_start))
    p = actions.add_parser("stop", parents=[common], help="end the alias's running shadow (maintainer role)")
    p.add_argument("name", metavar="MODEL")
    p.add_argument("alias", metavar="ALIAS")
    p.add_argument("--reason", default="")
    p.set_defaults(func=_runner(cmd_shadow_stop))
    p = actions.add_parser(
        "show", parents=[common], help="the alias's running shadow (else its last one) and how the versions agree"
    )
    p.add_argument("name", metavar="MODEL")
    p.add_argument("alias", metavar="ALIAS")
    p.set_defaults(func=_runner(cmd_shadow_show))

    policy = sub.add_parser(
        "policy",
        help="an alias's promotion policy: the rules (CEL) a version must pass to be promoted there",
        description="An alias's promotion policy: named rules, each a CEL expression over a candidate version's "
        "evidence that must be true for it to be promoted to the alias.",
    )
    actions = policy.add_subparsers(dest="policy_command", required=True)
    p = actions.add_parser(
        "show", parents=[common], help="the alias's policy in force (built-in until one is written) and a pending one"
    )
    p.add_argument("name", metavar="MODEL")
    p.add_argument("alias", metavar="ALIAS")
    p.set_defaults(func=_runner(cmd_policy_show))
    p = actions.add_parser(
        "set",
        parents=[common],
        help="write the alias's policy from a JSON file (maintainer role); a protected alias's waits for approval",
    )
    p.add_argument("name", metavar="MODEL")
    p.add_argument("alias", metavar="ALIAS")
    p.add_argument(
        "file",
        metavar="FILE",
        help='a JSON list of rules {"name", "expr", "message"}, or {"rules": [...]}; - reads stdin',
    )
    p.add_argument("--reason", default="")
    p.set_defaults(func=_runner(cmd_policy_set))
    p = actions.add_parser(
        "check",
        parents=[common],
        help="what the policy says now of promoting a version: a line per rule; exit 0 when every rule passes",
    )
    p.add_argument("name", metavar="MODEL")
    p.add_argument("alias", metavar="ALIAS")
    p.add_argument("version", type=int, metavar="VERSION")
    p.set_defaults(func=_runner(cmd_policy_check))

    retention = sub.add_parser(
        "retention",
        help="a model's retention rule: which old versions a periodic job archives or deletes",
        description="A model's retention rule keeps its newest versions and those created, aliased or served "
        "lately; an hourly job archives (or deletes) the others, sparing held versions and any still in use.",
    )
    actions = retention.add_subparsers(dest="retention_command", required=True)
    p = actions.add_parser("show", parents=[common], help="the model's retention rule")
    p.add_argument("name", metavar="MODEL")
    p.set_defaults(func=_runner(cmd_retention_show))
    p = actions.add_parser(
        "set", parents=[common], help="set the model's rule (maintainer role; --then delete: admin role)"
    )
    p.add_argument("name", metavar="MODEL")
    p.add_argument("--keep-last", type=int, required=True, metavar="N", help="the N newest versions are kept")
    p.add_argument(
        "--keep-days", type=int, required=True, metavar="D", help="versions created, aliased or served within D days"
    )
    p.add_argument("--then", choices=["archive", "delete"], default=None, help="what happens to the others (archive)")
    p.set_defaults(func=_runner(cmd_retention_set))
    p = actions.add_parser("clear", parents=[common], help="remove the model's rule (maintainer role)")
    p.add_argument("name", metavar="MODEL")
    p.set_defaults(func=_runner(cmd_retention_clear))
    p = actions.add_parser(
        "preview",
        parents=[common],
        help="what the next run would archive or delete, and what it spares and why; with --keep-last and "
        "--keep-days, for that rule instead of the saved one (nothing is saved)",
    )
    p.add_argument("name", metavar="MODEL")
    p.add_argument("--keep-last", type=int, default=None, metavar="N")
    p.add_argument("--keep-days", type=int, default=None, metavar="D")
    p.add_argument("--then", choices=["archive", "delete"], default=None)
    p.set_defaults(func=_runner(cmd_retention_preview))

    p = command("infer", cmd_infer, "run a served model on inputs from .npy or JSON")
    p.add_argument("name")
    p.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="NAME=VALUE",
        help="FILE.npy, FILE.json or inline JSON; a BYTES input (text) also takes a plain string",
    )
    p.add_argument("--version", default=None, help="a version number or a served alias (default: production)")
    p.add_argument("--output", action="append", default=[], help="only this output (repeatable)")
    p.add_argument("--save", default=None, metavar="DIR", help="also write each output to DIR/NAME.npy")

    p = command(
        "audit",
        cmd_audit,
        "audit events (auditor role), an export, a check of the hash chain, or an offline check of an export",
    )
    for name in ("actor", "action", "model", "since", "until"):
        p.add_argument(f"--{name}", default="")
    p.add_argument("--limit", type=int, default=50, help="events to list, newest first")
    p.add_argument("--export", choices=["csv", "jsonl"], default=None, help="stream every matching event")
    p.add_argument("--output", default=None, metavar="FILE", help="write the export here instead of stdout")
    p.add_argument("--verify", action="store_true", help="recompute the hash chain; exit 1 when broken")
    offline = p.add_subparsers(dest="audit_command", metavar="verify-offline")
    p = offline.add_parser(
        "verify-offline",
        help="check an exported JSONL log and its signed heads with the registry's public keys (no server)",
        description="Check an exported JSONL audit log: every event's hash and link, and every signed head's "
        "signature, with the given public keys only. No server and no database are needed.",
    )
    p.add_argument("file", metavar="FILE", help="from `modelyard audit --export jsonl --output FILE`")
    p.add_argument(
        "--key",
        action="append",
        required=True,
        metavar="PUB.pem",
        help="a trusted public key of the registry (repeatable: add the keys used before a rotation)",
    )
    # SUPPRESS: a `--json` given before `verify-offline` (the audit command's own) is kept.
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts")
    p.set_defaults(func=cmd_audit_verify_offline)

    p = command("derive", cmd_derive, "build a derived version (fp16, int8-dynamic, ort-optimized) of a ready version")
    p.add_argument("name")
    p.add_argument("version", help="a number or an alias")
    p.add_argument("recipe", choices=["fp16", "int8-dynamic", "ort-optimized"])
    p.add_argument(
        "--option",
        action="append",
        type=_option,
        default=[],
        metavar="KEY=VALUE",
        help="a recipe option, e.g. per_channel=true, optimize=true, level=extended (repeatable)",
    )
    p.add_argument(
        "--wait",
        nargs="?",
        type=float,
        const=600.0,
        default=None,
        metavar="SECONDS",
        help="until the new version is validated (default 600 s)",
    )

    p = command("benchmarks", cmd_benchmarks, "a version's benchmark runs on its serving hardware")
    p.add_argument("name")
    p.add_argument("version", help="a number or an alias")
    p.add_argument("--run", action="store_true", help="queue them again (maintainer role)")

    hooks = sub.add_parser("webhooks", help="webhooks (admin role): list, add, remove, deliveries")
    actions = hooks.add_subparsers(dest="webhooks_command", required=True)
    p = actions.add_parser("list", parents=[common], help="registered webhooks")
    p.set_defaults(func=_runner(cmd_webhooks_list))
    p = actions.add_parser("add", parents=[common], help="register an endpoint; prints a generated secret once")
    p.add_argument("endpoint", metavar="URL", help="where to POST the events")
    p.add_argument("--event", action="append", required=True, help="version.ready, alias.moved, ... (repeatable)")
    p.add_argument("--model", default=None, help="only this model's events")
    p.add_argument("--secret-stdin", action="store_true", help="read the signing secret from stdin")
    p.set_defaults(func=_runner(cmd_webhooks_add))
    p = actions.add_parser("remove", parents=[common], help="remove a webhook and its delivery log")
    p.add_argument("id", type=int)
    p.set_defaults(func=_runner(cmd_webhooks_remove))
    p = actions.add_parser("deliveries", parents=[common], help="a webhook's delivery log, newest first")
    p.add_argument("id", type=int)
    p.add_argument("--status", default="", choices=["", "pending", "sending", "delivered", "failed"])
    p.set_defaults(func=_runner(cmd_webhooks_deliveries))

    job = sub.add_parser(
        "job",
        help="asynchronous inference jobs: a model run over every row of a file, at the lowest priority",
        description="A job runs a version of a model over every row of an .npz, a .jsonl of v2 requests or a .txt "
        "of texts, in chunks on the inference processes, behind every interactive request. The version is fixed "
        "when the server accepts the job.",
    )
    actions = job.add_subparsers(dest="job_command", required=True)
    p = actions.add_parser("submit", parents=[common], help="upload an input file and queue a job (inference role)")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("input", metavar="INPUT", help="an .npz (one array per input), a .jsonl of v2 requests, a .txt")
    p.add_argument("--alias", default=None, help="the alias whose version runs it (default production)")
    p.add_argument("--version", type=int, default=None, metavar="N", help="a version number, instead of an alias")
    p.add_argument("--format", default=None, choices=["npz", "jsonl", "text"], help="default: from the suffix")
    p.add_argument(
        "--output", action="append", default=[], metavar="NAME", help="an output to keep (repeatable; default all)"
    )
    p.add_argument("--result-format", default=None, choices=["jsonl", "npz"], help="for text input (default jsonl)")
    p.add_argument("--wait", action="store_true", help="wait for the job to end; exit 1 if it failed or was cancelled")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="with --wait: give up after this")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_runner(cmd_job_submit))
    p = actions.add_parser("show", parents=[common], help="a job: its state, rows done, errors")
    p.add_argument("id", metavar="ID")
    p.set_defaults(func=_runner(cmd_job_show))
    p = actions.add_parser("list", parents=[common], help="your jobs, newest first")
    p.add_argument("--state", default="", choices=["", "queued", "running", "succeeded", "failed", "cancelled"])
    p.add_argument("--model", default="")
    p.set_defaults(func=_runner(cmd_job_list))
    p = actions.add_parser(
        "wait", parents=[common], help="a progress bar until the job ends; exit 1 if it failed or was cancelled"
    )
    p.add_argument("id", metavar="ID")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="give up after this (exit 1)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_runner(cmd_job_wait))
    p = actions.add_parser("fetch", parents=[common], help="download a succeeded job's result (.npz or JSON Lines)")
    p.add_argument("id", metavar="ID")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write it")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_runner(cmd_job_fetch))
    p = actions.add_parser("cancel", parents=[common], help="stop a queued or running job (inference role)")
    p.add_argument("id", metavar="ID")
    p.set_defaults(func=_runner(cmd_job_cancel))
