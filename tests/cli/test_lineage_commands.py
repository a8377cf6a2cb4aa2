"""``modelyard push`` with lineage and ``--allow-duplicate``, ``modelyard lineage`` and ``modelyard card`` against a
live server (``modelyard serve`` on the embedded default)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import onnx

from tests.support.embedded import LiveServer
from tests.support.onnx_models import add_model
from tests.support.polling import eventually

RUN = "https://runs.example.com/exp/7"
COMMIT = "4f2a9c1d0e8b7a69"


def runner(live: LiveServer, token: str) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        done = live.run(*args, "--token", token)
        assert done.returncode == expect, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    return run


def test_push_with_lineage_refuse_a_duplicate_then_set_show_and_card(live: LiveServer):
    run = runner(live, live.createtoken("lin", "maintainer"))
    other = runner(live, live.createtoken("lou", "maintainer"))
    for bias in (1.0, 2.0):
        onnx.save(add_model(bias=bias), live.folder / f"lin{bias:g}.onnx")
    run("push", "lineal", "lin1.onnx", "--quiet")
    pushed = run(
        "push",
        "lineal",
        "lin2.onnx",
        "--quiet",
        "--json",
        "--source-run-url",
        RUN,
        "--source-commit",
        COMMIT,
        "--dataset",
        "imagenet=sha256:0c1d",
        "--dataset",
        "extra=md5:aa==",
        "--parent",
        "1",
    )
    version = json.loads(pushed.stdout)
    assert (version["version"], version["derived_from"], version["source_run_url"], version["source_commit"]) == (
        2,
        1,
        RUN,
        COMMIT,
    )
    assert version["source_datasets"] == [
        {"name": "imagenet", "digest": "sha256:0c1d"},
        {"name": "extra", "digest": "md5:aa=="},
    ]

    # The same bytes again: refused, naming the version, unless allowed.
    again = run("push", "lineal", "lin2.onnx", "--quiet", expect=1)
    assert again.stderr == (
        "modelyard push: these bytes are already version 2 of model 'lineal' (the same files, byte for byte); "
        "send allow_duplicate=true to upload them again\n"
    )
    allowed = json.loads(run("push", "lineal", "lin2.onnx", "--quiet", "--json", "--allow-duplicate").stdout)
    assert (allowed["version"], allowed["sha256"]) == (3, version["sha256"])

    # Shown when no option is given.
    shown = run("lineage", "lineal", "2").stdout.splitlines()
    assert shown == [
        "lineal version 2",
        f"  run      {RUN}",
        f"  commit   {COMMIT}",
        "  dataset  imagenet sha256:0c1d",
        "  dataset  extra md5:aa==",
        "  parent   1 (named by its uploader)",
    ]
    # Changed by its uploader: datasets replaced, the run cleared, the parent changed.
    changed = run(
        "lineage", "lineal", "3", "--parent", "2", "--dataset", "coco=sha256:ff", "--source-commit", "abcdef0"
    )
    assert changed.stdout.splitlines() == [
        "lineal version 3",
        "  run      -",
        "  commit   abcdef0",
        "  dataset  coco sha256:ff",
        "  parent   2 (named by its uploader)",
    ]
    cleared = run("lineage", "lineal", "3", "--no-parent", "--no-datasets", "--source-commit", "", "--json").stdout
    assert (json.loads(cleared)["derived_from"], json.loads(cleared)["source_datasets"]) == (None, [])

    # Another maintainer may not; a bad value is the server's 400; a usage error exits 2.
    refused = other("lineage", "lineal", "2", "--source-commit", "abcdef0", expect=1)
    assert refused.stderr == (
        "modelyard lineage: only its uploader (lin) or an admin may change the lineage of version 2 of model 'lineal'\n"
    )
    bad = run("lineage", "lineal", "2", "--source-commit", "main", expect=1)
    assert bad.stderr == ("modelyard lineage: source_commit: must be a commit hash: 7 to 64 hexadecimal characters\n")
    assert run("lineage", "lineal", "2", "--dataset", "no-digest", expect=2).returncode == 2
    assert run("lineage", "lineal", "2", "--parent", "1", "--no-parent", expect=2).returncode == 2

    # The card: printed, or written to a file. Its benchmark row changes while the server's CPU benchmark
    # of version 2 runs, so the two copies are compared once that run has finished.
    def measured() -> bool:
        runs = json.loads(run("benchmarks", "lineal", "2", "--json").stdout)
        return bool(runs) and all(r["status"] in ("succeeded", "failed") for r in runs)

    assert eventually(measured, timeout=180, interval=1.0)
    card = run("card", "lineal", "2").stdout
    assert card.startswith("# Model card: lineal v2\n")
    assert [line for line in card.splitlines() if line.startswith("## ")] == [
        "## Summary",
        "## Signature",
        "## Validation",
        "## Benchmarks",
        "## Accuracy deltas",
        "## Provenance",
        "## Lineage",
        "## Promotion history",
        "## Served",
    ]
    assert f"- **sha256:** {version['sha256']}" in card
    written = run("card", "lineal", "2", "-o", "card.md")
    assert written.stdout == "" and written.stderr == "Wrote the model card of 'lineal' version 2 to card.md.\n"
    assert (live.folder / "card.md").read_text().split("\n", 3)[3] == card.split("\n", 3)[3]  # but its time
    missing = run("card", "lineal", "9", expect=1)
    assert missing.stderr == "modelyard card: model 'lineal' has no version 9\n"
