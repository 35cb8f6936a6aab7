"""Shared fixtures and the ``postgres`` marker's skip; the shared helpers are ``tests.support``."""

from __future__ import annotations

from datetime import timedelta

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
