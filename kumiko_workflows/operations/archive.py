"""The purge's archive: the events a purge deletes, as gzip-compressed JSON lines in one file.

One gzip member per batch, flushed to disk before the batch commits, so an
archive holds every event whose deletion committed: ``zcat PATH | jq`` reads
it, and so does :func:`read_archive`. A purge that was killed mid-member
leaves a torn tail, which the next purge appending to the file cuts off.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import json
import os
import stat
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from kumiko_workflows.exceptions import InvalidArgument
from kumiko_workflows.models import (
    Event,
)

#: The fields of an archived event, in the order each JSON line has them: every
#: column of the event table, as the model names them.
ARCHIVE_FIELDS = tuple(field.attname for field in Event._meta.concrete_fields)

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
