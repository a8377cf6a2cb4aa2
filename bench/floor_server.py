"""The floor under the served path: the least any Python HTTP server does to answer one inference request.

    .venv/bin/python bench/floor_server.py --model ../shared/models/minilm-l6/model.onnx --port 8101

A bare ASGI callable (no framework, no routing, no checks, no metrics) on the same server Modelyard
runs on (uvicorn with uvloop and httptools), answering the JSON form of the Open Inference Protocol
with orjson. The session (every core, as the one Modelyard runs a lone request on) runs in one
worker thread: an event loop must not run a model itself, or one request would stall every other
connection. So a request here costs what a single-client request to any asyncio server costs besides
``run()``: the loopback round trip, HTTP parsing, the JSON in and out, and the hand-over to the run
thread and back.

``POST .../echo`` answers the last answer again without decoding or running anything: the loopback
round trip and uvicorn's HTTP alone, for the same bytes out.

``bench/serve.py`` measures both beside Modelyard in the single-client paired blocks; the difference
between Modelyard and ``.../infer`` here is what Modelyard itself adds. It is not a server anyone
should run: it checks nothing and answers only ``POST .../infer``, ``POST .../echo`` and
``GET /v2/health/ready``.
"""

from __future__ import annotations

import argparse
import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import uvicorn

DTYPES = {"INT64": np.int64, "INT32": np.int32, "FP32": np.float32}
PROTOCOL = {np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32"}
ANSWER_HEADERS = [(b"content-type", b"application/json")]


def build(model_path: str, threads: int) -> Any:
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="floor-run")
    last = [b'{"outputs":[]}']

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        if scope["method"] == "GET":
            await respond(send, 200, b'{"ready":true}')
            return
        if scope["path"].endswith("/echo"):  # the transport alone: the last answer again, nothing decoded or run
            await respond(send, 200, last[0])
            return
        feeds = decode_json(b"".join(chunks))
        values = await asyncio.get_running_loop().run_in_executor(worker, session.run, None, feeds)
        last[0] = encode_json(names, values)
        await respond(send, 200, last[0])

    return app


def decode_json(body: bytes) -> dict[str, np.ndarray]:
    """The request's input tensors (named, so that ``bench/single_profile.py`` finds this step in a profile)."""
    request = orjson.loads(body)
    return {
        t["name"]: np.asarray(t["data"], dtype=DTYPES[t["datatype"]]).reshape(t["shape"]) for t in request["inputs"]
    }


def encode_json(names: list[str], values: list[np.ndarray]) -> bytes:
    """The answer's JSON body."""
    outputs = [
        {"name": name, "datatype": PROTOCOL[value.dtype], "shape": list(value.shape), "data": value.ravel()}
        for name, value in zip(names, values, strict=True)
    ]
    return orjson.dumps({"outputs": outputs}, option=orjson.OPT_SERIALIZE_NUMPY)


async def respond(send: Any, status: int, body: bytes) -> None:
    headers = [*ANSWER_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8101)
    parser.add_argument(
        "--threads", type=int, default=0, help="the session's intra-op threads (0: ONNX Runtime's default, every core)"
    )
    args = parser.parse_args()
    uvicorn.run(
        build(args.model, args.threads),
        host=args.host,
        port=args.port,
        log_level="warning",
        loop="uvloop",
        http="httptools",
        access_log=False,
        lifespan="off",
    )


if __name__ == "__main__":
    main()
