"""``python -m tests.support.skewed_clock SECONDS COMMAND [ARGS...]``: manage.py, clock off.

The clock is SECONDS off.

A process whose wall clock is wrong, for ``tests/multiprocess/test_health.py``: before
Django loads anything, ``django.utils.timezone.now`` (which Django's and the
engine's readings of the time all go through, the engine's clock
included) is made to return the real time plus SECONDS (negative: behind).
Then the management command runs as ``manage.py COMMAND ARGS...`` would.
"""

from __future__ import annotations

import sys
from datetime import timedelta

from django.utils import timezone

_offset = timedelta(seconds=float(sys.argv[1]))
_real_now = timezone.now
timezone.now = lambda: _real_now() + _offset

if __name__ == "__main__":
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[2:]])
