"""The web UI in real Chromium against a real ``modelyard serve --role all``: the server, people, and screenshots.

The server is the production stack: uvicorn, the ASGI handler that streams uploads, whitenoise for
the static files, the Content-Security-Policy header, and the inference runtime serving ``/v2``. It
runs on the test database (pytest-django's, committed by transactional tests) and shares the
artifact folder with the test process, so registry state made here through the services is what it
serves.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from registry.access import services
from registry.audit.chain import SYSTEM, Actor
from tests.support.processes import ServeProcess, base_env, subprocess_database_url

PASSWORD = "correct horse battery staple"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 375, "height": 740}


class UiServer:
    """``modelyard serve --role all`` on a free port, with its own data folder and the shared artifact folder."""

    def __init__(self, folder: Path) -> None:
        self.storage = folder / "artifacts"
        self.storage.mkdir(parents=True, exist_ok=True)
        env = base_env(
            MODELYARD_DATABASE_URL=subprocess_database_url(),
            MODELYARD_STORAGE_URL=self.storage.as_uri(),
            MODELYARD_DATA_DIR=str(folder / "data"),
            MODELYARD_SECRET_KEY=secrets.token_urlsafe(48),
            MODELYARD_RECONCILE_POLL_SECONDS="0.5",
            MODELYARD_FLEET_HEARTBEAT_SECONDS="1",
            MODELYARD_WORKER_ID="e2e-inference",
            MODELYARD_PROVIDERS="cpu",
            MODELYARD_ORT_INTRA_OP_THREADS="1",
        )
        self.process = ServeProcess("ui-server", "all", env, folder / "serve.log")

    @property
    def url(self) -> str:
        return self.process.base

    def start(self) -> UiServer:
        self.process.wait_ready(timeout=120)
        return self

    def stop(self) -> None:
        self.process.kill()


def person(username: str, *roles: str) -> Actor:
    """A user with roles and a password the server can check, as a service's actor.

    The test settings hash with MD5 for speed, which the server does not accept; this password is
    PBKDF2 with few iterations, which the server upgrades at the first login.
    """
    token, _ = services.token_create(username=username, create_user=True, roles=list(roles), actor=SYSTEM)
    user = get_user_model().objects.get(pk=token.user_id)
    hasher = PBKDF2PasswordHasher()
    user.password = hasher.encode(PASSWORD, hasher.salt(), iterations=1000)
    user.save(update_fields=["password"])
    return Actor(user=user, label=username)


def login(browser: Any, base: str, username: str, **context: Any) -> Any:
    """A fresh browser context signed in as ``username`` through the login form; returns its page."""
    ctx = browser.new_context(viewport=LAPTOP, **context)
    ctx.set_default_timeout(20_000)
    page = ctx.new_page()
    watch_console(page)
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]:has-text('Log in')")
    page.wait_for_url(f"{base}/ui/")
    return page


def watch_console(page: Any) -> None:
    """Collect the page's console errors (a Content-Security-Policy violation is one) in ``page.errors``."""
    errors: list[str] = []
    page.errors = errors
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))


def csp_violations(page: Any) -> list[str]:
    return [text for text in page.errors if "Content Security Policy" in text or "Content-Security-Policy" in text]


def shoot(page: Any, name: str) -> Path:
    """A full-page screenshot under build/screenshots (git-ignored; CI keeps it as an artifact)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def csrf_token(page: Any) -> str:
    """The CSRF cookie of the page's context, for posting forms directly as its user would."""
    return next(cookie["value"] for cookie in page.context.cookies() if cookie["name"] == "csrftoken")
