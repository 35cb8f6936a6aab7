"""The aggregate types of a tenant's streams, from an index: the event list's filter choices.

``kw_event_tenant_head_type`` (``tenant_id, aggregate_type``, on each
stream's first event only) lets the admin list every aggregate type a
tenant's streams have by a loose index scan; the filter read them before
from each event type's newest event, and missed a type an event type had
on older streams. One small entry per stream.

Built CONCURRENTLY on PostgreSQL (so outside a transaction), as the event
table may be large: appends go on while it builds.
"""

from django.db import migrations, models

ADDED = models.Index(
    fields=["tenant_id", "aggregate_type"], condition=models.Q(version=1), name="kw_event_tenant_head_type"
)


def _concurrently(schema_editor):
    return {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}


def forwards(apps, schema_editor):
    schema_editor.add_index(apps.get_model("kumiko_workflows", "Event"), ADDED, **_concurrently(schema_editor))


def backwards(apps, schema_editor):
    schema_editor.remove_index(apps.get_model("kumiko_workflows", "Event"), ADDED, **_concurrently(schema_editor))


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("kumiko_workflows", "0022_admin_list_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[migrations.AddIndex(model_name="event", index=ADDED)],
        ),
    ]
