"""The baseline users write: FastAPI, a sync endpoint, one ONNX Runtime run per request, no batching.

    .venv/bin/python bench/naive_server.py --model ../shared/models/minilm-l6/model.onnx --port 8100

It speaks the JSON form of the Open Inference Protocol (``POST /v2/models/{name}/infer``) so the
benchmark sends it the same request as Modelyard. FastAPI is not a Modelyard dependency; install it
into the virtual environment for the benchmark only: ``.venv/bin/pip install fastapi``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

try:
    from fastapi import FastAPI, HTTPException
    from pydantic import BaseModel
except ImportError:  # pragma: no cover - the benchmark prints the same hint
    sys.exit("bench/naive_server.py needs FastAPI: .venv/bin/pip install fastapi")

import numpy as np
import onnxruntime as ort
import uvicorn

DTYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32}
PROTOCOL = {np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32"}


class Tensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any]


class InferRequest(BaseModel):
    id: str | None = None
    inputs: list[Tensor]


def build(model_path: str, name: str) -> FastAPI:
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    types = {i.name: DTYPES[i.type] for i in session.get_inputs()}
    app = FastAPI()

    @app.post(f"/v2/models/{name}/infer")
    def infer(request: InferRequest) -> dict[str, Any]:  # sync: FastAPI runs it in its thread pool
        try:
            feeds = {t.name: np.asarray(t.data, dtype=types[t.name]).reshape(t.shape) for t in request.inputs}
        except (KeyError, ValueError) as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc
        outputs = session.run(None, feeds)
        return {
            "model_name": name,
            "id": request.id,
            "outputs": [
                {"name": o.name, "datatype": PROTOCOL[v.dtype], "shape": list(v.shape), "data": v.ravel().tolist()}
                for o, v in zip(session.get_outputs(), outputs, strict=True)
            ],
        }

    @app.get("/v2/health/ready")
    def ready() -> dict[str, bool]:
        return {"ready": True}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--name", default="minilm")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args()
    uvicorn.run(build(args.model, args.name), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
