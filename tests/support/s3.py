"""S3 for tests: moto's threaded server (the ``s3_*`` fixtures in tests/conftest.py start it) and helpers.

The server speaks real HTTP on 127.0.0.1, so S3Storage and boto3 run their ordinary code
paths (multipart uploads, retries, connection errors) rather than an in-process mock.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

S3_PREFIX = "pfx"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def closed_port_url() -> str:
    """An http:// URL on 127.0.0.1 where nothing listens: connections are refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on a free loopback port, with fake credentials in the environment; yields its URL."""
    from moto.server import ThreadedMotoServer

    saved = {name: os.environ.get(name) for name in (*AWS_ENV, "AWS_SESSION_TOKEN", "AWS_PROFILE")}
    os.environ.update(AWS_ENV)
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def delete_bucket(client: Any, bucket: str) -> None:
    """Empty the bucket and delete it."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
    client.delete_bucket(Bucket=bucket)


def bucket_objects(client: Any, bucket: str) -> dict[str, bytes]:
    """Every object in the bucket, full key -> bytes."""
    found: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            found[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found
