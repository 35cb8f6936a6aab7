"""The event store's table: ``Event``, the append-only log (the ORM refuses updates and deletes)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone

from kumiko_workflows.exceptions import AppendOnlyError


class EventQuerySet(models.QuerySet["Event"]):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("Events are append-only: QuerySet.update() is refused.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Events are append-only: QuerySet.delete() is refused.")

    def of_type_after(self, tenant_id: str, type: str, after_id: int) -> EventQuerySet:
        """Events of one type in one tenant appended after event id ``after_id``."""
        return self.filter(tenant_id=tenant_id, type=type, id__gt=after_id).order_by("id")


class Event(models.Model):
    """One immutable domain or workflow event.

    ``id`` is the global order. A stream is ``(tenant_id, aggregate_id)`` and
    ``(tenant_id, aggregate_id, version)`` is unique: two writers appending
    the same version of a stream cannot both succeed. The stream's first
    event fixes its aggregate type, and no stream starts with an id another
    tenant's stream has (``append_event`` checks both). Rows are written by
    :func:`kumiko_workflows.append_event`; ``save()`` of an existing row,
    ``delete()`` and ``QuerySet.update()/delete()`` refuse.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.CharField(max_length=100)
    aggregate_id = models.UUIDField()
    aggregate_type = models.CharField(max_length=100)
    version = models.PositiveIntegerField()
    type = models.CharField(max_length=200)
    event_version = models.PositiveSmallIntegerField(default=1)
    payload = models.JSONField(default=dict)
    metadata = models.JSONField(default=dict, blank=True)
    created_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    objects = EventQuerySet.as_manager()

    #: On the unsaved Event ``append_event`` returns when the append went to
    #: an outbox (``KUMIKO_WORKFLOWS['OUTBOX_DATABASES']``): the id of its
    #: relay. Its ``id`` and ``version`` are None: it is appended after commit.
    relay_id: uuid.UUID | None = None

    class Meta:
        constraints = [
            # Leads with tenant_id, as every key does, so the table shards by
            # tenant (Citus) unchanged.
            models.UniqueConstraint(
                fields=["tenant_id", "aggregate_id", "version"],
                name="kw_event_tenant_stream_version",
            ),
            models.CheckConstraint(condition=Q(version__gte=1), name="kw_event_version_gte_1"),
        ]
        indexes = [
            models.Index(fields=["tenant_id", "type", "id"], name="kw_event_tenant_type_id"),
            # A stream's first event, in any tenant: whether an id is taken
            # when a stream starts. The one lookup that cannot lead with
            # tenant_id (it is there to find another tenant's stream); one
            # small entry per stream.
            models.Index(
                fields=["aggregate_id"], condition=Q(version=1), name="kw_event_stream_head"
            ),
            # The aggregate types a tenant's streams have (the admin's filter
            # choices, a loose index scan): one small entry per stream.
            models.Index(
                fields=["tenant_id", "aggregate_type"],
                condition=Q(version=1),
                name="kw_event_tenant_head_type",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.id} ({self.aggregate_type} {self.aggregate_id} v{self.version})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError(
                f"Event #{self.pk} is append-only and cannot be changed; append a new event."
            )
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise AppendOnlyError(f"Event #{self.pk} is append-only and cannot be deleted.")
