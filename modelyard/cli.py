"""The ``modelyard`` command line: serve, worker, createtoken, and any management command via manage."""

from __future__ import annotations

import argparse
import os
import sys


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")
    import django

    django.setup()


def serve(args: argparse.Namespace) -> int:
    os.environ["MODELYARD_ROLE"] = args.role
    _setup()
    from django.conf import settings
    from django.core.management import call_command

    if settings.EMBEDDED_DATABASE or args.migrate:
        call_command("migrate", interactive=False, verbosity=0)
    import uvicorn

    if settings.BROKER_URL is None:
        from modelyard.embedded import EmbeddedScheduler

        EmbeddedScheduler().start()
    print(f"Modelyard ({args.role}) on http://{args.host}:{args.port}/  (API docs: /api/docs/)", flush=True)
    uvicorn.run(
        "modelyard.asgi:application",
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        proxy_headers=True,
        lifespan="on",
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
    from modelyard.celery import app

    app.start(["beat", "--loglevel", args.log_level])
    return 0


def createtoken(args: argparse.Namespace) -> int:
    _setup()
    from django.conf import settings
    from django.core.management import call_command

    if settings.EMBEDDED_DATABASE:
        call_command("migrate", interactive=False, verbosity=0)
    from registry import services

    try:
        token, raw = services.token_create(
            username=args.username, create_user=args.create_user, roles=args.role, name=args.name
        )
    except ValueError as exc:
        print(f"modelyard createtoken: {exc}", file=sys.stderr)
        return 2
    roles = ", ".join(args.role) or "no new roles"
    print(f"Created token {token.prefix} for {args.username} ({roles}). It is shown only once:", file=sys.stderr)
    print(raw)
    return 0


def manage(args: argparse.Namespace) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["modelyard manage", *args.manage_args])
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelyard", description="Modelyard: ONNX model registry and serving")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the web and/or inference server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--role", choices=["all", "web", "inference"], default="all")
    p.add_argument("--workers", type=int, default=1, help="server processes")
    p.add_argument("--migrate", action="store_true", help="apply migrations first (always in embedded mode)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=serve)

    p = sub.add_parser("worker", help="run a Celery worker (extra arguments go to Celery)")
    p.add_argument("--log-level", default="info")
    p.add_argument("celery_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=worker)

    p = sub.add_parser("beat", help="run Celery beat for periodic sweeps and garbage collection")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=beat)

    p = sub.add_parser("createtoken", help="create an API token; prints it as the last line")
    p.add_argument("username")
    p.add_argument("--create-user", action="store_true")
    p.add_argument("--role", action="append", default=[], help="grant a role (repeatable)")
    p.add_argument("--name", default="", help="a label for the token")
    p.set_defaults(func=createtoken)

    p = sub.add_parser("manage", help="run a Django management command")
    p.add_argument("manage_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=manage)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
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
