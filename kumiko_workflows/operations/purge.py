"""Retention: removing finished runs, the one way events ever leave the store.

The event table is append-only for every caller (``Event.delete()`` and
``QuerySet.delete()/update()`` refuse). :func:`purge_runs` is the single,
explicit exception: it deletes the engine's own run streams (aggregate type
``workflow-run``) of runs that completed, failed or were cancelled before a
cut-off, with their status rows and any leftovers (pending rows, wait keys,
wake-up checks). Domain events, including trigger and awaited events, and
cron schedule streams are never touched.

It works in batches, each its own short transaction. A batch locks the
status rows it takes with ``SKIP LOCKED`` (a run someone is changing is left
for later), and re-reads their status under that lock, so a run that is not
finished is never touched, whatever was asked. Each purged run leaves a
:class:`~kumiko_workflows.models.PurgedRun` tombstone, and
:mod:`kumiko_workflows.engine.purged_runs` refuses to start a run with a
purged run's id (the same idempotency key) again, unless
``KUMIKO_WORKFLOWS["REUSE_PURGED_KEYS"]`` allows it.

With an archive, every event a batch deletes is first written to one file
as gzip-compressed JSON lines, one gzip member per batch, flushed to disk
before the batch commits: ``zcat PATH | jq`` reads it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import json
import logging
import os
import stat
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

from django.utils import timezone

from kumiko_workflows import event_types as et
from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.engine.purged_runs import keeps_key
from kumiko_workflows.exceptions import InvalidArgument, InvalidDuration
from kumiko_workflows.models import (
    SETTLED_STATUSES,
    Event,
    PurgedRun,
    TaskAttempt,
    WakeCheck,
    WorkflowRun,
    WorkflowRunPending,
    WorkflowWaitKey,
)
from kumiko_workflows.store import db, statements
from kumiko_workflows.store.events import name_problem
from kumiko_workflows.workflow.durations import parse_duration

logger = logging.getLogger("kumiko_workflows.purge")

DEFAULT_BATCH = 500
MAX_BATCH = 10_000

#: The fields of an archived event, in the order each JSON line has them: every
#: column of the event table, as the model names them.
ARCHIVE_FIELDS = tuple(field.attname for field in Event._meta.concrete_fields)


# --- the cut-off ------------------------------------------------------------------


def parse_cutoff(value: Any, now: datetime | None = None) -> datetime:
    """The instant runs must have finished before to be purged, in UTC.

    ``value`` is an ISO 8601 duration (``P30D``: finished more than 30 days
    before ``now``) or instant with a UTC offset, a ``timedelta`` or an aware
    ``datetime``. A negative duration, an instant after ``now`` (a mistyped
    year would purge everything; ``PT0S`` says "until now"), a naive instant
    and anything unparsable raise :class:`InvalidArgument`.
    """
    moment = timezone.now() if now is None else now
    if isinstance(value, str):
        text = value.strip()
        if text.upper().startswith(("P", "-P")):
            if text.startswith("-"):
                raise InvalidArgument(
                    f"{_shown(value)} is a negative duration; give how long finished runs are "
                    "kept, e.g. P30D"
                )
            try:
                value = parse_duration(text)
            except InvalidDuration as exc:
                raise InvalidArgument(str(exc)) from None
        else:
            try:
                value = datetime.fromisoformat(text)
            except ValueError:
                raise InvalidArgument(
                    f"{_shown(value)} is neither an ISO 8601 duration (P30D, PT12H) nor an "
                    "instant with a UTC offset (2026-01-31T00:00:00Z)"
                ) from None
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise InvalidArgument(f"{value} is a negative duration")
        try:
            return (moment - value).astimezone(UTC)
        except OverflowError:
            raise InvalidArgument(f"{value} before now is out of range") from None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidArgument(f"{value.isoformat()} has no UTC offset; add Z or +01:00")
        try:
            instant = value.astimezone(UTC)
        except OverflowError:  # 0001-01-01T00:00:00+14:00 is before the year 1 in UTC
            raise InvalidArgument(
                f"{value.isoformat()} is out of range: it falls outside the years 1-9999 in UTC"
            ) from None
        if instant > moment:
            raise InvalidArgument(
                f"{value.isoformat()} is in the future; to purge every run finished until now, "
                "give PT0S"
            )
        return instant
    raise InvalidArgument(
        f"{_shown(value)} is not a cut-off: give an ISO 8601 duration (P30D) or instant, "
        "a timedelta or an aware datetime"
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:76]}...{text[-1]}"


def retention_problem(value: Any) -> str | None:
    """Why ``value`` cannot be ``KUMIKO_WORKFLOWS["RETENTION"]``, or None."""
    if value is None:
        return None
    if isinstance(value, str) and not value.strip().upper().startswith(("P", "-P")):
        return f"must be an ISO 8601 duration such as 'P30D', got {_shown(value)}"
    if not isinstance(value, str | timedelta):
        return f"must be an ISO 8601 duration such as 'P30D' or a timedelta, got {_shown(value)}"
    try:
        parse_cutoff(value)
    except InvalidArgument as exc:
        return str(exc)
    return None


def default_retention() -> Any:
    """``KUMIKO_WORKFLOWS["RETENTION"]`` (None when unset)."""
    return workflow_settings.RETENTION


# --- the archive ------------------------------------------------------------------


class ArchiveError(InvalidArgument):
    """The archive file cannot be written."""


#: The bytes every gzip member starts with: magic and the deflate method.
_GZIP_HEADER = b"\x1f\x8b\x08"

#: How far from its end the archive is first searched for its last member.
_TAIL_WINDOW = 1 << 16


def _member_from(handle: BinaryIO, position: int) -> int | None:
    """Where the gzip member starting at ``position`` ends: None if it is no gzip member
    (a header's bytes inside compressed data), -1 if it is still whole at the end of the
    file but does not end there (torn)."""
    member = zlib.decompressobj(wbits=31)
    handle.seek(position)
    offset = position
    try:
        while chunk := handle.read(1 << 16):
            member.decompress(chunk)
            if member.eof:
                return offset + len(chunk) - len(member.unused_data)
            offset += len(chunk)
    except zlib.error:
        return None
    return -1


def _complete_length(handle: BinaryIO) -> tuple[int, bool]:
    """Bytes of whole gzip members at the start of the file, and whether that is all of it.

    Only the tail is read: gzip members have no index, so the last one is
    found by trying, from the end backwards, each place a member header
    could start; the first that decompresses whole to the end of the file
    is the last member, and what comes before it was checked by the purges
    that wrote it. (Decompressing every member before each purge took
    2.2 s for 2.4 GB of archive.) A member that ends before the end of the
    file is followed by a torn one, which the caller refuses. The window
    searched doubles until a member is found, so only a file whose last
    member is huge, or one that is no gzip file, is read further.
    """
    size = handle.seek(0, os.SEEK_END)
    if size == 0:
        return 0, True
    handle.seek(0)
    if handle.read(len(_GZIP_HEADER)) != _GZIP_HEADER:
        raise zlib.error("not a gzip file")
    window = _TAIL_WINDOW
    searched = size  # candidates at or after this were tried
    torn_from_start = False
    while True:
        start = max(0, size - window)
        handle.seek(start)
        # A header straddling the window's end was not seen last time.
        tail = handle.read(min(searched + len(_GZIP_HEADER), size) - start)
        at = len(tail)
        while (at := tail.rfind(_GZIP_HEADER, 0, at)) >= 0:
            position = start + at
            if position >= searched:
                continue
            end = _member_from(handle, position)
            if end == size:
                return size, True
            if end is not None and end >= 0:
                return end, False
            torn_from_start = position == 0 and end is not None
        if start == 0:
            if torn_from_start:  # one member, torn: none of it is complete
                return 0, False
            raise zlib.error("no complete gzip member")
        searched = start
        window *= 2


class Archive:
    """One file of gzip-compressed JSON lines, appended one member per batch.

    A new file is created readable by its owner only (0600); an existing one
    others may read is refused, not widened or tightened behind the
    operator's back. The path must name the file itself: a symbolic link
    (dangling or not) and anything but a regular file (a FIFO, a device, a
    folder) are refused.

    Opened before any SQL: a path that cannot be written, a file another
    purge is appending to, or one that ends in a torn member (a purge killed
    while writing) is refused then, not after the first batch. A write that
    fails (a full disk) takes its member out again and raises
    :class:`ArchiveError`; the batch is then rolled back, nothing of it
    deleted.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: BinaryIO = self._open()
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.close()
            raise ArchiveError(
                f"the archive {self.path} is in use by another purge; give each its own file"
            ) from None
        try:
            complete, whole = _complete_length(self._file)
        except zlib.error:
            self.close()
            raise ArchiveError(
                f"{self.path} is not a gzip file; give a new or a .gz file"
            ) from None
        if not whole:
            self.close()
            raise ArchiveError(
                f"the archive {self.path} ends in an incomplete gzip member (a purge stopped "
                f"while writing it); keep its complete part with `truncate -s {complete} "
                f"{self.path}`, or give another file"
            )
        self.events = 0

    def _open(self) -> BinaryIO:
        """The file, opened for appending: created (0600) if new, else checked.

        ``O_NOFOLLOW`` refuses a symbolic link, and ``O_NONBLOCK`` keeps a
        FIFO from blocking the open until it is refused.
        """
        flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        created = True
        try:
            try:
                # A new file is its owner's only: it holds step results as they were.
                descriptor = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                created = False
                descriptor = os.open(self.path, flags)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ArchiveError(
                    f"the archive {self.path} is a symbolic link; give the file itself"
                ) from None
            raise ArchiveError(f"cannot open the archive {self.path}: {exc.strerror}") from None
        problem = _not_private_file(os.fstat(descriptor))
        if problem:
            os.close(descriptor)
            raise ArchiveError(f"the archive {self.path} {problem}")
        if created:
            _fsync_directory(self.path.parent)
        # Unbuffered: a write that failed must leave nothing behind to flush later.
        return os.fdopen(descriptor, "rb+", buffering=0)

    def write(self, lines: Sequence[bytes]) -> None:
        """Append ``lines`` as one gzip member and flush it to disk (fsync)."""
        if not lines:
            return
        member = gzip.compress(b"".join(lines), compresslevel=6)
        self._file.seek(0, os.SEEK_END)
        start = self._file.tell()
        try:
            written = memoryview(member)
            while written:
                written = written[self._file.write(written) or 0 :]
            os.fsync(self._file.fileno())
        except BaseException as exc:
            # The batch rolls back: leave no half member behind it.
            with contextlib.suppress(OSError):
                self._file.truncate(start)
            if isinstance(exc, OSError):
                raise ArchiveError(
                    f"cannot write the archive {self.path}: {exc.strerror}; the batch was "
                    "rolled back, nothing of it deleted"
                ) from None
            raise
        self.events += len(lines)

    def close(self) -> None:
        self._file.close()


def _not_private_file(status: os.stat_result) -> str:
    """Why a file with ``status`` cannot hold the archive ('' if it can)."""
    if not stat.S_ISREG(status.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(status.st_mode)
            else "a device"
            if stat.S_ISCHR(status.st_mode) or stat.S_ISBLK(status.st_mode)
            else "a socket"
            if stat.S_ISSOCK(status.st_mode)
            else "not a file"
        )
        return f"is not a regular file ({kind}); give a file"
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077:
        return (
            f"can be read or written by others than its owner (mode {mode:04o}), and it "
            "holds step results; `chmod 600` it, or give a new file"
        )
    return ""


def _fsync_directory(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - a directory we just created a file in
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _json_line(row: Sequence[Any]) -> bytes:
    record = dict(zip(ARCHIVE_FIELDS, row, strict=True))
    record["aggregate_id"] = str(record["aggregate_id"])
    record["created_at"] = record["created_at"].isoformat()
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def read_archive(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every event in an archive, in the order written (what ``zcat PATH | jq`` shows)."""
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            yield json.loads(line)


# --- the purge --------------------------------------------------------------------


@dataclass
class PurgeReport:
    """What a purge removed (or, dry, would remove), per table."""

    cutoff: datetime
    dry_run: bool = False
    #: Runs matching the filters when the purge began (the progress total).
    total: int = 0
    runs: int = 0
    events: int = 0
    pending: int = 0
    wait_keys: int = 0
    wake_checks: int = 0
    tombstones: int = 0
    batches: int = 0
    #: Runs left for a later purge: a worker held a leftover pending row of
    #: theirs, or a run not finished was started by one of their events.
    passed_over: int = 0
    #: Runs asked for by id that were not purged, with why.
    refused: list[tuple[str, str]] = field(default_factory=list)
    #: Runs asked for by id that an earlier purge removed.
    already_purged: list[str] = field(default_factory=list)
    #: With run ids asked for: the runs purged, and why others were passed over.
    purged_ids: set[str] = field(default_factory=set, repr=False)
    passed: dict[str, str] = field(default_factory=dict, repr=False)

    def counts(self) -> dict[str, int]:
        return {
            "runs": self.runs,
            "events": self.events,
            "pending": self.pending,
            "wait_keys": self.wait_keys,
            "wake_checks": self.wake_checks,
            "tombstones": self.tombstones,
            "passed_over": self.passed_over,
        }

    def __str__(self) -> str:
        return " ".join(f"{name}={value}" for name, value in self.counts().items())


@dataclass
class _Filters:
    cutoff: datetime
    tenant_id: str | None
    workflow_name: str | None
    run_ids: list[uuid.UUID] | None


def _runs(filters: _Filters, tenant_id: str | None = None) -> Any:
    """The finished runs the purge may remove: settled before the cut-off, as filtered.

    ``updated_at`` equals ``finished_at`` on a finished run; the condition on
    it lets the ``(tenant_id, status, updated_at)`` index find them.
    """
    runs = WorkflowRun.objects.filter(
        status__in=SETTLED_STATUSES,
        updated_at__lt=filters.cutoff,
        finished_at__lt=filters.cutoff,
    )
    tenant = tenant_id if tenant_id is not None else filters.tenant_id
    if tenant is not None:
        runs = runs.filter(tenant_id=tenant)
    if filters.workflow_name is not None:
        runs = runs.filter(workflow_name=filters.workflow_name)
    if filters.run_ids is not None:
        runs = runs.filter(run_id__in=filters.run_ids)
    return runs


def _chunks(values: Sequence[Any], extra: int = 10) -> Iterator[Sequence[Any]]:
    """``values`` in pieces that fit one statement's parameters (SQLite: 999)."""
    size = max(1, (db.engine().features.max_query_params or 65_535) - extra)
    for start in range(0, len(values), size):
        yield values[start : start + size]


def _check_name(value: Any, what: str, column: str) -> None:
    if value is not None:
        problem = name_problem(value, column)
        if problem:
            raise InvalidArgument(f"{what} {problem}")


def _as_run_ids(values: Iterable[Any]) -> list[uuid.UUID]:
    ids = []
    for value in values:
        try:
            ids.append(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
        except ValueError:
            raise InvalidArgument(f"{value!r} is not a run id (a UUID)") from None
    return ids


def purge_runs(
    finished_before: Any,
    *,
    now: datetime | None = None,
    tenant_id: str | None = None,
    workflow_name: str | None = None,
    run_ids: Iterable[uuid.UUID | str] | None = None,
    batch_size: int = DEFAULT_BATCH,
    dry_run: bool = False,
    archive: str | os.PathLike[str] | None = None,
    progress: Callable[[PurgeReport], None] | None = None,
) -> PurgeReport:
    """Remove the runs that completed, failed or were cancelled before a cut-off.

    ``finished_before`` is what :func:`parse_cutoff` takes (``"P30D"``, an
    instant, a timedelta), counted back from ``now``. For each run: its
    ``workflow-run`` events, its ``WorkflowRun`` row, and any pending rows,
    wait keys and wake-up checks left with it; and a
    :class:`~kumiko_workflows.models.PurgedRun` tombstone. ``tenant_id``,
    ``workflow_name`` and ``run_ids`` narrow the runs; a run asked for by id
    that is not finished, finished after the cut-off or does not match the
    other filters is left alone and listed in ``report.refused``.

    Batches of ``batch_size`` runs, each its own transaction when called
    outside one (call it so: inside a transaction every lock is held to its
    end). ``dry_run`` only counts (an upper bound: runs a batch would pass
    over are counted too). ``archive`` names a file to append every removed
    event to first (see :class:`Archive`). ``progress`` is called with the
    report after each batch. Bad arguments raise :class:`InvalidArgument`
    before any SQL.
    """
    try:
        cutoff = parse_cutoff(finished_before, now)
    except InvalidArgument as exc:
        raise InvalidArgument(f"finished_before {exc}") from None
    _check_name(tenant_id, "tenant_id", "tenant_id")
    if workflow_name is not None and (not isinstance(workflow_name, str) or not workflow_name):
        raise InvalidArgument(f"workflow_name must be a non-empty string, got {workflow_name!r}")
    asked = None if run_ids is None else _as_run_ids(run_ids)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise InvalidArgument(f"batch_size must be a whole number, got {batch_size!r}")
    if not 1 <= batch_size <= MAX_BATCH:
        raise InvalidArgument(f"batch_size must be from 1 to {MAX_BATCH}, got {batch_size}")
    filters = _Filters(cutoff, tenant_id, workflow_name, asked)
    report = PurgeReport(cutoff=cutoff, dry_run=dry_run)
    writer = None if archive is None or dry_run else Archive(archive)
    try:
        if asked is not None:
            _explain_asked(filters, report)
        if dry_run:
            _count(filters, report)
            return report
        report.total = _runs(filters).count()
        tenants = [tenant_id] if tenant_id is not None else _tenants(filters)
        for tenant in tenants:
            _purge_tenant(filters, tenant, batch_size, writer, report, progress)
        if asked is not None:
            _explain_left(asked, report)
    finally:
        if writer is not None:
            writer.close()
    logger.info(
        "purged runs finished before %s: %s batches=%d", cutoff.isoformat(), report, report.batches
    )
    return report


def _tenants(filters: _Filters) -> list[str]:
    rows = _runs(filters).order_by("tenant_id").values_list("tenant_id", flat=True).distinct()
    return list(rows)


def _explain_asked(filters: _Filters, report: PurgeReport) -> None:
    """Say why each run asked for by id will not be purged (if it will not)."""
    assert filters.run_ids is not None
    found: dict[uuid.UUID, WorkflowRun] = {}
    for chunk in _chunks(filters.run_ids):
        found.update(WorkflowRun.objects.in_bulk(list(chunk)))
    missing = [run_id for run_id in filters.run_ids if run_id not in found]
    purged: set[uuid.UUID] = set()
    for chunk in _chunks(missing):
        tombstones = PurgedRun.objects.filter(run_id__in=chunk)
        if filters.tenant_id is not None:
            tombstones = tombstones.filter(tenant_id=filters.tenant_id)
        purged.update(tombstones.values_list("run_id", flat=True))
    for run_id in dict.fromkeys(filters.run_ids):
        run = found.get(run_id)
        why = None
        if run is None:
            if run_id in purged:
                report.already_purged.append(str(run_id))
            else:
                why = "no workflow run has this id"
        elif filters.tenant_id is not None and run.tenant_id != filters.tenant_id:
            why = "no workflow run has this id in this tenant"
        elif filters.workflow_name is not None and run.workflow_name != filters.workflow_name:
            why = f"it is a run of {run.workflow_name!r}, not of {filters.workflow_name!r}"
        elif run.status not in SETTLED_STATUSES:
            why = f"it is {run.status}, not finished"
        elif run.finished_at is None or run.finished_at >= filters.cutoff:
            finished = run.finished_at.isoformat() if run.finished_at else "?"
            why = f"it finished at {finished}, not before {filters.cutoff.isoformat()}"
        if why is not None:
            report.refused.append((str(run_id), why))


def _explain_left(asked: list[uuid.UUID], report: PurgeReport) -> None:
    """Say why a run asked for that looked purgeable was left after all."""
    settled = {run_id for run_id, _ in report.refused} | set(report.already_purged)
    settled |= report.purged_ids
    for run_id in dict.fromkeys(str(run_id) for run_id in asked):
        if run_id not in settled:
            why = report.passed.get(run_id, "another transaction was changing it; try again")
            report.refused.append((run_id, why))


def _count(filters: _Filters, report: PurgeReport) -> None:
    """Fill ``report`` with what a purge would remove now, changing nothing."""
    tenants = [filters.tenant_id] if filters.tenant_id is not None else _tenants(filters)
    for tenant in tenants:
        runs = _runs(filters, tenant)
        ids = runs.values("run_id")
        report.runs += runs.count()
        report.events += Event.objects.filter(
            tenant_id=tenant, aggregate_type=et.RUN_AGGREGATE_TYPE, aggregate_id__in=ids
        ).count()
        report.pending += WorkflowRunPending.objects.filter(
            tenant_id=tenant, run_id__in=ids
        ).count()
        report.wait_keys += WorkflowWaitKey.objects.filter(tenant_id=tenant, run_id__in=ids).count()
        report.wake_checks += WakeCheck.objects.filter(tenant_id=tenant, run_id__in=ids).count()
        versions = runs.order_by().values_list("workflow_name", "workflow_version").distinct()
        for name, version in versions:
            if keeps_key(name, version):
                report.tombstones += runs.filter(
                    workflow_name=name, workflow_version=version
                ).count()
    report.total = report.runs


def _hold_writes() -> None:
    """SQLite: take the write lock first, so the batch's reads cannot go stale under it.

    (PostgreSQL locks the rows the batch reads instead.)
    """
    if not db.overlapping_writers():
        statements.lock_projection_tables()


def _purge_tenant(
    filters: _Filters,
    tenant: str,
    batch_size: int,
    writer: Archive | None,
    report: PurgeReport,
    progress: Callable[[PurgeReport], None] | None,
) -> None:
    passed_over: set[uuid.UUID] = set()
    while True:
        with db.atomic():
            _hold_writes()
            runs = _runs(filters, tenant)
            if passed_over:
                runs = runs.exclude(run_id__in=list(passed_over))
            # SKIP LOCKED: a run another transaction is changing (a retry) is
            # not waited for; the status is read again under the lock.
            taken = {
                run_id: (name, version)
                for run_id, name, version in runs.select_for_update(skip_locked=True)
                .order_by()
                .values_list("run_id", "workflow_name", "workflow_version")[:batch_size]
            }
            if not taken:
                return
            purged, kept = _purge_batch(tenant, taken, writer, report)
        passed_over.update(kept)
        if filters.run_ids is not None:
            report.purged_ids.update(str(run_id) for run_id in purged)
            report.passed.update((str(run_id), why) for run_id, why in kept.items())
        report.batches += 1
        if progress is not None:
            progress(report)


def _purge_batch(
    tenant: str,
    taken: dict[uuid.UUID, tuple[str, int | None]],
    writer: Archive | None,
    report: PurgeReport,
) -> tuple[list[uuid.UUID], dict[uuid.UUID, str]]:
    """Remove the runs ``taken`` (locked, finished; with their workflow and version).

    Returns the runs removed, and those passed over instead with why.
    """
    kept = {**_busy(tenant, list(taken)), **_still_triggering(tenant, list(taken))}
    ids = [run_id for run_id in taken if run_id not in kept]
    report.passed_over += len(kept)
    if not ids:
        return ids, kept
    for chunk in _chunks(ids):
        where = {"tenant_id": tenant, "run_id__in": chunk}
        report.wait_keys += WorkflowWaitKey.objects.filter(**where).delete()[0]
        report.pending += WorkflowRunPending.objects.filter(**where).delete()[0]
        report.wake_checks += WakeCheck.objects.filter(**where).delete()[0]
    report.events += _delete_events(tenant, ids, writer)
    moment = timezone.now()
    tombstones = [
        PurgedRun(tenant_id=tenant, run_id=run_id, workflow_name=taken[run_id][0], purged_at=moment)
        for run_id in ids
        if keeps_key(*taken[run_id])
    ]
    PurgedRun.objects.bulk_create(tombstones, ignore_conflicts=True, batch_size=500)
    report.tombstones += len(tombstones)
    for chunk in _chunks(ids):
        # A task's attempts (kumiko_workflows.tasks) go with its run; not counted apart.
        TaskAttempt.objects.filter(tenant_id=tenant, run_id__in=chunk).delete()
        report.runs += WorkflowRun.objects.filter(tenant_id=tenant, run_id__in=chunk).delete()[0]
    return ids, kept


def _busy(tenant: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Runs of ``ids`` with a leftover pending row another transaction holds (a worker).

    Those rows are locked here (skipping held ones), so the delete below
    never waits for a worker that may be waiting for this batch's rows.
    """
    busy: dict[uuid.UUID, str] = {}
    for chunk in _chunks(ids):
        rows = WorkflowRunPending.objects.filter(tenant_id=tenant, run_id__in=chunk)
        found = dict(rows.values_list("pk", "run_id"))
        if not found or not db.overlapping_writers():
            continue
        locked = set(rows.select_for_update(skip_locked=True).values_list("pk", flat=True))
        for pk, run_id in found.items():
            if pk not in locked:
                busy[run_id] = "a worker is resuming a pending row left with it; try again"
    return busy


def _still_triggering(tenant: str, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Runs of ``ids`` one of whose events started a run that is not finished yet.

    A workflow triggered by a run event (say ``workflow.run-completed``)
    loads that event as ``ctx.event`` on every resume: purging it would fail
    the run with ``trigger_event_unavailable``. Asked of the status rows,
    not of the code: a run of an older version (whose trigger the newest
    may have dropped), or of a version no longer declared (rerun once it is
    declared again), keeps its trigger as any other.
    """
    kept: dict[uuid.UUID, str] = {}
    for chunk in _chunks(ids):
        events = dict(
            Event.objects.filter(
                tenant_id=tenant, aggregate_type=et.RUN_AGGREGATE_TYPE, aggregate_id__in=chunk
            ).values_list("id", "aggregate_id")
        )
        for part in _chunks(list(events)):
            used = (
                WorkflowRun.objects.filter(tenant_id=tenant, trigger_event_id__in=part)
                .exclude(status__in=SETTLED_STATUSES)
                .values_list("run_id", "trigger_event_id")
            )
            for user, event_id in used:
                if event_id is not None:
                    kept[events[event_id]] = f"run {user}, not finished, was started by its event"
    return kept


def _delete_events(tenant: str, ids: list[uuid.UUID], writer: Archive | None) -> int:
    """Delete the run streams of ``ids`` (archived first); return how many events went.

    Past the model's refusal, through :func:`kumiko_workflows.store.db.delete_run_streams`:
    the engine's run streams of one tenant, nothing else.
    """
    deleted = 0
    lines: list[bytes] = []
    for chunk in _chunks(ids):
        if writer is not None:
            rows = (
                Event.objects.filter(
                    tenant_id=tenant, aggregate_type=et.RUN_AGGREGATE_TYPE, aggregate_id__in=chunk
                )
                .order_by("id")
                .values_list(*ARCHIVE_FIELDS)
            )
            lines.extend(_json_line(row) for row in rows)
        deleted += statements.delete_run_streams(tenant, list(chunk))
    if writer is not None:
        if deleted != len(lines):
            # An event committed between the read and the delete would be
            # gone without a copy: take the batch back instead.
            raise RuntimeError(
                f"the batch deleted {deleted} events but archived {len(lines)}; rolled back"
            )
        writer.write(lines)
    return deleted
