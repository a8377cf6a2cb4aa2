"""A tiny tokenizer and a tiny text-embedding ONNX model, for the "text in" tests.

The tokenizer is a Hugging Face ``tokenizers`` WordLevel model over a few words, with [PAD], [UNK],
[CLS] and [SEP], BERT's post-processor (``[CLS] $A [SEP]``), and MiniLM's habit of padding and
truncating every text to a fixed length in its own settings (which the server switches off).

The model embeds the ids (and token types), mixes in the masked mean of the sequence, so a padded
position that is not masked changes every output, and gives both a token-level output
(``token_embeddings`` [batch, seq, dim]) and a masked mean (``sentence_embedding`` [batch, dim]).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support.onnx_models import IR, OPSET

WORDS = [
    "the",
    "a",
    "an",
    "model",
    "registry",
    "stores",
    "versioned",
    "onnx",
    "artifacts",
    "text",
    "in",
    "embeddings",
    "out",
    "server",
    "tokenises",
    "pads",
    "and",
    "runs",
    "it",
    "hello",
    "world",
    "batch",
    "bucket",
    "short",
    "long",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
]
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
VOCAB = {token: index for index, token in enumerate([*SPECIALS, *WORDS])}
DIM = 4


def tiny_tokenizer(*, own_length: int | None = 32) -> Any:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])],
    )
    if own_length:
        tokenizer.enable_truncation(own_length)
        tokenizer.enable_padding(pad_id=VOCAB["[PAD]"], pad_token="[PAD]", length=own_length)
    return tokenizer


def tiny_tokenizer_json(**kwargs: Any) -> bytes:
    return tiny_tokenizer(**kwargs).to_str().encode()


def text_model(
    *, token_type_ids: bool = True, seq: str | int = "seq", batch: str | int = "batch", seed: int = 0
) -> onnx.ModelProto:
    """Embeddings of ``input_ids`` (+ ``token_type_ids``) mixed with their masked mean; token and pooled outputs."""
    rng = np.random.default_rng(seed)
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, seq]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, seq]),
    ]
    initializers = [
        numpy_helper.from_array(rng.normal(size=(len(VOCAB), DIM)).astype(np.float32), "word_embeddings"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "seq_axis"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "last_axis"),
    ]
    nodes = [helper.make_node("Gather", ["word_embeddings", "input_ids"], ["words"])]
    embedded = "words"
    if token_type_ids:
        inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, [batch, seq]))
        initializers.append(numpy_helper.from_array(rng.normal(size=(2, DIM)).astype(np.float32), "type_embeddings"))
        nodes += [
            helper.make_node("Gather", ["type_embeddings", "token_type_ids"], ["types"]),
            helper.make_node("Add", ["words", "types"], ["embedded"]),
        ]
        embedded = "embedded"
    nodes += [
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask_f", "last_axis"], ["mask3"]),
        helper.make_node("Mul", [embedded, "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "seq_axis"], ["summed"], keepdims=1),
        helper.make_node("ReduceSum", ["mask3", "seq_axis"], ["count"], keepdims=1),
        helper.make_node("Div", ["summed", "count"], ["context"]),
        helper.make_node("Add", [embedded, "context"], ["mixed"]),
        helper.make_node("Tanh", ["mixed"], ["token_embeddings"]),
        helper.make_node("Mul", ["token_embeddings", "mask3"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "seq_axis"], ["pooled_sum"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "seq_axis"], ["pooled_count"], keepdims=0),
        helper.make_node("Div", ["pooled_sum", "pooled_count"], ["sentence_embedding"]),
    ]
    outputs = [
        helper.make_tensor_value_info("token_embeddings", TensorProto.FLOAT, [batch, seq, DIM]),
        helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, [batch, DIM]),
    ]
    graph = helper.make_graph(nodes, "text", inputs, outputs, initializers)
    model = helper.make_model(
        graph, ir_version=IR, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelyard-tests"
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def text_model_bytes(**kwargs: Any) -> bytes:
    return text_model(**kwargs).SerializeToString()


def direct_run(
    model: bytes, texts: list[str], *, own_length: int | None = None, pad_to: int | None = None
) -> dict[str, np.ndarray]:
    """ONNX Runtime run directly on the tokenizer's ids for ``texts`` alone, padded to their longest, padding zeroed.

    This is the reference a served "text" request must match: no server, no buckets, no batch.
    """
    import onnxruntime as ort

    tokenizer = tiny_tokenizer(own_length=None)
    if own_length:
        tokenizer.enable_truncation(own_length)
    # To the longest of these texts, or to a fixed length.
    tokenizer.enable_padding(pad_id=VOCAB["[PAD]"], pad_token="[PAD]", length=pad_to)
    encodings = tokenizer.encode_batch(texts)
    feeds = {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
    }
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    if "token_type_ids" in {arg.name for arg in session.get_inputs()}:
        feeds["token_type_ids"] = np.array([e.type_ids for e in encodings], dtype=np.int64)
    names = [out.name for out in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feeds), strict=True))
    if "token_embeddings" in outputs:
        outputs["token_embeddings"] = outputs["token_embeddings"] * feeds["attention_mask"][:, :, None].astype(
            np.float32
        )
    return outputs
