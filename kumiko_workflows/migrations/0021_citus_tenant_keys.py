"""PostgreSQL: the tenant tables' primary keys carry tenant_id, so the tables can shard by it.

Citus (distributed PostgreSQL) takes a PRIMARY KEY or UNIQUE constraint
only if it includes the distribution column. Each tenant table's key
becomes (its id, tenant_id): the id stays the key's first column, so every
lookup by id alone is served by the same index as before, and the id is
still unique on its own (a sequence, or a run id derived from its tenant).
Django's state keeps the id as the model's primary key: the ORM's identity
of a row does not change, only the constraint in the database does.

SQLite keeps its rowid keys (an id unique on its own there is the stronger
constraint, and SQLite cannot change a table's key in place). The tables
without a tenant (worker heartbeats, deployed definitions, relayed
appends) keep theirs: they stay local to the coordinator on Citus. So does
the outbox table: it has a tenant, but the engine never writes it on its
own database (it lives on the site's other aliases, ``OUTBOX_DATABASES``).
"""

from django.db import migrations

#: table, key column: the tenant tables whose key gains tenant_id.
TENANT_KEYS = (
    ("kumiko_workflows_event", "id"),
    ("kumiko_workflows_workflowrun", "run_id"),
    ("kumiko_workflows_workflowrunpending", "id"),
    ("kumiko_workflows_workflowwaitkey", "id"),
    ("kumiko_workflows_wakecheck", "id"),
    ("kumiko_workflows_purgedrun", "id"),
    ("kumiko_workflows_signaldelivery", "event_id"),
    ("kumiko_workflows_taskattempt", "id"),
    ("kumiko_workflows_limitslot", "id"),
    ("kumiko_workflows_rateslot", "id"),
    ("kumiko_workflows_workflowchildgroup", "id"),
    ("kumiko_workflows_runday", "id"),
)


def _primary_key(schema_editor, table):
    """The name and columns of ``table``'s primary key constraint."""
    with schema_editor.connection.cursor() as cursor:
        found = schema_editor.connection.introspection.get_constraints(cursor, table)
    for name, info in found.items():
        if info["primary_key"]:
            return name, list(info["columns"])
    raise RuntimeError(f"{table} has no primary key")


def _distributed(schema_editor):
    """The tables Citus distributes in this database (none without Citus)."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL")
        if not cursor.fetchone()[0]:
            return set()
        cursor.execute("SELECT logicalrelid::regclass::text FROM pg_dist_partition")
        return {name for (name,) in cursor.fetchall()}


def _rekey(schema_editor, with_tenant):
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    distributed = set() if with_tenant else _distributed(schema_editor)
    for table, column in TENANT_KEYS:
        wanted = [column, "tenant_id"] if with_tenant else [column]
        name, columns = _primary_key(schema_editor, table)
        if columns == wanted:
            continue
        if table in distributed:
            raise RuntimeError(
                f"{table} is distributed by Citus, whose keys must hold tenant_id: "
                "undistribute it (undistribute_table) before migrating below 0021"
            )
        # Two statements (Citus takes no other subcommand beside ADD
        # CONSTRAINT), in the migration's one transaction: no other session
        # sees the table without its key.
        schema_editor.execute(f"ALTER TABLE {quote(table)} DROP CONSTRAINT {quote(name)}")
        schema_editor.execute(
            f"ALTER TABLE {quote(table)} ADD CONSTRAINT {quote(table + '_pkey')} "
            f"PRIMARY KEY ({', '.join(quote(c) for c in wanted)})"
        )


def keys_with_tenant(apps, schema_editor):
    _rekey(schema_editor, True)


def keys_without_tenant(apps, schema_editor):
    _rekey(schema_editor, False)


class Migration(migrations.Migration):

    dependencies = [
        ("kumiko_workflows", "0020_compose_children"),
    ]

    operations = [
        migrations.RunPython(keys_with_tenant, keys_without_tenant, elidable=False),
    ]
