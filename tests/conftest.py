"""Shared fixtures and the ``postgres`` marker's skip; the shared helpers are ``tests.support``."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.support import on_postgres

# The virtual clock fixture, as a site's conftest.py would list it. As a plugin
# name, not an import: helper processes import this module before Django is set up.
pytest_plugins = ["kumiko_workflows.testing"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if on_postgres():
        return
    skip = pytest.mark.skip(
        reason="needs PostgreSQL: run with DATABASE_URL=postgres://postgres@127.0.0.1:5432/kumiko"
    )
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> None:
    """The test database, its workflow tables distributed when ``KUMIKO_DISTRIBUTE`` is set.

    For a run of the suite against a Citus coordinator (with ``--reuse-db``:
    the coordinator's test database must keep the extension ``setup.sh``
    put in it); ``tests/multiprocess/test_citus.py`` distributes on its own.
    """
    if os.environ.get("KUMIKO_DISTRIBUTE"):
        from django.core.management import call_command

        with django_db_blocker.unblock():
            call_command("distribute_workflow_tables", "--shard-count", "8", verbosity=0)


@pytest.fixture(autouse=True)
def _not_on_distributed_tables(request: pytest.FixtureRequest) -> None:
    """Skip a ``not_citus`` test, with its reason, where the workflow tables are distributed.

    Only there: on plain PostgreSQL, SQLite and a Citus database whose tables
    are not distributed it runs. The tests and their reasons are listed in
    docs/discussions/reliability.md ("The suite on Citus").
    """
    marker = request.node.get_closest_marker("not_citus")
    if marker is None or not on_postgres():
        return
    reason = marker.kwargs["reason"]  # a not_citus marker without its reason is a KeyError
    request.getfixturevalue("django_db_setup")  # the test database, distributed or not
    from kumiko_workflows.store import distribution

    with request.getfixturevalue("django_db_blocker").unblock():
        if distribution.distributed():
            pytest.skip(f"on distributed tables (Citus): {reason}")


@pytest.fixture
def now():
    return timezone.now()


@pytest.fixture
def past(now):
    """An instant an hour ago, as ISO 8601: a wait until then is due at once."""
    return (now - timedelta(hours=1)).isoformat()


@pytest.fixture
def future(now):
    """An instant an hour ahead, as ISO 8601: a wait until then is not due."""
    return (now + timedelta(hours=1)).isoformat()
