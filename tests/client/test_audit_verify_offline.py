"""``modelyard audit verify-offline``: an exported audit log checked with public keys alone, no server, no database.

The files here are built as the registry writes them (``modelyard.auditfile``), without Django;
``tests/registry/test_audit_offline.py`` checks files exported by the real registry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modelyard.auditfile import GENESIS_HASH, HASHED_FIELDS, HEAD_BUNDLE_NAME, event_hash, signed_head_record
from modelyard.cli import main
from modelyard.provenance import Signer, generate_private_key
from tests.client.test_imports import run_python

PREFIX = "modelyard audit verify-offline: "


def chain(count: int, *, start: int = 1, prev_hash: str = GENESIS_HASH) -> list[dict[str, Any]]:
    events = []
    for seq in range(start, start + count):
        event: dict[str, Any] = {
            "seq": seq,
            "at": f"2026-01-01T00:00:{seq:02d}.250000+00:00",
            "actor": "alice",
            "actor_id": 2,
            "token_id": None,
            "action": "model.create",
            "target_type": "model",
            "target": f"m{seq}",
            "model": f"m{seq}",
            "before": None,
            "after": {"description": "ünïcode", "tags": ["a"]},
            "ip": "10.0.0.1",
            "user_agent": "modelyard/1.0",
            "request_id": f"{seq:032x}",
            "prev_hash": prev_hash,
        }
        event["hash"] = prev_hash = event_hash(prev_hash, {name: event[name] for name in HASHED_FIELDS})
        events.append(event)
    return events


def signed(signer: Signer, seq: int, chain_hash: str, *, digests: dict[str, str] | None = None) -> dict[str, Any]:
    bundle = signer.sign(digests or {f"audit-head/{seq}": chain_hash}, name=HEAD_BUNDLE_NAME)
    return signed_head_record(
        seq=seq, chain_hash=chain_hash, key_id=signer.key_id, at="2026-01-01T01:00:00+00:00", bundle=bundle
    )


def write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records))
    return path


@pytest.fixture
def signer() -> Signer:
    return Signer(generate_private_key())


@pytest.fixture
def public(signer: Signer, tmp_path: Path) -> Path:
    path = tmp_path / "registry.pub.pem"
    path.write_bytes(signer.public_pem)
    return path


def verify_offline(
    capsys: pytest.CaptureFixture[str], path: Path, *keys: Path, json_output: bool = False
) -> tuple[int, str, str]:
    args = ["audit", "verify-offline", str(path), *(f"--key={key}" for key in keys)]
    code = main([*args, "--json"] if json_output else args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_it_runs_with_the_server_code_unimportable(signer, public, tmp_path):
    events = chain(5)
    path = write(tmp_path / "audit.jsonl", [*events, signed(signer, 3, events[2]["hash"])])
    done = run_python(
        "from modelyard.cli import main\n"
        f"code = main(['audit', 'verify-offline', {str(path)!r}, '--key', {str(public)!r}])\n"
        "server = ('django', 'celery', 'onnx', 'onnxkit', 'registry', 'inference', 'storage', 'modelyard.settings')\n"
        "assert not [m for m, module in sys.modules.items() if module is not None and m.startswith(server)]\n"
        "sys.exit(code)\n"
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        "5 events, chain ok, 1 signed head verified, last signed seq 3\nevents seq 4-5 are not covered by a signature\n"
    )


def test_json_output_for_scripts(signer, public, tmp_path, capsys):
    events = chain(4)
    path = write(tmp_path / "audit.jsonl", [*events, signed(signer, 4, events[3]["hash"])])
    code, out, err = verify_offline(capsys, path, public, json_output=True)
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "ok": True,
        "events": 4,
        "first_seq": 1,
        "last_seq": 4,
        "signed_heads": 1,
        "last_signed_seq": 4,
        "summary": "4 events, chain ok, 1 signed head verified, last signed seq 4",
        "notes": [],
    }
    events[1]["actor"] = "mallory"
    write(path, [*events, signed(signer, 4, events[3]["hash"])])
    code, out, err = verify_offline(capsys, path, public, json_output=True)
    assert (code, json.loads(out)) == (1, {"ok": False, "error": "event seq 2: hash does not match its content"})
    assert err == f"{PREFIX}event seq 2: hash does not match its content\n"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda events: events.insert(3, events[2]), "event seq 3 follows event seq 3: out of order or repeated"),
        (
            lambda events: events.__delitem__(slice(1, 3)),
            "events seq 2-3 are missing (the next event in the file is seq 4)",
        ),
        (
            lambda events: events[3].update(prev_hash=events[1]["hash"]),
            "event seq 4: prev_hash does not link to event seq 3",
        ),
        (lambda events: events[0].update(prev_hash="1" * 64), "event seq 1: prev_hash is not the genesis hash"),
        (lambda events: events[4].update(after={"tags": ["b"]}), "event seq 5: hash does not match its content"),
        (lambda events: events[4].pop("request_id"), "line 5: an event without request_id"),
        (lambda events: events.clear(), "no audit events in the file"),
    ],
)
def test_a_damaged_chain_fails_naming_the_first_problem(signer, public, tmp_path, capsys, change, problem):
    events = chain(6)
    head = signed(signer, 6, events[5]["hash"])
    change(events)
    path = write(tmp_path / "audit.jsonl", [*events, head])
    assert verify_offline(capsys, path, public) == (1, "", f"{PREFIX}{problem}\n")


def test_a_signed_head_must_sign_its_own_seq_and_hash(signer, public, tmp_path, capsys):
    events = chain(4)
    path = tmp_path / "audit.jsonl"
    other = signed(signer, 3, events[3]["hash"], digests={"audit-head/4": events[3]["hash"]})
    write(path, [*events, other])
    assert verify_offline(capsys, path, public) == (
        1,
        "",
        f"{PREFIX}signed head seq 3: the signature covers audit-head/4, not audit-head/3\n",
    )

    relabelled = signed(signer, 4, events[3]["hash"]) | {"hash": events[2]["hash"]}
    write(path, [*events, relabelled])
    assert verify_offline(capsys, path, public) == (
        1,
        "",
        f"{PREFIX}signed head seq 4: the record's hash is not the one signed\n",
    )

    misnamed = signed(signer, 4, events[3]["hash"]) | {"key_id": "ab" * 32}
    write(path, [*events, misnamed])
    assert verify_offline(capsys, path, public) == (
        1,
        "",
        f"{PREFIX}signed head seq 4: key_id does not name the key that signed it\n",
    )


def test_a_tampered_bundle_does_not_verify(signer, public, tmp_path, capsys):
    events = chain(2)
    head = signed(signer, 2, events[1]["hash"])
    signature = head["bundle"]["dsseEnvelope"]["signatures"][0]
    signature["sig"] = ("A" if signature["sig"][0] != "A" else "B") + signature["sig"][1:]
    path = write(tmp_path / "audit.jsonl", [*events, head])
    code, out, err = verify_offline(capsys, path, public)
    assert (code, out) == (1, "")
    assert err.startswith(f"{PREFIX}signed head seq 2: the signature by {public} does not verify: ")


def test_a_partial_file_verifies_from_its_first_event(signer, public, tmp_path, capsys):
    events = chain(5)[2:]
    path = write(tmp_path / "audit.jsonl", [*events, signed(signer, 5, events[-1]["hash"])])
    assert verify_offline(capsys, path, public) == (
        0,
        "3 events, chain ok, 1 signed head verified, last signed seq 5\n"
        "the file starts at event seq 3: the events before it are not in the file\n",
        "",
    )


def test_a_signed_head_before_the_first_event_fails(signer, public, tmp_path, capsys):
    events = chain(5)
    path = write(tmp_path / "audit.jsonl", [*events[2:], signed(signer, 2, events[1]["hash"])])
    assert verify_offline(capsys, path, public) == (
        1,
        "",
        f"{PREFIX}signed head seq 2: the file has no event seq 2 (its events are seq 3-5)\n",
    )


def test_lines_that_are_not_records_fail(public, tmp_path, capsys):
    path = tmp_path / "audit.jsonl"
    path.write_text(json.dumps(chain(1)[0]) + "\n{not json\n")
    assert verify_offline(capsys, path, public) == (1, "", f"{PREFIX}line 2: not JSON\n")
    path.write_text('{"type": "note", "seq": 1}\n')
    assert verify_offline(capsys, path, public) == (1, "", f"{PREFIX}line 1: unknown record type 'note'\n")


def test_a_missing_file_or_key_is_named(public, tmp_path, capsys):
    missing = tmp_path / "nothing.jsonl"
    assert verify_offline(capsys, missing, public) == (1, "", f"{PREFIX}{missing}: No such file or directory\n")
    path = write(tmp_path / "audit.jsonl", chain(1))
    not_a_key = tmp_path / "key.txt"
    not_a_key.write_text("hello")
    code, out, err = verify_offline(capsys, path, not_a_key)
    assert (code, out) == (1, "")
    assert err.startswith(f"{PREFIX}{not_a_key}: not a PEM public key: ")


def test_the_key_is_required(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["audit", "verify-offline", "audit.jsonl"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.endswith("error: the following arguments are required: --key\n")


def test_the_audit_command_still_lists_exports_and_verifies_without_the_subcommand():
    from modelyard.cli import parse_args

    args = parse_args(["audit", "--export", "jsonl", "--output", "a.jsonl", "--since", "2026-01-01"])
    assert (args.audit_command, args.export, args.output, args.since) == (None, "jsonl", "a.jsonl", "2026-01-01")
    assert parse_args(["audit", "--json", "verify-offline", "a.jsonl", "--key", "k"]).json is True
