"""The purge's archive file: what it refuses, what it reads, and a disk that fills up.

Real files throughout: symbolic links, a FIFO (``os.mkfifo``), modes set with
``chmod``, and a full disk, both a tiny tmpfs mounted in a mount namespace of
the purging process (``unshare``, where the kernel allows it) and a file-size
limit (``RLIMIT_FSIZE``) the kernel enforces on the write.
"""

from __future__ import annotations

import gzip
import os
import resource
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from django.db import connection

from kumiko_workflows.operations.archive import ArchiveError
from kumiko_workflows.operations.purge import purge_runs
from tests.integration.test_purge import counts, start
from tests.support import REPO, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def finished():
    """Three failed (so finished) runs, ready to purge."""
    return [start("t.fail", "t-fail") for _ in range(3)]


def _private(path: Path, data: bytes = b"") -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def test_a_symbolic_link_is_refused_whether_it_points_at_a_file_or_nowhere(finished, tmp_path):
    before = counts()
    target = _private(tmp_path / "real.jsonl.gz")
    link = tmp_path / "link.jsonl.gz"
    link.symlink_to(target)
    with pytest.raises(ArchiveError, match=f"the archive {link} is a symbolic link"):
        purge_runs("PT0S", archive=link)
    assert target.read_bytes() == b""

    dangling = tmp_path / "dangling.jsonl.gz"
    dangling.symlink_to(tmp_path / "elsewhere.jsonl.gz")
    with pytest.raises(ArchiveError, match="is a symbolic link; give the file itself"):
        purge_runs("PT0S", archive=dangling)
    assert not (tmp_path / "elsewhere.jsonl.gz").exists()  # nothing created where it points
    assert counts() == before


def test_a_fifo_or_a_folder_is_refused_with_what_it_is(finished, tmp_path):
    fifo = tmp_path / "archive.fifo"
    os.mkfifo(fifo, 0o600)
    before = counts()
    with pytest.raises(ArchiveError) as refused:
        purge_runs("PT0S", archive=fifo)  # refused, not waited on for a reader
    assert str(refused.value) == f"the archive {fifo} is not a regular file (a FIFO); give a file"
    with pytest.raises(ArchiveError, match="cannot open the archive .*: Is a directory"):
        purge_runs("PT0S", archive=tmp_path)
    assert counts() == before


def test_an_existing_file_others_can_read_is_refused_and_left_as_it_is(finished, tmp_path):
    path = tmp_path / "purged.jsonl.gz"
    path.write_bytes(b"")
    path.chmod(0o644)
    before = counts()
    with pytest.raises(ArchiveError) as refused:
        purge_runs("PT0S", archive=path)
    assert "can be read or written by others than its owner (mode 0644)" in str(refused.value)
    assert "`chmod 600` it, or give a new file" in str(refused.value)
    assert path.stat().st_mode & 0o777 == 0o644  # not changed behind the operator's back
    assert counts() == before

    path.chmod(0o600)
    assert purge_runs("PT0S", archive=path).runs == 3
    assert path.stat().st_mode & 0o777 == 0o600


def test_only_the_archives_last_member_is_read_before_appending(finished, tmp_path):
    """Earlier members are not decompressed again at each purge: one damaged in the middle
    (the old check read every byte, and called the file "not a gzip file") goes unnoticed,
    while the end of the file is still checked whole."""
    first, last = gzip.compress(b'{"id": 1}\n'), gzip.compress(b'{"id": 3}\n')
    damaged = bytearray(gzip.compress(b'{"id": 2}\n' * 50))
    damaged[-8] ^= 0xFF  # its CRC
    path = _private(tmp_path / "purged.jsonl.gz", first + bytes(damaged) + last)

    report = purge_runs("PT0S", archive=path)

    assert report.runs == 3
    data = path.read_bytes()
    assert data.startswith(first + bytes(damaged) + last)
    appended = zlib.decompressobj(wbits=31)
    lines = appended.decompress(data[len(first) + len(damaged) + len(last) :]).splitlines()
    assert appended.eof and not appended.unused_data
    assert len(lines) == report.events

    # A torn end is still found, past members bigger than the first window searched.
    big = gzip.compress(os.urandom(200_000))
    torn = _private(tmp_path / "torn.jsonl.gz", first + big + gzip.compress(b"{}\n")[:12])
    with pytest.raises(ArchiveError, match=f"truncate -s {len(first) + len(big)} "):
        purge_runs("PT0S", archive=torn)
    # And a file whose only member is torn keeps nothing.
    _private(torn, gzip.compress(b"{}\n")[:12])
    with pytest.raises(ArchiveError, match="truncate -s 0 "):
        purge_runs("PT0S", archive=torn)


def test_a_large_archive_of_many_members_is_appended_to(finished, tmp_path):
    head = b"".join(gzip.compress(os.urandom(70_000)) for _ in range(3))
    path = _private(tmp_path / "purged.jsonl.gz", head)
    report = purge_runs("PT0S", archive=path)
    appended = zlib.decompressobj(wbits=31)
    lines = appended.decompress(path.read_bytes()[len(head) :]).splitlines()
    assert appended.eof and not appended.unused_data
    assert len(lines) == report.events


def _can_mount_in_a_namespace() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=16k tmpfs /tmp"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_in_a_namespace(), reason="needs unshare and user namespaces")
def test_a_full_disk_is_one_line_and_deletes_nothing(finished, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    archive = disk / "purged.jsonl.gz"
    before = counts()
    script = (
        f"mount -t tmpfs -o size=16k tmpfs {disk} && "
        f"(head -c 1000000 /dev/zero > {disk}/filler 2>/dev/null; true) && "
        f'exec "$0" -m django purge_workflow_runs --finished-before PT0S -v 0 --archive {archive}'
    )
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, sys.executable],
        env=subprocess_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines() == [
        f"CommandError: cannot write the archive {archive}: No space left on device; "
        "the batch was rolled back, nothing of it deleted"
    ]
    assert counts() == before


def test_a_write_the_kernel_refuses_is_the_documented_error_and_deletes_nothing(finished, tmp_path):
    """A file-size limit (``RLIMIT_FSIZE``) at the archive's current size: the kernel
    refuses the batch's member (EFBIG) as a full disk would (ENOSPC)."""
    # Bigger than any other file this process writes meanwhile (a SQLite database).
    database = str(connection.settings_dict["NAME"])
    others = os.path.getsize(database) if os.path.isfile(database) else 0
    path = _private(tmp_path / "purged.jsonl.gz", gzip.compress(os.urandom(others + (1 << 20))))
    size = path.stat().st_size
    before = counts()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a killing signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        with pytest.raises(ArchiveError) as refused:
            purge_runs("PT0S", archive=path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert str(refused.value) == (
        f"cannot write the archive {path}: File too large; "
        "the batch was rolled back, nothing of it deleted"
    )
    assert counts() == before
    assert path.stat().st_size == size  # no half member left behind
    assert purge_runs("PT0S", archive=path).runs == 3  # and the next purge goes on
