from __future__ import annotations

import pytest

from jobstate import registry


@pytest.fixture
def user(django_user_model):  # type: ignore[no-untyped-def]
    return django_user_model.objects.create_user("alice", password="pw-alice-123")


@pytest.fixture
def other_user(django_user_model):  # type: ignore[no-untyped-def]
    return django_user_model.objects.create_user("bob", password="pw-bob-123")


@pytest.fixture
def staff_user(django_user_model):  # type: ignore[no-untyped-def]
    return django_user_model.objects.create_user("carol", password="pw-carol-123", is_staff=True)


@pytest.fixture
def temp_handler():  # type: ignore[no-untyped-def]
    """Register handlers for one test only."""
    names: list[str] = []

    def register(name: str, func=None, **options):  # type: ignore[no-untyped-def]
        names.append(name)
        registry.unregister(name)
        return registry.handler(name, **options)(func or (lambda ctx: None))

    yield register
    for name in names:
        registry.unregister(name)
