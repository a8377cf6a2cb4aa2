"""Text in, embeddings out: a version uploaded with a ``tokenizer.json`` takes a BYTES input named ``text``.

The model and tokenizer are tiny ones built here (``tests/support/text_models.py``); each served
answer is compared with ONNX Runtime run directly on the tokenizer's ids for that request alone.
Versions are uploaded through the API, validated for real, and loaded by an in-process runtime;
requests go through the real codecs (REST JSON and binary, gRPC typed and raw) and the version's
batcher.
"""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from typing import Any

import numpy as np
import pytest
from django.contrib.auth import get_user_model

from inference.dataplane import DataPlane
from inference.errors import InvalidInput
from inference.grpc import grpc_service_pb2 as pb
from inference.grpc.codec import decode_infer_request
from inference.loaded import LoadedVersion
from inference.protocol import InferRequest, InferResult, body_limit, decode_request
from inference.text import bucket
from modelyard.client import tensors
from registry.models import ModelVersion, RegisteredModel
from tests.support import onnx_models
from tests.support.polling import reconcile_until
from tests.support.registry import create_model, promote
from tests.support.text_models import direct_run, text_model_bytes, tiny_tokenizer_json

pytestmark = pytest.mark.django_db(transaction=True)

SHORT = ["hello world", "the model"]  # 4 tokens at most with [CLS] and [SEP]: bucket 8
LONG = ["the registry stores versioned onnx artifacts and the server tokenises text and pads it"]  # 16: bucket 16


def upload_text_version(owner: Any, model: bytes | None = None, tokenizer: bytes | None = None) -> dict[str, Any]:
    files = [("model.onnx", model or text_model_bytes()), ("tokenizer.json", tokenizer or tiny_tokenizer_json())]
    response = owner.upload("demo", files)
    assert response.status_code == 201, response.content
    return owner.get(f"/api/v1/models/demo/versions/{response.json()['version']}").json()


def serve(owner: Any, approver: Any, make_runtime: Any, **upload: Any) -> DataPlane:
    """Upload a text version of 'demo', promote it and load it; the data plane over that runtime."""
    create_model(owner)
    version = upload_text_version(owner, **upload)
    assert version["status"] == "ready", version
    RegisteredModel.objects.filter(name="demo").update(max_queue_delay_us=200_000, max_batch_size=64)
    promote(owner, approver, 1)
    runtime = make_runtime()
    reconcile_until(runtime, lambda: runtime.router.resolve("demo") is not None, what="the text version never loaded")
    return DataPlane(runtime)


def text_request(loaded: LoadedVersion, texts: list[str], *, shape: list[int] | None = None) -> InferRequest:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape or [len(texts)], "data": texts}]}
    return decode_request(json.dumps(body).encode(), None, loaded.spec.signature)


def assert_matches_direct(result: InferResult, texts: list[str], **direct: Any) -> None:
    expected = direct_run(text_model_bytes(), texts, **direct)
    assert result.outputs["token_embeddings"].shape == expected["token_embeddings"].shape
    np.testing.assert_allclose(result.outputs["token_embeddings"], expected["token_embeddings"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(result.outputs["sentence_embedding"], expected["sentence_embedding"], atol=1e-5, rtol=0)


class RunLog:
    """Records the ``input_ids`` shape of every ONNX Runtime run of a loaded version."""

    def __init__(self, loaded: LoadedVersion, monkeypatch: pytest.MonkeyPatch) -> None:
        self.shapes: list[tuple[int, ...]] = []
        self._lock = threading.Lock()
        real = loaded.run

        def logged(feeds: dict[str, Any], output_names: list[str] | None = None) -> Any:
            with self._lock:
                self.shapes.append(feeds["input_ids"].shape)
            return real(feeds, output_names)

        monkeypatch.setattr(loaded, "run", logged)


# --- Validation and the signature -------------------------------------------------------------------------


def test_a_tokenizer_adds_the_text_input_to_the_signature_and_metadata(owner, approver, make_runtime):
    plane = serve(owner, approver, make_runtime)
    version = owner.get("/api/v1/models/demo/versions/1").json()
    assert [spec["name"] for spec in version["signature"]["inputs"]] == [
        "input_ids",
        "attention_mask",
        "token_type_ids",
    ]
    assert version["signature"]["text"] == {
        "name": "text",
        "datatype": "BYTES",
        "shape": [-1],
        "tokenizer": "tokenizer.json",
        "feeds": {"input_ids": "INT64", "attention_mask": "INT64", "token_type_ids": "INT64"},
        "fixed_length": None,
        "max_tokens": 32,  # the tokenizer's own truncation length
    }
    metadata = plane.model_metadata("demo")
    assert metadata["inputs"][-1] == {"name": "text", "datatype": "BYTES", "shape": [-1]}
    assert [spec["name"] for spec in metadata["inputs"]] == ["input_ids", "attention_mask", "token_type_ids", "text"]
    owner.client.force_login(get_user_model().objects.get(username=owner.username))
    page = owner.client.get("/ui/models/demo/versions/1")
    assert page.status_code == 200
    assert b"raw text instead of input_ids, attention_mask, token_type_ids, tokenised by tokenizer.json" in page.content
    # A text may be any length before it is truncated: no limit from fixed shapes.
    assert body_limit("demo", version["signature"], 1 << 20).source == "MODELYARD_V2_MAX_BODY_BYTES"


def test_a_broken_tokenizer_fails_validation_with_the_reason(owner):
    create_model(owner)
    version = upload_text_version(owner, tokenizer=b'{"version": "1.0", "model": {"type": "Nonsense"}}')
    assert version["status"] == "failed"
    assert version["errors"][0].startswith(
        "tokenizer.json is not a tokenizer the Hugging Face tokenizers library can read: "
    ), version["errors"]
    assert "text" not in (version["signature"] or {})


def test_a_tokenizer_over_the_size_limit_fails_validation(owner, settings):
    settings.TOKENIZER_MAX_BYTES = 1024
    create_model(owner)
    tokenizer = tiny_tokenizer_json()
    version = upload_text_version(owner, tokenizer=tokenizer)
    assert version["status"] == "failed"
    assert version["errors"] == [
        f"tokenizer.json has {len(tokenizer)} bytes, more than the 1024 a tokenizer may have "
        "(MODELYARD_TOKENIZER_MAX_BYTES)"
    ]


def test_a_model_that_text_cannot_feed_fails_validation(owner):
    create_model(owner)
    version = upload_text_version(owner, model=onnx_models.add_model_bytes())
    assert version["status"] == "failed"
    assert version["errors"] == [
        "tokenizer.json was uploaded, but the model's inputs are not ones the server fills from text "
        "(input_ids, attention_mask, token_type_ids, the last optional): input(s) x cannot be made from text; "
        "it lacks input_ids, attention_mask"
    ]


def test_a_tokenizer_over_the_limit_at_load_is_a_load_failure(owner, approver, make_runtime, settings):
    create_model(owner)
    assert upload_text_version(owner)["status"] == "ready"
    promote(owner, approver, 1)
    settings.TOKENIZER_MAX_BYTES = 1024  # lowered after validation: the runtime checks again
    runtime = make_runtime()
    rows = reconcile_until(runtime, lambda: [row for row in runtime.snapshot() if row.error], what="no load failure")
    assert rows[0].error.startswith("TokenizerError: tokenizer.json has "), rows[0].error
    assert rows[0].error.endswith("more than the 1024 a tokenizer may have (MODELYARD_TOKENIZER_MAX_BYTES)")
    assert runtime.router.resolve("demo") is None


# --- Inference --------------------------------------------------------------------------------------------


def test_text_gives_what_onnx_runtime_gives_on_the_tokenizers_ids(owner, approver, make_runtime, run):
    plane = serve(owner, approver, make_runtime)
    loaded = plane.resolve("demo")
    texts = ["Hello world", "the model registry stores versioned onnx artifacts", ""]
    result = run(plane.infer("demo", None, text_request(loaded, texts)))
    assert result.outputs["token_embeddings"].shape == (3, 9, 4)  # the longest text (9 tokens), not its bucket (16)
    assert_matches_direct(result, texts)
    # Texts shaped [n, 1], the way a batching client sends one string per row, are the same request.
    again = run(plane.infer("demo", None, text_request(loaded, texts, shape=[3, 1])))
    np.testing.assert_array_equal(again.outputs["sentence_embedding"], result.outputs["sentence_embedding"])
    # The token inputs still work, alone.
    ids = np.array([[2, 4, 3]], dtype=np.int64)
    body = {
        "inputs": [
            {"name": name, "datatype": "INT64", "shape": [1, 3], "data": data}
            for name, data in (("input_ids", ids), ("attention_mask", ids * 0 + 1), ("token_type_ids", ids * 0))
        ]
    }
    direct = run(
        plane.infer(
            "demo",
            None,
            decode_request(json.dumps(body, default=np.ndarray.tolist).encode(), None, loaded.spec.signature),
        )
    )
    assert direct.outputs["token_embeddings"].shape == (1, 3, 4)


def test_requests_of_different_buckets_run_in_separate_batches(owner, approver, make_runtime, run, monkeypatch):
    plane = serve(owner, approver, make_runtime)
    loaded = plane.resolve("demo")
    log = RunLog(loaded, monkeypatch)
    requests = [SHORT, LONG, SHORT[:1]]

    async def together() -> list[InferResult]:
        return await asyncio.gather(*(plane.infer("demo", None, text_request(loaded, texts)) for texts in requests))

    results = run(together())
    # The two short requests (bucket 8) merged into one run of 3 rows; the long one (bucket 16) ran alone.
    assert sorted(log.shapes) == [(1, 16), (3, 8)], log.shapes
    for texts, result in zip(requests, results, strict=True):
        assert_matches_direct(result, texts)  # each equals its own unbatched, unbucketed run


def test_text_over_the_token_limit_is_truncated_or_refused(owner, approver, make_runtime, run, settings):
    settings.TEXT_MAX_TOKENS = 8
    plane = serve(owner, approver, make_runtime)
    loaded = plane.resolve("demo")
    result = run(plane.infer("demo", None, text_request(loaded, LONG + SHORT)))
    assert result.outputs["token_embeddings"].shape == (3, 8, 4)
    assert_matches_direct(result, LONG + SHORT, own_length=8)  # the tokenizer truncates, keeping [SEP]

    assert bucket(3, 512) == 8 and bucket(9, 512) == 16 and bucket(300, 512) == 512 and bucket(9, 12) == 12


def test_with_truncation_off_a_long_text_is_refused_and_so_are_too_many_texts(
    owner, approver, make_runtime, run, settings
):
    settings.TEXT_MAX_TOKENS, settings.TEXT_TRUNCATE, settings.TEXT_MAX_TEXTS = 8, False, 2
    plane = serve(owner, approver, make_runtime)
    loaded = plane.resolve("demo")
    with pytest.raises(InvalidInput) as refused:
        run(plane.infer("demo", None, text_request(loaded, SHORT[:1] + LONG)))
    assert refused.value.message == (
        "input 'text': text 1 has more than 8 tokens, the limit of this version (the least of "
        "MODELYARD_TEXT_MAX_TOKENS, the model's sequence length and the tokenizer's own); truncation is off "
        "(MODELYARD_TEXT_TRUNCATE=false)"
    )
    with pytest.raises(InvalidInput) as refused:
        run(plane.infer("demo", None, text_request(loaded, SHORT + SHORT[:1])))
    assert refused.value.message == (
        "input 'text' has 3 texts, more than the 2 one request may have (MODELYARD_TEXT_MAX_TEXTS)"
    )
    assert_matches_direct(run(plane.infer("demo", None, text_request(loaded, SHORT))), SHORT)  # within both limits


def test_a_fixed_length_model_pads_every_text_to_it(owner, approver, make_runtime, run, monkeypatch):
    plane = serve(owner, approver, make_runtime, model=text_model_bytes(seq=12, token_type_ids=False))
    loaded = plane.resolve("demo")
    assert loaded.spec.signature["text"]["fixed_length"] == 12
    assert loaded.spec.signature["text"]["feeds"] == {"input_ids": "INT64", "attention_mask": "INT64"}
    log = RunLog(loaded, monkeypatch)
    result = run(plane.infer("demo", None, text_request(loaded, SHORT)))
    assert log.shapes == [(2, 12)]
    expected = direct_run(text_model_bytes(seq=12, token_type_ids=False), SHORT, pad_to=12)
    np.testing.assert_allclose(result.outputs["sentence_embedding"], expected["sentence_embedding"], atol=1e-5)


# --- Bad requests -----------------------------------------------------------------------------------------


def test_bad_text_requests_are_refused_with_the_reason(owner, approver, make_runtime):
    plane = serve(owner, approver, make_runtime)
    signature = plane.resolve("demo").spec.signature

    def refusal(inputs: list[dict[str, Any]], binary: bytes = b"") -> str:
        header = json.dumps({"inputs": inputs}).encode()
        with pytest.raises(InvalidInput) as refused:
            decode_request(header + binary, str(len(header)) if binary else None, signature)
        return refused.value.message

    text = {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}
    ids = {"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [2]}
    assert refusal([text, ids]) == (
        "input 'text' takes the place of the token inputs; send it alone, or the token inputs without it "
        "(got input_ids too)"
    )
    assert refusal([{**text, "shape": [0], "data": []}]) == "input 'text' has no texts"
    assert refusal([{**text, "shape": [1, 2], "data": ["a", "b"]}]) == "input 'text': expected shape [-1], got [1, 2]"
    assert refusal([{**text, "datatype": "INT64", "data": [1]}]) == ("input 'text': expected datatype BYTES, got INT64")
    latin1 = "café".encode("latin-1")
    binary = struct.pack("<I", len(latin1)) + latin1
    assert (
        refusal(
            [{"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(binary)}}],
            binary,
        )
        == "input 'text': BYTES element 0 is not valid UTF-8, which ONNX Runtime string tensors need"
    )


def test_text_on_a_version_without_a_tokenizer_is_refused(owner):
    from tests.support.registry import upload_versions

    create_model(owner)
    [version] = upload_versions(owner, [1.0])
    signature = ModelVersion.objects.get(pk=version.pk).signature
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}
    with pytest.raises(InvalidInput) as refused:
        decode_request(json.dumps(body).encode(), None, signature)
    assert refused.value.message == (
        "input 'text' needs a version uploaded with a tokenizer.json, and this one has none; send its inputs (x)"
    )


def test_the_v2_app_answers_text_and_refuses_bad_text_with_400(owner, approver, make_runtime, asgi_loop, settings):
    from inference.app import build_app

    settings.INFERENCE_PUBLIC = True
    plane = serve(owner, approver, make_runtime)
    app = build_app(plane.runtime, plane=plane)
    status, body = asgi_loop.request(
        app,
        "POST",
        "/v2/models/demo/infer",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": SHORT}]},
    )
    assert status == 200, body
    expected = direct_run(text_model_bytes(), SHORT)
    pooled = {o["name"]: o for o in body["outputs"]}["sentence_embedding"]
    assert pooled["shape"] == [2, 4]
    np.testing.assert_allclose(np.array(pooled["data"]).reshape(2, 4), expected["sentence_embedding"], atol=1e-5)
    status, body = asgi_loop.request(
        app,
        "POST",
        "/v2/models/demo/infer",
        {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [0], "data": []}]},
    )
    assert (status, body) == (400, {"error": "input 'text' has no texts"})


# --- The client's encoding and gRPC ------------------------------------------------------------------------


def test_the_python_clients_binary_text_request_decodes_to_the_texts(owner, approver, make_runtime, run):
    plane = serve(owner, approver, make_runtime)
    loaded = plane.resolve("demo")
    texts = np.array(["hello world", "Ünïcode text in"], dtype=object)
    body, header_length = tensors.encode_request({"text": texts})
    request = decode_request(body, str(header_length), loaded.spec.signature)
    assert request.inputs["text"].tolist() == texts.tolist()
    assert_matches_direct(run(plane.infer("demo", None, request)), list(texts))


def test_grpc_takes_text_as_bytes_contents_and_as_raw_input_contents(owner, approver, make_runtime, run):
    plane = serve(owner, approver, make_runtime)
    signature = plane.resolve("demo").spec.signature
    typed = pb.ModelInferRequest(model_name="demo")
    tensor = typed.inputs.add(name="text", datatype="BYTES", shape=[2])
    tensor.contents.bytes_contents.extend(text.encode() for text in SHORT)
    raw = pb.ModelInferRequest(model_name="demo")
    raw.inputs.add(name="text", datatype="BYTES", shape=[2, 1])
    raw.raw_input_contents.append(b"".join(struct.pack("<I", len(t)) + t.encode() for t in SHORT))
    for message in (typed, raw):
        result = run(plane.infer("demo", None, decode_infer_request(message, signature)))
        assert_matches_direct(result, SHORT)
    metadata_inputs = [spec["name"] for spec in plane.model_metadata("demo")["inputs"]]
    assert "text" in metadata_inputs


def test_losing_the_text_input_breaks_clients_and_gaining_it_does_not(owner):
    from onnxkit.signatures import signature_compare, signature_diff

    create_model(owner)
    with_text = upload_text_version(owner)["signature"]
    tokens_only = {key: with_text[key] for key in ("inputs", "outputs")}
    assert signature_diff(with_text, tokens_only) == ["input 'text' was removed"]
    assert signature_diff(tokens_only, with_text) == []
    rows = {(row.kind, row.name): row.change for row in signature_compare(tokens_only, with_text)}
    assert rows[("input", "text")] == "added"
