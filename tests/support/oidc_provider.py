"""A real OpenID Provider on loopback for the sign-in tests: node's oidc-provider (tests/oidc_provider/provider.mjs).

``make test`` installs it from its npm lock (``npm ci``). Its accounts and their groups live in a
JSON state file that it reads at every request, so a test changes someone's groups (or makes the
token endpoint hand out a token for another audience, or an expired one) while it runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from modelyard.processes import kill_group
from tests.support.polling import eventually
from tests.support.processes import free_port

PROVIDER_DIR = Path(__file__).resolve().parents[1] / "oidc_provider"
CLIENT_ID = "modelyard-tests"
CLIENT_SECRET = "a-client-secret-for-the-tests-only"
OTHER_CLIENT_ID = "another-app"


class OidcProvider:
    """``node provider.mjs PORT STATE`` in a process group of its own; one client, whose redirect URI is given."""

    def __init__(self, folder: Path, redirect_uri: str, *, port: int | None = None) -> None:
        if shutil.which("node") is None:
            pytest.fail("the OpenID sign-in tests need Node.js (node) to run the provider", pytrace=False)
        if not (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir():
            pytest.fail(
                "the test OpenID provider is not installed: run `make tests/oidc_provider/node_modules/.installed` "
                "(npm ci --prefix tests/oidc_provider)",
                pytrace=False,
            )
        self.port = port or free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.state_path = folder / "oidc-state.json"
        self.log_path = folder / "oidc-provider.log"
        self.state: dict[str, Any] = {
            "clients": [
                {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "redirect_uris": [redirect_uri]},
                {
                    "client_id": OTHER_CLIENT_ID,
                    "client_secret": CLIENT_SECRET + "-other",
                    "redirect_uris": [redirect_uri],
                },
            ],
            "accounts": {},
            "tamper": None,
        }
        self._write()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                ["node", str(PROVIDER_DIR / "provider.mjs"), str(self.port), str(self.state_path)],
                cwd=PROVIDER_DIR,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        eventually(self._ready, timeout=30, interval=0.1, what=lambda: f"OpenID provider not ready:\n{self.log()}")

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the OpenID provider exited with {self.process.returncode}:\n{self.log()}")
        return f"ready {self.issuer}" in self.log()

    def _write(self) -> None:
        temporary = self.state_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.state))
        temporary.replace(self.state_path)  # the provider never reads half a file

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def set_groups(self, subject: str, *groups: str) -> None:
        self.state["accounts"][subject] = {"groups": list(groups), "email": f"{subject}@example.test"}
        self._write()

    def tamper(self, **how: Any) -> None:
        """The next ID tokens re-signed with the provider's key: ``aud="..."`` or ``expired=True``; none to stop."""
        self.state["tamper"] = how or None
        self._write()

    def stop(self) -> None:
        kill_group(self.process)
