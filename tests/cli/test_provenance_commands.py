"""Signed provenance from the command line against a live server: ``push --sign-key``, ``pull`` checking the
registry's signature, ``verify`` of a pulled folder and of a version, and an alias that requires a signature.

The server is ``modelyard serve`` on the embedded default, trusting one uploader's key as ``ml-team``
(``MODELYARD_TRUSTED_SIGNERS``); the registry's own key is the one it generated into its data folder.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelyard.provenance import Signer, generate_private_key
from tests.support.embedded import LiveServer, modelyard, start_live_server
from tests.support.onnx_models import add_model_bytes
from tests.support.signing import certificate_chain

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("provenance")
    for name in ("ml-team", "stranger"):
        key = generate_private_key()
        (folder / f"{name}.key.pem").write_bytes(key)
        (folder / f"{name}.pub.pem").write_bytes(Signer(key).public_pem)
    chain = certificate_chain(folder, "ml-team-ca")  # a CA the registry trusts, and a leaf it issued
    (folder / "leaf.key.pem").write_bytes(chain.leaf_key_pem)
    (folder / "leaf.pem").write_bytes(chain.leaf_pem)
    signers = f"ml-team={folder / 'ml-team.pub.pem'},ml-team-ca={chain.root_path}"
    found = start_live_server(folder, MODELYARD_TRUSTED_SIGNERS=signers)
    try:
        yield found
    finally:
        found.server.stop()


def run(live: LiveServer, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    done = live.run(*args)
    assert done.returncode == expect, f"{args}: exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done


def key_id(folder: Path, name: str) -> str:
    return Signer((folder / name).read_bytes()).key_id


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_signed_push_pulled_and_verified(live: LiveServer):
    folder = live.folder
    run(live, "login", live.url, "--token", live.createtoken("alice", "admin"))
    subprocess.run([sys.executable, str(ROOT / "scripts" / "example_model.py"), str(folder)], check=True)
    # The registry's public key as an operator hands it out: the public half of the key it generated.
    (folder / "registry.pub.pem").write_bytes(Signer((folder / "data" / "signing-key.pem").read_bytes()).public_pem)
    registry, uploader = key_id(folder, "data/signing-key.pem"), key_id(folder, "ml-team.key.pem")

    push = run(live, "push", "example", "model.onnx", "model.onnx.data", "--sign-key", "ml-team.key.pem", "--quiet")
    assert push.stdout.splitlines()[1:] == [
        "  input   x  FP32  [-1, 4]",
        "  output  y  FP32  [-1, 2]",
        "  signed   model.sig by ml-team.key.pem, verified by the registry",
    ]

    # The server checks every signature of the version now.
    checked = run(live, "verify", "example", "1")
    assert checked.stdout == (
        "'example' version 1: signed\n"
        f"  uploader  ml-team  key {uploader[:16]}  verified\n"
        f"  registry  modelyard  key {registry[:16]}  verified\n"
    )
    pinned = run(live, "verify", "example", "1", "--key", "registry.pub.pem")
    assert pinned.stdout.splitlines()[-1] == (
        f"  Signature OK: model.sig signs every file, with registry.pub.pem (key {registry[:16]})."
    )

    # pull checks model.sig with the keys the server lists, says so, and keeps the bundle beside the files.
    pull = run(live, "pull", "example", "1", "pulled", "--quiet")
    assert pull.stdout.splitlines() == [
        "Pulled 'example' version 1 (2 file(s), sha256 checked) into pulled.",
        f"Signature OK: model.sig is the registry's over every file (key {registry[:16]}), checked with the keys "
        "the server itself lists (/api/v1/signing-keys); pass --key REGISTRY.pub.pem to check against a key you "
        "trust.",
        "Load pulled/model.onnx",
    ]
    assert sorted(p.name for p in (folder / "pulled").iterdir()) == ["model.onnx", "model.onnx.data", "model.sig"]
    as_json = json.loads(run(live, "pull", "example", "1", "pinned", "--key", "registry.pub.pem", "--json").stdout)
    assert as_json["signature"] == {"verified": True, "signer": "registry.pub.pem", "key_id": registry, "keys": "given"}

    # A key that did not sign it: refused, and no model.sig is kept.
    wrong = run(live, "pull", "example", "1", "wrong", "--key", "ml-team.pub.pem", "--quiet", expect=1)
    assert wrong.stderr == (
        f"modelyard pull: model.sig of 'example' version 1 does not verify: signed by key {registry[:16]}, "
        "which is not trusted here\n"
    )
    assert not (folder / "wrong" / "model.sig").exists()
    unchecked = run(live, "pull", "example", "1", "unchecked", "--no-verify", "--quiet")
    assert unchecked.stdout.splitlines()[1] == "Signature not checked (--no-verify)."
    assert sorted(p.name for p in (folder / "unchecked").iterdir()) == ["model.onnx", "model.onnx.data"]

    # verify PATH --key: the folder's files against its model.sig, no server needed.
    offline = {**live.env, "MODELYARD_URL": "http://127.0.0.1:9"}
    ok = modelyard(offline, "verify", "pulled", "--key", "registry.pub.pem", cwd=folder)
    assert (ok.returncode, ok.stdout) == (
        0,
        f"pulled: 2 file(s) match model.sig, signed with registry.pub.pem (key {registry[:16]}).\n",
    )

    model = folder / "pulled" / "model.onnx"
    signed = sha256(model)
    data = bytearray(model.read_bytes())
    data[-1] ^= 1  # one byte changed
    model.write_bytes(bytes(data))
    changed = run(live, "verify", "pulled", "--key", "registry.pub.pem", expect=1)
    assert changed.stderr == (
        f"modelyard verify: pulled: model.onnx: sha256 {sha256(model)[:16]}… is not the signed {signed[:16]}…\n"
    )
    assert changed.stdout == ""

    no_key = run(live, "verify", "pulled", expect=2)
    assert no_key.stderr == (
        "modelyard verify: checking a folder needs --key PUB.pem: the registry's public key (or the uploader's)\n"
    )
    nowhere = run(live, "verify", "example", "--key", "registry.pub.pem", expect=2)
    assert nowhere.stderr.startswith("modelyard verify: example is not a folder: ")


def test_a_push_signed_by_an_untrusted_key_is_refused(live: LiveServer):
    token = ("--token", live.createtoken("bob", "maintainer"))
    model = live.folder / "lone.onnx"
    model.write_bytes(add_model_bytes(bias=3.0))

    done = run(live, "push", "lone", str(model), "--sign-key", "stranger.key.pem", "--quiet", *token, expect=1)

    stranger = key_id(live.folder, "stranger.key.pem")
    assert done.stderr == (
        f"Created model 'lone'.\nmodelyard push: model.sig: signed by key {stranger[:16]}, which is not trusted here\n"
    )
    assert json.loads(run(live, "versions", "lone", "--json", *token).stdout) == []
    chain_alone = run(live, "push", "lone", str(model), "--sign-chain", "x.pem", *token, expect=2)
    assert chain_alone.stderr == "modelyard push: --sign-cert and --sign-chain go with --sign-key KEY.pem\n"


def test_an_alias_that_requires_a_signature_from_the_command_line(live: LiveServer):
    admin = ("--token", live.createtoken("carol", "admin"))
    for bias in (1.0, 2.0):
        (live.folder / f"add{bias:g}.onnx").write_bytes(add_model_bytes(bias=bias))
    run(live, "push", "guarded", "add1.onnx", "--sign-key", "ml-team.key.pem", "--quiet", *admin)
    run(live, "push", "guarded", "add2.onnx", "--quiet", *admin)  # version 2: not signed by its uploader

    required = run(live, "alias", "guarded", "staging", "--require-signature", "--trusted-signer", "ml-team", *admin)
    assert required.stdout == (
        "'staging' of 'guarded': version none; not protected, not served; requires a signature by ml-team.\n"
    )
    refused = run(live, "promote", "guarded", "staging", "2", *admin, expect=1)
    assert refused.stderr == (
        "modelyard promote: version 2 is not signed by its uploader, "
        "and 'staging' requires a signature by one of 'ml-team'\n"
    )
    assert run(live, "promote", "guarded", "staging", "1", *admin).stdout == (
        "Moved 'staging' of 'guarded' from version None to 1.\n"
    )
    shown = json.loads(run(live, "alias", "guarded", "staging", "--json", *admin).stdout)
    assert (shown["version"], shown["require_signature"], shown["trusted_signers"]) == (1, True, ["ml-team"])
    relaxed = run(live, "alias", "guarded", "staging", "--no-require-signature", "--any-signer", *admin)
    assert relaxed.stdout == "'staging' of 'guarded': version 1; not protected, not served; no signature required.\n"
    maintainer = ("--token", live.createtoken("dave", "maintainer"))
    denied = run(live, "alias", "guarded", "staging", "--require-signature", *maintainer, expect=1)
    assert denied.stderr == "modelyard alias: changing an alias's signature requirement needs the admin role\n"


def test_a_push_signed_with_a_certificate_is_recorded_under_its_authoritys_name(live: LiveServer):
    token = ("--token", live.createtoken("erin", "maintainer"))
    model = live.folder / "certified.onnx"
    model.write_bytes(add_model_bytes(bias=4.0))

    push = run(
        live,
        "push",
        "certified",
        str(model),
        "--sign-key",
        "leaf.key.pem",
        "--sign-cert",
        "leaf.pem",
        "--sign-chain",
        "ml-team-ca.pem",
        "--quiet",
        *token,
    )

    assert push.stdout.splitlines()[-1] == "  signed   model.sig by leaf.key.pem, verified by the registry"
    shown = run(live, "verify", "certified", "1", *token).stdout.splitlines()
    assert shown[0] == "'certified' version 1: signed"
    assert shown[1].startswith("  uploader  ml-team-ca  key ") and shown[1].endswith("  verified")
