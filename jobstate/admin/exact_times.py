"""Detail pages' times as the job page shows them (``display.exact_time``), not
Django's ``Nov. 30, 2026, 1:26 p.m.``, and other fields shown by a method of their own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from django.contrib import admin
from django.http import HttpRequest

from jobstate.admin import display


def _exact(name: str) -> Callable[[Any, Any], str]:
    @admin.display(description=name.replace("_", " "))
    def shown(self: Any, obj: Any) -> str:
        return display.exact_time(getattr(obj, name))

    return shown


class ShownAs:
    """ModelAdmin mixin: on a detail page each field of ``exact_times`` is shown as
    ``display.exact_time``, and each of ``shown_as`` by the read-only method it names,
    in the field's place (read-only, whatever the user's permissions)."""

    exact_times: ClassVar[tuple[str, ...]] = ()
    shown_as: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in cls.exact_times:
            setattr(cls, f"{name}_exact", _exact(name))

    def _shown(self) -> dict[str, str]:
        return {**{name: f"{name}_exact" for name in self.exact_times}, **self.shown_as}

    def _substituted(self, names: Sequence[Any]) -> list[Any]:
        shown, out = self._shown(), []
        for name in names:
            name = shown.get(name, name) if isinstance(name, str) else name
            if name not in out:
                out.append(name)
        return out

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        found = self._substituted(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        return (*found, *(m for m in self._shown().values() if m not in found))

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self._substituted(super().get_fields(request, obj))  # type: ignore[misc]
