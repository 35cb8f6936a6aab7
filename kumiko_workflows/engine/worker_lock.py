"""The one-worker lock on SQLite: an OS lock on a file beside the database.

SQLite lets one transaction write at a time: a second worker is refused at
once (:class:`~kumiko_workflows.exceptions.WorkerAlreadyRunning`) instead of
failing its runs with "database is locked".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock (nor signals, nor select)
    fcntl = None  # type: ignore[assignment]


from kumiko_workflows.exceptions import WorkerAlreadyRunning
from kumiko_workflows.store import db

logger = logging.getLogger(__name__)


#: The lock file beside a SQLite database: ``<database file>`` + this.
LOCK_SUFFIX = ".kumiko-worker.lock"


class WorkerLock:
    """An exclusive OS lock (``flock``) on ``path``, naming the holder's pid.

    The kernel drops the lock when its holder exits, however it exits, so a
    killed worker leaves no stale lock: the file stays, and only the lock on
    it counts (the file is never deleted, which would let two processes lock
    two files of one name).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`WorkerAlreadyRunning` naming the holder."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            database = self.path.removesuffix(LOCK_SUFFIX)
            raise WorkerAlreadyRunning(
                f"another resume worker (pid {holder}) is running on the SQLite database "
                f"{database}; SQLite allows one at a time: stop it first, or use PostgreSQL "
                "for several workers"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # no pid of a worker that is gone
            os.close(self.fd)  # (which drops the lock)
            self.fd = None


@contextmanager
def exclusive() -> Iterator[None]:
    """Hold the SQLite database's worker lock for the block (nothing where writers overlap)."""
    path = None if db.overlapping_writers() or fcntl is None else db.database_file()
    if path is None:
        yield
        return
    lock = WorkerLock(path + LOCK_SUFFIX)
    try:
        lock.acquire()
    except FileNotFoundError:
        pass  # no folder, so no database either: its own error says so, on first use
    except PermissionError as exc:
        logger.warning("cannot lock %s (%s); not checking for another worker", lock.path, exc)
    try:
        yield
    finally:
        lock.release()
