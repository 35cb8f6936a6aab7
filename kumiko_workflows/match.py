"""The match vocabulary: which awaited event ends a ``wait_for_event``, said in Python.

``match.eq("order_id", match.from_trigger("order_id"))`` builds exactly the
stored JSON of :mod:`kumiko_workflows.workflow.matching` (``{"version": 1,
"expr": ...}``), so the wake-up index, the admin and the look-back see what a
hand-written dict would give them. Why a builder: nine lines of nested dicts
for one equality hide mistakes, and a comparison that can never match by
type (``gt`` with ``None``, ``in_`` with nothing) waits for ever without a
word; the builder refuses those when it is called, with
:class:`~kumiko_workflows.exceptions.InvalidMatchExpression` naming the
problem.

A value may depend on the run: :func:`from_trigger` (the trigger event's
payload at a path, known to the fingerprint by that path) or any callable of
``ctx``. They are resolved, and checked as static values are, when the wait
begins; a bad one fails the run with ``invalid_step_argument``.

:data:`ANY` (``match.any()``) says on purpose that any event of the awaited
type ends every such wait. A ``wait_for_event`` without a match is system
check ``kumiko_workflows.W090``; ``ANY`` silences it and is stored and
fingerprinted as no match is, so adding it changes nothing for runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kumiko_workflows.exceptions import InvalidMatchExpression
from kumiko_workflows.workflow import matching
from kumiko_workflows.workflow.jsonvalues import NotJSON, to_json

PathArg = str | Sequence[str | int]
#: What a run-dependent value is replaced by: ``fill(op, value)`` (see :meth:`Expression.json`).
Fill = Callable[[str, Any], Any]


class Expression:
    """A match expression: combine with ``&`` (and) and ``|`` (or).

    :meth:`to_json` gives the stored form of an expression that depends on
    nothing; :meth:`resolve` that of one with run-dependent values.
    """

    __slots__ = ()

    def __and__(self, other: Any) -> Expression:
        return _combine("and", self, other)

    def __or__(self, other: Any) -> Expression:
        return _combine("or", self, other)

    def __rand__(self, other: Any) -> Expression:
        return _combine("and", other, self)

    def __ror__(self, other: Any) -> Expression:
        return _combine("or", other, self)

    def __bool__(self) -> bool:
        # ``a and b`` would quietly be ``b``: the one mistake Python lets through.
        raise InvalidMatchExpression(
            "a match expression has no truth value: combine expressions with & and |, "
            "not with 'and' and 'or'"
        )

    def node(self, fill: Fill) -> dict[str, Any]:
        """The ``expr`` node, each run-dependent value replaced by ``fill(op, value)``."""
        raise NotImplementedError

    def json(self, fill: Fill) -> dict[str, Any]:
        return {"version": 1, "expr": self.node(fill)}

    def dynamic(self) -> Iterator[tuple[str, Any]]:
        """Each run-dependent value, with where it stands (``"customer.id eq"``)."""
        raise NotImplementedError

    def is_static(self) -> bool:
        return next(self.dynamic(), None) is None

    def to_json(self) -> dict[str, Any]:
        """The stored form; refused if a value depends on the run (see :meth:`resolve`)."""
        for where, _ in self.dynamic():
            raise InvalidMatchExpression(
                f"match expression: the value of {where} depends on the run; it is known "
                "when the wait begins (resolve(ctx))"
            )
        return matching.validate(self.json(_unfilled))

    def resolve(self, ctx: Any, call: Callable[[Callable[[Any], Any]], Any]) -> dict[str, Any]:
        """The stored form for a run: ``call(fn)`` gives a callable value's result for ``ctx``.

        Raises :class:`InvalidMatchExpression` for a value that could never
        match (checked as a static one is) or a trigger path the payload lacks.
        """

        def fill(op: str, value: Any) -> Any:
            found = value.read(ctx) if isinstance(value, FromTrigger) else call(value)
            if op == "in":
                return _values(found, "the value given", run_dependent=False)
            return _value(op, found)

        return self.json(fill)

    def callables(self) -> Iterator[tuple[str, Callable[[Any], Any]]]:
        """The user callables it holds, with where they stand."""
        for where, value in self.dynamic():
            if not isinstance(value, FromTrigger):
                yield where, value

    def fingerprint(self, name_of: Callable[[Any], str]) -> dict[str, Any]:
        """What the definition's fingerprint knows: the stored form, callables by name.

        A static expression's is its stored form, so a hand-written dict
        rewritten with the builder keeps its fingerprint (and its runs).
        """

        def fill(op: str, value: Any) -> Any:
            if isinstance(value, FromTrigger):
                return {"trigger": list(value.path)}
            return {"callable": name_of(value)}

        return self.json(fill)

    def __repr__(self) -> str:
        return f"<match {matching.describe(self.json(_placeholder))}>"


def _unfilled(op: str, value: Any) -> Any:
    raise AssertionError("to_json() fills no value")  # pragma: no cover - is_static() first


def _placeholder(op: str, value: Any) -> Any:
    if isinstance(value, FromTrigger):
        text = repr(value)
    else:
        text = f"{getattr(value, '__name__', value)}(ctx)"
    return [text] if op == "in" else text  # a run-dependent list of values, or one value


@dataclass(frozen=True, repr=False)
class Atom(Expression):
    """One comparison: the awaited event's payload at ``path`` against ``value``.

    For ``in``, ``value`` is a tuple of values, or one run-dependent value
    that gives the list.
    """

    path: tuple[str | int, ...]
    op: str
    value: Any

    def _where(self) -> str:
        return f"{'.'.join(map(str, self.path))} {self.op}"

    def node(self, fill: Fill) -> dict[str, Any]:
        if self.op != "in":
            value = fill(self.op, self.value) if _is_dynamic(self.value) else self.value
            op = {"kind": self.op, "value": value}
        elif _is_dynamic(self.value):
            op = {"kind": "in", "values": fill("in", self.value)}
        else:
            values = [fill("eq", v) if _is_dynamic(v) else v for v in self.value]
            op = {"kind": "in", "values": values}
        return {"kind": "atom", "path": list(self.path), "op": op}

    def dynamic(self) -> Iterator[tuple[str, Any]]:
        if _is_dynamic(self.value):
            yield self._where(), self.value
        elif self.op == "in":
            for i, value in enumerate(self.value):
                if _is_dynamic(value):
                    yield f"{self._where()} [{i}]", value


@dataclass(frozen=True, repr=False)
class Group(Expression):
    """``and`` or ``or`` of two or more expressions (nested ones of its kind flattened)."""

    kind: str
    nodes: tuple[Expression, ...]

    def node(self, fill: Fill) -> dict[str, Any]:
        return {"kind": self.kind, "nodes": [child.node(fill) for child in self.nodes]}

    def dynamic(self) -> Iterator[tuple[str, Any]]:
        for child in self.nodes:
            yield from child.dynamic()


@dataclass(frozen=True, repr=False)
class FromTrigger:
    """The run's trigger event's payload at ``path``, read when the wait begins."""

    path: tuple[str | int, ...]

    def __repr__(self) -> str:
        return f"match.from_trigger({self.path!r})"

    def read(self, ctx: Any) -> Any:
        found = matching.value_at(ctx.event.payload, list(self.path))
        if found is matching.MISSING:
            raise InvalidMatchExpression(
                f"match expression: the trigger event's payload has no value at "
                f"{'.'.join(map(str, self.path))}"
            )
        return found


class AnyEvent:
    """Any event of the awaited type ends the wait (see the module docstring)."""

    _instance: AnyEvent | None = None

    def __new__(cls) -> AnyEvent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "match.ANY"

    def __and__(self, other: Any) -> Expression:
        raise _alone()

    __or__ = __rand__ = __ror__ = __and__


def _alone() -> InvalidMatchExpression:
    return InvalidMatchExpression(
        "match.any() stands alone: it matches every event already, so it combines with nothing"
    )


#: Any event of the awaited type: ``wait_for_event(key, match=match.ANY)``.
ANY = AnyEvent()


def _is_dynamic(value: Any) -> bool:
    return isinstance(value, FromTrigger) or (callable(value) and not isinstance(value, type))


def _is_dynamic_any(values: list[Any]) -> bool:
    return next((True for value in values if _is_dynamic(value)), False)


# --- checks ------------------------------------------------------------------------


def _path(path: Any) -> tuple[str | int, ...]:
    if isinstance(path, str):
        keys = path.split(".")
        for key in keys:
            if not key:
                raise InvalidMatchExpression(
                    f"match path {path!r} has an empty key; give keys joined by dots, "
                    "like 'customer.id', or a tuple ('customer', 'id')"
                )
            if key.isdigit():
                raise InvalidMatchExpression(
                    f"match path {path!r}: {key!r} could be a list index or a key; give a "
                    f"tuple path, with {int(key)} for a list index or {key!r} for a key"
                )
        found: tuple[Any, ...] = tuple(keys)
    elif isinstance(path, Sequence) and not isinstance(path, bytes):
        found = tuple(path)
        for key in found:
            if isinstance(key, bool) or not isinstance(key, str | int):
                raise InvalidMatchExpression(
                    f"match path {path!r}: each key must be a string (a mapping key) or an "
                    f"integer (a list index), got {key!r}"
                )
    else:
        raise InvalidMatchExpression(
            f"match path must be a string like 'customer.id' or a tuple of keys, got {path!r}"
        )
    if not found:
        raise InvalidMatchExpression("match path is empty; name the payload key to compare")
    if len(found) > matching.MAX_PATH:
        raise InvalidMatchExpression(f"match path {path!r} is longer than {matching.MAX_PATH} keys")
    return found


def _value(op: str, value: Any) -> Any:
    """``value`` as stored, or InvalidMatchExpression if it could never match with ``op``."""
    if op in matching.ORDERED_OPS:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            hint = (
                "; a Decimal in a payload is stored as a string, so compare numbers a payload "
                "holds as numbers (float or int)"
                if isinstance(value, Decimal)
                else ""
            )
            raise InvalidMatchExpression(
                f"match.{op}() with {value!r} ({type(value).__name__}) can never match: "
                f"{op} compares numbers with numbers and strings with strings{hint}"
            )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidMatchExpression(
            f"match.{_name(op)}() with {value!r} can never match: no payload holds it"
        )
    try:
        stored = to_json(value, "match value")
    except NotJSON as exc:
        raise InvalidMatchExpression(str(exc)) from None
    if isinstance(stored, dict | list):
        raise InvalidMatchExpression(
            f"match.{_name(op)}() with a {type(value).__name__} can never match: a match "
            "compares one value (a string, number, boolean or null); for one of several "
            "values use match.in_(path, [...]), for nested keys a path like 'customer.id'"
        )
    return stored


def _values(values: Any, where: str, *, run_dependent: bool) -> list[Any]:
    """``values`` as stored; ``run_dependent``: items may be resolved later."""
    if isinstance(values, str | bytes | dict) or not isinstance(values, Sequence | set | frozenset):
        raise InvalidMatchExpression(
            f"match.in_() takes a list of values, got {values!r} as {where}"
            + ("; a string would be its characters" if isinstance(values, str) else "")
        )
    found = [v if run_dependent and _is_dynamic(v) else _value("eq", v) for v in values]
    if not found:
        raise InvalidMatchExpression(
            "match.in_() with no values can never match; give at least one value"
        )
    if isinstance(values, set | frozenset) and not _is_dynamic_any(found):
        # A set has no order of its own; the stored form and the fingerprint do.
        found.sort(key=lambda value: matching.canonical_value(value) or "")
    return found


def _name(op: str) -> str:
    return "in_" if op == "in" else op


def _combine(kind: str, left: Any, right: Any) -> Expression:
    nodes: list[Expression] = []
    for side in (left, right):
        if isinstance(side, AnyEvent):
            raise _alone()
        if not isinstance(side, Expression):
            raise InvalidMatchExpression(
                f"match expressions combine with match expressions only, got {side!r}; "
                "build each part with match.eq(), match.in_(), ..."
            )
        if isinstance(side, Group) and side.kind == kind:
            nodes.extend(side.nodes)
        else:
            nodes.append(side)
    if len(nodes) > matching.MAX_NODES:
        raise InvalidMatchExpression(f"match expression has more than {matching.MAX_NODES} nodes")
    return Group(kind, tuple(nodes))


def _atom(op: str, path: PathArg, value: Any) -> Atom:
    return Atom(_path(path), op, value if _is_dynamic(value) else _value(op, value))


# --- the vocabulary ------------------------------------------------------------------


def eq(path: PathArg, value: Any) -> Expression:
    """The payload's value at ``path`` equals ``value`` (``"3"`` never equals ``3``)."""
    return _atom("eq", path, value)


def ne(path: PathArg, value: Any) -> Expression:
    """The payload has a value at ``path``, and it is not ``value``."""
    return _atom("ne", path, value)


def gt(path: PathArg, value: Any) -> Expression:
    """The value at ``path`` is greater: numbers with numbers, strings with strings."""
    return _atom("gt", path, value)


def gte(path: PathArg, value: Any) -> Expression:
    """The value at ``path`` is greater or equal (as :func:`gt`)."""
    return _atom("gte", path, value)


def lt(path: PathArg, value: Any) -> Expression:
    """The value at ``path`` is less (as :func:`gt`)."""
    return _atom("lt", path, value)


def lte(path: PathArg, value: Any) -> Expression:
    """The value at ``path`` is less or equal (as :func:`gt`)."""
    return _atom("lte", path, value)


def in_(path: PathArg, values: Any) -> Expression:
    """The value at ``path`` equals one of ``values`` (a list, or a run-dependent value)."""
    if _is_dynamic(values):
        return Atom(_path(path), "in", values)
    return Atom(_path(path), "in", tuple(_values(values, "values", run_dependent=True)))


def from_trigger(path: PathArg) -> FromTrigger:
    """A value read when the wait begins: the run's trigger event's payload at ``path``."""
    return FromTrigger(_path(path))


def any() -> AnyEvent:  # shadows the builtin here only: match.any() reads as it means
    """Any event of the awaited type ends the wait: says so, and silences W090."""
    return ANY


__all__ = [
    "ANY",
    "AnyEvent",
    "Expression",
    "FromTrigger",
    "any",
    "eq",
    "from_trigger",
    "gt",
    "gte",
    "in_",
    "lt",
    "lte",
    "ne",
]
