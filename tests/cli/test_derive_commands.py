"""``modelyard derive`` and ``modelyard benchmarks`` (and the client methods under them) against a live server.

The server is ``modelyard serve`` on the embedded default, whose in-process inference runtime takes the
CPU benchmark jobs; the model is a small classifier built here.
"""

from __future__ import annotations

import json
import subprocess

import onnx

from modelyard.client import Client
from tests.support.embedded import LiveServer
from tests.support.onnx_models import classifier_model
from tests.support.polling import eventually


def test_derive_and_benchmarks_from_the_command_line(live: LiveServer):
    token = live.createtoken("erin", "maintainer")

    def run(*args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        done = live.run(*args, "--token", token)
        assert done.returncode == expect, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    onnx.save(classifier_model(), live.folder / "classifier.onnx")
    run("push", "scores", "classifier.onnx", "--quiet")

    # int8 with an option given as KEY=VALUE (the value read as JSON), waited for until validated.
    derived = run("derive", "scores", "1", "int8-dynamic", "--option", "per_channel=true", "--wait", "300")
    assert derived.stdout.splitlines()[0] == "Version 2 of 'scores' is int8-dynamic of version 1."
    assert derived.stdout.splitlines()[1].startswith("  scores: max abs diff ")
    version = json.loads(run("show", "scores", "2", "--json").stdout)
    assert version["status"] == "ready"
    assert version["derived_from"] == 1
    assert version["recipe"]["recipe"] == "int8-dynamic"
    assert version["recipe"]["options"]["per_channel"] is True
    assert version["accuracy"]["against"] == 1

    # The client's view of the same job.
    client = Client(live.url, token)
    [job] = client.list_derive_jobs("scores", 1)
    assert (job.recipe, job.status, job.version, job.requested_by) == ("int8-dynamic", "succeeded", 2, "erin")
    assert client.get_derive_job(job.id).raw == job.raw

    # Refusals exit 1 with the server's words.
    bad = run("derive", "scores", "1", "int8-dynamic", "--option", "bits=4", expect=1)
    assert "bits" in bad.stderr and "per_channel" in bad.stderr, bad.stderr
    assert run("derive", "scores", "1", "fp16", "--option", "oops", expect=2).returncode == 2  # not KEY=VALUE

    # Every ready version gets a CPU benchmark, measured by the server's inference runtime.
    def measured() -> list[dict]:
        runs = json.loads(run("benchmarks", "scores", "2", "--json").stdout)
        return runs if runs and all(r["status"] == "succeeded" for r in runs) else []

    [bench] = eventually(measured, timeout=180, interval=1.0)
    assert bench["provider"] == "CPUExecutionProvider"
    # Dynamic int8 quantizes each run's activations with one scale, so the rows of a batch can move each
    # other's outputs; where validation's batching check measures that on this CPU, the version is served a
    # request per run and is measured without batched throughput.
    batches = {"8", "32"} if version["batching"]["merges"] else set()
    assert bench["numbers"]["p50_ms"] > 0 and set(bench["numbers"]["throughput"]) == batches, version["batching"]
    table = run("benchmarks", "scores", "2").stdout.splitlines()
    assert table[0].split() == ["PROVIDER", "STATUS", "P50", "MS", "P99", "MS", "THROUGHPUT", "NOTE"]
    assert table[1].startswith("CPUExecutionProvider  succeeded")

    rerun = json.loads(run("benchmarks", "scores", "2", "--run", "--json").stdout)
    assert [r["status"] for r in rerun] == ["pending"]
