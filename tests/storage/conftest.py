"""Backends under test: every contract test runs against a local folder and a moto S3 bucket."""

from __future__ import annotations

from typing import Any

import pytest

from storage.local import LocalStorage
from storage.s3 import S3Storage


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> LocalStorage | S3Storage:
    if request.param == "local":
        return LocalStorage(tmp_path / "store")
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    return S3Storage(bucket=bucket, prefix="pfx", endpoint_url=endpoint, region="us-east-1", addressing_style="path")
