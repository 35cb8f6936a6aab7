"""Errors raised by kumiko_workflows.

Each class's docstring is its default message. Mistakes in configuration or in
a workflow definition subclass ``ImproperlyConfigured``.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class WorkflowError(Exception):
    """A kumiko_workflows operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidEvent(WorkflowError, ValueError):
    """The event cannot be appended: its arguments are invalid."""


class StreamIdentityError(InvalidEvent):
    """The stream belongs to another tenant or has another aggregate type.

    A stream's first event fixes its tenant and aggregate type; nothing else
    may append to it.
    """


class VersionConflict(WorkflowError):
    """The stream moved: another writer appended at the expected version first."""

    def __init__(
        self,
        message: str | None = None,
        *,
        aggregate_id: object = None,
        expected_version: int | None = None,
    ) -> None:
        super().__init__(message)
        self.aggregate_id = aggregate_id
        self.expected_version = expected_version


class CrossDatabaseTransaction(WorkflowError):
    """The caller's transaction is on another database than the engine's tables.

    Raised before any SQL, and nothing is written, when a caller inside a
    transaction on one database alias appends (or cancels, wakes, reruns, or
    acts on a cron schedule) while ``KUMIKO_WORKFLOWS["DATABASE"]`` names
    another alias with no transaction open: the engine's writes would commit
    at once, whatever became of the caller's transaction. List that alias in
    ``KUMIKO_WORKFLOWS["OUTBOX_DATABASES"]`` (appends then join its
    transactions through an outbox), open a transaction on the engine's
    alias too, or call after the caller's commits (the docs' settings
    reference, "What is atomic with what"). Also raised for what an outbox
    cannot take: ``expected_version``, or transactions open on several
    aliases at once.
    """


class OutboxNotMigrated(WorkflowError, ImproperlyConfigured):
    """An alias of ``KUMIKO_WORKFLOWS["OUTBOX_DATABASES"]`` has no outbox table.

    Raised before any write in the caller's transaction (which stays usable):
    run ``manage.py migrate --database ALIAS`` (system check
    ``kumiko_workflows.E057`` says more when the migrations are applied).
    """


class AppendOnlyError(WorkflowError):
    """Events are append-only: they cannot be changed or deleted through the ORM."""


class WorkflowDefinitionError(WorkflowError, ImproperlyConfigured):
    """The workflow definition is invalid."""


class RegistryNotReady(WorkflowError, ImproperlyConfigured):
    """Workflows are not loaded yet.

    kumiko_workflows discovers the `workflows` modules of installed apps when
    Django's app registry is ready. Use workflows after django.setup() has run
    (for example not at import time of a models module), and make sure
    "kumiko_workflows" is in INSTALLED_APPS.
    """


class InvalidDuration(WorkflowError, ValueError):
    """The value is not a valid duration or instant."""


class InvalidMatchExpression(WorkflowError, ValueError):
    """The match expression is malformed."""


class RunNotFound(WorkflowError, LookupError):
    """No workflow run has that id."""


class RunNotRerunnable(WorkflowError):
    """The failed run cannot be rerun (see :func:`kumiko_workflows.rerun_run`)."""


class MigrationRefused(WorkflowError):
    """The runs cannot be moved to that version of their workflow; none was moved."""


class StreamMoved(WorkflowError):
    """Another writer appended to the run's stream while the run was running."""


class ScheduleError(WorkflowError):
    """A cron schedule could not fire."""


class InvalidArgument(WorkflowError, ValueError):
    """An argument is invalid."""


class WorkerAlreadyRunning(WorkflowError):
    """Another resume worker is already running on this SQLite database.

    SQLite lets one transaction write at a time, so a second worker would only
    wait for the first one's lock and fail its runs with "database is locked".
    """
