"""Match expressions: which awaited event a ``wait_for_event`` step accepts.

An expression is stored as JSON: ``{"version": 1, "expr": E}`` where ``E`` is
``{"kind": "and"|"or", "nodes": [E, ...]}`` or
``{"kind": "atom", "path": [key, ...], "op": OP}`` and ``OP`` is
``{"kind": "eq"|"ne"|"gt"|"gte"|"lt"|"lte", "value": v}`` or
``{"kind": "in", "values": [...]}``. :func:`validate` raises
:class:`InvalidMatchExpression` naming what is wrong and where;
:func:`matches` never raises for any payload.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kumiko_workflows.exceptions import InvalidMatchExpression

COMPARE_OPS = frozenset({"eq", "ne", "gt", "gte", "lt", "lte"})
ORDERED_OPS = frozenset({"gt", "gte", "lt", "lte"})
MAX_DEPTH = 16
MAX_NODES = 256
MAX_PATH = 16
MAX_BYTES = 64 * 1024


def _fail(where: str, message: str) -> InvalidMatchExpression:
    return InvalidMatchExpression(f"match expression{' ' + where if where else ''}: {message}")


def _is_json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def validate(expression: Any) -> dict[str, Any]:
    """Return ``expression`` if it is well formed, else raise InvalidMatchExpression."""
    if not isinstance(expression, dict):
        raise _fail(
            "",
            f"must be a dict like {{'version': 1, 'expr': ...}}, got {type(expression).__name__}",
        )
    extra = set(expression) - {"version", "expr"}
    if extra:
        raise _fail("", f"unknown keys {sorted(map(str, extra))}; expected 'version' and 'expr'")
    version = expression.get("version")
    if type(version) is not int or version != 1:
        raise _fail("['version']", f"must be 1, got {version!r}")
    if "expr" not in expression:
        raise _fail("", "has no 'expr'")
    # The walk bounds depth and node count before anything recurses freely.
    count = [0]
    _validate_node(expression["expr"], "['expr']", 1, count)
    try:
        size = len(json.dumps(expression, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise _fail("", f"is not JSON-serialisable ({exc})") from None
    if size > MAX_BYTES:
        raise _fail("", f"is {size} bytes, over the limit of {MAX_BYTES}")
    return expression


def _validate_node(node: Any, where: str, depth: int, count: list[int]) -> None:
    count[0] += 1
    if count[0] > MAX_NODES:
        raise _fail(where, f"the expression has more than {MAX_NODES} nodes")
    if depth > MAX_DEPTH:
        raise _fail(where, f"is nested more than {MAX_DEPTH} levels deep")
    if not isinstance(node, dict):
        raise _fail(where, f"must be a dict with a 'kind', got {type(node).__name__}")
    kind = node.get("kind")
    if kind in ("and", "or"):
        if set(node) != {"kind", "nodes"}:
            raise _fail(where, f"an {kind!r} node takes exactly 'kind' and 'nodes'")
        nodes = node["nodes"]
        if not isinstance(nodes, list) or not nodes:
            raise _fail(f"{where}['nodes']", "must be a non-empty list")
        for i, child in enumerate(nodes):
            _validate_node(child, f"{where}['nodes'][{i}]", depth + 1, count)
        return
    if kind != "atom":
        raise _fail(f"{where}['kind']", f"must be 'and', 'or' or 'atom', got {kind!r}")
    if set(node) != {"kind", "path", "op"}:
        raise _fail(where, "an 'atom' node takes exactly 'kind', 'path' and 'op'")
    path = node["path"]
    if not isinstance(path, list) or not path:
        raise _fail(f"{where}['path']", "must be a non-empty list of keys")
    if len(path) > MAX_PATH:
        raise _fail(f"{where}['path']", f"is longer than {MAX_PATH} keys")
    for i, key in enumerate(path):
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise _fail(f"{where}['path'][{i}]", f"must be a string or an integer, got {key!r}")
    op = node["op"]
    if not isinstance(op, dict):
        raise _fail(f"{where}['op']", "must be a dict with a 'kind'")
    op_kind = op.get("kind")
    if not isinstance(op_kind, str):
        op_kind = repr(op_kind)  # unhashable kinds must not reach the set lookup
    if op_kind in COMPARE_OPS:
        if set(op) != {"kind", "value"}:
            raise _fail(f"{where}['op']", f"an {op_kind!r} op takes exactly 'kind' and 'value'")
        if not _is_json_scalar(op["value"]):
            raise _fail(f"{where}['op']['value']", "must be a string, number, boolean or null")
    elif op_kind == "in":
        if set(op) != {"kind", "values"}:
            raise _fail(f"{where}['op']", "an 'in' op takes exactly 'kind' and 'values'")
        values = op["values"]
        if not isinstance(values, list):
            raise _fail(f"{where}['op']['values']", "must be a list")
        for i, value in enumerate(values):
            if not _is_json_scalar(value):
                raise _fail(
                    f"{where}['op']['values'][{i}]", "must be a string, number, boolean or null"
                )
    else:
        raise _fail(
            f"{where}['op']['kind']",
            f"unknown op {op_kind!r}; use one of eq, ne, gt, gte, lt, lte, in",
        )


_MISSING = object()
#: What :func:`value_at` gives for a path the payload has no value at.
MISSING = _MISSING


def value_at(payload: Any, path: list[Any]) -> Any:
    """The value at ``path`` as :func:`matches` finds it, or :data:`MISSING`."""
    return _lookup(payload, path)


def _lookup(payload: Any, path: list[Any]) -> Any:
    value = payload
    for key in path:
        if isinstance(value, dict) and isinstance(key, str):
            value = value.get(key, _MISSING)
        elif isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value):
            value = value[key]
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def _category(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    return "other"


def _equal(a: Any, b: Any) -> bool:
    return _category(a) == _category(b) and _category(a) != "other" and a == b


def _compare(op: str, actual: Any, expected: Any) -> bool:
    if op == "eq":
        return _equal(actual, expected)
    if op == "ne":
        return actual is not _MISSING and not _equal(actual, expected)
    kind = _category(actual)
    if kind not in ("number", "string") or kind != _category(expected):
        return False
    if op == "gt":
        return bool(actual > expected)
    if op == "gte":
        return bool(actual >= expected)
    if op == "lt":
        return bool(actual < expected)
    return bool(actual <= expected)


def _evaluate(node: dict[str, Any], payload: Any) -> bool:
    kind = node["kind"]
    if kind == "and":
        return all(_evaluate(child, payload) for child in node["nodes"])
    if kind == "or":
        return any(_evaluate(child, payload) for child in node["nodes"])
    actual = _lookup(payload, node["path"])
    op = node["op"]
    if op["kind"] == "in":
        return any(_equal(actual, value) for value in op["values"])
    return _compare(op["kind"], actual, op["value"])


def matches(expression: dict[str, Any] | None, payload: Any) -> bool:
    """Whether ``payload`` satisfies ``expression`` (None matches anything).

    ``expression`` must have passed :func:`validate`; any payload is safe.
    """
    if expression is None:
        return True
    return _evaluate(expression["expr"], payload)


def never_matching(expression: dict[str, Any]) -> list[str]:
    """The comparisons of a valid expression that no payload can satisfy, in words.

    An ordered comparison with a boolean or null (ordered ops compare numbers
    and strings only) and an ``in`` with no values. The builder in
    :mod:`kumiko_workflows.match` refuses them; in a hand-written expression
    they are a warning, as they were accepted before.
    """
    found: list[str] = []
    _never(expression["expr"], "['expr']", found)
    return found


def _never(node: dict[str, Any], where: str, found: list[str]) -> None:
    if node["kind"] in ("and", "or"):
        for i, child in enumerate(node["nodes"]):
            _never(child, f"{where}['nodes'][{i}]", found)
        return
    op = node["op"]
    if op["kind"] in ORDERED_OPS and _category(op["value"]) not in ("number", "string"):
        found.append(
            f"{where}: {op['kind']} {json.dumps(op['value'])} can never match "
            f"({op['kind']} compares numbers with numbers and strings with strings)"
        )
    elif op["kind"] == "in" and not op["values"]:
        found.append(f"{where}: 'in' with no values can never match")


# --- near misses: "3" is not 3 ------------------------------------------------------
#
# Which type an awaited event will carry is unknown until it arrives, so a
# wait comparing with "3" when events hold 3 cannot be caught beforehand. It
# can be seen once such an event has arrived: ``loosened`` gives the
# expression that also accepts the other spelling of each equality's value,
# and ``type_mismatches`` says, for an event that matches it but not the wait,
# which values differ in type only.

_NUMBER_TEXT = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")


def _respelled(value: Any) -> Any:
    """The other-typed spelling of an equality's value ("3" for 3, 3 for "3"), or _MISSING."""
    kind = _category(value)
    if kind == "number":
        return canonical_value(value)
    if kind == "string" and len(value) <= 40 and _NUMBER_TEXT.fullmatch(value):
        return json.loads(value)
    return _MISSING


def loosened(expression: dict[str, Any]) -> dict[str, Any] | None:
    """``expression`` with each eq/in also accepting the respelled values; None if none has one.

    ``expression`` must have passed :func:`validate`.
    """
    changed = [False]
    node = _loosen(expression["expr"], changed)
    return {"version": 1, "expr": node} if changed[0] else None


def _loosen(node: dict[str, Any], changed: list[bool]) -> dict[str, Any]:
    if node["kind"] in ("and", "or"):
        return {"kind": node["kind"], "nodes": [_loosen(child, changed) for child in node["nodes"]]}
    op = node["op"]
    if op["kind"] not in ("eq", "in"):
        return node
    values = [op["value"]] if op["kind"] == "eq" else list(op["values"])
    extra = [v for v in map(_respelled, values) if v is not _MISSING]
    if not extra:
        return node
    changed[0] = True
    return {"kind": "atom", "path": node["path"], "op": {"kind": "in", "values": values + extra}}


def type_mismatches(expression: dict[str, Any], payload: Any) -> list[str]:
    """Each equality that ``payload`` meets only in another type, in words."""
    found: list[str] = []
    _mismatches(expression["expr"], payload, found)
    return found


def _mismatches(node: dict[str, Any], payload: Any, found: list[str]) -> None:
    if node["kind"] in ("and", "or"):
        for child in node["nodes"]:
            _mismatches(child, payload, found)
        return
    op = node["op"]
    if op["kind"] not in ("eq", "in"):
        return
    values = [op["value"]] if op["kind"] == "eq" else op["values"]
    actual = _lookup(payload, node["path"])
    if actual is _MISSING or any(_equal(actual, value) for value in values):
        return
    for value in values:
        if _equal(actual, _respelled(value)):
            path = ".".join(str(key) for key in node["path"])
            found.append(
                f"{path} is {json.dumps(actual)} (a {_category(actual)}) in the event, "
                f"{json.dumps(value)} (a {_category(value)}) in the match"
            )
            return


def describe(expression: dict[str, Any] | None) -> str:
    """The expression in plain words, for the admin."""
    if expression is None:
        return "any event"
    return _describe(expression["expr"])


_OP_WORDS = {"eq": "=", "ne": "≠", "gt": ">", "gte": "≥", "lt": "<", "lte": "≤"}


def _describe(node: dict[str, Any]) -> str:
    if node["kind"] in ("and", "or"):
        parts = [_describe(child) for child in node["nodes"]]
        joined = f" {node['kind']} ".join(parts)
        return joined if len(parts) == 1 else f"({joined})"
    path = ".".join(str(key) for key in node["path"])
    op = node["op"]
    if op["kind"] == "in":
        values = ", ".join(json.dumps(v) for v in op["values"])
        return f"{path} is one of [{values}]"
    return f"{path} {_OP_WORDS[op['kind']]} {json.dumps(op['value'])}"


# --- correlation keys ---------------------------------------------------------
#
# A waiting run is found by what its match *requires*, not by evaluating every
# waiting run: ``required_keys`` gives a set of (path, value) equalities such
# that any matching payload has at least one of them. The wait is stored under
# each; an appended event looks up the keys its payload offers on the paths in
# use, and only those candidates are evaluated in full.

#: Longest canonical path or value kept as a key; a longer one is not indexed.
MAX_KEY_TEXT = 255

Key = tuple[str, str]  # (canonical path, canonical value)


def canonical_value(value: Any) -> str | None:
    """The text two :func:`matches`-equal scalars share, or None if not a scalar.

    ``1`` and ``1.0`` are equal for ``eq`` and so share ``"1"``; ``True`` and
    ``1`` are not and do not. Strings keep their JSON quotes, so ``"1"`` and
    ``1`` differ too.
    """
    # Subclasses (an IntEnum, a str Enum) are spelled as their plain value,
    # as matches() compares them.
    if value is None or isinstance(value, bool):
        return json.dumps(None if value is None else bool(value))
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        number = float(value)
        return int.__repr__(int(number)) if number.is_integer() else float.__repr__(number)
    if isinstance(value, str):
        return json.dumps(str.__str__(value), ensure_ascii=False)
    return None


def canonical_path(path: list[Any]) -> str:
    return json.dumps(path, ensure_ascii=False, separators=(",", ":"))


def _key(path: list[Any], value: Any) -> Key | None:
    text = canonical_value(value)
    path_text = canonical_path(path)
    if text is None or max(len(text), len(path_text)) > MAX_KEY_TEXT:
        return None
    if "\x00" in text or "\x00" in path_text:
        return None  # no database column holds NUL; such a wait is scanned instead
    return path_text, text


def _required(node: dict[str, Any]) -> frozenset[Key] | None:
    kind = node["kind"]
    if kind == "and":
        # Any one conjunct's keys will do: take the narrowest.
        options = [keys for keys in map(_required, node["nodes"]) if keys is not None]
        return min(options, key=len) if options else None
    if kind == "or":
        union: set[Key] = set()
        for child in node["nodes"]:
            keys = _required(child)
            if keys is None:
                return None  # a branch that needs no key: no key is needed
            union |= keys
        return frozenset(union)
    op = node["op"]
    if op["kind"] == "eq":
        values = [op["value"]]
    elif op["kind"] == "in":
        values = op["values"]
    else:
        return None
    found = [_key(node["path"], value) for value in values]
    if any(key is None for key in found):
        return None
    return frozenset(key for key in found if key is not None)


def required_keys(expression: dict[str, Any] | None) -> frozenset[Key] | None:
    """Keys of which every matching payload offers at least one; None if none is required.

    A wait whose match gives None is on the scan path: each event of its type
    is evaluated against it. An empty set means nothing can match (``in []``).
    ``expression`` must have passed :func:`validate`.
    """
    if expression is None:
        return None
    return _required(expression["expr"])


def offered_keys(payload: Any, paths: list[str]) -> set[Key]:
    """The keys ``payload`` offers on the given canonical paths."""
    keys = set()
    for path_text in paths:
        value = _lookup(payload, json.loads(path_text))
        if value is not _MISSING:
            key = _key(json.loads(path_text), value)
            if key is not None:
                keys.add(key)
    return keys
