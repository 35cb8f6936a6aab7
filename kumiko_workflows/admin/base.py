"""The base of the admins: read-only, tenant-scoped, ids found by range.

``KUMIKO_WORKFLOWS["ADMIN_TENANT"]`` (``request -> tenant id or None``)
limits a staff user to one tenant's rows; superusers see all.
"""

from __future__ import annotations

import functools
import operator
import uuid
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db import transaction
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from kumiko_workflows.admin.display import breakable, short_id
from kumiko_workflows.conf import import_callable, workflow_settings
from kumiko_workflows.models import (
    Event,
    WorkflowRun,
)
from kumiko_workflows.store import db


def own_transaction() -> transaction.Atomic:
    """A transaction on the engine's database for one of the admin's operations (wake, cancel...).

    Each acts at once, committed on its own: a request's transaction on
    another database (``ATOMIC_REQUESTS`` on the site's, the engine's tables
    on a database of their own) is not the operation's to join, and the
    operation would refuse to run inside it alone (``CrossDatabaseTransaction``).
    """
    return db.atomic()


def admin_tenant(request: HttpRequest) -> str | None:
    """The tenant this request's user is limited to, or None for all tenants."""
    if getattr(request.user, "is_superuser", False):
        return None
    if not hasattr(request, "_kumiko_admin_tenant"):
        scope = import_callable(workflow_settings.ADMIN_TENANT, "ADMIN_TENANT")
        tenant = scope(request) if scope is not None else None
        request._kumiko_admin_tenant = None if tenant is None else str(tenant)  # type: ignore[attr-defined]
    scoped: str | None = request._kumiko_admin_tenant  # type: ignore[attr-defined]
    return scoped


def actor_of(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


def _id_range(term: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The ids a search term names: a whole UUID, or its first 8 to 31 hex digits."""
    digits = term.replace("-", "").lower()
    if not 8 <= len(digits) <= 32 or any(c not in "0123456789abcdef" for c in digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def _id_match(field: str, term: str) -> Q | None:
    """A filter on the UUID column ``field`` for a search term, or None if it is no id.

    A range on the column, not a text match: the index serves it on every
    database, a shortened id copied from a list included.
    """
    found = _id_range(term)
    if found is None:
        return None
    low, high = found
    if low == high:
        return Q(**{field: low})
    return Q(**{f"{field}__gte": low, f"{field}__lte": high})


def many_tenants(request: HttpRequest) -> bool:
    """Whether the lists need a tenant column: the user is not scoped, and runs of two exist."""
    if admin_tenant(request) is not None:
        return False
    if not hasattr(request, "_kumiko_many_tenants"):
        # Two probes of an index that leads with the tenant, not a DISTINCT
        # that reads every run of the first tenant to find a second.
        tenants = WorkflowRun.objects.order_by("tenant_id").values_list("tenant_id", flat=True)
        first = tenants.first()
        found = first is not None and tenants.filter(tenant_id__gt=first).first() is not None
        request._kumiko_many_tenants = found  # type: ignore[attr-defined]
    many: bool = request._kumiko_many_tenants  # type: ignore[attr-defined]
    return many


class WorkflowAdmin(admin.ModelAdmin):  # type: ignore[type-arg]  # of any model
    """Read-only and tenant-scoped: the base of the three admins."""

    #: One placeholder everywhere: an empty cell, a fact that does not apply.
    empty_value_display = "—"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        tenant = admin_tenant(request)
        return queryset if tenant is None else queryset.filter(tenant_id=tenant)

    #: The UUID column the search box finds ids in (whole, or their first 8+ hex digits).
    id_field = "run_id"

    def search_matches(self, term: str) -> Q | None:
        """What else a search term finds, besides ids (None: nothing)."""
        return None

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """Ids and :meth:`search_matches`, exactly: index look-ups, never a text scan."""
        term = search_term.strip()
        if not term:
            return queryset, False
        found = [q for q in (_id_match(self.id_field, term), self.search_matches(term)) if q]
        if not found:
            return queryset.none(), False
        return queryset.filter(functools.reduce(operator.or_, found)), False

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = super().get_list_display(request)
        if not many_tenants(request):  # a column that would say the same on every row
            shown = [name for name in shown if name != "tenant_id"]
        return shown

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="workflow", ordering="workflow_name")
    def workflow(self, obj: Any) -> str:
        return breakable(obj.workflow_name)

    def _holds_permission(self, request: HttpRequest, codename: str) -> bool:
        """Whether the user holds the app's permission ``codename`` (an action's, a button's)."""
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def _url(self, model: type[Model], pk: Any) -> str:
        opts = model._meta
        return reverse(
            f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change",
            args=[quote(pk)],
        )

    def _changelist_url(self, model: type[Model]) -> str:
        opts = model._meta
        return reverse(f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist")

    def _run_link(self, run_id: Any) -> str:
        return short_id(run_id, self._url(WorkflowRun, run_id))

    def _event_link(self, event_id: int | None, text: str = "") -> str:
        if event_id is None:
            return "—"
        return format_html('<a href="{}">#{}{}</a>', self._url(Event, event_id), event_id, text)
