"""The outbox of appends made in a transaction on one of the site's databases, and its relays.

``OutboxEntry`` lives on the site's aliases (``KUMIKO_WORKFLOWS["OUTBOX_DATABASES"]``),
``RelayedAppend`` on the engine's: see :mod:`kumiko_workflows.store.outbox`.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class OutboxEntry(models.Model):
    """An append made inside a transaction on one of the site's databases, not yet relayed.

    Lives on each alias of ``KUMIKO_WORKFLOWS['OUTBOX_DATABASES']`` (not on
    the engine's): ``append_event`` inside a transaction there writes this
    row in that transaction, so it commits or rolls back with the caller's
    writes. After the commit it is appended to the engine's database (the
    caller's process right away; a resume pass takes what a dead process
    left) and deleted. ``relay_id`` is recorded in the engine's transaction
    of the append (:class:`RelayedAppend`), so a relay cut short between the
    two commits never appends it twice. Rows of one stream are relayed in
    ``id`` order. Not workflow state: never projected, never rebuilt.
    """

    id = models.BigAutoField(primary_key=True)
    relay_id = models.UUIDField(unique=True)
    tenant_id = models.CharField(max_length=100)
    aggregate_id = models.UUIDField()
    aggregate_type = models.CharField(max_length=100)
    type = models.CharField(max_length=200)
    event_version = models.PositiveSmallIntegerField(default=1)
    payload = models.JSONField(default=dict)
    metadata = models.JSONField(default=dict, blank=True)
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(help_text="The event's created_at (the caller's clock).")
    enqueued_at = models.DateTimeField(
        db_default=Now(), help_text="When the caller's transaction wrote it (its database's clock)"
    )
    attempts = models.PositiveIntegerField(
        default=0, help_text="Relays of this row that raised (it is held after MAX_RESUME_ERRORS)."
    )
    last_error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "kumiko_workflows_outbox"
        verbose_name = "outbox entry"
        verbose_name_plural = "outbox entries"
        indexes = [
            # A stream's oldest row: only it may be relayed (one stream, in order).
            models.Index(fields=["tenant_id", "aggregate_id", "id"], name="kw_outbox_stream"),
        ]

    def __str__(self) -> str:
        return f"{self.type} for stream {self.aggregate_id} (relay {self.relay_id})"


class RelayedAppend(models.Model):
    """An outbox row appended to the engine's database, recorded in the append's transaction.

    A relay that finds its ``relay_id`` here appends nothing and only
    deletes the outbox row: the process that appended it died before that
    deletion. Deleted once the outbox row is gone (a pass sweeps the few a
    killed relay left).
    """

    relay_id = models.UUIDField(primary_key=True)
    source = models.CharField(max_length=100, help_text="The alias whose outbox held it.")
    relayed_at = models.DateTimeField(db_default=Now())

    class Meta:
        verbose_name = "relayed append"

    def __str__(self) -> str:
        return f"relay {self.relay_id} from {self.source}"
