"""The ``modelyard`` command line.

Operator commands (serve, worker, beat, createtoken, revoketoken, rotatetoken, createserviceaccount,
demo, manage) run the server's code here; the user commands (login, push, promote, pull, infer, audit, ...) are in
``modelyard.client.commands`` and talk to a server over HTTP, so they never load Django.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import re
import shutil
import sys
import tempfile
from typing import Any


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")
    import django

    django.setup()


def _migrate() -> None:
    """Apply migrations while holding an exclusive lock on the data folder.

    ``serve``, ``createtoken`` and ``demo`` all migrate the embedded database on a first start, and
    a newcomer starts them together: two migrators on one fresh database each try to create the
    same tables, and one crashes (``table ... already exists``). The second waits here, then finds
    nothing left to apply. The kernel drops the lock if its holder dies.
    """
    import fcntl

    from django.conf import settings
    from django.core.management import call_command

    settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
    with (settings.DATA_DIR / "migrate.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        call_command("migrate", interactive=False, verbosity=0)


def _setup_database() -> None:
    """Django set up for a command that uses the database: the embedded one is migrated first (a first start)."""
    _setup()
    from django.conf import settings

    if settings.EMBEDDED_DATABASE:
        _migrate()


def _token_by_prefix(command: str, prefix: str) -> Any:
    """The API token with ``prefix`` (its user loaded), or None, having said so on stderr."""
    from registry.models import ApiToken

    token = ApiToken.objects.select_related("user").filter(prefix=prefix).first()
    if token is None:
        print(f"modelyard {command}: no API token with prefix '{prefix}'", file=sys.stderr)
    return token


def _serve_tls(args: argparse.Namespace) -> Any:
    """serve's TLS files (options, else MODELYARD_SSL_*), checked, and handed on to its worker processes."""
    from modelyard import tls

    values, names = [], []
    for attribute, (option, variable) in (
        ("ssl_certfile", tls.CERTFILE),
        ("ssl_keyfile", tls.KEYFILE),
        ("ssl_ca_certs", tls.CA_CERTS),
    ):
        given, inherited = getattr(args, attribute), os.environ.get(variable)
        values.append(given or inherited or None)
        names.append(variable if inherited and not given else option)
    server = tls.server_tls(*values, names=(names[0], names[1], names[2]))
    for (_, variable), value in zip((tls.CERTFILE, tls.KEYFILE, tls.CA_CERTS), values, strict=True):
        if value:
            os.environ[variable] = os.path.abspath(value)  # the worker processes read them too (gRPC)
        else:
            os.environ.pop(variable, None)
    return server


def serve(args: argparse.Namespace) -> int:
    from modelyard.tls import TLSConfigError

    try:
        args.tls = _serve_tls(args)
    except TLSConfigError as exc:
        print(f"modelyard serve: {exc}", file=sys.stderr)
        return 2
    os.environ["MODELYARD_ROLE"] = args.role
    # gRPC listens where HTTP does. Several worker processes share its port through SO_REUSEPORT (each
    # serves it, the kernel spreads connections); one process alone binds it exclusively, so a port
    # already taken stops the start instead of being silently shared with another server.
    if args.grpc_port is not None:
        os.environ["MODELYARD_GRPC_PORT"] = str(args.grpc_port)
    elif not os.environ.get("MODELYARD_GRPC_PORT") and 0 < args.port < 65535:
        # Unless told otherwise, gRPC follows HTTP to the next port (8000 and 8001), so that a second server
        # started on another --port does not fail on the first one's gRPC port.
        os.environ["MODELYARD_GRPC_PORT"] = str(args.port + 1)
    os.environ["MODELYARD_GRPC_HOST"] = args.host
    os.environ["MODELYARD_GRPC_REUSE_PORT"] = "true" if args.workers > 1 else "false"
    # Before anything imports prometheus_client (which reads it once, at import): every process of
    # this server keeps its metrics in this run's folder, so a scrape of any one of them gives the
    # sums over all (modelyard/metrics.py). Always a new folder: an old run's files would add up too.
    folder = tempfile.mkdtemp(prefix="modelyard-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    try:
        return _serve(args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# A set-password link (/accounts/reset/<uid>/<token>/) is a credential until it is used. Django moves
# the token into the session at once (the next address ends in set-password/), but uvicorn's access
# log would keep the first request's path, token and all, in every log store it reaches.
SET_PASSWORD_TOKEN = re.compile(r"(/accounts/reset/[^/?#\s]+/)(?!set-password/)[^/?#\s]+")


class AccessLogRedaction(logging.Filter):
    """Hides the token of a set-password link in uvicorn's access log lines (their path is one of the args)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                SET_PASSWORD_TOKEN.sub(r"\1[hidden]", arg) if isinstance(arg, str) else arg for arg in record.args
            )
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's own logging set-up, with the access log's redaction (named, so worker processes import it)."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact"] = {"()": "modelyard.cli.AccessLogRedaction"}
    config["loggers"]["uvicorn.access"]["filters"] = ["redact"]
    return config


def _serve(args: argparse.Namespace) -> int:
    _setup()
    from django.conf import settings

    from modelyard import malloc_arenas

    malloc_arenas.limit(settings.MALLOC_ARENA_MAX)  # before the embedded scheduler and uvicorn start threads
    if settings.EMBEDDED_DATABASE or args.migrate:
        _migrate()
    import uvicorn

    from modelyard import embedded

    if embedded.runs_in(args.role):
        embedded.EmbeddedScheduler().start()
    tls = args.tls
    over_tls = " over TLS" if tls else ""
    grpc = f", gRPC{over_tls} on {args.host}:{settings.GRPC_PORT}" if settings.GRPC_PORT and args.role != "web" else ""
    scheme = "https" if tls else "http"
    mutual = "  (client certificates required)" if tls and tls.client_certificates_required else ""
    print(
        f"Modelyard ({args.role}) on {scheme}://{args.host}:{args.port}/{grpc}  (API docs: /api/docs/){mutual}",
        flush=True,
    )
    ssl_options: dict[str, Any] = {}
    if tls:
        import ssl

        ssl_options = {"ssl_certfile": tls.certfile, "ssl_keyfile": tls.keyfile}
        if tls.ca_certs:
            ssl_options.update(ssl_ca_certs=tls.ca_certs, ssl_cert_reqs=ssl.CERT_REQUIRED)
    uvicorn.run(
        "modelyard.asgi:application",
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        # Which forwarded headers to believe is decided per request from MODELYARD_TRUSTED_PROXIES
        # (registry.access.clients.client_address). uvicorn's own handling would believe any X-Forwarded-For
        # sent from 127.0.0.1 and hide the real peer, which that decision needs.
        proxy_headers=False,
        # uvicorn formats each access line's fields before its logger drops them: below INFO, skip that.
        access_log=args.log_level.lower() in ("info", "debug", "trace"),
        log_config=log_config(),
        lifespan="on",
        **ssl_options,
    )
    return 0


def worker(args: argparse.Namespace) -> int:
    _setup()
    from modelyard.celery import app

    argv = ["worker", "--loglevel", args.log_level, *args.celery_args]
    app.worker_main(argv)
    return 0


def beat(args: argparse.Namespace) -> int:
    _setup()
    from django.conf import settings

    from modelyard.celery import app

    # Celery's default is ./celerybeat-schedule, in whatever folder beat was started from: a
    # read-only image or a folder that the next start does not share. The data folder is writable.
    schedule = args.schedule or str(settings.DATA_DIR / "celerybeat-schedule")
    app.start(["beat", "--loglevel", args.log_level, "--schedule", schedule])
    return 0


def sign_versions(args: argparse.Namespace) -> int:
    """Sign the ready versions that have no registry signature (validated before signing existed)."""
    _setup_database()
    from django.conf import settings

    from registry.provenance.services import versions_sign_unsigned

    signed = versions_sign_unsigned()
    for version in signed:
        print(f"signed {version.model.name} v{version.version}")
    print(f"Signed {len(signed)} version(s) with key {settings.SIGNING_KEY_SOURCE}.", file=sys.stderr)
    return 0


def createtoken(args: argparse.Namespace) -> int:
    _setup_database()
    from datetime import timedelta

    from registry.access import services
    from registry.errors import RegistryError

    try:
        token, raw = services.token_create(
            username=args.username,
            create_user=args.create_user,
            roles=args.role,
            name=args.name,
            expires_in=timedelta(days=args.expires_days) if args.expires_days else None,
            only_roles=args.only_role or None,
            model_patterns=args.only_model,
            priority=args.priority,
        )
    except RegistryError as exc:
        print(f"modelyard createtoken: {exc.message}", file=sys.stderr)
        return 2
    roles = ", ".join(args.role) or "no new roles"
    expiry = f", expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else ""
    print(
        f"Created token {token.prefix} for {args.username} ({roles}{expiry}; {_token_scope(token)}). "
        "It is shown only once:",
        file=sys.stderr,
    )
    print(raw)  # the last stdout line, so scripts can take it with `tail -1`
    return 0


def _token_scope(token: Any) -> str:
    roles = "carries roles " + ", ".join(token.roles) if token.roles is not None else "carries all its user's roles"
    models = "models " + ", ".join(token.model_patterns) if token.model_patterns else "every model"
    priority = f", priority class {token.priority}" if token.priority != "normal" else ""
    return f"{roles}, on {models}{priority}"


def rotatetoken(args: argparse.Namespace) -> int:
    _setup_database()
    from datetime import timedelta

    from registry.access import services
    from registry.audit.chain import SYSTEM
    from registry.errors import RegistryError

    token = _token_by_prefix("rotatetoken", args.prefix)
    if token is None:
        return 1
    try:
        new, raw = services.token_rotate(
            token=token,
            overlap=timedelta(hours=args.overlap_hours),
            expires_in=timedelta(days=args.expires_days) if args.expires_days else None,
            actor=SYSTEM,
        )
    except RegistryError as exc:
        print(f"modelyard rotatetoken: {exc.message}", file=sys.stderr)
        return 2
    token.refresh_from_db()
    assert token.expires_at is not None
    expiry = f", expires {new.expires_at:%Y-%m-%d %H:%M} UTC" if new.expires_at else ""
    print(
        f"Rotated token {token.prefix} of {token.user.get_username()}: it works until "
        f"{token.expires_at:%Y-%m-%d %H:%M} UTC. New token {new.prefix} ({_token_scope(new)}{expiry}) "
        "is shown only once:",
        file=sys.stderr,
    )
    print(raw)
    return 0


def createserviceaccount(args: argparse.Namespace) -> int:
    _setup_database()
    from registry.access import services
    from registry.audit.chain import SYSTEM
    from registry.errors import RegistryError

    try:
        account = services.service_account_create(
            username=args.username, owner=args.owner, roles=args.role, description=args.description, actor=SYSTEM
        )
    except RegistryError as exc:
        print(f"modelyard createserviceaccount: {exc.message}", file=sys.stderr)
        return 2
    roles = ", ".join(sorted(set(args.role))) or "no roles"
    print(
        f"Created service account {account.user.get_username()} ({roles}), owned by {args.owner}. It cannot sign "
        f"in; give it a token: modelyard createtoken {account.user.get_username()} --only-role inference "
        "--expires-days 90"
    )
    return 0


def revoketoken(args: argparse.Namespace) -> int:
    _setup_database()
    from registry.access import services
    from registry.audit.chain import SYSTEM

    token = _token_by_prefix("revoketoken", args.prefix)
    if token is None:
        return 1
    owner = token.user.get_username()
    if token.revoked_at is not None:
        print(f"Token {token.prefix} of {owner} was already revoked at {token.revoked_at:%Y-%m-%d %H:%M} UTC.")
        return 0
    services.token_revoke(token=token, actor=SYSTEM)
    print(f"Revoked token {token.prefix} of {owner}.")
    return 0


# The roles (registry.models.Role), listed here so that parsing the command line needs no Django.
ROLES = ["viewer", "maintainer", "approver", "auditor", "inference", "admin"]
# A token's priority classes (registry.models.PriorityClass), for the same reason.
PRIORITY_CLASSES = ["high", "normal", "low"]


def _hours(text: str) -> int:
    try:
        hours = int(text)
    except ValueError:
        hours = -1
    if not 0 <= hours <= 24 * 90:
        raise argparse.ArgumentTypeError(f"expected a whole number of hours from 0 to {24 * 90}, got {text!r}")
    return hours


def _positive_days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        days = 0
    if days < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of days of at least 1, got {text!r}")
    return days


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number (0 turns gRPC off), got {text!r}")
    return port


DEMO_MODEL = "demo"


def demo(args: argparse.Namespace) -> int:
    """Register a generated model (y = 2x + 1), serve it on ``production``, print a curl and a tritonclient example.

    Talks only to the database and storage, so it works beside a running ``modelyard serve``; run
    twice, it finds its user, token, model and version again and changes nothing.
    """
    _setup()
    import hashlib
    import logging
    import time

    import numpy as np
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from onnx import TensorProto, helper, numpy_helper

    from registry import promotions, services, serving
    from registry.access import services as access
    from registry.access.auth import authenticate_token
    from registry.audit.chain import Actor
    from registry.errors import Conflict
    from registry.models import (
        PRODUCTION,
        Alias,
        PromotionRequest,
        PromotionState,
        RegisteredModel,
        Role,
    )
    from registry.models import VersionStatus as Status
    from registry.uploads import LocalUpload, version_upload

    _migrate()
    for noisy in ("celery", "kombu"):  # in-process validation logs every task; the newcomer needs none of it
        logging.getLogger(noisy).setLevel(logging.ERROR)

    # The same bytes on every run, so a second run finds its version by sha256.
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["twice"]), helper.make_node("Add", ["twice", "one"], ["y"])],
        "demo",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("two", 2), ("one", 1))],
    )
    opsets = [helper.make_opsetid("", 17)]
    data = helper.make_model(
        graph, ir_version=10, opset_imports=opsets, producer_name="modelyard-demo"
    ).SerializeToString()
    sha256 = hashlib.sha256(data).hexdigest()

    # An admin token for user "demo", kept in the data folder so that a second run prints the same one.
    token_file = settings.DATA_DIR / "demo-token"
    raw = token_file.read_text().strip() if token_file.exists() else ""
    token = authenticate_token(raw) if raw else None
    if token is None:
        token, raw = access.token_create(username="demo", create_user=True, roles=[Role.ADMIN], name="modelyard demo")
        token_file.write_text(raw + "\n")
        token_file.chmod(0o600)
    owner = Actor(user=token.user, token_id=token.pk, label="demo")
    approver_user = get_user_model().objects.filter(username="demo-approver").first()
    if approver_user is None:  # production is protected: a second person approves the promotion
        unused, _ = access.token_create(username="demo-approver", create_user=True, roles=[Role.APPROVER])
        access.token_revoke(token=unused, actor=owner)
        approver_user = unused.user
    approver = Actor(user=approver_user, label="demo-approver")

    model = RegisteredModel.objects.filter(name=DEMO_MODEL).first() or services.model_create(
        name=DEMO_MODEL, description="y = 2x + 1, registered by `modelyard demo`", tags=["demo"], actor=owner
    )
    version = model.versions.filter(sha256=sha256).exclude(status=Status.FAILED).order_by("-version").first()
    if version is None:
        upload = LocalUpload([("model.onnx", data)], description="modelyard demo")
        version = version_upload(model=model, source=upload, actor=owner)
    deadline = time.monotonic() + 120  # embedded mode validates at once; with a broker a worker does
    while version.status in (Status.PENDING, Status.VALIDATING) and time.monotonic() < deadline:
        time.sleep(0.5)
        version.refresh_from_db()
    if version.status != Status.READY:
        hint = " (is a worker running? `modelyard worker`)" if version.status == Status.PENDING else ""
        print(f"modelyard demo: version {version.version} is {version.status}{hint}: {version.errors}", file=sys.stderr)
        return 1

    alias = Alias.objects.get(model=model, name=PRODUCTION)
    if alias.version_id != version.pk:
        try:
            pending = PromotionRequest.objects.filter(
                alias=alias, version=version, state=PromotionState.PENDING
            ).first()
            if pending is None:
                pending = promotions.alias_set(
                    model=model, alias_name=alias.name, version_number=version.version, actor=owner, reason="demo"
                ).promotion
            if pending is not None:
                promotions.promotion_approve(promotion_id=pending.pk, actor=approver, reason="demo")
        except Conflict as exc:
            print(f"modelyard demo: cannot promote version {version.version}: {exc}", file=sys.stderr)
            return 1
    print(f"Model '{model.name}' version {version.version} (y = 2x + 1) is on the production alias.")

    # A running inference server picks the alias up within its poll interval; wait for its heartbeat to say so.
    if serving.fleet_list(online_only=True):
        behind = serving.fleet_wait(
            model=model.name,
            alias=alias.name,
            version=version.version,
            timeout=max(30.0, 3 * settings.RECONCILE_POLL_SECONDS),
        )
        print(
            "The running inference server has loaded it."
            if not behind
            else "The inference server has not loaded it yet."
        )
    else:
        print("No inference server is running: start one in another terminal with `make run` (or `modelyard serve`).")

    url = args.url.rstrip("/")
    host = url.split("://", 1)[-1]
    body = '{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]}'
    print(f"\nAPI token for user 'demo' (admin): {raw}\n")
    print("Try it with curl (JSON tensors):\n")
    print(f"curl -s -X POST {url}/v2/models/{model.name}/infer -H 'Authorization: Bearer {raw}' -d '{body}'")
    answer = '"outputs":[{"name":"y","datatype":"FP32","shape":[1,4],"data":[3.0,5.0,7.0,9.0]}]'
    print(f'\n  -> {{"model_name":"{model.name}","model_version":"{version.version}",{answer}}}')
    print("\nOr with tritonclient (pip install 'tritonclient[http]'; binary tensors):\n")
    print(
        f"""import numpy as np
import tritonclient.http as httpclient

client = httpclient.InferenceServerClient("{host}")
x = np.array([[1, 2, 3, 4]], dtype=np.float32)
inputs = [httpclient.InferInput("x", list(x.shape), "FP32")]
inputs[0].set_data_from_numpy(x)
result = client.infer("{model.name}", inputs, headers={{"Authorization": "Bearer {raw}"}})
print(result.as_numpy("y"))  # [[3. 5. 7. 9.]]"""
    )
    return 0


def manage(args: argparse.Namespace) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["modelyard manage", *args.manage_args])
    return 0


# The commands above, which run the server's code. Their command lines are parsed without the user commands,
# whose module (with the HTTP client under it) takes longer to import than most operator commands take to run.
OPERATOR_COMMANDS = frozenset(
    {
        "serve",
        "worker",
        "beat",
        "createtoken",
        "rotatetoken",
        "createserviceaccount",
        "revoketoken",
        "sign-versions",
        "demo",
        "manage",
    }
)


def build_parser(*, user_commands: bool = True) -> argparse.ArgumentParser:
    """``modelyard``'s parser: the operator commands, and the user commands unless ``user_commands`` is false."""
    parser = argparse.ArgumentParser(prog="modelyard", description="Modelyard: ONNX model registry and serving")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the web and/or inference server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--role", choices=["all", "web", "inference"], default="all")
    p.add_argument("--workers", type=int, default=1, help="server processes")
    p.add_argument(
        "--grpc-port",
        type=_port,
        default=None,
        help="gRPC port of the inference role (default $MODELYARD_GRPC_PORT, else --port + 1; 0 turns gRPC off)",
    )
    p.add_argument("--migrate", action="store_true", help="apply migrations first (always in embedded mode)")
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--ssl-certfile",
        default=None,
        metavar="CERT.pem",
        help="serve HTTPS and gRPC over TLS with this certificate (chain) (default $MODELYARD_SSL_CERTFILE)",
    )
    p.add_argument(
        "--ssl-keyfile", default=None, metavar="KEY.pem", help="its private key (default $MODELYARD_SSL_KEYFILE)"
    )
    p.add_argument(
        "--ssl-ca-certs",
        default=None,
        metavar="CA.pem",
        help="require client certificates signed by these CAs from every caller (default $MODELYARD_SSL_CA_CERTS)",
    )
    p.set_defaults(func=serve)

    p = sub.add_parser("worker", help="run a Celery worker (extra arguments go to Celery)")
    p.add_argument("--log-level", default="info")
    p.add_argument("celery_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=worker)

    p = sub.add_parser("beat", help="run Celery beat for periodic sweeps and garbage collection")
    p.add_argument("--log-level", default="info")
    p.add_argument("--schedule", default=None, help="state file (default: $MODELYARD_DATA_DIR/celerybeat-schedule)")
    p.set_defaults(func=beat)

    p = sub.add_parser("createtoken", help="create an API token; prints it as the last line")
    p.add_argument("username")
    p.add_argument("--create-user", action="store_true")
    p.add_argument("--role", action="append", default=[], help="grant a role (repeatable)")
    p.add_argument("--name", default="", help="a label for the token")
    p.add_argument("--expires-days", type=_positive_days, default=None, help="the token stops working after N days")
    p.add_argument(
        "--only-role",
        action="append",
        default=[],
        choices=ROLES,
        help="the token carries only this of its user's roles (repeatable; default: all of them)",
    )
    p.add_argument(
        "--only-model",
        action="append",
        default=[],
        metavar="PATTERN",
        help="the token reaches only models matching this fnmatch pattern, e.g. 'fraud-*' (repeatable)",
    )
    p.add_argument(
        "--priority",
        default="normal",
        choices=PRIORITY_CLASSES,
        help="its requests' class on /v2 and gRPC: a higher class is served first when the queue is busy "
        "(default normal)",
    )
    p.set_defaults(func=createtoken)

    p = sub.add_parser(
        "rotatetoken", help="replace an API token by a new one with the same roles and models; prints it last"
    )
    p.add_argument("prefix")
    p.add_argument(
        "--overlap-hours",
        type=_hours,
        default=24,
        help="the old token keeps working this many hours, so its users can switch (default 24; 0: stops now)",
    )
    p.add_argument(
        "--expires-days", type=_positive_days, default=None, help="the new token's lifetime (default: the old one's)"
    )
    p.set_defaults(func=rotatetoken)

    p = sub.add_parser(
        "createserviceaccount", help="create a user for a pipeline: it cannot sign in, only use API tokens"
    )
    p.add_argument("username")
    p.add_argument("--owner", required=True, help="the admin who answers for it")
    p.add_argument("--role", action="append", default=[], choices=ROLES, help="grant a role (repeatable)")
    p.add_argument("--description", default="", help="what it is for")
    p.set_defaults(func=createserviceaccount)

    p = sub.add_parser("revoketoken", help="revoke an API token by its prefix (the part after my_)")
    p.add_argument("prefix")
    p.set_defaults(func=revoketoken)

    p = sub.add_parser("sign-versions", help="sign the ready versions that have no registry signature yet")
    p.set_defaults(func=sign_versions)

    p = sub.add_parser("demo", help="register and serve a small model, then print curl and tritonclient examples")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="where `modelyard serve` listens")
    p.set_defaults(func=demo)

    p = sub.add_parser("manage", help="run a Django management command")
    p.add_argument("manage_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=manage)

    if user_commands:
        from modelyard.client.commands import add_commands

        add_commands(sub)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    # ``modelyard`` has no options of its own before the command (only --help, which lists every command).
    parser = build_parser(user_commands=not (argv and argv[0] in OPERATOR_COMMANDS))
    args, extra = parser.parse_known_args(argv)
    if args.command == "worker":
        # Everything modelyard does not know (--pool solo, -Q ...) goes to Celery as it is.
        args.celery_args = [*extra, *args.celery_args]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
