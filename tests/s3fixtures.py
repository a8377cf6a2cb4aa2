"""S3 fixtures backed by moto's threaded server, loaded as a plugin from tests/conftest.py.

The server speaks real HTTP on 127.0.0.1, so S3Storage and boto3 run their ordinary code
paths (multipart uploads, retries, connection errors) rather than an in-process mock.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from storage import get_storage

S3_PREFIX = "pfx"
_AWS_ENV = {
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


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """Start moto's S3 server once per session; returns its endpoint URL."""
    from moto.server import ThreadedMotoServer

    saved = {name: os.environ.get(name) for name in (*_AWS_ENV, "AWS_SESSION_TOKEN", "AWS_PROFILE")}
    os.environ.update(_AWS_ENV)
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


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> Any:
    return boto3.session.Session().client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")


@pytest.fixture
def s3_bucket(s3_client: Any) -> Iterator[str]:
    """A fresh, uniquely named bucket; emptied and deleted afterwards."""
    name = f"modelyard-test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        paginator = s3_client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=name):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                s3_client.delete_objects(Bucket=name, Delete={"Objects": keys})
        s3_client.delete_bucket(Bucket=name)


def bucket_objects(client: Any, bucket: str) -> dict[str, bytes]:
    """Every object in the bucket, full key -> bytes."""
    found: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            found[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found


@pytest.fixture
def s3_settings(settings: Any, s3_endpoint: str, s3_bucket: str) -> Iterator[Any]:
    """Point Django's artifact storage at the moto bucket, under the key prefix ``pfx``."""
    from modelyard.env import StorageConfig

    get_storage.cache_clear()
    settings.STORAGE = StorageConfig(kind="s3", bucket=s3_bucket, prefix=S3_PREFIX)
    settings.S3_ENDPOINT_URL = s3_endpoint
    settings.S3_REGION = "us-east-1"
    settings.S3_ADDRESSING_STYLE = "path"
    yield settings
    get_storage.cache_clear()
