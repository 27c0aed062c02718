"""Markup jobstate's own admin pages share with the running Django's admin.

Django 6's admin writes its breadcrumbs as a list (``<ol>``, an item a part) where
Django 5.2's wrote a ``div`` with ``&rsaquo;`` between the parts; its paginator is a
``nav`` with a list. jobstate's pages follow the running version, each from one
template (``{% load jobstate_admin %}``).
"""

from __future__ import annotations

from typing import Any

import django
from django import template

register = template.Library()


@register.simple_tag
def admin_lists() -> bool:
    """Whether the running Django's admin writes its breadcrumbs and paginator as lists
    (6.0 on): ``{% admin_lists as lists %}``."""
    return django.VERSION >= (6, 0)


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
