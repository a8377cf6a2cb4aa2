"""Django settings for Modelyard.

With no environment at all this is the embedded default: SQLite and artifacts in
``MODELYARD_DATA_DIR``, tasks run in-process after commit. Production is configured entirely
through ``MODELYARD_*`` variables; the README lists them all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from modelyard.env import (
    cache_from_url,
    database_from_url,
    env_bool,
    env_choice,
    env_encryption_keys,
    env_enum,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_pem_files,
    env_providers,
    env_rate,
    env_signers,
    env_signing_key,
    env_str,
    load_or_create_secret,
    parse_rate,
    redis_url,
    storage_from_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent

DATA_DIR = Path(env_str("MODELYARD_DATA_DIR") or Path.cwd() / ".modelyard").resolve()

SECRET_KEY = env_str("MODELYARD_SECRET_KEY") or load_or_create_secret(DATA_DIR / "secret_key")
if "REPLACE-ME" in SECRET_KEY:  # deploy/k8s/base/secret.example.yaml applied as it is: a key the world knows
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("MODELYARD_SECRET_KEY: still the example Secret's placeholder; set a long random one")

# Signed provenance (modelyard/provenance.py, docs/provenance.md). The registry signs every validated
# version with SIGNING_KEY (PEM text or a path; generated into the data folder when unset). VERIFY_KEYS
# are public keys also trusted as the registry's (rotation: the keys before this one; inference hosts that
# hold no private key). TRUSTED_SIGNERS (NAME=PATH,...) are the uploaders whose bundles are accepted.
SIGNING_KEY, SIGNING_KEY_SOURCE = env_signing_key("MODELYARD_SIGNING_KEY", DATA_DIR / "signing-key.pem")
VERIFY_KEYS = env_pem_files("MODELYARD_VERIFY_KEYS")
TRUSTED_SIGNERS = env_signers("MODELYARD_TRUSTED_SIGNERS")
# Secrets the registry reads back (webhook secrets) are stored encrypted (modelyard/crypto.py): Fernet keys,
# comma-separated, the first encrypting and all decrypting; generated into the data folder when unset.
ENCRYPTION_KEYS, ENCRYPTION_KEYS_SOURCE = env_encryption_keys("MODELYARD_ENCRYPTION_KEYS", DATA_DIR / "encryption-key")

DEBUG = env_bool("MODELYARD_DEBUG", False)
ALLOWED_HOSTS = env_list("MODELYARD_ALLOWED_HOSTS", ["*"])
CSRF_TRUSTED_ORIGINS = env_list("MODELYARD_CSRF_TRUSTED_ORIGINS", [])
# Reverse proxies whose X-Forwarded-For and X-Request-ID are believed; from anyone else they are ignored.
TRUSTED_PROXIES = env_networks("MODELYARD_TRUSTED_PROXIES")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "csp",
    "storage",
    "registry",
    "inference",
]

MIDDLEWARE = [
    "modelyard.middleware.ReplaceNulInURL",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "registry.ui.errors.UiErrorPages",
]

# The web UI runs no inline script or style: everything it loads comes from this origin, so an injected
# <script> or style attribute does nothing. The Django admin and the Swagger page are third-party markup
# with inline code of their own, and keep going without the header.
CONTENT_SECURITY_POLICY = {
    "EXCLUDE_URL_PREFIXES": ["/admin/", "/api/docs/"],
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}
# A refused CSRF check gets the UI's own 403 page (JSON outside the UI).
CSRF_FAILURE_VIEW = "registry.ui.errors.csrf_failure"

ROOT_URLCONF = "modelyard.urls"
WSGI_APPLICATION = "modelyard.wsgi.application"
ASGI_APPLICATION = "modelyard.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "registry.ui.context.ui",
            ],
        },
    },
]

_database_url = env_str("MODELYARD_DATABASE_URL")
EMBEDDED_DATABASE = not _database_url
DATABASES = {
    "default": database_from_url("MODELYARD_DATABASE_URL", _database_url)
    if _database_url
    else {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "modelyard.sqlite3",
        # Several threads (request, in-process tasks) share one file: wait instead of failing.
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/ui/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
# Password logins (/accounts/login/ and /admin/login/) lock a username after this many failures, and a
# client address after LOGIN_MAX_FAILURES_PER_IP, within LOGIN_LOCKOUT_SECONDS; the lock lasts as long.
LOGIN_MAX_FAILURES = env_int("MODELYARD_LOGIN_MAX_FAILURES", 5, minimum=1)
LOGIN_MAX_FAILURES_PER_IP = env_int("MODELYARD_LOGIN_MAX_FAILURES_PER_IP", 20, minimum=1)
LOGIN_LOCKOUT_SECONDS = env_int("MODELYARD_LOGIN_LOCKOUT_SECONDS", 900, minimum=1)
# Sign-in with an OpenID Connect provider (MODELYARD_OIDC_*, modelyard/oidc_config.py, docs/operations/oidc.md);
# None when off. PASSWORD_LOGIN false hides and refuses the password form (the Django admin's login too).
from modelyard.oidc_config import env_oidc  # noqa: E402

OIDC = env_oidc()
PASSWORD_LOGIN = env_bool("MODELYARD_PASSWORD_LOGIN", True)
if not PASSWORD_LOGIN and OIDC is None:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        "MODELYARD_PASSWORD_LOGIN=false with no OpenID Connect provider: nobody could sign in; "
        "set MODELYARD_OIDC_ISSUER, MODELYARD_OIDC_CLIENT_ID and MODELYARD_OIDC_CLIENT_SECRET"
    )
AUTHENTICATION_BACKENDS = ["registry.access.oidc.PasswordLoginBackend"]

# --- Artifacts -------------------------------------------------------------------------------
_storage_url = env_str("MODELYARD_STORAGE_URL")
STORAGE = storage_from_url("MODELYARD_STORAGE_URL", _storage_url or (DATA_DIR / "artifacts").as_uri())
if not _storage_url:
    # The embedded folder exists from the start, so /readyz is ready before the first upload; a
    # configured folder is the operator's to provide, and /readyz says when it is missing.
    (DATA_DIR / "artifacts").mkdir(parents=True, exist_ok=True)
S3_ENDPOINT_URL = env_str("MODELYARD_S3_ENDPOINT_URL") or None
S3_REGION = env_str("MODELYARD_S3_REGION") or None
S3_ADDRESSING_STYLE = env_str("MODELYARD_S3_ADDRESSING_STYLE", "auto")
if S3_ADDRESSING_STYLE not in {"auto", "path", "virtual"}:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"MODELYARD_S3_ADDRESSING_STYLE: expected auto, path or virtual, got {S3_ADDRESSING_STYLE!r}"
    )
S3_MAX_ATTEMPTS = env_int("MODELYARD_S3_MAX_ATTEMPTS", 3, minimum=1)
S3_CONNECT_TIMEOUT = env_float("MODELYARD_S3_CONNECT_TIMEOUT", 5.0, minimum=0.1)
S3_MULTIPART_CHUNK_MB = env_int("MODELYARD_S3_MULTIPART_CHUNK_MB", 8, minimum=5)
S3_MAX_CONCURRENCY = env_int("MODELYARD_S3_MAX_CONCURRENCY", 4, minimum=1)
# Server-side encryption asked for on every object written (storage/s3.py): AES256 (SSE-S3) or aws:kms
# (SSE-KMS, with S3_SSE_KMS_KEY_ID or else the account's default KMS key); unset, the bucket's default.
S3_SSE = env_enum("MODELYARD_S3_SSE", "", ("AES256", "aws:kms")) or None
S3_SSE_KMS_KEY_ID = env_str("MODELYARD_S3_SSE_KMS_KEY_ID") or None
if S3_SSE_KMS_KEY_ID and S3_SSE != "aws:kms":
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        "MODELYARD_S3_SSE_KMS_KEY_ID: only used with MODELYARD_S3_SSE=aws:kms, "
        f"and MODELYARD_S3_SSE is {S3_SSE or 'unset'}"
    )

MAX_UPLOAD_BYTES = env_int("MODELYARD_MAX_UPLOAD_BYTES", 8 * 1024**3, minimum=1)
# Every other request body (JSON, forms) is refused as soon as it passes this size, chunked or not,
# before authentication runs (modelyard/streaming.py).
MAX_REQUEST_BODY_BYTES = env_int("MODELYARD_MAX_REQUEST_BODY_BYTES", 16 * 1024**2, minimum=1024)
# JSON bodies and JSON form fields nested deeper than this are refused with a 400 (far below the stack limit).
MAX_JSON_DEPTH = env_int("MODELYARD_MAX_JSON_DEPTH", 64, minimum=1)
# Tags of a model or a version: how many, and how long each. Every edit of them is an audit event kept
# for good, so the defaults keep one within a few KiB.
MAX_TAGS = env_int("MODELYARD_MAX_TAGS", 32, minimum=1)
MAX_TAG_CHARS = env_int("MODELYARD_MAX_TAG_CHARS", 64, minimum=1)
# Datasets named in one version's lineage (source_datasets), each kept in its upload's or edit's audit event.
MAX_SOURCE_DATASETS = env_int("MODELYARD_MAX_SOURCE_DATASETS", 50, minimum=1)
# A client that sends no body bytes for this long has its request ended (408), so a stalled upload
# cannot hold a server thread for as long as it likes. Also applies to /v2 request bodies.
BODY_IDLE_TIMEOUT_SECONDS = env_float("MODELYARD_BODY_IDLE_TIMEOUT_SECONDS", 60.0, minimum=0.01)
# Multipart limits of Django's parser: the number of file parts, and the bytes of all non-file
# fields together (description, metadata), which are held in memory.
DATA_UPLOAD_MAX_NUMBER_FILES = env_int("MODELYARD_MAX_UPLOAD_FILES", 100, minimum=1)
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MODELYARD_MAX_FORM_BYTES", 2_621_440, minimum=1024)
# Uploaded files are spooled to disk as they arrive; nothing over this stays in memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
FILE_UPLOAD_TEMP_DIR = env_str("MODELYARD_UPLOAD_TEMP_DIR") or None
# Objects that no version references are deleted after this grace period.
GC_GRACE_SECONDS = env_int("MODELYARD_GC_GRACE_SECONDS", 24 * 3600, minimum=0)
# A validation whose worker stopped heartbeating for this long is taken over by another.
VALIDATION_HEARTBEAT_SECONDS = env_float("MODELYARD_VALIDATION_HEARTBEAT_SECONDS", 5.0, minimum=0.1)
VALIDATION_STALE_SECONDS = env_float("MODELYARD_VALIDATION_STALE_SECONDS", 30.0, minimum=0.5)
# Validation runs in a child process that is stopped past either limit (onnxkit/sandbox.py).
# The limit is on address space: the child needs about 200 MB of it to import numpy, onnx and ONNX
# Runtime, and MiniLM-L6 (a 90 MB model) validates under 512 MB but not 448. The default leaves a
# wide margin for real models; a hostile one can no longer take the server down.
VALIDATION_TIMEOUT_SECONDS = env_float("MODELYARD_VALIDATION_TIMEOUT_SECONDS", 120.0, minimum=1.0)
VALIDATION_MEMORY_MB = env_int("MODELYARD_VALIDATION_MEMORY_MB", 4096, minimum=256)
# Text in (onnxkit/tokenizer.py, inference/text.py): the largest tokenizer.json a version may carry,
# checked at validation and again at load. Real ones are 0.5-20 MB (MiniLM's 0.47 MB, Llama 3's 9 MB).
TOKENIZER_MAX_BYTES = env_int("MODELYARD_TOKENIZER_MAX_BYTES", 64 * 1024**2, minimum=1024)
PROMOTION_TTL_SECONDS = env_int("MODELYARD_PROMOTION_TTL_SECONDS", 7 * 24 * 3600, minimum=1)
# Promotion policies (registry/policy/engine.py), rules in CEL: at most this many rules in one alias's policy,
POLICY_MAX_RULES = env_int("MODELYARD_POLICY_MAX_RULES", 50, minimum=1)
# at most this many characters in one rule's expression,
POLICY_MAX_RULE_LENGTH = env_int("MODELYARD_POLICY_MAX_RULE_LENGTH", 2000, minimum=16)
# and one rule running past this against a promotion's evidence is stopped there and fails.
POLICY_EVAL_TIMEOUT_MS = env_int("MODELYARD_POLICY_EVAL_TIMEOUT_MS", 100, minimum=1)
VALIDATION_WORK_DIR = env_str("MODELYARD_WORK_DIR") or str(DATA_DIR / "work")
# Derived versions are built, and versions benchmarked, in child processes under the same kind of
# limits (onnxkit/sandbox.py). An fp16 or int8 conversion holds the model about three times.
DERIVE_TIMEOUT_SECONDS = env_float("MODELYARD_DERIVE_TIMEOUT_SECONDS", 900.0, minimum=1.0)
DERIVE_MEMORY_MB = env_int("MODELYARD_DERIVE_MEMORY_MB", 8192, minimum=256)
# A derive option that lists operators (op_block_list, op_types): how many names, and how long each. The
# options go into the job row and its audit event for good; ONNX's default domain has about 200 operators.
DERIVE_MAX_OPTION_ITEMS = env_int("MODELYARD_DERIVE_MAX_OPTION_ITEMS", 256, minimum=1)
DERIVE_MAX_OPTION_ITEM_CHARS = env_int("MODELYARD_DERIVE_MAX_OPTION_ITEM_CHARS", 128, minimum=1)
# A benchmark's whole run (load, warm-up, latency, throughput); on CPU its address space is limited too
# (on CUDA it is not: the driver reserves far more address space than it uses). It runs at this niceness.
BENCHMARK_TIMEOUT_SECONDS = env_float("MODELYARD_BENCHMARK_TIMEOUT_SECONDS", 300.0, minimum=1.0)
BENCHMARK_MEMORY_MB = env_int("MODELYARD_BENCHMARK_MEMORY_MB", 8192, minimum=256)
# Whether inference processes take benchmark jobs (the rows are requested either way).
BENCHMARKS_ENABLED = env_bool("MODELYARD_BENCHMARKS", True)
BENCHMARK_NICE = env_int("MODELYARD_BENCHMARK_NICE", 10, minimum=0)
# Latency is measured over this many batch-1 runs (p50 and p99), throughput over as many batches as fit in
# BENCHMARK_SECONDS per batch size.
BENCHMARK_ITERATIONS = env_int("MODELYARD_BENCHMARK_ITERATIONS", 200, minimum=1)
BENCHMARK_SECONDS = env_float("MODELYARD_BENCHMARK_SECONDS", 3.0, minimum=0.01)

# Asynchronous inference (registry/jobs/): what one job may hold, how many may wait, how its chunks run.
INFERENCE_JOB_MAX_ROWS = env_int("MODELYARD_INFERENCE_JOB_MAX_ROWS", 1_000_000, minimum=1)
# Counted while the input streams to the store, so a larger one is refused before it is all sent.
INFERENCE_JOB_MAX_BYTES = env_int("MODELYARD_INFERENCE_JOB_MAX_BYTES", 512 * 1024**2, minimum=1)
# Jobs queued or running: per token (per user without one), and in all.
INFERENCE_JOB_MAX_QUEUED_PER_TOKEN = env_int("MODELYARD_INFERENCE_JOB_MAX_QUEUED_PER_TOKEN", 10, minimum=1)
INFERENCE_JOB_MAX_QUEUED = env_int("MODELYARD_INFERENCE_JOB_MAX_QUEUED", 100, minimum=1)
# Rows per chunk: what an inference process takes at once, and loses when it dies.
INFERENCE_JOB_CHUNK_ROWS = env_int("MODELYARD_INFERENCE_JOB_CHUNK_ROWS", 1024, minimum=1)
# Rows per batcher run of a job (0: the model's max_batch_size). An online request waits at most for the
# one job run in flight, so a smaller slice keeps online latency closer to idle and the job slower.
INFERENCE_JOB_SLICE_ROWS = env_int("MODELYARD_INFERENCE_JOB_SLICE_ROWS", 0, minimum=0)
# A chunk whose process has not renewed its lease this long is taken by another, up to MAX_ATTEMPTS times.
INFERENCE_JOB_LEASE_SECONDS = env_float("MODELYARD_INFERENCE_JOB_LEASE_SECONDS", 60.0, minimum=1.0)
INFERENCE_JOB_MAX_ATTEMPTS = env_int("MODELYARD_INFERENCE_JOB_MAX_ATTEMPTS", 3, minimum=1)
# How long an infer-async answer, and a finished job's result, are kept.
ASYNC_RESULT_TTL_SECONDS = env_int("MODELYARD_ASYNC_RESULT_TTL_SECONDS", 3600, minimum=1)
INFERENCE_JOB_RESULT_TTL_SECONDS = env_int("MODELYARD_INFERENCE_JOB_RESULT_TTL_SECONDS", 7 * 24 * 3600, minimum=1)

# --- Tasks -----------------------------------------------------------------------------------
BROKER_URL = env_str("MODELYARD_BROKER_URL") or None
CELERY_BROKER_URL = BROKER_URL or "memory://"
CELERY_TASK_ALWAYS_EAGER = BROKER_URL is None
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
BROKER_VISIBILITY_TIMEOUT = env_int("MODELYARD_BROKER_VISIBILITY_TIMEOUT", 3600, minimum=1)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # With Redis, a message whose worker died unacknowledged comes back after this long...
    "visibility_timeout": BROKER_VISIBILITY_TIMEOUT,
    # ...once a live worker looks for it. kombu looks when a worker starts and then only every
    # interval * throttle seconds (10 * 10 by default), which can add 100 s to a short timeout.
    # Look a few times per timeout instead, and at least once a minute.
    "unacked_restore_interval": max(1, min(60, BROKER_VISIBILITY_TIMEOUT // 5)),
    "unacked_restore_throttle": 1,
}
# How often the periodic task signs the audit chain's head (when it moved); every JSONL export signs it too.
AUDIT_SIGN_HEAD_SECONDS = env_int("MODELYARD_AUDIT_SIGN_HEAD_SECONDS", 3600, minimum=1)
# How often running rollouts are checked: a breach rolls back at most this long (plus a heartbeat) after it shows.
ROLLOUT_CHECK_SECONDS = env_float("MODELYARD_ROLLOUT_CHECK_SECONDS", 5.0, minimum=1.0)
CELERY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    "sweep-stuck-versions": {"task": "registry.tasks.sweep_stuck_versions", "schedule": 60.0},
    "expire-promotions": {"task": "registry.tasks.expire_promotions", "schedule": 300.0},
    "fail-lost-jobs": {"task": "registry.tasks.fail_lost_jobs", "schedule": 300.0},
    "collect-orphaned-artifacts": {"task": "registry.tasks.collect_orphaned_artifacts", "schedule": 3600.0},
    "purge-deleted-versions": {"task": "registry.tasks.purge_deleted_versions", "schedule": 300.0},
    # Archives or deletes what each model's retention rule no longer keeps (registry/lifecycle/retention.py).
    "apply-retention": {"task": "registry.tasks.apply_retention", "schedule": 3600.0},
    "summarise-auth-failures": {"task": "registry.tasks.summarise_auth_failures", "schedule": 60.0},
    "retry-webhook-deliveries": {"task": "registry.tasks.retry_webhook_deliveries", "schedule": 30.0},
    # Incremental: each run checks only the events appended since the last one (at most AUDIT_VERIFY_MAX_EVENTS).
    "verify-audit-chain": {"task": "registry.tasks.verify_audit_chain", "schedule": 300.0},
    # Signs the chain's head when it moved, so an exported copy of the log proves itself (registry/audit/heads.py).
    "sign-audit-head": {"task": "registry.tasks.sign_audit_head", "schedule": float(AUDIT_SIGN_HEAD_SECONDS)},
    # Versions validated before the batching check existed are served without merging until it has run.
    "recheck-batching": {"task": "registry.tasks.recheck_batching", "schedule": 300.0},
    # Checks each running rollout's step against its limits, rolls back or moves it on (registry/rollout).
    "advance-rollouts": {"task": "registry.tasks.advance_rollouts", "schedule": ROLLOUT_CHECK_SECONDS},
    # Deletes expired infer-async answers and job results, and queues again a job's lost preparation or finish.
    "sweep-inference-jobs": {"task": "registry.tasks.sweep_inference_jobs", "schedule": 60.0},
}
# How many of them one run re-validates (each a sandboxed validation); 0 turns the re-check off.
BATCH_RECHECK_PER_RUN = env_int("MODELYARD_BATCH_RECHECK_PER_RUN", 2, minimum=0)
AUDIT_VERIFY_MAX_EVENTS = env_int("MODELYARD_AUDIT_VERIFY_MAX_EVENTS", 100_000, minimum=1)

# --- Webhooks --------------------------------------------------------------------------------
# Deliveries to loopback and private addresses (10/8, 172.16/12, 192.168/16, fc00::/7, ...) only when
# set; link-local and cloud metadata addresses never (registry/webhooks/outbound.py).
WEBHOOK_ALLOW_PRIVATE = env_bool("MODELYARD_WEBHOOK_ALLOW_PRIVATE", False)
# One attempt's limit, from connecting to the end of the answer's first KiB.
WEBHOOK_TIMEOUT_SECONDS = env_float("MODELYARD_WEBHOOK_TIMEOUT_SECONDS", 10.0, minimum=0.1)
# Attempts per delivery before it ends failed; a retry waits RETRY_SECONDS, doubling each time, at most an hour.
WEBHOOK_MAX_ATTEMPTS = env_int("MODELYARD_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1)
WEBHOOK_RETRY_SECONDS = env_float("MODELYARD_WEBHOOK_RETRY_SECONDS", 30.0, minimum=0)

# --- Cache -----------------------------------------------------------------------------------
# Holds the API throttling counters. Redis when MODELYARD_CACHE_URL (or else a redis:// broker) is
# set, so every server process counts together; otherwise each process counts on its own.
_cache_url = env_str("MODELYARD_CACHE_URL") or (
    BROKER_URL if BROKER_URL and BROKER_URL.startswith(("redis://", "rediss://")) else None
)
CACHES = cache_from_url("MODELYARD_CACHE_URL", _cache_url)

# --- Response cache --------------------------------------------------------------------------
# Aliases opt in (``cache`` on the alias). Entries live in each inference process's memory, bounded by
# the alias's max_bytes, or in this Redis, shared by the fleet (Redis's own maxmemory bounds it).
RESPONSE_CACHE_REDIS_URL = redis_url(
    "MODELYARD_RESPONSE_CACHE_REDIS_URL", env_str("MODELYARD_RESPONSE_CACHE_REDIS_URL")
)
# An answer larger than this (or than a quarter of the alias's max_bytes) is not cached.
RESPONSE_CACHE_MAX_ENTRY_BYTES = env_int("MODELYARD_RESPONSE_CACHE_MAX_ENTRY_BYTES", 4 * 1024 * 1024, minimum=1)

# --- Health ----------------------------------------------------------------------------------
# /readyz waits this long for each of the database, storage and broker checks (they run side by side).
READY_TIMEOUT_SECONDS = env_float("MODELYARD_READY_TIMEOUT_SECONDS", 2.0, minimum=0.05)

# --- API -------------------------------------------------------------------------------------
# Requests per token (or per signed-in browser session), and per client address for requests
# without valid credentials; "off" disables a limit. Read on every request (registry.access.throttling).
API_RATE_USER = env_rate("MODELYARD_API_RATE_USER", "1200/min")
API_RATE_ANON = env_rate("MODELYARD_API_RATE_ANON", "120/min")
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "registry.access.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        # Last: counts requests without credentials per address (registry.access.throttling).
        "registry.access.auth.AddressCount",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["registry.access.permissions.ReadAuthenticatedWriteMaintainer"],
    # First: refuses (403) a model outside its API token's patterns (a check, not a rate; see its docstring).
    "DEFAULT_THROTTLE_CLASSES": [
        "registry.access.scopes.TokenModelScope",
        "registry.access.throttling.TokenRateThrottle",
    ],
    "DEFAULT_PARSER_CLASSES": [
        "registry.api.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "registry.api.pagination.Pagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "registry.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Modelyard registry API",
    "DESCRIPTION": "Versioned ONNX artifacts, aliases and promotions.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # A text field that refuses "" says so (minLength 1), so a client knows which empty fields it may send.
    # Only in requests: each body has its own component (ModelCreateInputRequest), since an answer's text
    # may well be "" (a worker's notice, a webhook's model).
    "COMPONENT_SPLIT_REQUEST": True,
    # The two kinds of job share one set of states, and so one name.
    "ENUM_NAME_OVERRIDES": {"JobStatusEnum": "registry.models.JobStatus"},
    # Every operation's error answers, in the one shape they all have (registry/api/schema.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "registry.api.schema.document_errors"],
    # How a client signs in (registry/api/schema.py); AddressCount takes no credentials, so it is left out.
    "AUTHENTICATION_WHITELIST": [
        "registry.access.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("MODELYARD_LOG_LEVEL", "INFO")},
}

# --- Inference -------------------------------------------------------------------------------
ROLE = env_choice("MODELYARD_ROLE", "all", ("all", "web", "inference"))
PROVIDERS = env_providers(
    "MODELYARD_PROVIDERS", ["cuda", "cpu"], ("cuda", "tensorrt", "rocm", "openvino", "coreml", "cpu")
)
# Refuse to serve on the CPU when CUDA (or TensorRT) does not load: each load fails with the reason.
REQUIRE_GPU = env_bool("MODELYARD_REQUIRE_GPU", False)
_GPU_PROVIDERS = {"cuda", "tensorrt", "cudaexecutionprovider", "tensorrtexecutionprovider"}
if REQUIRE_GPU and not _GPU_PROVIDERS & {name.lower() for name in PROVIDERS}:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"MODELYARD_REQUIRE_GPU: MODELYARD_PROVIDERS={','.join(PROVIDERS)} names no GPU provider (cuda or tensorrt)"
    )
# CUDA provider options (inference/sessions.py: provider_options); ONNX Runtime's defaults unless set.
CUDA_DEVICE_ID = env_int("MODELYARD_CUDA_DEVICE_ID", 0, minimum=0)
CUDA_MEM_LIMIT_MB = env_int("MODELYARD_CUDA_MEM_LIMIT_MB", 0, minimum=0)  # 0: no limit on the arena
CUDA_ARENA_STRATEGY = env_enum(
    "MODELYARD_CUDA_ARENA_STRATEGY", "kNextPowerOfTwo", ("kNextPowerOfTwo", "kSameAsRequested")
)
CUDA_CONV_ALGO_SEARCH = env_enum(
    "MODELYARD_CUDA_CONV_ALGO_SEARCH", "EXHAUSTIVE", ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")
)
CUDA_COPY_IN_DEFAULT_STREAM = env_bool("MODELYARD_CUDA_COPY_IN_DEFAULT_STREAM", True)
# CUDA graphs replay one captured run: only for models whose input shapes never change.
CUDA_GRAPHS = env_bool("MODELYARD_CUDA_GRAPHS", False)
TRT_FP16 = env_bool("MODELYARD_TRT_FP16", False)
ORT_INTRA_OP_THREADS = env_int("MODELYARD_ORT_INTRA_OP_THREADS", 0, minimum=0)
ORT_INTER_OP_THREADS = env_int("MODELYARD_ORT_INTER_OP_THREADS", 0, minimum=0)
ORT_SPINNING = env_bool("MODELYARD_ORT_SPINNING", True)
ORT_GRAPH_OPTIMIZATION = env_choice("MODELYARD_ORT_GRAPH_OPTIMIZATION", "all", ("disable", "basic", "extended", "all"))
# ONNX Runtime's optimised graph of each version, saved on its first load beside the artifact cache and
# loaded by later loads (and the host's other processes) without optimising again; 0 turns it off.
# Off by default until a quiet-machine run of bench/swap.py shows the gain (docs/inference/index.md).
ORT_OPTIMIZED_CACHE_MAX_BYTES = env_int("MODELYARD_ORT_OPTIMIZED_CACHE_MAX_BYTES", 0, minimum=0)
# How much lower than serving a load runs (the nice value added to the loading thread, 0 to 19): hashing,
# the session build and the warm-up give way to the requests being served; 0 turns it off.
LOAD_NICE = env_int("MODELYARD_LOAD_NICE", 0, minimum=0)  # off by default, as above
# ...for at most this long: then the load goes on at the serving priority, so that it ends (0: no limit).
LOAD_NICE_SECONDS = env_float("MODELYARD_LOAD_NICE_SECONDS", 1.0, minimum=0)
if LOAD_NICE > 19:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(f"MODELYARD_LOAD_NICE: must be at most 19, got {LOAD_NICE}")
INFERENCE_PUBLIC = env_bool("MODELYARD_INFERENCE_PUBLIC", False)
# /metrics needs a token with the inference or admin role unless this is set.
METRICS_PUBLIC = env_bool("MODELYARD_METRICS_PUBLIC", False)
# The largest /v2 request body, raw and after decompression; a version whose inputs all have fixed
# shapes gets a lower limit computed from them (inference/protocol.py: body_limit). 64 MiB holds a
# batch of 32 RGB 224x224 images as FP32 binary (19 MB) or as JSON, and bounds what a few
# concurrent requests can make the process hold.
V2_MAX_BODY_BYTES = env_int("MODELYARD_V2_MAX_BODY_BYTES", 64 * 1024**2, minimum=1024)
# Per token (per client address when /v2 is public) and per process; unset means unlimited.
_v2_rate = env_rate("MODELYARD_V2_RATE", "off")
V2_RATE = parse_rate(_v2_rate) if _v2_rate else None  # (requests, period in seconds)
# Token verdicts /v2 keeps in memory (each for 5 s, so a revoked token stops working within 5 s).
V2_TOKEN_CACHE_ENTRIES = env_int("MODELYARD_V2_TOKEN_CACHE_ENTRIES", 10_000, minimum=1)
# Triton's system shared memory (/v2/systemsharedmemory and its gRPC calls): clients on this host pass tensors
# in POSIX shared memory regions they register (docs/inference/shared-memory.md). Off unless asked for; then
# each client (token) may map at most so many regions and bytes in each inference process.
SHARED_MEMORY = env_bool("MODELYARD_SHARED_MEMORY", False)
SHARED_MEMORY_MAX_REGIONS = env_int("MODELYARD_SHARED_MEMORY_MAX_REGIONS", 16, minimum=1)
SHARED_MEMORY_MAX_BYTES = env_int("MODELYARD_SHARED_MEMORY_MAX_BYTES", 256 * 1024**2, minimum=1)
# gRPC (inference.GRPCInferenceService) beside /v2 in every inference process; port 0 turns it off.
# `modelyard serve` sets these from --grpc-port, --host and --workers.
GRPC_PORT = env_int("MODELYARD_GRPC_PORT", 8001, minimum=0)
if GRPC_PORT > 65535:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(f"MODELYARD_GRPC_PORT: must be a port number (0 turns gRPC off), got {GRPC_PORT}")
GRPC_HOST = env_str("MODELYARD_GRPC_HOST", "127.0.0.1") or "127.0.0.1"
# Every worker process of `serve --workers N` binds the port with SO_REUSEPORT; one process alone does not share it.
GRPC_REUSE_PORT = env_bool("MODELYARD_GRPC_REUSE_PORT", False)
# The largest gRPC message a client may send (RESOURCE_EXHAUSTED past it); as large as /v2's body by default.
# Text in: a text longer than this many tokens (or the model's fixed sequence length, or the tokenizer's
# own truncation length, whichever is shortest) is truncated, or refused with a 400 when truncation is off.
TEXT_MAX_TOKENS = env_int("MODELYARD_TEXT_MAX_TOKENS", 512, minimum=8)
TEXT_TRUNCATE = env_bool("MODELYARD_TEXT_TRUNCATE", True)
# Texts in one request: each becomes up to TEXT_MAX_TOKENS ids in every token input (1024 x 512 x 3 int64 = 12 MiB).
TEXT_MAX_TEXTS = env_int("MODELYARD_TEXT_MAX_TEXTS", 1024, minimum=1)
GRPC_MAX_MESSAGE_BYTES = env_int("MODELYARD_GRPC_MAX_MESSAGE_BYTES", V2_MAX_BODY_BYTES, minimum=1024)
# Requests of one ModelStreamInfer stream in flight at once; the client's further requests wait (flow control).
GRPC_STREAM_CONCURRENCY = env_int("MODELYARD_GRPC_STREAM_CONCURRENCY", 64, minimum=1)
# TLS of `modelyard serve`, HTTP and gRPC alike (PEM files; `serve --ssl-certfile/--ssl-keyfile/--ssl-ca-certs`
# set them, and serve checks them before it starts: modelyard/tls.py). With SSL_CA_CERTS every caller needs a
# client certificate signed by one of those CAs. Paths, read as serve reads them (no NAME_FILE variant).
SSL_CERTFILE = os.environ.get("MODELYARD_SSL_CERTFILE", "")
SSL_KEYFILE = os.environ.get("MODELYARD_SSL_KEYFILE", "")
SSL_CA_CERTS = os.environ.get("MODELYARD_SSL_CA_CERTS", "")
RECONCILE_POLL_SECONDS = env_float("MODELYARD_RECONCILE_POLL_SECONDS", 5.0, minimum=0.05)
FLEET_HEARTBEAT_SECONDS = env_float("MODELYARD_FLEET_HEARTBEAT_SECONDS", 5.0, minimum=0.05)
# An inference process that went offline without a clean stop is named as lagging by ?wait= until
# it has been silent this long (a clean stop leaves the fleet at once).
FLEET_FORGET_SECONDS = env_float("MODELYARD_FLEET_FORGET_SECONDS", 3600.0, minimum=0)
CACHE_DIR = Path(env_str("MODELYARD_CACHE_DIR") or DATA_DIR / "cache")
CACHE_MAX_BYTES = env_int("MODELYARD_CACHE_MAX_BYTES", 20 * 1024**3, minimum=1)
WORKER_ID = env_str("MODELYARD_WORKER_ID") or ""
DRAIN_TIMEOUT_SECONDS = env_float("MODELYARD_DRAIN_TIMEOUT_SECONDS", 30.0, minimum=0)
# Once a server has started: freeze its start-up objects out of the garbage collector's scans, and
# collect the oldest generation ten times less often (modelyard/gc_tuning.py).
GC_TUNING = env_bool("MODELYARD_GC_TUNING", True)
# At most this many glibc malloc arenas in a server process and its workers (modelyard/malloc_arenas.py):
# an upload's threads then share their free memory instead of each keeping its own. 0: glibc's default.
MALLOC_ARENA_MAX = env_int("MODELYARD_MALLOC_ARENA_MAX", 2, minimum=0)
# Shadow traffic (inference/shadow.py): at most this many sampled requests wait to be mirrored to a
# candidate in one inference process; more are dropped and counted, never queued behind real work.
SHADOW_QUEUE_SIZE = env_int("MODELYARD_SHADOW_QUEUE_SIZE", 16, minimum=1)
# The most time a process's shadows may run, as a share of the time the shadowed aliases' primaries
# spent answering there; past it, sampled requests are dropped (counted as "budget").
SHADOW_MAX_COST = env_float("MODELYARD_SHADOW_MAX_COST", 0.03, minimum=0.0001)

# The Celery app becomes the current one in every process that loads these settings, so that the
# registry's tasks queue to it (the package root imports nothing, for the sake of modelyard.client).
from modelyard.celery import app as celery_app  # noqa: E402, F401
