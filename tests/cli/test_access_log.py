"""``modelyard serve``'s access log: a set-password link's token never reaches it."""

from __future__ import annotations

import urllib.request

from tests.support.embedded import EmbeddedServer, embedded_env, modelyard

LINK = """
from django.contrib.auth import get_user_model
from registry.access import services
from registry.audit.chain import Actor
ada = get_user_model().objects.get(username="ada")
print(*services.user_password_link(username="tia", actor=Actor(user=ada)))
"""


def test_a_set_password_links_token_is_hidden_in_the_access_log(tmp_path):
    env = embedded_env(tmp_path / "data")
    for argv in (["ada", "--role", "admin"], ["tia"]):
        assert modelyard(env, "createtoken", "--create-user", *argv).returncode == 0
    made = modelyard(env, "manage", "shell", "-c", LINK)
    assert made.returncode == 0, made.stderr
    uid, token = made.stdout.strip().splitlines()[-1].split()
    server = EmbeddedServer(env, tmp_path / "serve.log", args=("--log-level", "info"))
    try:
        server.wait_ready()
        # The link as its holder opens it: Django moves the token into the session and redirects.
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with browser.open(f"{server.url}/accounts/reset/{uid}/{token}/", timeout=30) as page:
            assert page.status == 200 and page.url.endswith(f"/accounts/reset/{uid}/set-password/")
            assert b"new_password1" in page.read()
    finally:
        server.stop()
    log = server.log()
    assert f'"GET /accounts/reset/{uid}/[hidden]/ HTTP/1.1" 302' in log, log
    assert f'"GET /accounts/reset/{uid}/set-password/ HTTP/1.1" 200' in log
    assert token not in log
