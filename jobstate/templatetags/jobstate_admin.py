"""Markup jobstate's own admin pages share with the running Django's admin.

Django 6's admin writes its breadcrumbs as a list (``<ol>``, an item a part) where
Django 5.2's wrote a ``div`` with ``&rsaquo;`` between the parts; its paginator is a
``nav`` with a list; it marks the links of a submit row (Close, Delete, "No, take me
back") ``role="button"``, and puts a form row's help and errors inside its
``.flex-container``. jobstate's pages follow the running version, each from one
template (``{% load jobstate_admin %}``).
"""

from __future__ import annotations

from typing import Any

import django
from django import template
from django.forms import BoundField
from django.utils.safestring import SafeString, mark_safe

register = template.Library()


@register.simple_tag
def admin_lists() -> bool:
    """Whether the running Django's admin writes its breadcrumbs and paginator as lists
    (6.0 on): ``{% admin_lists as lists %}``."""
    return django.VERSION >= (6, 0)


@register.simple_tag
def button_role() -> SafeString:
    """`` role="button"`` where the running Django's admin marks a submit row's link as a
    button (6.0 on), else nothing: ``<a{% button_role %} href="…" class="closelink">``."""
    return mark_safe(' role="button"' if django.VERSION >= (6, 0) else "")


@register.filter
def number(value: Any) -> Any:
    """A count as jobstate's admin writes every count, with thousands separators ("3,006"),
    as the Python side's ``f"{n:,}"`` labels; not humanize's ``intcomma``, which would need
    ``django.contrib.humanize`` in the project's INSTALLED_APPS. Anything else unchanged."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return value


@register.inclusion_tag("jobstate/breadcrumbs.html", takes_context=True)
def jobstate_breadcrumbs(context: template.Context, *parts: Any) -> dict[str, Any]:
    """Home, the app of ``opts``, then ``parts``: label and URL pairs (an empty URL:
    no link), the current page's label last. ``{% jobstate_breadcrumbs "Jobs" jobs_url
    "Stuck jobs" %}``."""
    *pairs, current = parts
    return {
        "opts": context["opts"],
        "crumbs": list(zip(pairs[::2], pairs[1::2], strict=True)),
        "current": current,
        "lists": admin_lists(),
    }


@register.inclusion_tag("jobstate/form_row.html")
def jobstate_form_row(field: BoundField) -> dict[str, Any]:
    """A form row of one field, laid out as the running Django's admin lays out one
    (``admin/includes/fieldset.html``): ``{% jobstate_form_row form.reason %}``."""
    return {"field": field, "inside": django.VERSION >= (6, 0)}
