"""``resume_due_runs --loop --reload``: restart the worker when a watched file changes.

Beside ``runserver`` in development, a worker left running with the old code
resumes runs the new code started, and fails them. ``--reload`` uses
Django's autoreloader, the one ``runserver`` uses, with its parent/child
protocol: the process you start (:func:`supervise`) runs the worker again as
a child with ``RUN_MAIN=true`` while it exits 3, Django's "reload" code.

What differs from ``runserver`` is how the child stops. ``run_with_reloader``
runs the server in a daemon thread and exits the process from under it on a
change, which would kill a worker in the middle of a run; and its parent
kills the child on SIGTERM. Here the worker keeps the main thread (and its
signal handling), the reloader watches from a thread of its own, and a
change stops the loop as a first SIGTERM would: the current run finishes and
its batch commits, and only then does the child exit 3. The parent passes a
SIGTERM on to the child; a terminal's Ctrl-C reaches both, and the parent
leaves it to the child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.utils import autoreload

#: The exit code that asks the parent for a restart (Django's autoreloader's).
RELOAD_EXIT = 3


def in_child() -> bool:
    """Whether this process is the watched worker (started by :func:`supervise`)."""
    return os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true"


def supervise() -> int:
    """Run this command as a child until it exits other than 3; return its exit code."""
    arguments = autoreload.get_child_arguments()
    environment = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    child: subprocess.Popen[bytes] | None = None
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if signum == signal.SIGTERM and child is not None and child.poll() is None:
            child.send_signal(signum)  # the child finishes its run, then exits 0

    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.signal(signum, on_signal) for signum in signals}
    try:
        while True:
            child = subprocess.Popen(arguments, env=environment, close_fds=False)
            code = child.wait()
            if code != RELOAD_EXIT:
                return code
            if stopping:  # told to stop while the child was restarting
                return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def watch(changed: Callable[[str], None]) -> None:
    """Call ``changed(path)`` (from another thread) on the first change to a watched file.

    The files are those Django's autoreloader watches: every imported
    module's, and what ``autoreload_started`` receivers add. One change is
    enough: the reloader stops, and the worker is restarted by its parent.
    """
    reloader = autoreload.get_reloader()

    def on_change(sender: Any, file_path: Any, **kwargs: Any) -> bool:
        if sender is reloader:
            reloader.stop()
            changed(str(file_path))
        return True  # handled: not the autoreloader's own exit, which would end only its thread

    autoreload.file_changed.connect(on_change, weak=False)
    threading.Thread(
        target=reloader.run,
        args=(threading.main_thread(),),
        name="kumiko-reloader",
        daemon=True,
    ).start()
