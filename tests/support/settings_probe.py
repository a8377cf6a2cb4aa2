"""Settings read from the environment in a child process: what each case's variables make of them.

``modelyard.settings`` reads the environment once, at import; a child reloads it for each case, so a
test sees the settings a server would start with, or the ``ImproperlyConfigured`` that would stop it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

_PROBE = textwrap.dedent(
    """
    import importlib, os, sys
    from django.core.exceptions import ImproperlyConfigured
    import modelyard.settings
    shown = sys.argv[1:]
    for line in sys.stdin.read().splitlines():  # "NAME=value [NAME=value]" per case
        pairs = dict(item.split("=", 1) for item in line.split())
        os.environ.update(pairs)
        try:
            importlib.reload(modelyard.settings)
            print(" ".join(["ok", *(str(getattr(modelyard.settings, name)) for name in shown)]))
        except ImproperlyConfigured as exc:
            print(exc)
        for name in pairs:
            del os.environ[name]
    """
)


def settings_outcomes(data_dir: Path, cases: Iterable[str], shown: Iterable[str]) -> list[str]:
    """For each case (``NAME=value [NAME=value]``): ``ok`` and the ``shown`` settings' values, or the error.

    Only the case's variables and a data folder (``data_dir``) are set: no other ``MODELYARD_`` variable
    of this process reaches the child.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith(("MODELYARD_", "DJANGO_SETTINGS"))}
    env["MODELYARD_DATA_DIR"] = str(data_dir)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *shown],
        input="\n".join(cases),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.splitlines()
