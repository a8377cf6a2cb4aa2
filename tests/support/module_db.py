"""Registry state made once for a test module and undone after its last test, as Django's ``setUpTestData`` keeps it.

The state lives in an outer transaction that is never committed. Each test still runs in its own
savepoint inside it (pytest-django's ``db``), so what one test changes is rolled back before the
next, while the people, models and validated versions are made once per module instead of once
per test. Services open durable blocks inside it as they do inside a ``TestCase``'s class-wide
transaction, which is what this is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction


@contextmanager
def kept_for_module(django_db_blocker: Any) -> Iterator[None]:
    """Open the module's transaction; whatever is written until the block ends is rolled back then."""
    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer._from_testcase = True  # type: ignore[attr-defined]  # durable services may nest in it, as in a TestCase
        outer.__enter__()
    try:
        yield
    finally:
        with django_db_blocker.unblock():
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)
