"""The outbox: appends made inside a transaction on one of the site's own databases.

With the engine's tables on a database of their own
(``KUMIKO_WORKFLOWS["DATABASE"]``), no transaction spans the site's write and
the engine's append. So an append made inside a transaction on an alias of
``KUMIKO_WORKFLOWS["OUTBOX_DATABASES"]`` is written there instead, as an
:class:`~kumiko_workflows.models.OutboxEntry` in the caller's transaction:
it commits or rolls back with the caller's writes. After that commit it is
relayed: appended to the engine's database (projections, triggers, runs,
signals as for any append) and deleted from the outbox.

The relay is exactly once per row. Its ``relay_id`` is recorded
(:class:`~kumiko_workflows.models.RelayedAppend`) in the engine's transaction
of the append, so a relay that dies between the engine's commit and the
outbox row's deletion leaves a record that the next relay finds: it only
deletes the row. Rows are taken with ``FOR UPDATE SKIP LOCKED`` (SQLite:
relays of one file take turns on its write lock), so racing relays share
the rows out; only a stream's oldest row is ever taken, so one stream's
rows are appended in the order they were written.

The caller's process relays its rows once the caller's transaction has
committed (once the engine's has too, when one was open there); rows a
process left (it died right after the commit, or the engine's database
was down) are relayed by the next resume pass, oldest first.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Count, Exists, F, Min, OuterRef, Q
from django.db.models.functions import Now

from kumiko_workflows.conf import workflow_settings
from kumiko_workflows.exceptions import CrossDatabaseTransaction, OutboxNotMigrated
from kumiko_workflows.models import Event, OutboxEntry, RelayedAppend
from kumiko_workflows.store import db, statements

logger = logging.getLogger(__name__)

#: Rows one transaction of a relay takes at most (each the oldest of its stream).
RELAY_BATCH = 100
#: Rows one resume pass relays at most, over every outbox; the next pass takes more.
RELAYS_PER_PASS = 1000
#: Records of relayed rows older than this are checked against their outbox
#: and deleted once its row is gone (a relay killed before deleting them).
SWEEP_AFTER = timedelta(hours=1)
_SWEEP_LIMIT = 500
_ERROR_CHARS = 2000

_relaying: ContextVar[bool] = ContextVar("kumiko_workflows_relaying", default=False)

#: The event store's ``append_event``: the relay appends each row with it
#: (checked again, as a setting may have changed since), inside the relay's
#: transaction on the engine's database, where it appends directly.
Append = Callable[..., Event]


def aliases() -> tuple[str, ...]:
    """The aliases whose transactions an append joins through their outbox (the setting)."""
    value = workflow_settings.OUTBOX_DATABASES or ()
    if isinstance(value, str):
        return (value,)  # the system check (E055) says it should be a list
    return tuple(str(each) for each in value)


def relaying() -> bool:
    """Whether this thread is relaying: an append made now goes to the engine's database."""
    return _relaying.get()


@contextmanager
def _relaying_now() -> Iterator[None]:
    token = _relaying.set(True)
    try:
        yield
    finally:
        _relaying.reset(token)


def alias_for_append() -> str | None:
    """The alias whose outbox an append made now joins, or None (appended directly).

    The outbox of the one site alias with a transaction open, when it is
    listed. Raises :class:`CrossDatabaseTransaction` when transactions are
    open on several aliases besides the engine's and one of them is listed:
    the append could be atomic with one of them only. (An alias not listed
    is left to :func:`~kumiko_workflows.store.events.joins_callers_transaction`.)
    """
    listed = aliases()
    if not listed or relaying():
        return None
    elsewhere = db.transactions_elsewhere()
    chosen = [each for each in elsewhere if each in listed]
    if not chosen:
        return None
    if len(elsewhere) > 1:
        raise CrossDatabaseTransaction(
            f"append_event() was called inside transactions on the databases "
            f"{', '.join(map(repr, sorted(elsewhere)))} at once: an append can join one of them "
            f"only (through its outbox, KUMIKO_WORKFLOWS['OUTBOX_DATABASES']). Nothing was "
            f"written. Make the call inside a transaction on one of them"
        )
    return chosen[0]


def refusal_hint(alias: str) -> str:
    """The outbox's way out, for the refusal of an append in ``alias``'s transaction alone."""
    return (
        f"List {alias!r} in KUMIKO_WORKFLOWS['OUTBOX_DATABASES'] (and run manage.py migrate "
        f"--database {alias}) so that appends join its transactions through an outbox there. "
    )


def refuse_expected_version(alias: str, expected_version: int | None) -> None:
    """Refuse (:class:`CrossDatabaseTransaction`) an ``expected_version`` an outbox cannot check."""
    if expected_version is None:
        return
    raise CrossDatabaseTransaction(
        f"append_event() with expected_version={expected_version} was called inside a "
        f"transaction on database {alias!r}: the append goes to its outbox "
        f"(KUMIKO_WORKFLOWS['OUTBOX_DATABASES']) and reaches the engine's database only "
        f"after your commit, when the stream's version may have moved, so it cannot be "
        f"checked now. Nothing was written. Append without expected_version there, or make "
        f"the checked append outside that transaction"
    )


def enqueue(alias: str, event: Event, append: Append) -> uuid.UUID:
    """Write ``event`` (validated, unsaved) to ``alias``'s outbox in the caller's transaction.

    Its relay is registered for after the commit; returns its ``relay_id``.
    """
    _check_migrated(alias)
    relay_id = uuid.uuid4()
    OutboxEntry.objects.using(alias).create(
        relay_id=relay_id,
        tenant_id=event.tenant_id,
        aggregate_id=event.aggregate_id,
        aggregate_type=event.aggregate_type,
        type=event.type,
        event_version=event.event_version,
        payload=event.payload,
        metadata=event.metadata,
        created_by=event.created_by,
        created_at=event.created_at,
    )
    stream = (event.tenant_id, event.aggregate_id)
    if connections[alias].in_atomic_block:
        transaction.on_commit(lambda: _after_commit(alias, stream, append), using=alias)
    # (Under manual transaction management, with no atomic block, Django has no
    # after-commit callback: the next resume pass relays the row.)
    return relay_id


#: Aliases whose outbox table was found (looked for once per process and alias).
_migrated: set[str] = set()


def _check_migrated(alias: str) -> None:
    """Raise :class:`OutboxNotMigrated` if ``alias`` has no outbox table (a read, once).

    A failed insert would abort the caller's transaction on PostgreSQL.
    """
    if alias in _migrated:
        return
    if not statements.has_outbox_table(alias):
        raise OutboxNotMigrated(
            f"append_event() was called inside a transaction on database {alias!r}, which "
            f"KUMIKO_WORKFLOWS['OUTBOX_DATABASES'] lists, but {alias!r} has no outbox table "
            f"({OutboxEntry._meta.db_table}). Nothing was written. Run manage.py migrate "
            f"--database {alias} (and see system check kumiko_workflows.E057)"
        )
    _migrated.add(alias)


def _after_commit(alias: str, stream: tuple[str, uuid.UUID], append: Append) -> None:
    """The caller's transaction on ``alias`` committed: relay its stream's rows now.

    If a transaction is still open on the engine's alias (the caller's,
    around the one that committed), not before it commits: relayed inside
    it, the rows would be deleted from the outbox and their append rolled
    back with it. Should it roll back, the rows wait for the next pass.
    Never raises into the caller, whose transaction has committed.
    """
    if db.engine().in_atomic_block:
        db.on_commit(lambda: _after_commit(alias, stream, append))
        return
    try:
        relay(alias, append, streams=[stream])
    except Exception:
        logger.exception(
            "outbox=%s stream=%s: not relayed now; the next resume pass relays it",
            alias,
            stream[1],
        )


@dataclass
class RelayReport:
    """What a relay did: rows appended, rows found appended already, rows whose append raised."""

    relayed: int = 0
    repeated: int = 0
    failed: int = 0

    def add(self, other: RelayReport) -> None:
        self.relayed += other.relayed
        self.repeated += other.repeated
        self.failed += other.failed

    @property
    def taken(self) -> int:
        return self.relayed + self.repeated + self.failed


def relay(
    alias: str,
    append: Append,
    *,
    streams: Sequence[tuple[str, uuid.UUID]] | None = None,
    tenants: Sequence[str] | None = None,
    limit: int | None = None,
) -> RelayReport:
    """Relay ``alias``'s outbox (of ``streams``, of ``tenants``, or all), oldest first.

    In one transaction on ``alias``, each round takes the oldest row of
    each stream that no other relay holds (up to :data:`RELAY_BATCH`),
    appends them in one transaction on the engine's database (each in a
    savepoint, its ``relay_id`` recorded with it), and deletes them; then
    the next round, until none is left; then the commit. A row whose
    append raises stays, its ``attempts`` and ``last_error`` noted, and
    holds back its stream's later rows; after
    ``MAX_RESUME_ERRORS`` of them it is no longer tried (``workflow_status``
    shows it). A database error (the engine's down) rolls the round back
    and propagates: the rows wait.
    """
    report = RelayReport()
    tried: set[int] = set()  # rows that raised in this relay: not again in it
    relayed: list[uuid.UUID] = []
    # One transaction here for every round: a round's rows, deleted in it, make
    # their streams' next rows the oldest for the next round. (A relay killed
    # before its commit leaves them all, each with its record: appended once.)
    with transaction.atomic(using=alias):
        statements.take_outbox_lock(alias)
        rows = OutboxEntry.objects.using(alias)
        while limit is None or report.taken < limit:
            size = RELAY_BATCH if limit is None else min(RELAY_BATCH, limit - report.taken)
            heads = list(_heads(alias, streams, tenants, tried)[:size])
            if not heads:
                break
            done, failed = _append_all(alias, heads, append, report)
            if done:
                rows.filter(id__in=[entry.id for entry in done]).delete()
                relayed.extend(entry.relay_id for entry in done)
            for entry, error in failed:
                rows.filter(id=entry.id).update(attempts=F("attempts") + 1, last_error=error)
                tried.add(entry.id)
    # The outbox rows are gone: their records are needed no more (a relay
    # killed before this leaves them to the sweep).
    if relayed:
        statements.forget_relays(relayed)
    return report


def _heads(
    alias: str,
    streams: Sequence[tuple[str, uuid.UUID]] | None,
    tenants: Sequence[str] | None,
    tried: set[int],
) -> Any:
    """The outbox rows a relay may take now: each the oldest of its stream, free, not held."""
    rows = OutboxEntry.objects.using(alias)
    older = rows.filter(
        tenant_id=OuterRef("tenant_id"),
        aggregate_id=OuterRef("aggregate_id"),
        id__lt=OuterRef("id"),
    )
    query = rows.filter(~Exists(older), attempts__lt=_max_attempts())
    if streams is not None:
        wanted = Q()
        for tenant, aggregate in streams:
            wanted |= Q(tenant_id=tenant, aggregate_id=aggregate)
        query = query.filter(wanted)
    if tenants is not None:
        query = query.filter(tenant_id__in=list(tenants))
    if tried:
        query = query.exclude(id__in=tried)
    return query.select_for_update(skip_locked=True, of=("self",)).order_by("id")


def _max_attempts() -> int:
    return int(workflow_settings.MAX_RESUME_ERRORS)


def _append_all(
    alias: str, heads: list[OutboxEntry], append: Append, report: RelayReport
) -> tuple[list[OutboxEntry], list[tuple[OutboxEntry, str]]]:
    """Append ``heads`` in one transaction on the engine's database: (done, failed with why).

    Each row in a savepoint of its own, so that one that raises leaves the
    others appended; a lone row's transaction is its savepoint.
    """
    isolated = len(heads) > 1
    done: list[OutboxEntry] = []
    failed: list[tuple[OutboxEntry, str]] = []
    counts = RelayReport()
    try:
        with db.atomic(), _relaying_now():
            for entry in heads:
                try:
                    with db.atomic() if isolated else nullcontext():
                        # False: appended by a relay that died before deleting the row.
                        fresh = statements.record_relay(entry.relay_id, alias)
                        if fresh:
                            _append_entry(append, entry)
                except Exception as exc:
                    if not isolated or db.connection_broken():
                        raise
                    failed.append((entry, _failure(alias, entry, exc)))
                else:
                    done.append(entry)
                    counts.relayed += fresh
                    counts.repeated += not fresh
    except Exception as exc:
        if isolated or db.connection_broken():
            raise
        done, failed, counts = [], [(heads[0], _failure(alias, heads[0], exc))], RelayReport()
    counts.failed = len(failed)
    report.add(counts)
    return done, failed


def _append_entry(append: Append, entry: OutboxEntry) -> Event:
    """Append the outbox row ``entry`` as it was asked for (``savepoint``: the relay's own)."""
    return append(
        entry.aggregate_id,
        entry.aggregate_type,
        entry.type,
        entry.payload,
        entry.tenant_id,
        None,
        entry.metadata,
        entry.created_by,
        event_version=entry.event_version,
        created_at=entry.created_at,
        savepoint=False,
    )


def _failure(alias: str, entry: OutboxEntry, exc: Exception) -> str:
    """Log the failed relay of ``entry``; the error as noted on its row."""
    logger.error(
        "outbox=%s relay=%s stream=%s: the append raised %s; the row stays (attempt %s of %s) "
        "and holds back its stream's later rows",
        alias,
        entry.relay_id,
        entry.aggregate_id,
        type(exc).__name__,
        entry.attempts + 1,
        _max_attempts(),
        exc_info=exc,
    )
    return f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]


def relay_leftovers(
    append: Append, *, tenants: Sequence[str] | None = None, limit: int = RELAYS_PER_PASS
) -> RelayReport:
    """Relay what processes left in every outbox (a resume pass's first work).

    Nothing inside a transaction on the engine's alias (a rehearsal's: the
    outbox rows would be deleted and their appends rolled back) or on the
    outbox's own. Then sweeps the records of rows relayed long ago.
    """
    report = RelayReport()
    if db.engine().in_atomic_block:
        return report
    for alias in aliases():
        if alias not in connections.settings or connections[alias].in_atomic_block:
            continue
        report.add(relay(alias, append, tenants=tenants, limit=max(limit - report.taken, 0)))
        if report.taken >= limit:
            break
    sweep()
    return report


def sweep() -> int:
    """Delete records of relayed rows whose outbox row is gone, once they are old; how many."""
    old = list(
        RelayedAppend.objects.filter(relayed_at__lt=Now() - SWEEP_AFTER).values_list(
            "relay_id", "source"
        )[:_SWEEP_LIMIT]
    )
    by_source: dict[str, list[uuid.UUID]] = {}
    for relay_id, source in old:
        by_source.setdefault(source, []).append(relay_id)
    gone: list[uuid.UUID] = []
    for source, relay_ids in by_source.items():
        if source in connections.settings:
            kept = set(
                OutboxEntry.objects.using(source)
                .filter(relay_id__in=relay_ids)
                .values_list("relay_id", flat=True)
            )
            gone.extend(each for each in relay_ids if each not in kept)
        else:
            gone.extend(relay_ids)  # the alias is gone, and its outbox with it
    if gone:
        RelayedAppend.objects.filter(relay_id__in=gone).delete()
    return len(gone)


def backlog(alias: str, tenant: str | None = None) -> dict[str, Any]:
    """``alias``'s outbox (of ``tenant``, or all): rows waiting, rows held, the oldest's age.

    ``waiting`` counts every row not relayed yet, ``held`` those no longer
    tried after failing ``MAX_RESUME_ERRORS`` relays; ``oldest_seconds`` is
    the age of the oldest row, read on that database's clock (the one the
    rows were written with); ``last_error`` the error of the oldest row
    whose relay raised.
    """
    rows = OutboxEntry.objects.using(alias)
    if tenant is not None:
        rows = rows.filter(tenant_id=tenant)
    counts = rows.aggregate(
        waiting=Count("id"),
        held=Count("id", filter=Q(attempts__gte=_max_attempts())),
        oldest=Min("enqueued_at"),
    )
    oldest = counts.pop("oldest")
    age = None
    if oldest is not None:
        age = round(max((db.database_now(alias) - oldest).total_seconds(), 0.0), 3)
    error = rows.filter(attempts__gt=0).order_by("id").values_list("last_error", flat=True).first()
    return {**counts, "oldest_seconds": age, "last_error": error}
