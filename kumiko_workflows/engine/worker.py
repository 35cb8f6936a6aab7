"""The resume worker behind ``manage.py resume_due_runs``.

One pass fires due cron slots and resumes every due run. ``--loop`` repeats
passes: between them it sleeps until the next ``wake_at`` or the interval,
and on PostgreSQL it also LISTENs on ``KUMIKO_WORKFLOWS['NOTIFY_CHANNEL']``,
which the projections NOTIFY (at commit) whenever a row becomes due now, so
a woken run starts well under a second later. The first SIGTERM/SIGINT lets
the current run finish and the worker exit 0; a second exits 1 at once.

On SQLite, which lets one transaction write at a time, a worker (a loop or
a single pass) holds an OS lock on a file beside the database, and a second
one is refused at once
(:class:`~kumiko_workflows.exceptions.WorkerAlreadyRunning`) instead of failing
its runs with "database is locked".
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Any

from django.db import close_old_connections
from django.db.models import Min
from django.utils import timezone

from kumiko_workflows import telemetry
from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.engine import deploys, transitions
from kumiko_workflows.engine.cron import fire_due_schedules
from kumiko_workflows.engine.heartbeat import Heartbeat
from kumiko_workflows.engine.rehearsal import Rehearsal, rehearse
from kumiko_workflows.engine.resume import ResumeReport, resume_due_runs
from kumiko_workflows.engine.worker_lock import exclusive
from kumiko_workflows.models import WorkflowRunPending
from kumiko_workflows.store import db
from kumiko_workflows.store.db import CONNECTION_ERRORS

logger = logging.getLogger(__name__)

_MAX_BACKOFF = 30.0


@dataclass
class PassResult:
    report: ResumeReport
    fired: int = 0
    cron_errors: int = 0
    #: Signals left over by a process that died, delivered again by this pass.
    redelivered: int = 0
    started_at: datetime = field(default_factory=timezone.now)

    @property
    def errors(self) -> int:
        return self.report.errors + self.cron_errors + self.report.relay_errors

    @property
    def idle(self) -> bool:
        """Nothing happened that this worker did: no run resumed or failed, no error, no slot."""
        report = self.report
        return not (
            report.resumed
            or report.failed
            or self.errors
            or self.fired
            or self.redelivered
            or report.relayed
        )

    def __str__(self) -> str:
        return f"{self.report} fired={self.fired}"


class Listener:
    """A dedicated autocommit connection LISTENing for due rows (PostgreSQL only)."""

    def __init__(self) -> None:
        self.conn: Any = None

    def connect(self) -> bool:
        """LISTEN if not yet listening; True if this call (re)connected.

        A NOTIFY sent while nobody listened is lost, so after (re)connecting
        the worker makes a pass before it sleeps.
        """
        if self.conn is not None:
            return False
        try:
            self._connect()
        except Exception as exc:
            logger.warning("LISTEN connection failed (%s); polling instead", exc)
            self.conn = None
            return False
        return True

    def fileno(self) -> int | None:
        return None if self.conn is None else self.conn.fileno()

    def _connect(self) -> None:
        self.conn = db.listen(workflow_settings.NOTIFY_CHANNEL)

    def drain(self) -> int:
        """Consume pending notifications; return how many there were."""
        if self.conn is None:
            return 0
        try:
            return sum(1 for _ in self.conn.notifies(timeout=0.0))
        except Exception as exc:
            logger.warning("LISTEN connection lost (%s); reconnecting", exc)
            self.close()
            return 1  # be safe: do a pass

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # pragma: no cover - closing a broken connection
                pass
            self.conn = None


class Worker:
    """Runs resume passes once or in a loop; see the module docstring."""

    def __init__(
        self,
        *,
        tenants: Sequence[str] | None = None,
        limit: int | None = None,
        interval: float | None = None,
        max_runs: int | None = None,
        cron: bool = True,
        on_pass: Callable[[PassResult], None] | None = None,
        on_start: Callable[[str], None] | None = None,
        heartbeat: bool = True,
        loop: bool = False,
    ) -> None:
        self.tenants = list(tenants or [])
        self.limit = limit
        self.interval = float(
            interval if interval is not None else workflow_settings.WORKER_INTERVAL
        )
        self.max_runs = max_runs
        self.cron = cron
        self.on_pass = on_pass or (lambda result: None)
        self.on_start = on_start or (lambda line: None)
        self.stopping = False
        #: What every pass of this worker did, added up.
        self.totals = ResumeReport()
        self.fired = 0
        self.passes = 0
        self.errors = 0
        self._wakeup_r: int | None = None
        self._wakeup_w: int | None = None
        self._wakeup_lock = threading.Lock()
        self._signalled = False
        self.heartbeat = Heartbeat(self.tenants, loop) if heartbeat else None

    @property
    def handled(self) -> int:
        """Runs this worker moved on: each ended completed, suspended or failed.

        Not rows whose resume raised (``errors``: they are still due, and
        counted again).
        """
        totals = self.totals
        return totals.completed + totals.suspended + totals.failed

    def describe(self, listening: str) -> str:
        """The worker's start line: where it works and how (no user, no password)."""
        batch = int(workflow_settings.BATCH_SIZE)
        batches = (
            "batch_size=1 (a commit per run)"
            if batch <= 1
            else f"batch_size={batch} batch_seconds={float(workflow_settings.BATCH_SECONDS):g}"
        )
        return " ".join(
            [
                f"pid={os.getpid()}",
                db.database_description(),
                f"tenants={','.join(self.tenants) or 'all'}",
                f"interval={self.interval:g}s",
                f"listen={listening}",
                f"cron={'on' if self.cron else 'off'}",
                batches,
                f"limit={self.limit or 'none'}",
                f"max_runs={self.max_runs or 'none'}",
            ]
        )

    # -- one pass ----------------------------------------------------------------

    def run_single_pass(self, now: datetime | None = None) -> PassResult:
        """One pass as a worker of its own: on SQLite, refused while another one runs."""
        with exclusive(), transitions.beating_between_receivers(self._beat):
            return self.run_once(now)

    def rehearse(self, now: datetime | None = None) -> Rehearsal[PassResult]:
        """One pass rolled back at its end: what it would do, written nothing (``--dry-run``)."""
        with exclusive():
            return rehearse(lambda: self.run_once(now))

    def run_once(self, now: datetime | None = None) -> PassResult:
        self._beat()
        fired = cron_errors = 0
        # Signals a dead process committed but did not deliver, before new work.
        redelivered = 0
        try:
            redelivered = transitions.deliver_leftovers()
        except Exception:
            if db.connection_broken():
                raise
            # Not migrated yet, or a bug: resuming goes on all the same.
            logger.exception("left-over signals could not be delivered")
        if self.cron:
            try:
                fired = fire_due_schedules(now=now)
            except CONNECTION_ERRORS:
                raise
            except Exception:
                # A bad schedule or CRON_TENANTS setting must not stop resuming.
                logger.exception("cron schedules could not be fired")
                cron_errors = 1
        limit = self.limit
        if self.max_runs is not None:
            left = self.max_runs - self.handled
            limit = left if limit is None else min(limit, left)
        # Its tenants (or every tenant) take turns in the one pass.
        report = resume_due_runs(
            limit=limit,
            now=now,
            should_stop=lambda: self.stopping,
            tenants=self.tenants or None,
        )
        if self.heartbeat is not None and report.left:
            self.heartbeat.note_left(deploys.left_code())
        self.totals.add(report)
        self.fired += fired
        self.passes += 1
        self.errors += report.errors + report.relay_errors
        self.errors += cron_errors
        result = PassResult(report, fired, cron_errors, redelivered)
        telemetry.worker_pass(report.errors, cron_errors)
        self.on_pass(result)
        return result

    # -- the loop ------------------------------------------------------------------

    def run_forever(self) -> None:
        """Run passes until signalled (or ``max_runs``); refused on SQLite while another runs."""
        with exclusive(), transitions.beating_between_receivers(self._beat):
            self._loop()

    def _loop(self) -> None:
        self._install_signals()
        listener = Listener() if db.can_listen() else None
        listening = "off"
        if listener is not None:
            # Before the first pass: no NOTIFY is missed after it.
            listening = "on" if listener.connect() else "retrying"
        self.on_start(self.describe(listening))
        backoff = 1.0
        try:
            while not self.stopping and not self._done():
                close_old_connections()
                try:
                    result = self.run_once()
                except CONNECTION_ERRORS as exc:
                    telemetry.worker_error("database")
                    logger.error(
                        "database unavailable (%s: %s); retrying in %.0fs",
                        type(exc).__name__,
                        str(exc).strip().splitlines()[0] if str(exc) else "",
                        backoff,
                    )
                    self._reset_connection(listener)
                    self._sleep(backoff, None)
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    continue
                except Exception:
                    # Not a row's error (those are counted per row): the pass
                    # itself broke. Keep the worker alive, loudly.
                    logger.exception("resume pass failed; retrying in %.0fs", backoff)
                    telemetry.worker_error("pass")
                    self.errors += 1
                    self._sleep(backoff, None)
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    continue
                backoff = 1.0
                if self.stopping or self._done():
                    break
                report = result.report
                if report.resumed or report.relayed or result.fired or result.redelivered:
                    continue  # progress was made: more may be due right away
                self._sleep(self._sleep_seconds(), listener)
        finally:
            if listener is not None:
                listener.close()
            if self.heartbeat is not None:
                self.heartbeat.stop()
            self._restore_signals()

    def _beat(self) -> None:
        """A heartbeat at most every ``HEARTBEAT_SECONDS``: at each pass, and between signal
        deliveries (so slow receivers never make a live worker look dead)."""
        if self.heartbeat is not None:
            self.heartbeat.beat()

    def _done(self) -> bool:
        return self.max_runs is not None and self.handled >= self.max_runs

    def _sleep_seconds(self) -> float:
        now = timezone.now()
        query = WorkflowRunPending.objects.filter(wake_at__gt=now)
        if self.tenants:
            query = query.filter(tenant_id__in=self.tenants)
        try:
            next_wake = query.aggregate(next=Min("wake_at"))["next"]
        except CONNECTION_ERRORS:
            return self.interval
        seconds = self.interval
        if next_wake is not None:
            seconds = min(seconds, (next_wake - now).total_seconds())
        return max(seconds, 0.01)

    def _sleep(self, seconds: float, listener: Listener | None) -> None:
        """Sleep up to ``seconds``; return early on NOTIFY or a signal."""
        if listener is not None and (listener.connect() or listener.drain()):
            return
        fds = [self._wakeup_r] if self._wakeup_r is not None else []
        pg_fd = listener.fileno() if listener is not None else None
        if pg_fd is not None:
            fds.append(pg_fd)
        deadline = time.monotonic() + seconds
        while not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if not fds:
                time.sleep(remaining)
                return
            readable, _, _ = select.select(fds, [], [], remaining)
            if self._wakeup_r is not None and self._wakeup_r in readable:
                try:
                    os.read(self._wakeup_r, 512)
                except BlockingIOError:
                    pass
            if (
                pg_fd is not None
                and pg_fd in readable
                and listener is not None
                and listener.drain()
            ):
                return

    @staticmethod
    def _reset_connection(listener: Listener | None) -> None:
        try:
            db.engine().close()
        except Exception:  # pragma: no cover - the connection is already gone
            pass
        if listener is not None:
            listener.close()

    # -- signals ------------------------------------------------------------------

    def _install_signals(self) -> None:
        self._previous: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._on_signal)
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._wakeup_r, self._wakeup_w = r, w
        self._previous_wakeup = signal.set_wakeup_fd(w)

    def _restore_signals(self) -> None:
        for signum, handler in getattr(self, "_previous", {}).items():
            signal.signal(signum, handler)
        with self._wakeup_lock:  # not while stop() writes to the pipe
            if self._wakeup_r is not None and self._wakeup_w is not None:
                signal.set_wakeup_fd(self._previous_wakeup)
                os.close(self._wakeup_r)
                os.close(self._wakeup_w)
                self._wakeup_r = self._wakeup_w = None

    def stop(self) -> None:
        """Finish the current run, then leave the loop, as a first SIGTERM does; from any thread.

        ``--reload`` calls it from the thread that watches the files.
        """
        self.stopping = True
        with self._wakeup_lock:
            if self._wakeup_w is not None:
                try:
                    os.write(self._wakeup_w, b"\0")  # ends the loop's sleep
                except BlockingIOError:
                    pass  # the pipe is full: the loop wakes anyway

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._signalled:
            logger.warning("second %s: exiting now", signal.Signals(signum).name)
            raise SystemExit(1)
        self._signalled = self.stopping = True
        logger.warning(
            "%s received: finishing the current run, then exiting (send again to force)",
            signal.Signals(signum).name,
        )
