"""A slow ``run_completed`` receiver that records each delivery in a file.

Connected in worker subprocesses that get ``KUMIKO_TEST_SIGNAL_LOG``. Each
call takes ``delay`` seconds, then appends one line ``delivery_id run_id pid``
with a single ``write`` on an ``O_APPEND`` file: committed on its own,
whatever happens to the database transaction or to the process afterwards.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from kumiko_workflows import signals


def connect(path: str, delay: float) -> None:
    def record(sender: Any, delivery_id: int, run_id: Any, **kwargs: Any) -> None:
        time.sleep(delay)  # the slow receiver a worker may be killed in
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{delivery_id} {run_id} {os.getpid()}\n".encode())
        finally:
            os.close(fd)

    signals.run_completed.connect(record, weak=False, dispatch_uid="testapp.signal_log")


def read(path: Path) -> list[tuple[int, str, int]]:
    """The recorded deliveries: (delivery_id, run_id, pid) per line, in order."""
    found = []
    for line in path.read_text().splitlines():
        delivery_id, run_id, pid = line.split()
        found.append((int(delivery_id), run_id, int(pid)))
    return found
