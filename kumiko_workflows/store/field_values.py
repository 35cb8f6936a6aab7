"""A field's value as the database takes it: ``field.get_db_prep_save``, quicker for plain values.

The projections' row writes pass each value through its field, as the ORM
does (:func:`kumiko_workflows.store.statements.row_params`). For the plain
cases, a string in a ``CharField``, an int in an integer field, an aware
datetime in a ``DateTimeField``, a UUID in a ``UUIDField`` (each of those
exact classes and types), Django's own preparation comes down to one
adapter of the connection or to the value itself, through four to six
calls: 4 to 5 µs a datetime or an int, where the few writes of a resumed
run take 9 values. :func:`preparer` returns a function doing just that for
those cases and Django's for every other, found once per field.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

#: Integer fields whose preparation of an int is the connection's integer adapter.
_INTEGERS = (
    models.IntegerField,
    models.BigIntegerField,
    models.SmallIntegerField,
    models.PositiveIntegerField,
    models.PositiveBigIntegerField,
    models.PositiveSmallIntegerField,
)
_TEXTS = (models.CharField, models.TextField)


def preparer(field: Any) -> Callable[[Any, BaseDatabaseWrapper], Any]:
    """``(value, conn) -> field.get_db_prep_save(value, conn)``, without Django's calls for
    plain values."""
    slow = field.get_db_prep_save
    kind = type(field)
    if kind in _TEXTS:

        def text(value: Any, conn: BaseDatabaseWrapper) -> Any:
            return value if type(value) is str else slow(value, conn)

        return text
    if kind in _INTEGERS:
        internal = field.get_internal_type()

        def integer(value: Any, conn: BaseDatabaseWrapper) -> Any:
            if type(value) is int:
                return conn.ops.adapt_integerfield_value(value, internal)
            return slow(value, conn)

        return integer
    if kind is models.DateTimeField:

        def instant(value: Any, conn: BaseDatabaseWrapper) -> Any:
            if value is None or (type(value) is datetime and value.utcoffset() is not None):
                return conn.ops.adapt_datetimefield_value(value)
            return slow(value, conn)  # a naive one: Django's warning, and its zone

        return instant
    if kind is models.UUIDField:

        def uuid_value(value: Any, conn: BaseDatabaseWrapper) -> Any:
            if type(value) is uuid.UUID:
                return value if conn.features.has_native_uuid_field else value.hex
            return slow(value, conn)

        return uuid_value
    return cast("Callable[[Any, BaseDatabaseWrapper], Any]", slow)
