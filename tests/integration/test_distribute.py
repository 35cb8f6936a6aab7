"""Distribution by tenant, off Citus: the keys of migration 0021, the command's refusal, W140.

The cluster itself is tests/multiprocess/test_citus.py's; these run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import importlib
import uuid

import pytest
from django.core import checks
from django.core.management import CommandError, call_command
from django.db import connection

from kumiko_workflows import append_event
from kumiko_workflows.models import Event
from kumiko_workflows.operations.distribute import TENANT_MODELS
from kumiko_workflows.store import distribution

KEYS = importlib.import_module("kumiko_workflows.migrations.0021_citus_tenant_keys")


@pytest.mark.django_db
def test_the_migration_lists_every_tenant_table_with_its_key():
    assert [(m._meta.db_table, m._meta.pk.column) for m in TENANT_MODELS] == list(KEYS.TENANT_KEYS)


@pytest.mark.django_db
def test_each_tenant_tables_key_leads_with_its_id_and_carries_the_tenant():
    for model in TENANT_MODELS:
        columns = distribution.primary_key_columns(model._meta.db_table)
        if connection.vendor == "postgresql":
            assert columns == [model._meta.pk.column, "tenant_id"], model
        else:  # SQLite keeps its rowid keys
            assert columns == [model._meta.pk.column], model


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_keys_change_both_ways_on_a_table_with_rows():
    _skip_on_citus()  # a distributed table's key must keep tenant_id
    stream = uuid.uuid4()
    first = append_event(stream, "thing", "t.keyed", {}, tenant_id="a")
    table = Event._meta.db_table
    with connection.schema_editor() as editor:
        KEYS.keys_without_tenant(None, editor)
    assert distribution.primary_key_columns(table) == ["id"]
    with connection.schema_editor() as editor:
        KEYS.keys_with_tenant(None, editor)
        KEYS.keys_with_tenant(None, editor)  # again: nothing left to do
    assert distribution.primary_key_columns(table) == ["id", "tenant_id"]
    second = append_event(stream, "thing", "t.keyed", {}, tenant_id="a")
    assert (first.version, second.version) == (1, 2)
    assert Event.objects.get(pk=first.pk).tenant_id == "a"


def _skip_on_citus() -> None:
    if distribution.has_citus():
        pytest.skip(
            "the database is a Citus coordinator (tests/multiprocess/test_citus.py covers it)"
        )


@pytest.mark.django_db
def test_the_command_refuses_clearly_where_there_is_no_citus():
    _skip_on_citus()
    missing = "is not PostgreSQL" if connection.vendor == "sqlite" else "has no citus extension"
    with pytest.raises(CommandError, match=f"cannot distribute the workflow tables: .*{missing}"):
        call_command("distribute_workflow_tables")
    with pytest.raises(CommandError, match=missing):
        call_command("distribute_workflow_tables", "--check")


@pytest.mark.django_db
def test_w140_is_not_reported_without_citus():
    _skip_on_citus()
    assert not distribution.distributed()
    found = checks.run_checks(databases=["default"])
    assert not [message for message in found if message.id == "kumiko_workflows.W140"]
