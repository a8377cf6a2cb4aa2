"""A version's ``tokenizer.json``: what lets it take raw text, shared by validation and the inference runtime.

A version uploaded with a Hugging Face ``tokenizers`` file named ``tokenizer.json`` takes, besides its
own token inputs, one BYTES input named ``text``: the server tokenises, pads and builds the attention
mask. Validation reads the tokenizer (under ``MODELYARD_TOKENIZER_MAX_BYTES``), checks that the
model's inputs are ones text can fill, and records the ``text`` entry in the signature
(:func:`text_signature`); the inference runtime reads the same file again when it loads the version
(``inference/text.py``). Nothing here touches the database or Django's settings: validation runs it
in a bare child process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

TOKENIZER_FILE = "tokenizer.json"
TEXT_INPUT = "text"
# The model inputs the server fills from text, with the names Hugging Face exports give them.
IDS, MASK, TYPE_IDS = "input_ids", "attention_mask", "token_type_ids"
TOKEN_INPUTS = (IDS, MASK, TYPE_IDS)
TOKEN_DATATYPES = {"INT64": np.int64, "INT32": np.int32}
TOKENIZER_MAX_BYTES_SETTING = "MODELYARD_TOKENIZER_MAX_BYTES"


class TokenizerError(ValueError):
    """``tokenizer.json`` cannot be read, or the model cannot take what it gives; the message says why."""


def load_tokenizer(path: Path, *, max_bytes: int) -> tuple[Any, int, int | None]:
    """The tokenizer of ``path``, with padding and truncation off; its pad id; its own truncation length, if any.

    The server pads and truncates per request, so the file's own settings (MiniLM's pads every text
    to 128) are read and then switched off.
    """
    size = path.stat().st_size
    if size > max_bytes:
        raise TokenizerError(
            f"{TOKENIZER_FILE} has {size} bytes, more than the {max_bytes} a tokenizer may have "
            f"({TOKENIZER_MAX_BYTES_SETTING})"
        )
    from tokenizers import Tokenizer  # here: the validation child imports it only for a version that has one

    try:
        tokenizer = Tokenizer.from_str(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise TokenizerError(f"{TOKENIZER_FILE} is not UTF-8 text") from None
    except Exception as exc:  # noqa: BLE001 - the Rust library raises plain Exception
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerError(
            f"{TOKENIZER_FILE} is not a tokenizer the Hugging Face tokenizers library can read: {first[:300]}"
        ) from None
    padding = tokenizer.padding
    pad_id = int(padding["pad_id"]) if padding else 0
    truncation = tokenizer.truncation
    own_length = int(truncation["max_length"]) if truncation else None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer, pad_id, own_length


def text_signature(inputs: list[dict[str, Any]], own_length: int | None) -> dict[str, Any]:
    """The signature's ``text`` entry for a model with ``inputs``, or :class:`TokenizerError` saying why it cannot.

    ``feeds`` maps each token input to its datatype; ``fixed_length`` is the model's fixed sequence
    length, if it has one (every request is then padded to it); ``max_tokens`` is the shortest of that
    and the tokenizer's own truncation length (the server's ``MODELYARD_TEXT_MAX_TOKENS`` may lower it).
    """
    by_name = {spec["name"]: spec for spec in inputs}
    if TEXT_INPUT in by_name:
        raise TokenizerError(
            f"the model has an input named '{TEXT_INPUT}' of its own, so {TOKENIZER_FILE} cannot add one; "
            f"upload it without {TOKENIZER_FILE}"
        )
    others = sorted(name for name in by_name if name not in TOKEN_INPUTS)
    missing = [name for name in (IDS, MASK) if name not in by_name]
    if others or missing:
        problem = f"input(s) {', '.join(others)} cannot be made from text" if others else ""
        if missing:
            problem += ("; " if problem else "") + f"it lacks {', '.join(missing)}"
        raise TokenizerError(
            f"{TOKENIZER_FILE} was uploaded, but the model's inputs are not ones the server fills from text "
            f"({', '.join(TOKEN_INPUTS)}, the last optional): {problem}"
        )
    shapes = []
    feeds: dict[str, str] = {}
    for name in TOKEN_INPUTS:
        spec = by_name.get(name)
        if spec is None:
            continue
        if spec["datatype"] not in TOKEN_DATATYPES:
            raise TokenizerError(f"input '{name}' is {spec['datatype']}; text needs INT64 or INT32 token inputs")
        shape = spec.get("shape")
        if not isinstance(shape, list) or len(shape) != 2:
            raise TokenizerError(f"input '{name}' has the shape {shape}; text needs [batch, sequence] token inputs")
        feeds[name] = spec["datatype"]
        shapes.append(shape)
    if any(shape != shapes[0] for shape in shapes):
        raise TokenizerError(f"the token inputs' shapes differ ({shapes}); text needs them all alike")
    batch, length = shapes[0]
    fixed = length if length > 0 else None
    limits = [n for n in (fixed, own_length) if n]
    return {
        "name": TEXT_INPUT,
        "datatype": "BYTES",
        "shape": [batch],
        "tokenizer": TOKENIZER_FILE,
        "feeds": feeds,
        "fixed_length": fixed,
        "max_tokens": min(limits) if limits else None,
    }


def pad_encodings(encodings: list[Any], spec: dict[str, Any], *, pad_id: int, length: int) -> dict[str, np.ndarray]:
    """The token inputs of ``spec["feeds"]`` for tokenised texts, each padded to ``length`` (none may be longer)."""
    rows = len(encodings)
    arrays = {
        name: np.zeros((rows, length), dtype=TOKEN_DATATYPES[datatype]) for name, datatype in spec["feeds"].items()
    }
    ids, mask = arrays[IDS], arrays[MASK]
    ids.fill(pad_id)
    for row, encoding in enumerate(encodings):
        size = len(encoding.ids)
        ids[row, :size] = encoding.ids
        mask[row, :size] = 1
        if TYPE_IDS in arrays:
            arrays[TYPE_IDS][row, :size] = encoding.type_ids
    return arrays
