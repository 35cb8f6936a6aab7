"""``field_values.preparer``: what ``field.get_db_prep_save`` gives, for every value.

The projections' row writes prepare their values through it; a plain value
takes a shorter way there, anything else Django's own. Each field and value
below is prepared both ways on the test database's connection (SQLite or
PostgreSQL), and must come out the same, of the same type.
"""

import enum
import uuid
import warnings
import zoneinfo
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.db import connection, models

from kumiko_workflows.store.field_values import preparer

pytestmark = pytest.mark.django_db


class Colour(models.TextChoices):
    RED = "red"


class Size(enum.IntEnum):
    BIG = 3


AWARE = datetime(2026, 12, 6, 6, 30, 15, 123456, tzinfo=UTC)
ELSEWHERE = AWARE.astimezone(zoneinfo.ZoneInfo("Asia/Kolkata"))
NAIVE = datetime(2026, 12, 6, 6, 30, 15)
RUN = uuid.UUID("5f0c6b1e-8a8d-4c59-9c7e-3d2b1a0f9e8d")

TEXTS = ["done", "", Colour.RED, None, "x" * 300, 7, RUN]
INTEGERS = [0, 4, 2**40, -3, None, True, Size.BIG, "12", Decimal("5"), 7.0]
INSTANTS = [AWARE, ELSEWHERE, None, NAIVE, "2026-12-06T06:30:15+00:00"]
UUIDS = [RUN, str(RUN), RUN.hex, None]

CASES = [
    *((models.CharField(max_length=500), value) for value in TEXTS),
    *((models.TextField(), value) for value in TEXTS),
    *(
        (field, value)
        for field in (
            models.IntegerField(),
            models.PositiveIntegerField(),
            models.BigIntegerField(),
            models.SmallIntegerField(),
            models.PositiveSmallIntegerField(),
        )
        for value in INTEGERS
    ),
    *((models.DateTimeField(null=True), value) for value in INSTANTS),
    *((models.UUIDField(null=True), value) for value in UUIDS),
    # Fields with no shorter way: Django's, whatever the value.
    (models.BooleanField(), True),
    (models.DateField(), AWARE.date()),
]


@pytest.mark.parametrize(
    ("field", "value"),
    CASES,
    ids=[
        f"{type(field).__name__}-{type(value).__name__}-{i}"
        for i, (field, value) in enumerate(CASES)
    ],
)
def test_a_value_is_prepared_as_its_field_prepares_it(field, value):
    field.set_attributes_from_name("column")
    connection.ensure_connection()

    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        expected = field.get_db_prep_save(value, connection)
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        got = preparer(field)(value, connection)

    assert got == expected
    assert type(got) is type(expected)
    # A naive instant warns the same way both times (Django's way is taken for it).
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
