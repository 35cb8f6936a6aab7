"""App configuration: wires projections and discovers ``workflows`` modules."""

from django.apps import AppConfig


class KumikoWorkflowsConfig(AppConfig):
    name = "kumiko_workflows"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_save
        from django.utils.module_loading import autodiscover_modules

        from kumiko_workflows import (
            checks,  # noqa: F401 - registers the system checks
            projections,
            run_projections,
        )
        from kumiko_workflows.models import Event

        if "kumiko_workflows.run_status" not in projections.registry:
            run_projections.register(projections.registry)
        post_save.connect(
            projections.on_event_saved, sender=Event, dispatch_uid="kumiko_workflows.projections"
        )
        autodiscover_modules("workflows")
