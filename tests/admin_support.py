"""Fixtures and helpers shared by the admin tests (this module holds no tests).

Every situation is made through jobstate.services, with ``now=`` arguments for
time travel; nothing here depends on real workers.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import django
import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from jobstate import services
from jobstate.models import Job

KIND = "test.echo"  # max_attempts 3, no timeout of its own


def ago(**kwargs: float) -> Any:
    return timezone.now() - timedelta(**kwargs)


def queued(owner: Any = None, kind: str = KIND, **kwargs: Any) -> Job:
    return services.enqueue(kind, kwargs.pop("parameters", {"n": 1}), owner=owner, **kwargs)


def processing(
    owner: Any = None,
    *,
    kind: str = KIND,
    started: Any = None,
    lease_seconds: float = 600,
    worker: str = "w-test",
    **kwargs: Any,
) -> Job:
    """A job claimed at ``started`` (default now) under a lease of ``lease_seconds``."""
    started = started or timezone.now()
    job = services.enqueue(
        kind,
        kwargs.pop("parameters", {"n": 2}),
        owner=owner,
        run_after=started - timedelta(seconds=1),
        **kwargs,
    )
    services.start(job, worker, lease_seconds=lease_seconds, now=started)
    return Job.objects.get(pk=job.pk)


def expired(owner: Any = None, **kwargs: Any) -> Job:
    """Claimed 30 minutes ago with a 60 s lease: the lease expired 29 minutes ago."""
    return processing(owner, started=ago(minutes=30), lease_seconds=60, **kwargs)


def completed(owner: Any = None, **kwargs: Any) -> Job:
    job = processing(owner, started=kwargs.pop("started", None), **kwargs)
    services.complete(job, job.lease_token, {"ok": True, "rows": [1, 2, 3]})
    return Job.objects.get(pk=job.pk)


def failed(owner: Any = None, error: str = "boom: disk full", **kwargs: Any) -> Job:
    job = processing(owner, max_attempts=1, **kwargs)
    services.fail(job, job.lease_token, error, error_type="OSError", traceback="Traceback...\nOSError: boom")
    return Job.objects.get(pk=job.pk)


def grant(user: Any, *codenames: str) -> Any:
    perms = Permission.objects.filter(content_type__app_label="jobstate", codename__in=codenames)
    assert perms.count() == len(codenames), codenames
    user.user_permissions.add(*perms)
    # Permissions are cached on the instance; a fresh one sees them.
    return type(user).objects.get(pk=user.pk)


@pytest.fixture
def operator(django_user_model: Any) -> Any:
    """Staff who may view jobs and assets and perform every operation."""
    user = django_user_model.objects.create_user("olga", password="pw-olga-123", is_staff=True)
    return grant(user, "view_job", "view_asset", "cancel_job", "retry_job", "requeue_job")


@pytest.fixture
def viewer(django_user_model: Any) -> Any:
    """Staff who may only look at jobs."""
    user = django_user_model.objects.create_user("victor", password="pw-victor-123", is_staff=True)
    return grant(user, "view_job")


def breadcrumbs(html: str) -> list[str]:
    """The page's breadcrumbs as text, a part each, once their markup is checked to be
    the running Django's admin's: from 6.0 a list (an item a part, the last one the
    current page), before it a div with &rsaquo; between the parts."""
    nav = r'<nav aria-label="Breadcrumbs">\s*<(div|ol) class="breadcrumbs">(.*?)</\1>\s*</nav>'
    match = re.search(nav, html, re.S)
    assert match is not None, "no breadcrumbs"
    tag, block = match.groups()
    if django.VERSION >= (6, 0):
        assert tag == "ol" and "&rsaquo;" not in block, block
        assert not re.sub(r"<li[^>]*>.*?</li>", "", block, flags=re.S).strip(), block  # items only
        items = re.findall(r"<li( aria-current=\"page\")?>(.*?)</li>", block, re.S)
        assert [bool(current) for current, _ in items] == [False] * (len(items) - 1) + [True], block
        parts = [text for _, text in items]
    else:
        assert tag == "div" and "<li" not in block, block
        parts = block.split("&rsaquo;")
    return [" ".join(re.sub(r"<[^>]+>", "", part).split()) for part in parts]
