"""The worker's heartbeat: its row of :class:`~kumiko_workflows.models.WorkerHeartbeat`.

Written on the database's clock (``Now()``), at most every
:data:`HEARTBEAT_SECONDS`, so its age is judged on the clock it was written with.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db.models.functions import Now

from kumiko_workflows.engine import deploys
from kumiko_workflows.models import WorkerHeartbeat
from kumiko_workflows.store import db
from kumiko_workflows.store.db import CONNECTION_ERRORS

logger = logging.getLogger(__name__)


#: Seconds between two heartbeats of one worker, at least.
HEARTBEAT_SECONDS = 5.0
#: Heartbeats older than this are deleted when a worker writes its first one:
#: one-shot passes (from cron) leave theirs, and a killed worker cannot delete its own.
HEARTBEAT_KEPT = timedelta(days=1)


class Heartbeat:
    """The worker's row of :class:`~kumiko_workflows.models.WorkerHeartbeat`.

    Written at the start of a pass and between signal deliveries (see
    :meth:`kumiko_workflows.engine.worker.Worker._beat`), at most every :data:`HEARTBEAT_SECONDS`:
    one UPDATE of the worker's own row (an INSERT the first time). Its
    instants are the database's clock (``Now()`` in the statement), neither
    the engine's (a test's virtual time) nor this process's: they are
    judged against that clock by another process (``workflow_status
    --check``), and a worker whose own clock is off would otherwise look
    dead while it runs, or alive long after it died. A heartbeat that
    cannot be written (the table not migrated yet) is logged once and never
    stops the worker; a broken connection is raised like any other, so the
    worker backs off.
    """

    def __init__(self, tenants: Sequence[str], loop: bool) -> None:
        self.hostname = socket.gethostname()[:255]
        self.name = deploys.process_name()  # as the definitions it registers name it
        self.tenants = list(tenants)
        self.loop = loop
        self._pk: int | None = None
        self._last: float | None = None
        self._warned = False
        self._left: list[dict[str, Any]] = []

    def beat(self) -> None:
        if self._last is not None and time.monotonic() - self._last < HEARTBEAT_SECONDS:
            return
        self._last = time.monotonic()
        try:
            self._write()
        except CONNECTION_ERRORS as exc:
            if db.connection_broken():
                raise
            if not self._warned:
                self._warned = True
                logger.warning(
                    "the worker's heartbeat could not be written (%s: %s); "
                    "is the kumiko_workflows migration applied?",
                    type(exc).__name__,
                    str(exc).strip().splitlines()[0] if str(exc) else "",
                )

    def _write(self) -> None:
        # In a block of its own: a refused statement never spoils a caller's transaction.
        with db.atomic():
            rows = WorkerHeartbeat.objects.filter(pk=self._pk) if self._pk is not None else None
            if rows is not None and rows.update(seen_at=Now()):
                return
            WorkerHeartbeat.objects.filter(seen_at__lt=Now() - HEARTBEAT_KEPT).delete()
            row, _ = WorkerHeartbeat.objects.update_or_create(
                name=self.name,
                defaults={
                    "hostname": self.hostname,
                    "pid": os.getpid(),
                    "tenants": self.tenants,
                    "loop": self.loop,
                    "started_at": Now(),
                    "seen_at": Now(),
                },
            )
        self._pk = row.pk

    def note_left(self, entries: list[dict[str, Any]]) -> None:
        """Say in the row which newer definitions this worker left runs of (once each)."""
        if self._pk is None or entries == self._left:
            return
        with db.atomic():
            WorkerHeartbeat.objects.filter(pk=self._pk).update(left_code=entries)
        self._left = list(entries)

    def stop(self) -> None:
        """Delete the row: the worker stopped on purpose (best effort)."""
        if self._pk is None:
            return
        try:
            WorkerHeartbeat.objects.filter(pk=self._pk).delete()
        except CONNECTION_ERRORS:
            logger.warning("the worker's heartbeat could not be deleted; it goes stale")
        self._pk = None
