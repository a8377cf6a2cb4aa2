"""How the suite is spread over pytest-xdist workers (``--dist loadgroup``, see ``make suite``).

Most tests share nothing but the machine: each worker has its own test database (pytest-django adds
the worker's name), its own moto server, artifact folders and free ports. A few share something
outside the process that a test on another worker would disturb; those run on one worker, one after
another, by an ``xdist_group``. The slow tests go first so the run does not end waiting for them.
"""

from __future__ import annotations

import pytest

MODULE = "module"  # each module under the prefix is a group of its own

# Module path prefix -> the group its tests run in (or MODULE), and why.
GROUPS: dict[str, str] = {
    # One Redis database (MODELYARD_TEST_REDIS_DB) and RabbitMQ's default vhost: their "celery" queues
    # are counted, emptied and consumed by these tests.
    "tests/test_health.py": "broker",
    "tests/observability/test_registry_metrics.py": "broker",
    "tests/observability/test_live_metrics.py": "broker",
    "tests/registry/test_celery_worker.py": "broker",
    "tests/registry/test_throttling.py": "broker",
    "tests/registry/test_alias_notify.py": "broker",
    # Network namespaces and veth pairs: several hosts on one machine.
    "tests/inference/test_fleet_hosts.py": "netns",
    # One Triton-compatible server for the whole package (tests/compat/conftest.py, scope="package"),
    # started once instead of once per worker; later tests read what earlier ones pushed.
    "tests/compat/": "compat",
    # A server, browser or world made once per module, whose tests build on each other's state.
    "tests/cli/": MODULE,
    "tests/client/": MODULE,
    "tests/e2e/": MODULE,
    "tests/registry/test_required_fields_api.py": MODULE,
    "tests/registry/test_api_fuzz.py": MODULE,
    "tests/registry/test_required_fields_ui.py": MODULE,
}


def group_of(nodeid: str) -> str | None:
    path = nodeid.split("::", 1)[0]
    for prefix, group in GROUPS.items():
        if path.startswith(prefix):
            return path if group == MODULE else group
    return None


def mark_groups(items: list[pytest.Item]) -> None:
    """Mark each item with its group (before pytest-xdist turns the marks into node id suffixes)."""
    for item in items:
        if group := group_of(item.nodeid):
            item.add_marker(pytest.mark.xdist_group(group))


class SuiteOrder:
    """The slow tests, then the grouped ones, then the rest, each in collection order (a stable sort).

    pytest-xdist hands out work in this order, a group or an ungrouped module at a time. A group runs on one
    worker from start to end (the CLI's modules and the compat package take minutes each), so the long
    units start first and the run ends on short modules spread over every worker. A plugin of its own
    (tests/conftest.py registers it) so that it sorts last, after pytest-django's ordering by kind of
    database use, and before xdist sends the list to the scheduler.
    """

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items.sort(key=lambda item: (item.get_closest_marker("slow") is None, group_of(item.nodeid) is None))


def check_groups_arrived(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-xdist passes a test's group to the scheduler as an ``@group`` suffix of its node id. When a
    pytest release stops that from working, the groups would be ignored in silence: stop the run instead."""
    if not config.getoption("loadgroup", default=False):
        return  # not an xdist worker with --dist loadgroup
    lost = [item.nodeid for item in items if group_of(item.nodeid) and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(
            f"--dist loadgroup lost the xdist_group of {len(lost)} tests (first: {lost[0]}); "
            "this pytest and pytest-xdist do not pass groups to the scheduler"
        )
