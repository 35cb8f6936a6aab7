# The admin's "Rerun" permission was called retry_workflowrun: renamed in
# place, so the groups and users that hold it keep it.

from django.apps import apps as installed
from django.db import migrations, router

OLD, NEW = "retry_workflowrun", "rerun_workflowrun"


def rename(apps, schema_editor, source=OLD, target=NEW, name="Can rerun a failed workflow run"):
    try:
        Permission = apps.get_model("auth", "Permission")
    except LookupError:  # no django.contrib.auth: no permissions to rename
        return
    db = router.db_for_write(Permission)
    if schema_editor.connection.alias != db:
        return  # auth lives on another database: renamed when that one migrates
    permissions = Permission.objects.using(db).filter(
        content_type__app_label="kumiko_workflows", content_type__model="workflowrun"
    )
    if not permissions.filter(codename=target).exists():
        permissions.filter(codename=source).update(codename=target, name=name)


def rename_back(apps, schema_editor):
    rename(apps, schema_editor, NEW, OLD, "Can retry a failed workflow run")


class Migration(migrations.Migration):

    dependencies = [
        ('kumiko_workflows', '0006_event_payload_gin'),
    ] + ([('auth', '0001_initial')] if installed.is_installed('django.contrib.auth') else [])

    operations = [
        migrations.AlterModelOptions(
            name='workflowrun',
            options={'permissions': [('wake_workflowrun', 'Can wake a waiting workflow run now'), ('cancel_workflowrun', 'Can cancel a workflow run'), ('rerun_workflowrun', 'Can rerun a failed workflow run')]},
        ),
        migrations.RunPython(rename, rename_back),
    ]
