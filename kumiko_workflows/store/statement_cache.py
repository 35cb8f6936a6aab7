"""The statement cache: each raw statement built once per shape and database; rows read back.

A row a raw statement returns becomes a model instance as the ORM would load
it (:func:`_instance_of`).

Emptied when the settings change (``setting_changed``, as ``override_settings``
sends): a statement names the tables of the database it was built for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.core.signals import setting_changed
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
    return model.from_db(conn.alias, None, row)


_CONVERTERS: dict[tuple[str, str], list[tuple[int, Any, list[Any]]]] = {}


@receiver(setting_changed)
def _forget(setting: str, **kwargs: Any) -> None:
    # A statement names the tables and quoting of the database it was built for.
    if setting in ("KUMIKO_WORKFLOWS", "DATABASES"):
        _SQL.clear()
