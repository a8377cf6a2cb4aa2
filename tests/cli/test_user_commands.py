"""Every user command against a live server, as two people with their own profiles; webhooks received and checked.

The server is ``modelyard serve`` on the embedded default (SQLite, in-process tasks); the commands
are the installed ``modelyard`` in processes of their own; the webhook receiver is a real HTTP
server on 127.0.0.1 that checks each signature.
"""

from __future__ import annotations

import json
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tests.support.embedded import LiveServer
from tests.support.onnx_models import unknown_op_model
from tests.support.polling import eventually
from tests.support.webhooks import webhook_receiver

ROOT = Path(__file__).resolve().parents[2]
SECRET = "the-receivers-shared-secret"


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, f"exit {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}"
    return done


def example_model(folder: Path) -> None:
    ok(
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "example_model.py"), str(folder)], capture_output=True, text=True
        )
    )


def test_every_command_against_a_live_server(live: LiveServer):
    alice_token = live.createtoken("alice", "admin")
    bob_token = live.createtoken("bob", "approver")
    outputs: list[str] = []  # everything the commands printed, checked for secrets at the end

    def run(*args: str, stdin: str | None = None, expect: int = 0) -> subprocess.CompletedProcess[str]:
        done = live.run(*args, stdin=stdin)
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == expect, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    # Profiles: alice is the default, bob has his own; the file is the owner's alone.
    login = run("login", live.url, "--token", alice_token)
    config = live.folder / "home" / ".config" / "modelyard" / "config.toml"
    assert login.stdout == f"Logged in to {live.url} as alice (admin); saved as profile 'default' in {config}.\n"
    run("login", live.url, "--profile", "bob", "--token", bob_token)
    assert stat.S_IMODE(config.stat().st_mode) == 0o600

    with webhook_receiver() as receiver:
        hooks = run(
            "webhooks",
            "add",
            receiver.url,
            "--event",
            "version.ready",
            "--event",
            "promotion.requested",
            "--event",
            "promotion.approved",
            "--event",
            "alias.moved",
            "--secret-stdin",
            stdin=SECRET + "\n",
        )
        assert hooks.stdout.startswith("Registered webhook ")
        assert SECRET not in hooks.stdout + hooks.stderr

        # Push with a progress bar, wait for validation, print the signature.
        example_model(live.folder)
        push = run(
            "push",
            "example",
            "model.onnx",
            "model.onnx.data",
            "--description",
            "first cut",
            "--metadata",
            '{"run": "42"}',
        )
        assert "Created model 'example'." in push.stderr
        progress = push.stderr.splitlines()[-1]
        assert progress.startswith("Uploading model.onnx + 1 file(s) [########################] 100.0%")
        files = sum((live.folder / name).stat().st_size for name in ("model.onnx", "model.onnx.data"))
        assert f"  {files} B / {files} B  " in progress  # the files' bytes, not the multipart form around them
        assert "/s  in 0:0" in progress
        assert push.stdout.splitlines()[0].startswith("Version 1 of 'example' is ready (sha256 ")
        assert push.stdout.splitlines()[1:] == ["  input   x  FP32  [-1, 4]", "  output  y  FP32  [-1, 2]"]

        models = run("models")
        assert models.stdout.splitlines()[1].split() == ["example", "1"]
        versions = json.loads(run("versions", "example", "--json").stdout)
        assert [(v["version"], v["status"], v["metadata"]) for v in versions] == [(1, "ready", {"run": "42"})]
        show = run("show", "example", "1")
        assert "  file     model.onnx.data  external_data  36 B  " in show.stdout

        # Promote: production is protected, so a request; bob approves it from his profile and waits for the fleet.
        promote = run("promote", "example", "production", "1", "--reason", "first release")
        assert promote.stdout == (
            "'production' is protected: promotion request 1 is pending.\nAnother approver runs: modelyard approve 1\n"
        )
        own = run("approve", "1", expect=1)  # alice may not approve her own request
        assert own.stderr == "modelyard approve: you requested this promotion; another approver must approve it\n"
        approve = run("approve", "1", "--profile", "bob", "--reason", "looks good", "--wait", "60")
        assert approve.stdout == "Approved promotion 1: 'production' of 'example' now points to version 1.\n"

        # Infer over /v2 binary tensors.
        infer = run("infer", "example", "--input", "x=[[1, 2, 3, 4]]")
        assert infer.stdout == "y  float32  [1, 2]\n[[4.5 6.5]]\n"
        np.save(live.folder / "x.npy", np.array([[0, 1, 0, 1], [1, 1, 1, 1]], dtype=np.float64))  # cast to FP32
        infer_json = json.loads(run("infer", "example", "--input", "x=x.npy", "--json").stdout)
        assert infer_json == {"y": {"shape": [2, 2], "dtype": "float32", "data": [[0.5, 2.5], [2.5, 2.5]]}}

        # Pull every file, sha256 checked, and load it with ONNX Runtime.
        pull = run("pull", "example", "production", "pulled")
        assert pull.stdout.splitlines()[0] == "Pulled 'example' version 1 (2 file(s), sha256 checked) into pulled."
        assert pull.stderr.splitlines()[-1].startswith("Downloading example version 1 [####")
        assert pull.stdout.splitlines()[1].startswith("Signature OK: model.sig is the registry's over every file")
        assert sorted(p.name for p in (live.folder / "pulled").iterdir()) == [
            "model.onnx",
            "model.onnx.data",
            "model.sig",
        ]
        session = ort.InferenceSession(str(live.folder / "pulled" / "model.onnx"), providers=["CPUExecutionProvider"])
        [y] = session.run(None, {"x": np.array([[1, 2, 3, 4]], dtype=np.float32)})
        assert y.tolist() == [[4.5, 6.5]]

        # A second version (the same files, so allowed on purpose): a direct move on an unprotected alias, a
        # rollback, a rejected request, the history.
        run("push", "example", "model.onnx", "model.onnx.data", "--quiet", "--allow-duplicate")
        moved = run("promote", "example", "staging", "1", "--reason", "try")
        assert moved.stdout == "Moved 'staging' of 'example' from version None to 1.\n"
        assert run("promote", "example", "staging", "2").stdout == "Moved 'staging' of 'example' from version 1 to 2.\n"
        rollback = run("rollback", "example", "staging", "--reason", "back")
        assert rollback.stdout == "Rolled 'staging' of 'example' back from version 2 to 1.\n"
        run("promote", "example", "production", "2", "--reason", "next")
        pending = json.loads(run("promotions", "--state", "pending", "--json").stdout)
        assert [(p["id"], p["version"], p["requested_by"]) for p in pending] == [(2, 2, "alice")]
        assert run("reject", "2", "--profile", "bob", "--reason", "not yet").stdout == (
            "Rejected promotion 2: production of 'example' -> version 2 (rejected).\n"
        )
        history = run("history", "example", "staging").stdout.splitlines()
        assert [line.split()[1:4] for line in history[1:]] == [
            ["1", "set", "alice"],
            ["1", "2", "set"],
            ["2", "1", "rollback"],
        ]
        at = run("history", "example", "production", "--at", "2099-01-01T00:00:00Z")
        assert at.stdout.startswith(
            "At 2099-01-01T00:00:00+00:00, 'production' of 'example' pointed to version 1 (since "
        )

        # The audit log: listed, exported, verified.
        audit = run("audit", "--limit", "3", "--action", "promotion.")
        assert [line.split()[3] for line in audit.stdout.splitlines()[1:]] == [
            "promotion.reject",
            "promotion.request",
            "promotion.approve",
        ]
        run("audit", "--export", "jsonl", "--output", "audit.jsonl")
        *exported, signed = [json.loads(line) for line in (live.folder / "audit.jsonl").read_text().splitlines()]
        assert [e["seq"] for e in exported] == list(range(1, len(exported) + 1))
        assert (signed["type"], signed["seq"]) == ("signed_head", len(exported))
        assert run("audit", "--verify").stdout == f"Audit chain OK: {len(exported)} events checked.\n"
        assert run("audit", "--verify", "--profile", "bob", expect=1).stderr == (
            "modelyard audit: reading the audit log needs the auditor or admin role\n"
        )

        # The webhooks came in, each signed with the shared secret.
        expected = ["version.ready", "promotion.requested", "promotion.approved", "alias.moved"]
        eventually(lambda: set(expected) <= set(receiver.events()), timeout=30, what=lambda: receiver.events())
        assert all(request.signature_ok(SECRET) for request in receiver.received)
        first = next(r.json for r in receiver.received if r.json["event"] == "alias.moved")
        assert (first["model"], first["version"], first["details"]["moved_by"]) == ("example", 1, "bob")
        deliveries = json.loads(run("webhooks", "deliveries", hooks.stdout.split()[2].rstrip(":"), "--json").stdout)
        assert {d["status"] for d in deliveries} == {"delivered"}

    # No command printed a secret.
    assert not [text for text in outputs if alice_token in text or bob_token in text or SECRET in text]


def test_refusals_exit_1_with_the_servers_message_and_json_for_scripts(live: LiveServer):
    token = live.createtoken("carl", "maintainer")
    env_token = ("--token", token)
    missing = live.run("promote", "nothing", "production", "1", *env_token)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == "modelyard promote: not found\n"
    as_json = live.run("show", "nothing", "3", "--json", *env_token)
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout) == {"error": "not found", "detail": None, "status": 404}
    bad_token = live.run("models", "--token", "my_0000_bogus")
    assert (bad_token.returncode, bad_token.stderr) == (1, "modelyard models: invalid or revoked API token\n")
    no_server = live.run("models", "--url", "http://127.0.0.1:9", *env_token)
    assert no_server.returncode == 1 and no_server.stderr.startswith(
        "modelyard models: cannot reach http://127.0.0.1:9"
    )
    env = {k: v for k, v in live.env.items() if k not in ("MODELYARD_URL", "MODELYARD_TOKEN")}
    unconfigured = subprocess.run(
        [sys.executable, "-m", "modelyard.cli", "models"],
        env={**env, "HOME": str(live.folder / "nobody"), "XDG_CONFIG_HOME": str(live.folder / "nobody")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unconfigured.returncode == 2
    assert unconfigured.stderr.startswith("modelyard models: no server: pass --url, set MODELYARD_URL")


def test_a_failed_push_prints_each_error_as_its_reason_with_the_detail_lines_below(live: LiveServer):
    token = ("--token", live.createtoken("fay", "maintainer"))
    model = live.folder / "frobnicate.onnx"
    model.write_bytes(unknown_op_model().SerializeToString())
    reason = "onnx.checker rejected the model: No Op registered for FrobnicateTensor with domain_version of 17"
    detail = "==> Context: Bad node spec for node. Name:  OpType: FrobnicateTensor"
    pushed = live.run("push", "frobnicate", str(model), "--quiet", *token)
    assert pushed.returncode == 1
    assert pushed.stderr.endswith(f"Version 1 of 'frobnicate' failed validation:\n  - {reason}\n    {detail}\n"), (
        pushed.stderr
    )
    shown = ok(live.run("show", "frobnicate", "1", *token))
    assert f"  error    {reason}\n           {detail}\n" in shown.stdout
    assert json.loads(ok(live.run("show", "frobnicate", "1", "--json", *token)).stdout)["errors"] == [
        f"{reason}\n{detail}"
    ]


def test_an_upload_over_the_limit_is_refused_with_the_servers_message(live: LiveServer):
    token = live.createtoken("dora", "maintainer")
    big = live.folder / "big.onnx"
    big.write_bytes(b"\0" * 2_100_000)  # MODELYARD_MAX_UPLOAD_BYTES is 2,000,000 on this server
    done = live.run("push", "big", str(big), "--token", token, "--quiet")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "modelyard push: the request body is larger than the limit of 2000000 bytes"


def test_login_with_a_password_makes_a_token_and_a_lockout_is_reported(live: LiveServer):
    live.createtoken("erin", "viewer")
    setpw = live.run(
        "manage",
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model as g; u = g().objects.get(username='erin'); "
        "u.set_password('a long enough password'); u.save()",
    )
    assert setpw.returncode == 0, setpw.stderr

    wrong = live.run("login", live.url, "--profile", "erin", "--username", "erin", "--password-stdin", stdin="nope\n")
    assert (wrong.returncode, wrong.stderr) == (1, "modelyard login: login failed: Wrong username or password.\n")
    right = live.run(
        "login",
        live.url,
        "--profile",
        "erin",
        "--username",
        "erin",
        "--password-stdin",
        "--json",
        stdin="a long enough password\n",
    )
    assert right.returncode == 0, right.stderr
    assert json.loads(right.stdout)["user"] == "erin"
    assert "my_" not in right.stdout + right.stderr
    assert live.run("models", "--profile", "erin").returncode == 0  # the saved token works
    with sqlite3.connect(live.folder / "data" / "modelyard.sqlite3") as db:
        [(name,)] = db.execute(
            "SELECT t.name FROM registry_apitoken t JOIN auth_user u ON u.id = t.user_id WHERE u.username = 'erin' "
            "AND t.name != ''"
        ).fetchall()
        assert name == "modelyard login"
        sessions = db.execute("SELECT COUNT(*) FROM django_session").fetchone()[0]
    assert sessions == 0  # signed out again: no session outlives the login

    for _ in range(3):  # MODELYARD_LOGIN_MAX_FAILURES is 3 on this server
        live.run("login", live.url, "--profile", "erin", "--username", "erin", "--password-stdin", stdin="nope\n")
    locked = live.run(
        "login",
        live.url,
        "--profile",
        "erin",
        "--username",
        "erin",
        "--password-stdin",
        stdin="a long enough password\n",
    )
    assert locked.returncode == 1
    assert locked.stderr.startswith(
        "modelyard login: login failed: Too many failed logins for 'erin': logging in is locked"
    )


def test_a_pulled_file_whose_sha256_does_not_match_is_not_kept(live: LiveServer):
    token = live.createtoken("finn", "maintainer")
    example_model(live.folder / "finn")
    pushed = live.run(
        "push", "tampered", "finn/model.onnx", "finn/model.onnx.data", "--token", token, "--quiet", "--json"
    )
    assert pushed.returncode == 0, pushed.stderr
    [stored] = (live.folder / "data" / "artifacts").rglob("tampered/*/model.onnx.data")
    stored.write_bytes(b"\1" * stored.stat().st_size)

    done = live.run("pull", "tampered", "1", "out", "--token", token, "--quiet")
    assert done.returncode == 1
    assert "modelyard pull: model.onnx.data of 'tampered' version 1: sha256 " in done.stderr
    assert done.stderr.rstrip().endswith("; the file was not kept")
    assert sorted(p.name for p in (live.folder / "out").iterdir()) == ["model.onnx"]


def test_batching_shows_and_changes_whether_a_models_requests_are_merged(live: LiveServer, tmp_path: Path):
    from tests.support.onnx_models import first_dim_model

    token = ("--token", live.createtoken("nora", "maintainer"))
    model = tmp_path / "normalised.onnx"
    model.write_bytes(first_dim_model("softmax0").SerializeToString())
    ok(live.run("push", "normalised", str(model), "--quiet", *token))
    unsafe = (
        "output 'y' of two synthetic samples run together differs from each run alone by up to 0.438 "
        "(tolerance 0.0001): the first dimension is not a batch"
    )

    shown = ok(live.run("batching", "normalised", *token))
    assert shown.stdout == f"normalised: batching auto, max_batch_size 32\n  v1: not merged: {unsafe}\n"
    turned_on = ok(live.run("batching", "normalised", "on", *token))
    assert turned_on.stdout == (
        f"normalised: batching on, max_batch_size 32\n  v1: merged: the model's batching is on (validation: {unsafe})\n"
    )
    no_batch = ok(live.run("batching", "normalised", "--max-batch-size", "0", *token))
    assert no_batch.stdout == (
        "normalised: batching on, max_batch_size 0 (does not batch)\n"
        "  v1: not merged: the model's max_batch_size is 0: it does not batch\n"
    )
    as_json = json.loads(ok(live.run("batching", "normalised", "--json", *token)).stdout)
    assert (as_json["model"]["batching"], as_json["model"]["max_batch_size"]) == ("on", 0)
    assert as_json["versions"]["1"]["check"] == "unsafe"
    assert (
        "  batching not merged: the model's max_batch_size is 0: it does not batch\n"
        in ok(live.run("show", "normalised", "1", *token)).stdout
    )

    bad = live.run("batching", "normalised", "maybe", *token)
    assert bad.returncode == 2 and "invalid choice: 'maybe'" in bad.stderr
    too_big = live.run("batching", "normalised", "--max-batch-size", "5000", *token)
    assert (too_big.returncode, too_big.stderr) == (
        1,
        "modelyard batching: max_batch_size: Ensure this value is less than or equal to 4096.\n",
    )


def test_a_limited_token_from_login_or_createtoken_is_refused_outside_its_models(live: LiveServer):
    """Least privilege on the embedded server (SQLite): the token carries only the roles and models it names."""
    maker = live.createtoken("hana", "maintainer", "inference")
    assert live.run("models", "--token", maker).returncode == 0
    setpw = live.run(
        "manage",
        "shell",
        "-c",
        "from django.contrib.auth import get_user_model as g; u = g().objects.get(username='hana'); "
        "u.set_password('a long enough password'); u.save()",
    )
    assert setpw.returncode == 0, setpw.stderr
    login = live.run(
        "login",
        live.url,
        "--profile",
        "hana-scorer",
        "--username",
        "hana",
        "--password-stdin",
        "--only-role",
        "inference",
        "--only-model",
        "fraud-*",
        "--json",
        stdin="a long enough password\n",
    )
    assert login.returncode == 0, login.stderr
    assert json.loads(login.stdout)["roles"] == ["inference"]  # what the saved token carries, not all of hana's
    with sqlite3.connect(live.folder / "data" / "modelyard.sqlite3") as db:
        [(roles, models)] = db.execute(
            "SELECT t.roles, t.model_patterns FROM registry_apitoken t JOIN auth_user u ON u.id = t.user_id "
            "WHERE u.username = 'hana' AND t.name = 'modelyard login'"
        ).fetchall()
    assert (json.loads(roles), json.loads(models)) == (["inference"], ["fraud-*"])

    done = live.run("createtoken", "hana", "--only-role", "maintainer", "--only-model", "fraud-*")
    assert done.returncode == 0, done.stderr
    limited = done.stdout.strip().splitlines()[-1]
    example_model(live.folder / "hana")
    files = ("hana/model.onnx", "hana/model.onnx.data")
    refused_push = live.run("push", "other", *files, "--token", limited, "--quiet")
    assert refused_push.returncode == 1
    assert (
        refused_push.stderr.strip()
        .splitlines()[-1]
        .endswith("this API token is limited to models matching 'fraud-*'; 'other' is not one of them")
    )
    assert live.run("push", "other", *files, "--token", maker, "--quiet").returncode == 0, "hana herself may"
    pushed = live.run("push", "fraud-scorer", *files, "--token", limited, "--quiet")
    assert pushed.returncode == 0, pushed.stderr
    listed = live.run("models", "--token", limited, "--json")
    assert [m["name"] for m in json.loads(listed.stdout)] == ["fraud-scorer"]
    refused = live.run("createtoken", "hana", "--only-role", "approver")
    assert refused.returncode == 2
    assert "does not hold the role(s) approver" in refused.stderr
