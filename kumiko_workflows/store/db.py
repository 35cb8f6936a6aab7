"""The engine's database connection: its alias, transactions, clock and the vendors' differences.

The engine's tables live on the database alias ``KUMIKO_WORKFLOWS["DATABASE"]``
(default ``"default"``): :func:`engine` is its connection and :func:`atomic`
its transactions; the ORM reaches it through
:class:`kumiko_workflows.routers.WorkflowsRouter`. Capability flags stand for
the databases' differences, so engine code asks "can writers overlap?"
instead of naming a vendor.

The statements the ORM cannot say well are beside it:
:mod:`~kumiko_workflows.store.statement_cache` (each built once per shape),
:mod:`~kumiko_workflows.store.cursors` (the hot statements' cursor),
:mod:`~kumiko_workflows.store.appends`, :mod:`~kumiko_workflows.store.claims`
and :mod:`~kumiko_workflows.store.statements`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from django.core.signals import setting_changed
from django.db import DatabaseError, InterfaceError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.dispatch import receiver

from kumiko_workflows.conf import workflow_settings

#: Errors that mean "the database is unreachable or the connection broke".
CONNECTION_ERRORS = (DatabaseError, InterfaceError)

_alias: str | None = None


def alias() -> str:
    """The database alias the engine's tables live on (``KUMIKO_WORKFLOWS["DATABASE"]``).

    Read once and again whenever the settings change (``setting_changed``,
    as ``override_settings`` sends): every statement asks for it.
    """
    global _alias
    if _alias is None:
        _alias = str(workflow_settings.DATABASE)
    return _alias


#: Bumped when the settings change, so that kept cursors are made again (see
#: :func:`kumiko_workflows.store.cursors._kept_cursor`).
_settings_generation = 0


@receiver(setting_changed)
def _forget(setting: str, **kwargs: Any) -> None:
    global _alias, _settings_generation
    if setting in ("KUMIKO_WORKFLOWS", "DATABASES"):
        _alias = None
        _settings_generation += 1


def settings_generation() -> int:
    """How many times the settings have changed in this process (kept cursors are made again)."""
    return _settings_generation


def engine() -> BaseDatabaseWrapper:
    """The engine's connection (this thread's, for :func:`alias`)."""
    pinned = _pinned.get()
    return pinned if pinned is not None else connections[alias()]


#: The engine's connection while a worker batch runs (see :func:`pinned`).
_pinned: ContextVar[BaseDatabaseWrapper | None] = ContextVar("kumiko_engine", default=None)


@contextmanager
def pinned() -> Iterator[BaseDatabaseWrapper]:
    """Around a worker batch: :func:`engine` answers with this connection, looked up once.

    The batch's transaction is on it, so it cannot change in the batch;
    asked several times a run, Django's connection handler costs a look-up
    in its context-local storage each time.
    """
    conn = connections[alias()]
    token = _pinned.set(conn)
    try:
        yield conn
    finally:
        _pinned.reset(token)


def atomic(*, savepoint: bool = True) -> transaction.Atomic:
    """A transaction (or savepoint) on the engine's database."""
    return transaction.atomic(using=alias(), savepoint=savepoint)


def on_commit(func: Callable[[], Any], *, robust: bool = False) -> None:
    """Run ``func`` once the engine's current transaction commits."""
    transaction.on_commit(func, using=alias(), robust=robust)


def _in_transaction(conn: BaseDatabaseWrapper) -> bool:
    """Whether ``conn`` has a transaction open (an atomic block, or autocommit turned off)."""
    return conn.in_atomic_block or (conn.connection is not None and not conn.autocommit)


def foreign_transaction() -> str | None:
    """The alias of another database with a transaction open here, if the engine's has none.

    A write of the engine's made then would commit at once, outside that
    transaction: the caller would have a transaction the engine's writes are
    not part of. Reads only this thread's connection state (no SQL), and
    only connections this thread has opened: another cannot be in a
    transaction.
    """
    if len(connections.settings) == 1:
        return None  # one database: every transaction is the engine's (asked on every append)
    own = engine()
    if _in_transaction(own):
        return None
    for conn in connections.all(initialized_only=True):
        if conn.alias != own.alias and _in_transaction(conn):
            return str(conn.alias)
    return None


def transactions_elsewhere() -> list[str]:
    """The aliases other than the engine's with a transaction open in this thread (no SQL).

    Whatever the engine's own connection is doing: the outbox joins such a
    transaction (:mod:`kumiko_workflows.store.outbox`).
    """
    if len(connections.settings) == 1:
        return []
    own = alias()
    return [
        str(conn.alias)
        for conn in connections.all(initialized_only=True)
        if conn.alias != own and _in_transaction(conn)
    ]


def set_rollback(rollback: bool) -> None:
    transaction.set_rollback(rollback, using=alias())


def overlapping_writers() -> bool:
    """Whether two transactions can write at once (PostgreSQL), or one at a time (SQLite).

    With one writer at a time, a transaction sees every committed row and no
    other write can be in flight: a wake-up decided inside it is final.
    """
    return engine().vendor != "sqlite"


def can_listen() -> bool:
    """Whether a worker can LISTEN for rows that become due (PostgreSQL's NOTIFY)."""
    return engine().vendor == "postgresql"


def database_file() -> str | None:
    """The file the engine's database is, if one file on this host holds it (SQLite).

    None for a server (PostgreSQL) and for an in-memory SQLite database,
    which no other process can open.
    """
    db = engine()
    if db.vendor != "sqlite" or db.is_in_memory_db():  # type: ignore[attr-defined]
        return None
    name = str(db.settings_dict["NAME"])
    if name.startswith("file:"):  # a URI filename (OPTIONS "uri": True)
        name = name.removeprefix("file:").split("?", 1)[0]
    return os.path.abspath(name)


def database_description() -> str:
    """The engine's database for a worker's start line: alias, vendor, where.

    Never a user or a password: the line goes to logs others read.
    """
    db = engine()
    settings = db.settings_dict
    if db.vendor == "sqlite":
        where = f"file={database_file() or 'memory'}"
    else:
        host = settings.get("HOST") or "local socket"
        port = settings.get("PORT")
        where = f"name={settings.get('NAME')} host={host}{f':{port}' if port else ''}"
    return f"database={alias()} vendor={db.vendor} {where}"


def has_payload_containment() -> bool:
    """Whether ``payload @> {...}`` is served by an index (PostgreSQL's GIN)."""
    return engine().vendor == "postgresql"


def chains_writes() -> bool:
    """Whether one statement can chain writes (a data-modifying ``WITH``: PostgreSQL)."""
    return engine().vendor == "postgresql"


#: The notifications a :func:`notifying_once` block gathered, in order (None: not in one).
_gathered: ContextVar[dict[tuple[str, str], None] | None] = ContextVar(
    "kumiko_notify_once", default=None
)


def notify(channel: str, payload: str) -> None:
    """``NOTIFY channel`` at commit where the database has it (PostgreSQL); else nothing.

    Inside :func:`notifying_once`, at the block's end instead, once per
    channel and payload.
    """
    conn = engine()
    if conn.vendor != "postgresql":
        return
    gathered = _gathered.get()
    if gathered is not None:
        gathered[(channel, payload)] = None
        return
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])


@contextmanager
def notifying_once() -> Iterator[None]:
    """Send each notification the block asks for once, at its end, in its transaction.

    PostgreSQL delivers a transaction's identical notifications once at its
    commit anyway; this saves the statement per repeat (a fan-out queues
    thousands of children, each of which asks). Nothing is sent when the
    block raises: its writes are being taken back. Nested, the outermost
    block sends.
    """
    if _gathered.get() is not None:
        yield
        return
    gathered: dict[tuple[str, str], None] = {}
    token = _gathered.set(gathered)
    try:
        yield
    finally:
        _gathered.reset(token)
    for channel, payload in gathered:
        notify(channel, payload)


def listen(channel: str) -> Any:
    """A new autocommit connection (psycopg) LISTENing on ``channel`` (PostgreSQL only)."""
    import psycopg  # only PostgreSQL deployments have it
    from psycopg import sql

    conn = engine()
    conn.ensure_connection()
    params = conn.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    listener = psycopg.connect(**params, autocommit=True)
    listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    return listener


def lock_name(name: str) -> None:
    """Hold a lock named ``name`` until the transaction ends (PostgreSQL; SQLite has one writer).

    A transaction-scoped advisory lock: what serialises the triggers of one
    gate (:mod:`kumiko_workflows.engine.gates`), so each decides on the
    gate as the one before it left it. Nothing else waits for it.
    """
    conn = engine()
    if conn.vendor != "postgresql":
        return
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [name])


#: The database's clock, as Django's ``Now()`` reads it (the statement's
#: instant on PostgreSQL, not the transaction's; UTC text to the millisecond
#: on SQLite): what heartbeats, signal leases and registered definitions are
#: written with, and what :func:`database_now` reads.
_NOW_SQL = {
    "postgresql": "STATEMENT_TIMESTAMP()",
    "sqlite": "STRFTIME('%Y-%m-%d %H:%M:%f', 'now')",
}


def _now_sql(conn: BaseDatabaseWrapper, *, with_params: bool) -> str:
    """The clock's SQL expression for ``conn`` (``%`` doubled in a statement with parameters)."""
    sql = _NOW_SQL.get(conn.vendor, "CURRENT_TIMESTAMP")
    return sql.replace("%", "%%") if with_params else sql


def database_now(using: str | None = None) -> datetime:
    """The engine's database's clock now: the one clock of instants other processes wrote.

    Workers write their heartbeats with ``Now()`` (this clock), and their
    age is judged on it too, so no process's own clock, however far it is
    off, makes a dead worker look alive or a live one dead. ``using`` reads
    another alias's clock instead (an outbox's rows are written on it).
    """
    conn = engine() if using is None else connections[using]
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT {_now_sql(conn, with_params=False)}")
        (value,) = cursor.fetchone()
    if isinstance(value, str):  # SQLite: UTC as text
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    instant: datetime = value.astimezone(UTC)
    return instant


def connection_broken() -> bool:
    """Whether the engine's database connection itself is gone (not just a failed statement)."""
    raw = engine().connection
    return raw is None or bool(getattr(raw, "closed", False))


def gather_on_commit(name: str, item: Any, decide: Callable[[list[Any]], Any]) -> None:
    """Add ``item`` to the current transaction's list ``name``; at commit, ``decide(list)`` once.

    For work after commit that is cheaper taken together (one statement for
    a transaction's many appends) than one by one. Each item registers a
    callback of its own, so a savepoint rolled back takes none of the
    others' away; the first to run takes the whole list. An item whose
    savepoint was rolled back may still be in it: ``decide`` must take
    items whose rows are gone as a no-op. A list left by a transaction
    that rolled back is dropped when the next one gathers.
    """
    conn = engine()
    lists: dict[str, list[Any]] = conn.__dict__.setdefault("_kumiko_gathered", {})
    if not conn.run_on_commit:
        lists.clear()  # nothing pending at commit: what is gathered was rolled back
    items = lists.setdefault(name, [])
    items.append(item)

    def run() -> None:
        taken = lists.pop(name, None)
        if taken:
            decide(taken)

    transaction.on_commit(run, using=conn.alias, robust=True)
