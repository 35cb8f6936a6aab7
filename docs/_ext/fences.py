"""A Sphinx extension that refuses a page whose code fence is never closed.

MyST, like CommonMark, lets an unclosed fence run silently to the end of the
page, and a fence left open before another one swallows the headings and
prose up to that one's closing line (how "Health checks for orchestrators"
once rendered inside a shell block of the README). So each page is read
here before MyST parses it, and each such fence is reported as a warning,
which ``sphinx-build -W`` turns into a failed build. ``tests/acceptance/test_docs.py``
runs :func:`unclosed_fences` on the README too.
"""

from __future__ import annotations

import re
from typing import Any

from sphinx.util import logging

logger = logging.getLogger(__name__)

# A fence line: up to the margin of a list item, three or more backticks or
# tildes, then an info string (an opening fence) or nothing (either).
FENCE = re.compile(r"^\s*(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s][^`]*)?$")


def unclosed_fences(text: str) -> list[str]:
    """What is wrong with the page's code fences, one message each; empty when all close.

    A fence is closed by a bare fence line of its own character at least as
    long. Inside one, a line that would open another fence as long (a
    fence with an info string, such as ```` ```yaml ````) means the first was
    left open: a block meant to contain fences uses a longer fence around them.
    """
    problems = []
    opened: tuple[int, str] | None = None  # (line, fence)
    for number, line in enumerate(text.splitlines(), start=1):
        found = FENCE.match(line)
        if not found:
            continue
        fence, info = found["fence"], found["info"]
        if opened is None:
            opened = (number, fence)
            continue
        start, outer = opened
        if fence[0] != outer[0] or len(fence) < len(outer):
            continue  # the block's own text
        if info is None:
            opened = None
        else:
            problems.append(
                f"the code fence opened on line {start} is not closed before another "
                f"opens on line {number} ({line.strip()!r}): close it with {outer}"
            )
            opened = (number, fence)
    if opened is not None:
        problems.append(f"the code fence opened on line {opened[0]} is never closed")
    return problems


def _check(app: Any, docname: str, source: list[str]) -> None:
    for problem in unclosed_fences(source[0]):
        logger.warning(problem, location=docname, type="fences", subtype="unclosed")


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _check)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
