"""The audit log as a file: the hash of one event, a signed chain head, and the offline check of an export.

The registry hashes every event it appends with :func:`event_hash` (``registry/audit/chain.py``) and
recomputes the chain with it (``registry/audit/verify.py``); ``modelyard audit verify-offline``
recomputes an exported file with the same function, with no server and no database. So this module
imports the standard library and :mod:`modelyard.provenance`, nothing of Django or the registry.

A JSONL export (``GET /api/v1/audit/export?format=jsonl``) holds one event per line, as the registry
stores it, then the signed heads: lines of ``{"type": "signed_head", "seq", "hash", "key_id", "at",
"bundle"}``. A signed head is an OpenSSF Model Signing bundle over one resource, ``audit-head/<seq>``,
whose sha256 is the chain's hash at that seq; since every event's hash covers the one before it, a
trusted signature over the hash at ``seq`` pins every event up to ``seq``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelyard.provenance import ProvenanceError, Trust, verify_bundle

GENESIS_HASH = "0" * 64
# The fields of an event its hash covers, by their exported names (the database's model_name is "model").
HASHED_FIELDS = (
    "seq",
    "at",
    "actor",
    "actor_id",
    "token_id",
    "action",
    "target_type",
    "target",
    "model",
    "before",
    "after",
    "ip",
    "user_agent",
    "request_id",
)
SIGNED_HEAD = "signed_head"
# The name of the manifest a signed head's bundle signs.
HEAD_BUNDLE_NAME = "modelyard-audit-head"


def event_hash(prev_hash: str, canonical: Mapping[str, Any]) -> str:
    """An event's chain hash: sha256 of the previous hash and the event's fields (``HASHED_FIELDS``) as JSON."""
    body = json.dumps(dict(canonical), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256((prev_hash + body).encode()).hexdigest()


def head_resource(seq: int) -> str:
    """The resource a signed head names: its sha256 is the chain's hash at ``seq``."""
    return f"audit-head/{seq}"


def head_digests(seq: int, chain_hash: str) -> dict[str, str]:
    """What a signed head signs (``modelyard.provenance.Signer.sign``): the chain's hash at ``seq``."""
    return {head_resource(seq): chain_hash}


def signed_head_record(*, seq: int, chain_hash: str, key_id: str, at: str, bundle: bytes | str) -> dict[str, Any]:
    """A signed head as one line of a JSONL export; the bundle is embedded as the JSON it is."""
    return {
        "type": SIGNED_HEAD,
        "seq": seq,
        "hash": chain_hash,
        "key_id": key_id,
        "at": at,
        "bundle": json.loads(bundle),
    }


# --- The offline check -------------------------------------------------------------------------------


class AuditFileError(Exception):
    """The first thing wrong with an exported audit log; the message names the event or the signed head."""


@dataclass(frozen=True)
class OfflineReport:
    """What an exported log proved: its events chain, and the signed heads that pin them."""

    events: int
    first_seq: int
    last_seq: int
    signed_heads: int
    last_signed_seq: int | None

    @property
    def summary(self) -> str:
        last = "none" if self.last_signed_seq is None else str(self.last_signed_seq)
        events = "event" if self.events == 1 else "events"
        heads = "signed head" if self.signed_heads == 1 else "signed heads"
        return f"{self.events} {events}, chain ok, {self.signed_heads} {heads} verified, last signed seq {last}"

    @property
    def notes(self) -> list[str]:
        """What the file cannot prove: events before its first, and events after the last signed head."""
        notes = []
        if self.first_seq > 1:
            notes.append(f"the file starts at event seq {self.first_seq}: the events before it are not in the file")
        covered = self.last_signed_seq or 0
        if covered < self.last_seq:
            first = max(covered + 1, self.first_seq)
            if first == self.last_seq:
                notes.append(f"event seq {first} is not covered by a signature")
            else:
                notes.append(f"events seq {first}-{self.last_seq} are not covered by a signature")
        return notes

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "events": self.events,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "signed_heads": self.signed_heads,
            "last_signed_seq": self.last_signed_seq,
            "summary": self.summary,
            "notes": self.notes,
        }


@dataclass(frozen=True)
class _Head:
    line: int
    seq: int
    chain_hash: str
    key_id: str
    bundle: Any


def verify_export(path: Path, trust: Trust) -> OfflineReport:
    """Check an exported JSONL audit log against ``trust``; raises :class:`AuditFileError` at the first problem.

    Every event must follow the one before it without a gap from the file's first event, link to its
    hash and hash to its own fields. Every signed head must verify with a trusted key, sign exactly
    ``audit-head/<seq>`` with the hash the record states, and that hash must be the chain's at ``seq``.
    The file is read twice (the signed heads, then the events), so memory stays constant however long
    the log is.
    """
    heads = sorted(_heads(path), key=lambda head: (head.seq, head.line))
    wanted = {head.seq for head in heads}
    chain_at: dict[int, str] = {}
    count, first_seq, last_seq, prev_hash = 0, 0, 0, GENESIS_HASH
    for number, record in _records(path):
        if record.get("type") is not None:
            continue
        seq, claimed_prev, claimed = _event_fields(number, record)
        if count == 0:
            first_seq = seq
            if seq == 1 and claimed_prev != GENESIS_HASH:
                raise AuditFileError("event seq 1: prev_hash is not the genesis hash")
        elif seq != last_seq + 1:
            if seq <= last_seq:
                raise AuditFileError(f"event seq {seq} follows event seq {last_seq}: out of order or repeated")
            missing = (
                f"event seq {last_seq + 1} is" if seq == last_seq + 2 else f"events seq {last_seq + 1}-{seq - 1} are"
            )
            raise AuditFileError(f"{missing} missing (the next event in the file is seq {seq})")
        elif claimed_prev != prev_hash:
            raise AuditFileError(f"event seq {seq}: prev_hash does not link to event seq {last_seq}")
        if event_hash(claimed_prev, {name: record[name] for name in HASHED_FIELDS}) != claimed:
            raise AuditFileError(f"event seq {seq}: hash does not match its content")
        if seq in wanted:
            chain_at[seq] = claimed
        count, last_seq, prev_hash = count + 1, seq, claimed
    if count == 0:
        raise AuditFileError("no audit events in the file")
    for head in heads:
        _check_head(head, trust, chain_at, first_seq, last_seq)
    return OfflineReport(
        events=count,
        first_seq=first_seq,
        last_seq=last_seq,
        signed_heads=len(heads),
        last_signed_seq=heads[-1].seq if heads else None,
    )


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise AuditFileError(f"line {number}: not JSON") from None
            if not isinstance(record, dict):
                raise AuditFileError(f"line {number}: not a JSON object")
            yield number, record


def _heads(path: Path) -> Iterator[_Head]:
    for number, record in _records(path):
        kind = record.get("type")
        if kind is None:
            continue
        if kind != SIGNED_HEAD:
            raise AuditFileError(f"line {number}: unknown record type {kind!r}")
        seq, chain_hash, key, bundle = (record.get(name) for name in ("seq", "hash", "key_id", "bundle"))
        if not isinstance(seq, int) or not _is_seq(seq) or not isinstance(chain_hash, str) or not isinstance(key, str):
            raise AuditFileError(f"line {number}: a signed head needs an integer seq, a hash and a key_id")
        if not isinstance(bundle, dict):
            raise AuditFileError(f"line {number}: signed head seq {seq}: its bundle is not a JSON object")
        yield _Head(line=number, seq=seq, chain_hash=chain_hash, key_id=key, bundle=bundle)


def _is_seq(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _event_fields(number: int, record: dict[str, Any]) -> tuple[int, str, str]:
    missing = [name for name in (*HASHED_FIELDS, "prev_hash", "hash") if name not in record]
    if missing:
        raise AuditFileError(f"line {number}: an event without {', '.join(missing)}")
    seq, prev_hash, claimed = record["seq"], record["prev_hash"], record["hash"]
    if not _is_seq(seq) or not isinstance(prev_hash, str) or not isinstance(claimed, str):
        raise AuditFileError(f"line {number}: an event needs an integer seq and string prev_hash and hash")
    return seq, prev_hash, claimed


def _check_head(head: _Head, trust: Trust, chain_at: Mapping[int, str], first_seq: int, last_seq: int) -> None:
    where = f"signed head seq {head.seq}"
    try:
        verified = verify_bundle(json.dumps(head.bundle).encode(), trust)
    except ProvenanceError as exc:
        raise AuditFileError(f"{where}: {exc}") from None
    expected = head_resource(head.seq)
    if set(verified.digests) != {expected}:
        raise AuditFileError(f"{where}: the signature covers {', '.join(sorted(verified.digests))}, not {expected}")
    if verified.digests[expected] != head.chain_hash:
        raise AuditFileError(f"{where}: the record's hash is not the one signed")
    if verified.kind == "key" and verified.key_id != head.key_id:
        raise AuditFileError(f"{where}: key_id does not name the key that signed it")
    if head.seq not in chain_at:
        raise AuditFileError(
            f"{where}: the file has no event seq {head.seq} (its events are seq {first_seq}-{last_seq})"
        )
    if chain_at[head.seq] != head.chain_hash:
        raise AuditFileError(f"{where}: hash does not match the chain's hash at seq {head.seq}")
