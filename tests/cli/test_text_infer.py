"""Text in from the user's side: ``modelyard push`` with a tokenizer.json, ``modelyard infer --input text=...``
and ``modelyard.client.Client.infer`` with a BYTES array, against a live embedded server.

The answers are compared with ONNX Runtime run directly on the tiny tokenizer's ids
(``tests/support/text_models.py``).
"""

from __future__ import annotations

import json
import subprocess

import numpy as np

from modelyard.client import Client
from tests.support.embedded import LiveServer
from tests.support.text_models import direct_run, text_model_bytes, tiny_tokenizer_json


def test_push_then_infer_text_from_the_command_line_and_the_client(live: LiveServer):
    token = live.createtoken("carol", "admin")
    approver = live.createtoken("dave", "approver")

    def run(*args: str, as_token: str = token) -> subprocess.CompletedProcess[str]:
        done = live.run(*args, "--token", as_token)
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    (live.folder / "text.onnx").write_bytes(text_model_bytes())
    (live.folder / "tokenizer.json").write_bytes(tiny_tokenizer_json())
    push = run("push", "texts", "text.onnx", "tokenizer.json", "--quiet")
    assert push.stdout.splitlines()[1:5] == [
        "  input   input_ids  INT64  [-1, -1]",
        "  input   attention_mask  INT64  [-1, -1]",
        "  input   token_type_ids  INT64  [-1, -1]",
        "  input   text  BYTES  [-1]  (text, by tokenizer.json)",
    ]
    promote = run("promote", "texts", "production", "1", "--reason", "text in").stdout
    request = promote.split("request ")[1].split(" ")[0]
    run("approve", request, "--reason", "ok", "--wait", "60", as_token=approver)

    plain = json.loads(run("infer", "texts", "--input", "text=hello world", "--json").stdout)
    expected = direct_run(text_model_bytes(), ["hello world"])
    assert plain["sentence_embedding"]["shape"] == [1, 4]
    np.testing.assert_allclose(plain["sentence_embedding"]["data"], expected["sentence_embedding"], atol=1e-5)

    texts = ["the model registry", "hello", "text in and embeddings out"]
    listed = run("infer", "texts", "--input", f"text={json.dumps(texts)}", "--json").stdout
    expected = direct_run(text_model_bytes(), texts)
    np.testing.assert_allclose(
        json.loads(listed)["sentence_embedding"]["data"], expected["sentence_embedding"], atol=1e-5
    )

    client = Client(live.url, token)
    outputs = client.infer("texts", {"text": np.array(texts, dtype=object)})
    np.testing.assert_allclose(outputs["sentence_embedding"], expected["sentence_embedding"], atol=1e-5)
    np.testing.assert_allclose(outputs["token_embeddings"], expected["token_embeddings"], atol=1e-5)
