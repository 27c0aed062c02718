"""The django-q2 adapter: the installed django-q2 is in the range it is tested with,
and no module but the adapter imports django-q2's internals."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

from jobstate.worker import q2

PACKAGE = Path(q2.__file__).resolve().parent.parent
# Public, documented API that other modules may use (schedules, the admin's status).
PUBLIC = {"django_q.models.Schedule", "django_q.status", "django_q.tasks"}


def _parse(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def test_installed_django_q2_is_in_the_tested_range():
    low, high = re.fullmatch(r">=([\d.]+),<([\d.]+)", q2.TESTED).groups()  # type: ignore[union-attr]
    assert _parse(low) <= _parse(version("django-q2")) < _parse(high)
    requirements = (PACKAGE.parent / "requirements.txt").read_text()
    assert f"django-q2{q2.TESTED}" in requirements


def test_only_the_adapter_reaches_into_django_q2_internals():
    internal = re.compile(r"from django_q\.(brokers|conf|signals|signing|cluster|pusher|worker)\b")
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path != Path(q2.__file__).resolve() and internal.search(path.read_text())
    ]
    assert offenders == []
