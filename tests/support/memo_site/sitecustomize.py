"""Run at start-up by the servers the tests start, whose ``PYTHONPATH`` names this folder.

Only :func:`tests.support.validation_memo.in_servers` names it, together with the run's shared memo (and
a process the server starts inherits both). Validation in this process goes through the memo: the first
validation of each distinct bundle in the whole run still runs for real, in the sandbox; a server that
validates the same bytes under the same limits later reads that result.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# By its file, so that the folder above (the checkout's tests) never joins the server's sys.path.
_spec = importlib.util.spec_from_file_location(
    "_modelyard_test_validation_memo", Path(__file__).resolve().parent.parent / "validation_memo.py"
)
assert _spec is not None and _spec.loader is not None
_memo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_memo)
_memo.install_in_this_process()
