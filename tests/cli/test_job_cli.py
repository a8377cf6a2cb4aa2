"""``modelyard job submit|show|list|wait|fetch|cancel`` against a live server.

The server is ``modelyard serve`` on the embedded default: its in-process inference runtime runs the
jobs' chunks, its job threads prepare and finish them. The input streams up with a progress bar as a
version's upload does; ``job wait`` draws the rows done on stderr and exits 1 unless the job succeeded.
"""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import onnx

from tests.support.embedded import LiveServer
from tests.support.onnx_models import add_model

ROWS = np.arange(40, dtype=np.float32).reshape(10, 4)


def test_a_job_from_the_command_line(live: LiveServer):
    owner = live.createtoken("jo", "maintainer")
    pipeline = live.createtoken("jobber", "inference")

    def run(*args: str, token: str = pipeline, expect: int = 0) -> subprocess.CompletedProcess[str]:
        done = live.run(*args, "--token", token)
        assert done.returncode == expect, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    onnx.save(add_model(bias=1.0), live.folder / "add.onnx")
    run("push", "adder", "add.onnx", "--quiet", token=owner)
    np.savez(live.folder / "rows.npz", x=ROWS)

    # Submitted and waited for: the upload's bar and the rows' bar on stderr, the job on stdout.
    done = run("job", "submit", "adder", "rows.npz", "--version", "1", "--wait", "--timeout", "180")
    assert "Uploading rows.npz [" in done.stderr and "100.0%" in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    job_id = lines[0].split()[1].rstrip(":")
    assert lines[0] == f"Job {job_id}: succeeded"
    assert "  model    adder version 1" in lines
    assert "  rows     10 of 10" in lines
    assert re.search(rf"Job {job_id} (queued|running): version 1 of 'adder', 10 rows\.", done.stderr), done.stderr
    assert f"Job {job_id} succeeded" in done.stderr  # the last line of the rows' bar

    shown = json.loads(run("job", "show", job_id, "--json").stdout)
    assert (shown["state"], shown["rows_done"], shown["format"], shown["created_by"]) == (
        "succeeded",
        10,
        "npz",
        "jobber",
    )
    listed = json.loads(run("job", "list", "--json").stdout)
    assert [job["id"] for job in listed] == [job_id]
    assert job_id in run("job", "list", "--state", "succeeded").stdout

    fetched = run("job", "fetch", job_id, "-o", "result.npz")
    assert fetched.stdout.startswith("Wrote result.npz (")
    with np.load(live.folder / "result.npz", allow_pickle=False) as result:
        np.testing.assert_array_equal(result["y"], ROWS + 1)

    # Waiting for a job that ended answers at once; cancelling it is refused with the server's words.
    assert run("job", "wait", job_id, "--quiet").stdout.startswith(f"Job {job_id}: succeeded")
    refused = run("job", "cancel", job_id, expect=1)
    assert f"job {job_id} is succeeded; only a queued or running job can be cancelled" in refused.stderr

    # Refusals: no inference role, a model that does not exist, a file that is not there.
    assert "asynchronous inference needs the inference or admin role" in (
        run("job", "submit", "adder", "rows.npz", "--version", "1", token=owner, expect=1).stderr
    )
    assert "no model named 'nope'" in run("job", "submit", "nope", "rows.npz", "--version", "1", expect=1).stderr
    assert "missing.npz: no such file" in run("job", "submit", "adder", "missing.npz", expect=1).stderr
    assert run("job", "submit", "adder", "rows.npz", "--alias", "a", "--version", "1", expect=2).returncode == 2


def test_a_cancelled_job_makes_wait_exit_1(live: LiveServer):
    owner = live.createtoken("jo2", "maintainer")
    pipeline = live.createtoken("jobber2", "inference")
    onnx.save(add_model(bias=2.0), live.folder / "add2.onnx")
    assert live.run("push", "adder2", "add2.onnx", "--quiet", "--token", owner).returncode == 0
    np.savez(live.folder / "many.npz", x=np.zeros((50_000, 4), dtype=np.float32))
    submitted = live.run("job", "submit", "adder2", "many.npz", "--version", "1", "--quiet", "--token", pipeline)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    cancel = live.run("job", "cancel", job_id, "--token", pipeline)
    if cancel.returncode == 0:  # it was still queued or running, as it is almost always
        assert cancel.stdout.startswith(f"Job {job_id} cancelled (")
        waited = live.run("job", "wait", job_id, "--token", pipeline)
        assert waited.returncode == 1, waited.stdout
        assert f"Job {job_id}: cancelled" in waited.stderr
    else:  # 50,000 rows all done before the cancel arrived
        assert "only a queued or running job can be cancelled" in cancel.stderr
