"""The ``KUMIKO_WORKFLOWS`` settings dict, read lazily with documented defaults.

Read on first use and again whenever the settings change
(``setting_changed``: ``override_settings`` and pytest-django's ``settings``
fixture's assignments send it), so both just work; a lookup costs a dict's,
not a read of ``django.conf.settings`` (microseconds, several times a resumed
run). As with Django's own settings caches, a change that sends no signal
(the dict mutated in place, pytest-django's ``del settings.KUMIKO_WORKFLOWS``)
is not seen.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    # The database alias the engine's tables live on. Another than "default"
    # needs kumiko_workflows.routers.WorkflowsRouter in DATABASE_ROUTERS.
    "DATABASE": "default",
    # Aliases of the site's own databases whose transactions an append joins
    # through an outbox there (relayed to DATABASE after their commit); an
    # append inside a transaction on another alias only is refused.
    "OUTBOX_DATABASES": (),
    # Tenant used when append_event() is called without tenant_id.
    "DEFAULT_TENANT": "default",
    # Largest JSON payload (and metadata) one event may carry, in bytes.
    "MAX_PAYLOAD_BYTES": 256 * 1024,
    # Base delay of retry backoff, in seconds, when a retry step gives none.
    "RETRY_BASE_DELAY": 10.0,
    # Longest sleep of a `resume_due_runs --loop` worker between passes, seconds.
    "WORKER_INTERVAL": 5.0,
    # Runs a worker resumes per transaction (each claimed when its turn comes,
    # when its turn comes); 1 commits every run on its own.
    "BATCH_SIZE": 50,
    # Weights of tenants' turns in a resume pass (tenant id -> positive int):
    # a turn resumes BATCH_SIZE x weight runs; a tenant not named weighs 1.
    "TENANT_WEIGHTS": {},
    # Seconds of head start a run of priority 100 gets on its due time among
    # due rows (priority p: p/100 of it; negative: held back as much). A run
    # is passed over only by work due within 2x this after it (priorities.md).
    "PRIORITY_HEAD_START": 60.0,
    # Seconds after which a worker commits its batch early (a slow step ends it).
    "BATCH_SECONDS": 0.5,
    # True: a batch claims its rows in one statement at its start and writes
    # its runs' closing events in one at its end (PostgreSQL; a slow step then
    # holds the batch's rows behind it until it returns, a run that commits
    # alone holds none). False: each row is claimed when its turn comes.
    "BATCH_TOGETHER": True,
    # Passes in a row whose resume of a run raises before the run is failed
    # (reason resume_failed_repeatedly), so no run trips every pass for ever.
    "MAX_RESUME_ERRORS": 3,
    # Seconds after which a resume worker delivers again a run signal whose
    # process (on another host) has not finished delivering it: at least once.
    "SIGNAL_REDELIVERY_SECONDS": 120,
    # PostgreSQL channel NOTIFYed when a pending row becomes due now.
    "NOTIFY_CHANNEL": "kumiko_workflows_due",
    # Dotted path (or callable) returning the tenants cron workflows fire for;
    # None means only DEFAULT_TENANT.
    "CRON_TENANTS": None,
    # Most missed slots one pass fires for a schedule with catch_up="all".
    "CRON_CATCH_UP_LIMIT": 100,
    # Seconds a cron slot stays on time: a pass fires it whatever catch_up
    # says; a slot first seen later was missed and catch_up decides.
    "CRON_GRACE": 300,
    # Dotted path (or callable) `request -> tenant id or None` that limits a
    # staff user in the admin to one tenant; None means no scoping.
    "ADMIN_TENANT": None,
    # How long finished runs are kept: the default of `purge_workflow_runs
    # --finished-before` (an ISO 8601 duration such as "P30D", or a
    # timedelta). None: nothing is purged unless the command is given one.
    "RETENTION": None,
    # Whether a trigger may start a run again whose id (idempotency key) belonged
    # to a purged run. False: the key stays used, as if the run still existed.
    "REUSE_PURGED_KEYS": False,
    # Whether the engine prepares its hot statements (PostgreSQL with psycopg 3):
    # off behind a connection pooler that cannot keep them (docs/reference/settings.md).
    "PREPARED_STATEMENTS": True,
}


class WorkflowSettings:
    """Attribute access to ``settings.KUMIKO_WORKFLOWS`` with defaults."""

    def __init__(self) -> None:
        #: Every setting's value, the site's or the default (None: read on next use).
        self._values: dict[str, Any] | None = None

    def user_settings(self) -> dict[str, Any]:
        value = getattr(django_settings, "KUMIKO_WORKFLOWS", None) or {}
        return dict(value)

    def __getattr__(self, name: str) -> Any:
        values = self._values
        if values is None:
            user = self.user_settings()
            values = {key: user.get(key, default) for key, default in DEFAULTS.items()}
            self._values = values
        try:
            return values[name]
        except KeyError:
            raise AttributeError(f"KUMIKO_WORKFLOWS has no setting {name!r}") from None


workflow_settings = WorkflowSettings()


@receiver(setting_changed)
def _reread(*, setting: str, **kwargs: Any) -> None:
    if setting == "KUMIKO_WORKFLOWS":
        workflow_settings._values = None


def import_callable(value: Any, setting: str) -> Any:
    """Return a callable named by a setting (a callable or a dotted path)."""
    from django.core.exceptions import ImproperlyConfigured
    from django.utils.module_loading import import_string

    if value is None or callable(value):
        return value
    try:
        return import_string(value)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"KUMIKO_WORKFLOWS[{setting!r}] = {value!r} cannot be imported: {exc}"
        ) from exc
