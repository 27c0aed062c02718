"""List filters for the job list that stay cheap on millions of rows.

Choices never come from ``SELECT DISTINCT`` over the whole table: kinds and
owners are read with a loose index scan (a recursive query that hops from one
distinct value to the next through the index), bounded in length.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from jobstate import registry, stuck
from jobstate.admin import own_jobs
from jobstate.ids import short
from jobstate.models import Job
from jobstate.states import ACTIVE, TERMINAL, Status
from jobstate.storable import clean_key
from jobstate.stuck import distinct_values


class StatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("active", "Active (queued, waiting or processing)"),
            ("finished", "Finished"),
            *[(s.value, s.label) for s in Status],
        ]

    def queryset(self, request: Any, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        if value is None:
            return queryset
        if value == "active":
            return queryset.filter(status__in=sorted(ACTIVE))
        if value == "finished":
            return queryset.filter(status__in=sorted(TERMINAL))
        if value not in Status.values:
            raise IncorrectLookupParameters(f"Unknown status '{value}'")
        return queryset.filter(status=value)


class OriginFilter(admin.SimpleListFilter):
    """The project's jobs, or jobstate's own (``own_jobs.KINDS``: webhook deliveries).
    Unchosen, the list shows both: the counts the dashboard and the stuck page link to
    are of both, and a search for a delivery's id finds it. The kind is compared on the
    rows an index walk reads newest first (``created_at``'s, a status's), as ``kind`` is."""

    title = "origin"
    parameter_name = "origin"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [("project", "This project's jobs"), ("jobstate", "jobstate's own (webhook deliveries)")]

    def queryset(self, request: Any, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        if value is None:
            return queryset
        if value == "project":
            return queryset.exclude(kind__in=own_jobs.KINDS)
        if value == "jobstate":
            return queryset.filter(kind__in=own_jobs.KINDS)
        raise IncorrectLookupParameters(f"Unknown origin '{value}'")


class KindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    max_stored = 200  # stored kinds listed, besides the registered ones

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        # The list's stuck counts read the stored kinds already (JobAdmin.changelist_view).
        ctx: stuck.Context | None = getattr(request, "_jobstate_stuck_ctx", None)
        if ctx is not None:
            stored = ctx.stored_kinds[: self.max_stored]
        else:
            stored = distinct_values(Job, "kind", self.max_stored)
        kinds = set(registry.all_handlers()) | set(stored)
        return [(k, k) for k in sorted(kinds)]

    def queryset(self, request: Any, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        return queryset if value is None else queryset.filter(kind=value)


class OwnerFilter(admin.SimpleListFilter):
    title = "owner"
    parameter_name = "owner"
    max_listed = 30

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        ids = distinct_values(Job, "owner_id", self.max_listed)
        User = get_user_model()
        users = User.objects.filter(pk__in=ids).order_by(User.USERNAME_FIELD)
        choices = [("me", "Me"), ("none", "No owner (system)")]
        choices += [(str(u.pk), u.get_username()) for u in users if u.pk != request.user.pk]
        selected = self.value()
        if selected and selected not in {c[0] for c in choices}:
            pk = self._owner_pk(selected)
            user = User.objects.filter(pk=pk).first() if pk is not None else None
            choices.append((selected, user.get_username() if user else selected))
        return choices

    @staticmethod
    def _owner_pk(value: str) -> Any:
        """The user id ``value`` names, or None if it is malformed or out of range."""
        try:
            return clean_key(Job._meta.get_field("owner").target_field, value)
        except ValidationError:
            return None

    def queryset(self, request: Any, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        if value is None:
            return queryset
        if value == "me":
            return queryset.filter(owner=request.user)
        if value == "none":
            return queryset.filter(owner__isnull=True)
        pk = self._owner_pk(value)
        if pk is None:
            raise IncorrectLookupParameters(f"Unknown owner '{value}'")
        return queryset.filter(owner_id=pk)


class StuckFilter(admin.SimpleListFilter):
    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        return [("any", "Any reason"), *[(r.code, r.title) for r in stuck.REASONS]]

    def queryset(self, request: Any, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        if value is None:
            return queryset
        # The context the list's stuck counts already used (see JobAdmin.changelist_view).
        ctx = getattr(request, "_jobstate_stuck_ctx", None)
        if value == "any":
            return queryset.filter(stuck.any_stuck_q(ctx))
        if value not in stuck.BY_CODE:
            raise IncorrectLookupParameters(f"Unknown stuck reason '{value}'")
        return queryset.filter(stuck.stuck_q(value, ctx))


class JobIdFilter(admin.SimpleListFilter):
    """Rows of one job (reached from the job page); shows only the chosen job."""

    title = "job"
    parameter_name = "job"

    def lookups(self, request: Any, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, f"Job {short(value)}")] if value else []

    def has_output(self) -> bool:
        return self.value() is not None

    def queryset(self, request: Any, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        try:
            return queryset.filter(job_id=value)
        except (ValueError, ValidationError) as exc:  # a malformed id
            raise IncorrectLookupParameters(str(exc)) from exc
