"""What keeps the big lists (runs, events, pending rows) cheap on a store of millions of rows.

Django's changelist counts every row the filters leave for "N results"
(and the whole table for "of M"), and its list filters read every
distinct value of their column. Here:

- :class:`CappedPaginator` counts at most :data:`COUNT_CAP` rows: a list
  of more says "more than 1,000" and pages through the first 1,000
  (narrow it with the filters or the search to see the others);
- :class:`IndexedValuesFilter` lists the values of a column as an index
  holds them (:func:`kumiko_workflows.store.choices.distinct_values`: one
  probe per tenant and value), scoped to the user's tenant;
- :class:`CheapListMixin` puts them together for an admin: no full count,
  no facet counts, the capped paginator, the rows' action checkboxes
  written out rather than rendered as widgets.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.filters import AllValuesFieldListFilter
from django.core.paginator import Paginator
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext

from kumiko_workflows.admin.base import admin_tenant
from kumiko_workflows.store.choices import distinct_values

#: The most rows a list counts; a list of more says "more than" this many.
COUNT_CAP = 1_000


class CappedPaginator(Paginator):  # type: ignore[type-arg]  # of any rows
    """A paginator that counts at most :data:`COUNT_CAP` rows (``capped``: there are more).

    The count reads the first ``COUNT_CAP + 1`` matching rows, unordered,
    so its cost is bounded by the cap and not by the table. Past the cap
    there are no pages: the list then offers its first ``COUNT_CAP`` rows.
    """

    cap = COUNT_CAP

    @cached_property
    def _counted(self) -> int:
        """The matching rows, up to one past the cap."""
        object_list: Any = self.object_list
        if not hasattr(object_list, "order_by"):  # a list: its length is known
            return len(object_list)
        found: int = object_list.order_by()[: self.cap + 1].count()
        return found

    @cached_property
    def count(self) -> int:
        return min(self._counted, self.cap)

    @property
    def capped(self) -> bool:
        """Whether more rows match than were counted."""
        return self._counted > self.cap


class IndexedValuesFilter(AllValuesFieldListFilter):
    """Django's filter by a column's values, the values read from an index (loose index scan).

    Subclasses name the index's leading columns (:attr:`columns`, the
    tenant's first, the filtered column last); the choices are the values
    the user's tenant's rows have (every tenant's for a superuser), and the
    chosen one stays listed.
    """

    #: The leading columns of the index the values are read from.
    columns: tuple[str, ...] = ()
    #: Whether the column may be empty (NULL): the filter then offers "—" too.
    nullable = False
    #: The model whose index is read (default: the admin's own).
    source: type[Model] | None = None
    #: Among the rows whose fields have these values only: a partial
    #: index's condition (see :func:`~kumiko_workflows.store.choices.distinct_values`).
    where: ClassVar[dict[str, Any] | None] = None

    def __init__(
        self,
        field: Any,
        request: HttpRequest,
        params: dict[str, Any],
        model: type[Model],
        model_admin: Any,
        field_path: str,
    ) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        values = distinct_values(
            self.source or model,
            self.columns,
            admin_tenant(request),
            nullable=self.nullable,
            where=self.where,
        )
        self.lookup_choices = values  # type: ignore[assignment]  # a list, not a queryset


def indexed(
    *columns: str,
    nullable: bool = False,
    source: type[Model] | None = None,
    where: dict[str, Any] | None = None,
) -> type[IndexedValuesFilter]:
    """An :class:`IndexedValuesFilter` reading index columns ``columns`` (of ``source``)."""
    attributes = {"columns": columns, "nullable": nullable, "source": source, "where": where}
    return type("IndexedValuesFilter", (IndexedValuesFilter,), attributes)


class CheapListMixin:
    """For an admin of a big table: the capped count, no full count, no facet counts.

    Its templates (``admin/kumiko_workflows/pagination.html``,
    ``search_form.html``, ``actions.html``) say "more than" past the cap.
    """

    paginator: ClassVar[type] = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    def action_checkbox(self, obj: Any) -> SafeString:
        """Each row's checkbox for the actions, as Django's, written out instead of rendered.

        Django renders it as a form widget through the template engine, a
        third of the time a page of 100 runs takes to draw.
        """
        label = gettext("Select this object for an action - {}").format(obj)
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            str(obj.pk),
            label,
        )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        response: HttpResponse = super().changelist_view(request, extra_context)  # type: ignore[misc]
        context = getattr(response, "context_data", None) or {}
        listed = context.get("cl")
        if getattr(getattr(listed, "paginator", None), "capped", False):
            context["selection_note_all"] = "All matching selected (more than the count shown)"
        return response
