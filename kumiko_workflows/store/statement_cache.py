"""The statement cache: each raw statement built once per shape and database; rows read back.

A row a raw statement returns becomes a model instance as the ORM would load
it (:func:`_instance_of`); :func:`new_instance` makes the engine's instances
without ``Model.__init__``'s work, where nothing could tell.

Emptied when the settings change (``setting_changed``, as ``override_settings``
sends): a statement names the tables of the database it was built for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.core.signals import setting_changed
from django.db.models import Model
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.dispatch import receiver

from kumiko_workflows.store.db import alias, engine

_SQL: dict[tuple[Any, ...], str] = {}


def statement(key: tuple[Any, ...], build: Callable[[], str]) -> str:
    """The statement ``build`` makes for ``key``, built once per key and database."""
    full = (alias(), *key)
    sql = _SQL.get(full)
    if sql is None:
        sql = _SQL[full] = build()
    return sql


def _instance_of(model: type[Any], values: Sequence[Any]) -> Any:
    """An instance of ``model`` from its concrete columns' raw values, as the ORM would load it.

    The converters (JSON text to objects, SQLite's timestamps, ...) are the
    ones a query's compiler would apply, found once per model and vendor
    (only the columns that have any).
    """
    conn = engine()
    key = (conn.vendor, model._meta.label)
    converters = _CONVERTERS.get(key)
    if converters is None:
        converters = []
        for index, field in enumerate(model._meta.concrete_fields):
            col = field.get_col(model._meta.db_table)
            found = conn.ops.get_db_converters(col) + col.get_db_converters(conn)
            if found:
                converters.append((index, col, found))
        _CONVERTERS[key] = converters
    row = list(values)
    for index, col, found in converters:
        for convert in found:
            row[index] = convert(row[index], col, conn)
    return new_instance(model, row, conn.alias)


_CONVERTERS: dict[tuple[str, str], list[tuple[int, Any, list[Any]]]] = {}


def new_instance(model: type[Any], values: Sequence[Any], db: str | None = None) -> Any:
    """``model(*values)`` (its concrete fields' values in order), or with ``db`` what
    ``model.from_db(db, None, values)`` returns: loaded from that database.

    Where no receiver of ``pre_init`` or ``post_init`` is connected and each
    field's attribute is a plain one, the values go into the instance's
    ``__dict__`` in one step, which is all ``Model.__init__`` would do with
    them one by one (in about half the time, for an event or a pending row).
    Otherwise, or for a model with its own ``__init__`` or ``from_db``,
    Django's own way.
    """
    names = _plain_names(model)
    if names is None or pre_init.receivers or post_init.receivers:
        return model(*values) if db is None else model.from_db(db, None, values)
    if len(values) != len(names):
        raise IndexError(f"{model.__name__} takes {len(names)} values, not {len(values)}")
    instance = object.__new__(model)
    state = ModelState()
    if db is not None:
        state.adding = False
        state.db = db
    fields = instance.__dict__
    fields["_state"] = state  # first, as Model.__init__ sets it
    fields.update(zip(names, values, strict=True))
    return instance


def _plain_names(model: type[Any]) -> tuple[str, ...] | None:
    """``model``'s concrete fields' attribute names, if assigning them is only storing them
    (no field's class attribute takes assignments itself, no ``__init__`` or ``from_db``
    of the model's own); None otherwise."""
    if model not in _PLAIN:
        names = tuple(field.attname for field in model._meta.concrete_fields)
        own = any(
            "__init__" in vars(cls) or "from_db" in vars(cls)
            for cls in model.__mro__
            if cls is not Model and issubclass(cls, Model)
        )
        setters = any(hasattr(getattr(model, name, None), "__set__") for name in names)
        _PLAIN[model] = None if own or setters else names
    return _PLAIN[model]


_PLAIN: dict[type[Any], tuple[str, ...] | None] = {}


@receiver(setting_changed)
def _forget(setting: str, **kwargs: Any) -> None:
    # A statement names the tables and quoting of the database it was built for.
    if setting in ("KUMIKO_WORKFLOWS", "DATABASES"):
        _SQL.clear()
