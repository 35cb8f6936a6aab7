"""App configuration: wires projections and discovers ``workflows`` modules."""

from django.apps import AppConfig


class KumikoWorkflowsConfig(AppConfig):
    name = "kumiko_workflows"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_save
        from django.utils.module_loading import autodiscover_modules

        from kumiko_workflows import checks  # noqa: F401 - registers the system checks
        from kumiko_workflows import event_types as et
        from kumiko_workflows.engine import (  # noqa: F401 - deploys registers code on connect
            children,
            deploys,
            gates,
            limits,
            purged_runs,
            starts,
            transitions,
            wakeups,
        )
        from kumiko_workflows.models import Event
        from kumiko_workflows.projections import children as children_projection
        from kumiko_workflows.projections import limits as limit_slots
        from kumiko_workflows.projections import pending, run_status
        from kumiko_workflows.store import dispatch
        from kumiko_workflows.workflow.registry import registry as workflows

        projections = dispatch.registry
        if "kumiko_workflows.run_status" not in projections:
            # In the order they must run; reactions after the projections.
            projections.register(
                "kumiko_workflows.run_status",
                run_status.handles,
                run_status.project_run_status,
                order=10,
                builtin=True,
                fold=run_status.status_write,
            )
            projections.register(
                "kumiko_workflows.pending",
                run_status.handles,
                pending.project_pending,
                order=20,
                builtin=True,
            )
            projections.register(
                "kumiko_workflows.limits",
                limit_slots.HANDLED,
                limit_slots.project_limits,
                order=25,
                builtin=True,
            )
            projections.register(
                "kumiko_workflows.children",
                children_projection.HANDLED,
                children_projection.project_children,
                order=26,
                builtin=True,
            )
            # The reactions append run events: a replay replays those, not them.
            projections.register(
                "kumiko_workflows.fan_in",
                frozenset(et.TERMINAL),
                lambda event, replaying: children.on_child_finished(
                    event, replaying, children.starter()
                ),
                order=35,
                replay=False,
                builtin=True,
            )
            projections.register(
                "kumiko_workflows.wakeup",
                workflows.is_awaited,
                wakeups.project_wakeup,
                order=30,
                replay=False,
                builtin=True,
                after_check=wakeups.after_event_check,
            )
            projections.register(
                "kumiko_workflows.gates",
                frozenset(et.TERMINAL),
                gates.release_ended,
                order=35,
                replay=False,
                builtin=True,
            )
            projections.register(
                "kumiko_workflows.trigger",
                workflows.is_trigger,
                starts.trigger_projection,
                order=40,
                replay=False,
                builtin=True,
            )
            projections.register(
                "kumiko_workflows.slot_release",
                frozenset(et.TERMINAL),
                limits.release_on_end,
                order=45,
                replay=False,
                builtin=True,
            )
            # Signals after commit: the last to see an event, never replayed.
            projections.register(
                "kumiko_workflows.signals",
                transitions.handles,
                transitions.announce,
                order=50,
                replay=False,
                builtin=True,
            )
        if "kumiko_workflows.purged_runs" not in projections:
            purged_runs.register(projections)
        post_save.connect(
            dispatch.on_event_saved, sender=Event, dispatch_uid="kumiko_workflows.projections"
        )
        autodiscover_modules("workflows")
        self._define_task_workflows()

    @staticmethod
    def _define_task_workflows() -> None:
        """Each queue's workflow of every ``TASKS`` backend of ours: a worker must know them.

        The Tasks framework is imported only when ``TASKS`` names such a backend.
        """
        from django.conf import settings
        from django.utils.module_loading import import_string

        for params in (getattr(settings, "TASKS", None) or {}).values():
            try:
                backend = import_string(str(params.get("BACKEND", "")))
            except ImportError:
                continue  # the Tasks framework's own check reports it
            if getattr(backend, "runs_as_workflows", False):
                from kumiko_workflows.tasks import compat, runner

                queues = params.get("QUEUES", [compat.DEFAULT_TASK_QUEUE_NAME])
                runner.ensure_queue_workflows(sorted(queues))
