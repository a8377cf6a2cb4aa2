"""Export a BERT-shaped sentence encoder to ONNX with torch, for the H200 run (``bench/gpu/run.sh``).

    python bench/gpu/export_model.py OUT.onnx [--preset minilm|tiny]

``minilm`` has all-MiniLM-L6-v2's shape (6 layers, hidden 384, 12 heads, 90 MB); ``tiny`` (2 layers,
hidden 64) is for the CPU rehearsal. Weights are random: speed does not depend on their values, and
the 90 MB MiniLM does not fit in a device call beside the ONNX Runtime pack. Inputs ``input_ids`` and
``attention_mask`` (int64, [batch, seq]), output ``sentence_embedding`` ([batch, hidden], mean-pooled
and normalised), batch and sequence dynamic. It needs torch and transformers, which the H200 image
has; it runs without the Modelyard wheels on the path.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

PRESETS: dict[str, dict[str, int]] = {
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 1000,
    },
}


def export(out: Path, preset: str, fixed: tuple[int, int] | None = None) -> dict[str, Any]:
    import torch
    from transformers import BertConfig, BertModel

    class Embed(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    torch.manual_seed(0)
    config = BertConfig(**PRESETS[preset])
    model = Embed(BertModel(config, add_pooling_layer=False).eval())
    batch, seq = fixed or (2, 16)
    ids = torch.randint(100, 1000, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, seq // 2 :] = 0
    dynamic = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "seq"},
        "sentence_embedding": {0: "batch"},
    }
    started = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(
            model,
            (ids, mask),
            str(out),
            input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"],
            dynamic_axes=None if fixed else dynamic,
            opset_version=17,
            dynamo=False,
        )
    return {
        "preset": preset,
        "config": PRESETS[preset],
        "fixed_shape": list(fixed) if fixed else None,
        "bytes": out.stat().st_size,
        "export_s": round(time.perf_counter() - started, 2),
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="minilm")
    parser.add_argument(
        "--fixed",
        metavar="BATCH,SEQ",
        help="every shape fixed (no dynamic axes), as CUDA graphs need: e.g. 1,32 for batch-1 requests of 32 tokens",
    )
    args = parser.parse_args()
    fixed: tuple[int, int] | None = None
    if args.fixed:
        try:
            batch, seq = (int(n) for n in args.fixed.split(","))
        except ValueError:
            parser.error("--fixed takes BATCH,SEQ, two whole numbers")
        fixed = (batch, seq)
    info = export(args.out, args.preset, fixed)
    args.out.with_suffix(".json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"exported {args.preset} ({info['bytes'] / 1e6:.1f} MB) to {args.out} in {info['export_s']} s", flush=True)


if __name__ == "__main__":
    main()
