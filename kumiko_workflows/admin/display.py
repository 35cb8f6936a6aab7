"""How the admin shows values: ids cut short, text clipped, times in the zone, JSON in ``<pre>``.

The lists fit a 1280 px screen: ids show their first 8 characters (the
whole id is the text, so hovering and copying give it), times drop the
zone (the column title names it).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.functional import lazy
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from kumiko_workflows.operations.words import plural, pretty_json, when


def runs_text(count: int) -> str:
    return plural(count, "run")


def pre_json(value: Any) -> str:
    return format_html("<pre>{}</pre>", pretty_json(value))


def short_id(value: Any, url: str | None = None) -> str:
    """An id cut to its first 8 characters on screen; the text (hover, copy) is whole."""
    text = str(value)
    if url is None:
        return format_html('<span class="kw-id" title="{}">{}</span>', text, text)
    return format_html('<a class="kw-id" href="{}" title="{}">{}</a>', url, text, text)


def clipped_text(text: str) -> str:
    """Long text in a list cell, cut on screen; the whole of it on hover and copy."""
    if not text:
        return "—"
    return format_html('<span class="kw-clip" title="{}">{}</span>', text, text)


def breakable(text: str) -> str:
    """Text that may wrap after an underscore or a dot (reasons, step labels, event types)."""
    return mark_safe(escape(text).replace("_", "_<wbr>").replace(".", ".<wbr>"))


def list_time(value: datetime | None) -> str:
    """An instant in a list, in the current time zone; the column title names the zone.

    The date and the time may wrap onto two lines, which keeps the column narrow.
    """
    if value is None:
        return "—"
    local = timezone.localtime(value)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        value.isoformat(),
        when(value),
        f"{local:%Y-%m-%d %H:%M:%S}",
    )


def _zone_title(label: str) -> str:
    return f"{label} ({timezone.get_current_timezone_name()})"


#: A column title naming the zone its times are in, as of the request rendering it.
zoned_title: Callable[[str], str] = lazy(_zone_title, str)
