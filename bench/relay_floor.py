"""The floor under an upload through a server: the least a Python server does to pass a file on to its store.

    .venv/bin/python bench/relay_floor.py --port 8102 --s3-endpoint http://127.0.0.1:9000 --bucket b
    .venv/bin/python bench/relay_floor.py --port 8102 --folder /tmp/relay

``POST /<name>`` with the file's bytes as the raw body (and a Content-Length): the standard library's
threading HTTP server reads the body straight from the socket into the store, hashing it with sha256
on the way, and answers ``{"sha256": ..., "size": ...}``. To S3, it is boto3's ``upload_fileobj``
reading the socket with the client and transfer settings of Modelyard's store (``storage/s3.py``: 8 MiB
parts, 4 at a time, no SHA-256 of each part for its signature); to a folder, 1 MiB reads written to a
file that is fsynced before the answer, as Modelyard's local store does.

No multipart form to parse, no database, no checks, no second thread between the socket and the store:
``bench/upload.py`` measures it beside Modelyard and boto3, so that what any relaying server costs on
this machine (the bytes received, hashed and sent again, on the cores the client and the store share)
is told apart from what Modelyard adds. It is not a server anyone should run: it checks nothing.
"""

from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

from storage.base import HashingReader

MIB = 1024 * 1024


class Body:
    """The request body as a file boto3 reads once, in order: ``size`` bytes from the socket, no more."""

    def __init__(self, source: IO[bytes], size: int) -> None:
        self.source = source
        self.left = size

    def read(self, amount: int = -1) -> bytes:
        amount = self.left if amount is None or amount < 0 else min(amount, self.left)
        data = self.source.read(amount) if amount else b""
        self.left -= len(data)
        return data


def build_handler(store: Any) -> type[BaseHTTPRequestHandler]:
    class Relay(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.answer({"ready": True})

        def do_POST(self) -> None:
            # Hashed as it is read, by the same reader as Modelyard's stores (storage.base.HashingReader).
            body = HashingReader(cast(BinaryIO, Body(cast(IO[bytes], self.rfile), int(self.headers["Content-Length"]))))
            store(self.path.strip("/"), body)
            self.answer({"sha256": body.sha256, "size": body.size})

        def answer(self, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Relay


def s3_store(endpoint: str, bucket: str) -> Any:
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(s3={"payload_signing_enabled": False}, max_pool_connections=10),
    )
    transfer = TransferConfig(multipart_threshold=8 * MIB, multipart_chunksize=8 * MIB, max_concurrency=4)
    transfer.max_in_memory_upload_chunks = 4

    def store(name: str, body: HashingReader) -> None:
        client.upload_fileobj(cast(Any, body), bucket, f"relay/{name}", Config=transfer)

    return store


def folder_store(folder: Path) -> Any:
    folder.mkdir(parents=True, exist_ok=True)

    def store(name: str, body: HashingReader) -> None:
        with (folder / name).open("wb") as out:
            while chunk := body.read(MIB):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())

    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--s3-endpoint")
    parser.add_argument("--bucket")
    parser.add_argument("--folder", type=Path)
    args = parser.parse_args()
    if args.folder is not None:
        store = folder_store(args.folder)
    elif args.s3_endpoint and args.bucket:
        store = s3_store(args.s3_endpoint, args.bucket)
    else:
        parser.error("give --folder, or --s3-endpoint and --bucket")
    ThreadingHTTPServer(("127.0.0.1", args.port), build_handler(store)).serve_forever()


if __name__ == "__main__":
    main()
