"""The bench's scratch database: created beside the configured one, migrated, dropped.

The bench never measures in the database its settings name. On PostgreSQL it
creates ``<name>_kbench_<token>`` on the same server; on SQLite it uses a
file in a temporary folder. Each measurement starts on an empty, freshly
migrated copy (``renew``), and the database is dropped at the end, failure
or not, so nothing needs deleting from the append-only event table.

The engine works on the ``default`` connection, so this process points that
connection at the scratch database while the bench runs and back afterwards,
as Django's test runner does with its test database. Worker processes are
told the name and point themselves at it before their first query.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from types import TracebackType

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection

#: Scratch databases are named ``<configured name>_kbench_<token>``.
MARKER = "_kbench_"


def use_database(name: str) -> None:
    """Point this process's ``default`` connection at database ``name`` (closing it first)."""
    connection.close()
    settings.DATABASES[connection.alias]["NAME"] = name
    connection.settings_dict["NAME"] = name


class ScratchDatabase:
    """One bench run's scratch database; a context manager that drops it on exit."""

    def __init__(self) -> None:
        self.vendor = connection.vendor
        self.configured = connection.settings_dict["NAME"]
        token = uuid.uuid4().hex[:10]
        self.folder: Path | None = None
        if self.vendor == "postgresql":
            # 63 bytes is PostgreSQL's limit for a name.
            self.name = f"{str(self.configured)[:40]}{MARKER}{token}"
        elif self.vendor == "sqlite":
            self.folder = Path(tempfile.mkdtemp(prefix="kumiko-bench-"))
            self.name = str(self.folder / f"kbench_{token}.sqlite3")
        else:
            raise CommandError(f"kumiko_bench runs on PostgreSQL or SQLite, not {self.vendor}")
        self.exists = False
        #: Citus: the worker nodes of the configured database, which the scratch
        #: database is created on too, and distributed over (see :meth:`renew`).
        self.citus_workers = self._citus_workers() if self.vendor == "postgresql" else []

    def __enter__(self) -> ScratchDatabase:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.drop()
        finally:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)

    def renew(self) -> None:
        """Drop the scratch database if there is one, create it empty, migrate it, use it."""
        self.drop()
        if self.vendor == "postgresql":
            self._server(f"CREATE DATABASE {connection.ops.quote_name(self.name)}")
        # Set before the first statement in it: a failed migrate still drops it.
        self.exists = True
        if self.citus_workers:
            self._citus_cluster()
        use_database(self.name)
        call_command("migrate", verbosity=0, interactive=False, run_syncdb=True)
        if self.citus_workers:
            call_command("distribute_workflow_tables", verbosity=0)

    def renew_from(self, template: str) -> None:
        """PostgreSQL: drop the scratch database, create it as a copy of database ``template``
        (its files copied, no statistics gathered), migrate it, use it."""
        self.drop()
        quoted = connection.ops.quote_name
        self._server(f"CREATE DATABASE {quoted(self.name)} TEMPLATE {quoted(template)}")
        self.exists = True
        use_database(self.name)
        call_command("migrate", verbosity=0, interactive=False, run_syncdb=True)

    def save_as(self, template: str, comment: str) -> None:
        """PostgreSQL: keep a copy of the scratch database as database ``template`` (replacing
        one of that name), with ``comment`` on it; the scratch database stays in use."""
        quoted = connection.ops.quote_name
        use_database(self.configured)
        self._server(f"DROP DATABASE IF EXISTS {quoted(template)} WITH (FORCE)")
        self._server(f"CREATE DATABASE {quoted(template)} TEMPLATE {quoted(self.name)}")
        with connection._nodb_cursor() as cursor:
            cursor.execute(f"COMMENT ON DATABASE {quoted(template)} IS %s", [comment])
        use_database(self.name)

    @staticmethod
    def comment_of(name: str) -> str | None:
        """The comment on database ``name``, or None if there is no such database."""
        with connection._nodb_cursor() as cursor:
            cursor.execute(
                "SELECT coalesce(shobj_description(oid, 'pg_database'), '') "
                "FROM pg_database WHERE datname = %s",
                [name],
            )
            row = cursor.fetchone()
        return None if row is None else str(row[0])

    def drop(self) -> None:
        """Point this process back at the configured database and drop the scratch one."""
        if not self.exists:
            return
        use_database(self.configured)
        self.exists = False
        if self.vendor == "postgresql":
            # FORCE: a worker killed a moment ago may not have closed its session yet.
            quoted = connection.ops.quote_name(self.name)
            self._server(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
            dropping = f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"
            for host, port in self.citus_workers:
                self._on_node(host, port, "postgres", dropping)
        else:
            for suffix in ("", "-journal", "-wal", "-shm"):
                Path(self.name + suffix).unlink(missing_ok=True)

    @staticmethod
    def _server(statement: str) -> None:
        # A session outside any database (Django's own test-database creation
        # uses the same one): CREATE/DROP DATABASE cannot run inside the one dropped.
        with connection._nodb_cursor() as cursor:
            cursor.execute(statement)

    # --- Citus: the scratch database on the coordinator and every worker ----------

    @staticmethod
    def _citus_workers() -> list[tuple[str, int]]:
        """The primary worker nodes of the configured database, if it is a Citus coordinator.

        None if that database does not exist (the bench needs only its server).
        """
        try:
            connection.ensure_connection()
        except DatabaseError:
            return []
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'")
            if cursor.fetchone() is None:
                return []
            cursor.execute(
                "SELECT nodename, nodeport FROM pg_dist_node "
                "WHERE groupid <> 0 AND noderole = 'primary' ORDER BY nodeport"
            )
            return [(str(host), int(port)) for host, port in cursor.fetchall()]

    def _citus_cluster(self) -> None:
        """Create the scratch database on each worker, with Citus everywhere, workers added."""
        quoted = connection.ops.quote_name(self.name)
        for host, port in self.citus_workers:
            self._on_node(host, port, "postgres", f"CREATE DATABASE {quoted}")
            self._on_node(host, port, self.name, "CREATE EXTENSION citus")
        settings_dict = connection.settings_dict
        host = str(settings_dict.get("HOST") or "127.0.0.1")
        port = int(settings_dict.get("PORT") or 5432)
        self._on_node(host, port, self.name, "CREATE EXTENSION citus")
        self._on_node(host, port, self.name, f"SELECT citus_set_coordinator_host('{host}', {port})")
        for worker_host, worker_port in self.citus_workers:
            self._on_node(
                host, port, self.name, f"SELECT citus_add_node('{worker_host}', {worker_port})"
            )

    @staticmethod
    def _on_node(host: str, port: int, dbname: str, statement: str) -> None:
        """Run one statement on a node of the cluster, in its own autocommit session."""
        import psycopg

        settings_dict = connection.settings_dict
        with psycopg.connect(
            host=host,
            port=port,
            dbname=dbname,
            user=settings_dict.get("USER") or None,
            password=settings_dict.get("PASSWORD") or None,
            autocommit=True,
        ) as conn:
            conn.execute(statement)
