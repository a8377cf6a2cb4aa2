"""Text in: a loaded version's tokenizer, turning a request's ``text`` input into the model's token inputs.

A version that validated with a ``tokenizer.json`` has a ``text`` entry in its signature
(``onnxkit/tokenizer.py``). When it loads, :meth:`TextEncoder.load` reads the tokenizer again.
A request whose one input is ``text`` (BYTES, shape ``[n]`` or ``[n, 1]``) is tokenised here,
truncated or refused past the token limit, and padded to a *bucket*: the next power of two of its
longest text, at least ``MIN_BUCKET``, at most the limit, or the model's fixed sequence length when
it has one. The padded length is part of the batcher's key (``batcher.batch_key``: every shape
beyond the batch dimension), so requests merge only with requests of their own bucket, and a
batch is never padded to the longest text of some other request.

Outputs with a sequence axis (the second axis, named like ``input_ids``'s in the model) come back
for the request's texts padded to its own longest text, with padded positions set to 0, so a
response never depends on the bucket or on what else ran in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from inference.errors import InvalidInput
from onnxkit.tokenizer import TEXT_INPUT, TOKENIZER_FILE, TokenizerError, load_tokenizer, pad_encodings

MIN_BUCKET = 8
# Tokenising more text than this (in characters) moves to a worker thread, off the event loop.
INLINE_CHARACTERS = 4096

__all__ = ["MIN_BUCKET", "TEXT_INPUT", "TOKENIZER_FILE", "Encoded", "TextEncoder", "TokenizerError", "bucket"]


def bucket(longest: int, limit: int) -> int:
    """The padded length of a request whose longest text has ``longest`` tokens: a power of two, capped at ``limit``."""
    size = MIN_BUCKET
    while size < longest:
        size *= 2
    return min(size, limit)


@dataclass(frozen=True)
class Encoded:
    """One request's texts as token inputs, padded to ``length``; ``longest`` is its longest text in tokens."""

    feeds: dict[str, np.ndarray]
    length: int
    longest: int


class TextEncoder:
    """The tokenizer of one loaded version and how its texts become the model's token inputs."""

    def __init__(
        self,
        tokenizer: Any,
        spec: dict[str, Any],
        *,
        pad_id: int,
        max_tokens: int,
        truncate: bool,
        max_texts: int = 1024,
        sequence_outputs: frozenset[str] = frozenset(),
    ) -> None:
        self.tokenizer = tokenizer
        self.spec = spec
        self.pad_id = pad_id
        self.fixed_length: int | None = spec.get("fixed_length")
        limits = [n for n in (self.fixed_length, spec.get("max_tokens"), max_tokens) if n]
        self.max_tokens = min(limits)
        self.truncate = truncate
        self.max_texts = max_texts
        self.sequence_outputs = sequence_outputs
        # The library truncates (keeping [CLS] and [SEP]) and keeps what it cut in ``overflowing``.
        tokenizer.enable_truncation(self.max_tokens)

    @classmethod
    def load(
        cls,
        folder: Path,
        spec: dict[str, Any],
        session: Any,
        *,
        max_bytes: int,
        max_tokens: int,
        truncate: bool,
        max_texts: int,
    ) -> TextEncoder:
        """Read ``tokenizer.json`` of a version's files; raises :class:`TokenizerError` with the reason."""
        tokenizer, pad_id, _own_length = load_tokenizer(folder / TOKENIZER_FILE, max_bytes=max_bytes)
        try:
            return cls(
                tokenizer,
                spec,
                pad_id=pad_id,
                max_tokens=max_tokens,
                truncate=truncate,
                max_texts=max_texts,
                sequence_outputs=sequence_outputs(session),
            )
        except Exception as exc:  # noqa: BLE001 - e.g. a limit shorter than the tokenizer's special tokens
            raise TokenizerError(f"{TOKENIZER_FILE} cannot truncate to {max_tokens} tokens: {exc}") from None

    def encode(self, texts: np.ndarray, *, tight: bool = False) -> Encoded:
        """Token inputs for the ``text`` input of one request; :class:`InvalidInput` for what cannot be served.

        ``tight``: padded to the longest text itself, not to its bucket. For runs that merge with nothing
        (an inference job's slices), where a bucket's only effect would be more padding to compute.
        """
        if texts.size > self.max_texts:
            # Each text becomes up to max_tokens ids in every token input: a bound on what one request allocates.
            raise InvalidInput(
                f"input '{TEXT_INPUT}' has {texts.size} texts, more than the {self.max_texts} one request may "
                "have (MODELYARD_TEXT_MAX_TEXTS)"
            )
        flat = [str(text) for text in texts.reshape(-1)]
        if not flat:
            raise InvalidInput(f"input '{TEXT_INPUT}' has no texts")
        # One by one: encode_batch would spread the texts over a thread pool of its own, which would compete
        # with ONNX Runtime's threads for the same cores.
        encode = self.tokenizer.encode
        encodings = [encode(text) for text in flat]
        if not self.truncate:
            for index, encoding in enumerate(encodings):
                if encoding.overflowing:
                    raise InvalidInput(
                        f"input '{TEXT_INPUT}': text {index} has more than {self.max_tokens} tokens, the limit of "
                        "this version (the least of MODELYARD_TEXT_MAX_TOKENS, the model's sequence length and the "
                        "tokenizer's own); truncation is off (MODELYARD_TEXT_TRUNCATE=false)"
                    )
        longest = max(len(encoding.ids) for encoding in encodings)
        length = self.fixed_length or (longest if tight else bucket(longest, self.max_tokens))
        feeds = pad_encodings(encodings, self.spec, pad_id=self.pad_id, length=length)
        return Encoded(feeds, length, longest)

    async def encode_async(self, texts: np.ndarray) -> Encoded:
        """:meth:`encode`, in a worker thread when the texts are long enough to hold up the event loop."""
        if sum(len(text) for text in texts.reshape(-1)) <= INLINE_CHARACTERS:
            return self.encode(texts)
        return await anyio.to_thread.run_sync(self.encode, texts)

    def unpad(self, outputs: dict[str, np.ndarray], encoded: Encoded) -> dict[str, np.ndarray]:
        """Sequence outputs cut to the request's longest text, padded positions 0: the bucket leaves no trace."""
        if self.fixed_length or not self.sequence_outputs:
            return outputs
        mask = encoded.feeds["attention_mask"][:, : encoded.longest].astype(bool)
        for name in self.sequence_outputs & outputs.keys():
            value = outputs[name]
            if value.ndim < 2 or value.shape[:2] != (mask.shape[0], encoded.length):
                continue
            value = value[:, : encoded.longest]
            keep = mask.reshape(mask.shape + (1,) * (value.ndim - 2))
            outputs[name] = np.where(keep, value, np.zeros((), dtype=value.dtype))
        return outputs


def sequence_outputs(session: Any) -> frozenset[str]:
    """Outputs whose second axis is the sequence: named as ``input_ids``'s second axis is in the model."""
    ids = next((arg for arg in session.get_inputs() if arg.name == "input_ids"), None)
    if ids is None or len(ids.shape) != 2 or not isinstance(ids.shape[1], str):
        return frozenset()
    axis = ids.shape[1]
    return frozenset(out.name for out in session.get_outputs() if len(out.shape) >= 2 and out.shape[1] == axis)
