"""Settings for the test suite: PostgreSQL by default, a throwaway data folder, in-process tasks."""

import os
import tempfile

os.environ.setdefault("MODELYARD_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/modelyard")
os.environ.setdefault("MODELYARD_DATA_DIR", tempfile.mkdtemp(prefix="modelyard-test-"))
os.environ.pop("MODELYARD_BROKER_URL", None)
os.environ.pop("MODELYARD_STORAGE_URL", None)
# Runtimes that tests start take no benchmark jobs unless a test turns it on (tests/inference/test_benchmarks.py).
os.environ.setdefault("MODELYARD_BENCHMARKS", "false")

from modelyard.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
