"""``modelyard shadow start|show|stop`` against a live server, and how ``show`` reads a full report.

The server is ``modelyard serve`` on the embedded default; its in-process inference runtime serves
``production`` and, for the one test that sends requests, mirrors them to the candidate (with no cost
budget, so the mirrored requests are not dropped as ``budget``).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator

import numpy as np
import onnx
import pytest

from modelyard.client import Client, ModelyardError, Promotion, Shadow
from modelyard.client.commands import _shadow_lines
from tests.support.embedded import LiveServer, start_live_server
from tests.support.onnx_models import add_model
from tests.support.polling import eventually


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The package's server, but its shadows may take all the time they need (no request dropped as 'budget')."""
    found = start_live_server(
        tmp_path_factory.mktemp("shadow"),
        MODELYARD_RECONCILE_POLL_SECONDS="0.5",
        MODELYARD_FLEET_HEARTBEAT_SECONDS="0.5",
        MODELYARD_SHADOW_MAX_COST="1",
    )
    try:
        yield found
    finally:
        found.server.stop()


def served_model(live: LiveServer, owner: Client, name: str) -> None:
    """``name`` with versions 1 (x + 1) and 2 (x + 2), version 1 on its protected, served ``production``."""
    approver = Client(live.url, live.createtoken(f"{name}-approver", "approver"))
    folder = live.folder / name
    folder.mkdir()
    for number, bias in ((1, 1.0), (2, 2.0)):
        onnx.save(add_model(bias=bias), folder / f"v{number}.onnx")
        assert owner.wait_ready(name, owner.push(name, folder / f"v{number}.onnx").version).version == number
    request = owner.promote(name, "production", 1, reason="launch")
    assert isinstance(request, Promotion)
    approver.approve(request.id, reason="ok")


def runner(live: LiveServer, token: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        done = live.run(*args, "--token", token)
        assert done.returncode == expect, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    return run


def moment(text: str | None) -> str:
    assert text
    return text[:19].replace("T", " ")


def test_start_show_stop_and_the_refusals(live: LiveServer):
    token = live.createtoken("shay", "maintainer")
    served_model(live, Client(live.url, token), "mirror")
    run = runner(live, token)

    # Nothing shadowed yet, nothing running.
    never = run("shadow", "show", "mirror", "production", expect=1)
    assert (never.stdout, never.stderr) == (
        "",
        "modelyard shadow: alias 'production' of model 'mirror' has never been shadowed\n",
    )
    idle = run("shadow", "stop", "mirror", "production", expect=1)
    assert idle.stderr == "modelyard shadow: alias 'production' of model 'mirror' has no running shadow\n"

    # Start with the version alone: a tenth of the requests.
    started = run("shadow", "start", "mirror", "production", "--version", "2")
    shadow = json.loads(run("shadow", "show", "mirror", "production", "--json").stdout)
    assert (shadow["version"], shadow["serving"], shadow["sample"], shadow["running"]) == (2, 1, 0.1, True)
    assert started.stdout == (
        f"Version 2 of 'mirror' now shadows 'production' (version 1) on 10% of its requests (shadow {shadow['id']}).\n"
        "Its report: modelyard shadow show mirror production\n"
    )

    shown = run("shadow", "show", "mirror", "production").stdout.splitlines()
    assert shown[:3] == [
        f"Shadow {shadow['id']} on 'production' of 'mirror': candidate version 2, serving version 1",
        "  sample    0.1 (10% of the requests)",
        f"  state     running since {moment(shadow['started_at'])} (started by shay)",
    ]
    # No request was sent: every count is zero (how many processes reported may change meanwhile).
    assert shown[3].startswith("  requests  0 mirrored, 0 compared, 0 dropped; ")
    assert shown[3].endswith(" inference process(es) reported")
    assert shown[4:] == [
        "  serving   v1: 0 answered, 0 errors, p50 -, p99 -",
        "  candidate v2: 0 answered, 0 errors, p50 -, p99 -",
        "  outputs   none compared yet",
    ]

    stopped = run("shadow", "stop", "mirror", "production", "--reason", "enough for today").stdout.splitlines()
    ended = json.loads(run("shadow", "show", "mirror", "production", "--json").stdout)
    assert (ended["id"], ended["running"], ended["ended_by"], ended["end_reason"]) == (
        shadow["id"],
        False,
        "shay",
        "enough for today",
    )
    assert stopped[0] == "Stopped the shadow of version 2 on 'production' of 'mirror'. Its final report:"
    after = run("shadow", "show", "mirror", "production").stdout.splitlines()
    # The final report, as show prints it after the stop (but for how many processes have reported it).
    assert stopped[1:5] + stopped[6:] == after[:4] + after[5:]
    assert after[2:4] == [
        f"  state     ended {moment(ended['ended_at'])} by shay: enough for today",
        f"  started   {moment(shadow['started_at'])} by shay",
    ]
    assert run("shadow", "stop", "mirror", "production", expect=1).stderr == (
        "modelyard shadow: alias 'production' of model 'mirror' has no running shadow\n"
    )

    # Refusals: the server's words on stderr, exit 1; with --json also as JSON on stdout.
    missing = run("shadow", "start", "mirror", "production", "--version", "7", expect=1)
    assert (missing.stdout, missing.stderr) == ("", "modelyard shadow: model 'mirror' has no version 7\n")
    as_json = run("shadow", "start", "mirror", "production", "--version", "7", "--json", expect=1)
    assert json.loads(as_json.stdout) == {"error": "model 'mirror' has no version 7", "detail": None, "status": 404}
    same = run("shadow", "start", "mirror", "production", "--version", "1", expect=1)
    assert same.stderr == ("modelyard shadow: alias 'production' serves version 1 already; shadow another version\n")
    share = run("shadow", "start", "mirror", "production", "--version", "2", "--sample", "0", "--json", expect=1)
    refused = json.loads(share.stdout)
    assert refused["status"] == 400 and "sample" in refused["error"], refused
    assert share.stderr.startswith("modelyard shadow: ") and "sample" in share.stderr
    nobody = run("shadow", "show", "nothing", "production", expect=1)
    assert nobody.stderr == "modelyard shadow: not found\n"
    # A usage error is argparse's: exit 2, before any request.
    assert run("shadow", "start", "mirror", "production", expect=2).stderr.endswith(
        "error: the following arguments are required: --version\n"
    )

    # The last shadow stays the one shown: the refused starts changed nothing.
    assert json.loads(run("shadow", "show", "mirror", "production", "--json").stdout)["id"] == shadow["id"]


def test_show_reports_what_the_inference_runtime_mirrored(live: LiveServer):
    token = live.createtoken("mira", "maintainer", "inference")
    owner = Client(live.url, token)
    served_model(live, owner, "mirrored")
    run = runner(live, token)
    run("shadow", "start", "mirrored", "production", "--version", "2", "--sample", "1")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)

    def served() -> bool:
        try:
            owner.infer("mirrored", {"x": x})
        except ModelyardError:  # not loaded yet
            return False
        return True

    eventually(served, timeout=120, interval=0.2, what="production never served version 1")

    def compared() -> Shadow | None:
        [y] = owner.infer("mirrored", {"x": x}).values()
        assert y.tolist() == (x + 1).tolist()  # always the serving version's answer
        shadow = owner.shadow("mirrored", "production")
        return shadow if shadow.compared >= 5 and "y" in shadow.outputs else None

    shadow = eventually(compared, timeout=120, interval=0.2, what=lambda: owner.shadow("mirrored", "production").raw)
    y = shadow.outputs["y"]
    assert (y.max_abs_diff, y.mean_abs_diff, y.top1_agreement) == (1.0, 1.0, 1.0)  # x + 2 against x + 1

    lines = run("shadow", "show", "mirrored", "production").stdout.splitlines()
    assert lines[0].endswith("candidate version 2, serving version 1")
    assert lines[1] == "  sample    1 (100% of the requests)"
    [requests] = [line for line in lines if line.startswith("  requests  ")]
    assert " mirrored, " in requests and " compared, " in requests
    [serving] = [line for line in lines if line.startswith("  serving   v1: ")]
    [candidate] = [line for line in lines if line.startswith("  candidate v2: ")]
    assert ", 0 errors, p50 " in serving and " ms, p99 " in serving and ", 0 errors, p50 " in candidate
    [output] = [line for line in lines if line.startswith("  output    ")]
    assert output.startswith("  output    y: ") and " rows, cosine p1 0." in output
    assert ", max abs diff 1, top-1 agreement 100.00%, psi " in output

    run("shadow", "stop", "mirrored", "production")


def test_show_prints_each_version_and_each_output():
    report = {
        "requests": 40,
        "compared": 37,
        "dropped": 3,
        "dropped_by_reason": {"busy": 2, "queue_full": 1},
        "primary": {"answered": 40, "errors": 0, "error_rate": 0.0, "p50_ms": 1.5, "p99_ms": 4.25, "last_error": ""},
        "candidate": {
            "answered": 37,
            "errors": 3,
            "error_rate": 0.075,
            "p50_ms": 2.5,
            "p99_ms": 8.0,
            "last_error": "Got invalid dimensions\n for input: x",
        },
        "outputs": {
            "embedding": {
                "rows": 74,
                "cosine_p1": 0.99912,
                "cosine_p50": 0.9999994,
                "cosine_min": 0.998,
                "max_abs_diff": 0.0213,
                "mean_abs_diff": 0.001,
                "top1_agreement": None,
                "psi": None,
                "mismatched": 0,
                "mismatch": "",
            },
            "scores": {
                "rows": 74,
                "cosine_p1": 0.95,
                "cosine_p50": 0.99,
                "cosine_min": 0.9,
                "max_abs_diff": 0.5,
                "mean_abs_diff": 0.1,
                "top1_agreement": 0.972973,
                "psi": 0.0412,
                "mismatched": 2,
                "mismatch": "shape [2, 9] against [2, 10]",
            },
        },
    }
    shadow = Shadow.from_json(
        {
            "id": 4,
            "model": "ranker",
            "alias": "production",
            "version": 8,
            "serving": 7,
            "sample": 0.25,
            "running": False,
            "started_by": "olga",
            "started_at": "2026-03-01T09:30:00.123456+00:00",
            "ended_at": "2026-03-02T10:00:05.5+00:00",
            "ended_by": "paul",
            "end_reason": "promoted: the alias serves the candidate now",
            "workers": 2,
            "report": report,
        }
    )
    assert _shadow_lines(shadow) == [
        "Shadow 4 on 'production' of 'ranker': candidate version 8, serving version 7",
        "  sample    0.25 (25% of the requests)",
        "  state     ended 2026-03-02 10:00:05 by paul: promoted: the alias serves the candidate now",
        "  started   2026-03-01 09:30:00 by olga",
        "  requests  40 mirrored, 37 compared, 3 dropped (busy 2, queue_full 1); 2 inference process(es) reported",
        "  serving   v7: 40 answered, 0 errors, p50 1.50 ms, p99 4.25 ms",
        "  candidate v8: 37 answered, 3 errors (7.50%), p50 2.50 ms, p99 8.00 ms; "
        "last error: Got invalid dimensions for input: x",
        "  output    embedding: 74 rows, cosine p1 0.999120 p50 0.999999, max abs diff 0.0213",
        "  output    scores: 74 rows, cosine p1 0.950000 p50 0.990000, max abs diff 0.5, top-1 agreement 97.30%, "
        "psi 0.0412, 2 mismatched: shape [2, 9] against [2, 10]",
    ]


def test_the_shadow_commands_are_listed(live: LiveServer):
    done = live.run("shadow", "--help")
    assert done.returncode == 0, done.stderr
    assert "{start,stop,show}" in done.stdout
    start = live.run("shadow", "start", "--help")
    assert "--version N" in start.stdout and "--sample F" in start.stdout
