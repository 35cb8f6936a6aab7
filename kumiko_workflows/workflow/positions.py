"""Step positions (``"2.then.0"``): parsing and ordering them, and what a run at one has reached."""

from __future__ import annotations

from typing import Any


def parse_path(text: str) -> tuple[Any, ...]:
    """``"2.then.0"`` -> ``(2, "then", 0)``; raises ValueError on malformed text."""
    if not text:
        return ()
    parts: list[Any] = []
    for i, part in enumerate(text.split(".")):
        if i % 2 == 0:
            if not part.isdigit():
                raise ValueError(f"step position {text!r} is malformed")
            parts.append(int(part))
        else:
            if not part.isidentifier():  # an arm's name; the workflow knows which exist
                raise ValueError(f"step position {text!r} is malformed")
            parts.append(part)
    return tuple(parts)


def reached(path: str, position: str) -> bool:
    """Whether a run at step ``position`` has run (or waits at) the step at ``path``.

    True for the steps before it in its own list and in each list around it
    (with every step nested in them: which arm of an earlier branch ran is
    not recorded), for the steps it is nested in, and for the step itself
    with what it holds. False for the steps after it and for the other arm
    of a branch it is inside.
    """
    try:
        step, here = parse_path(path), parse_path(position)
    except ValueError:
        return True  # not a position: count it as met, the safe side
    for depth, (mine, theirs) in enumerate(zip(step, here, strict=False)):
        if mine != theirs:
            # Two indexes in one list: an earlier step was run. Two arm names:
            # the other arm of a branch the run is inside.
            return depth % 2 == 0 and mine < theirs
    return True  # one holds the other, or both are the same step


def reach_text(path: str, position: str) -> str:
    """How the step at ``path`` stands to a run at ``position``, for messages."""
    if path == position:
        return "(where the run waits)"
    if position.startswith(path + "."):
        return f"(which holds step {position}, where the run waits)"
    if path.startswith(position + "."):
        return f"(inside step {position}, where the run waits)"
    return f"(before step {position}, where the run waits)"


def _path_sort_key(path: str) -> tuple[Any, ...]:
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in _safe_parse(path))


def _safe_parse(path: str) -> tuple[Any, ...]:
    try:
        return parse_path(path)
    except ValueError:
        return (10**9, path)
