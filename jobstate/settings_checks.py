"""The system checks of jobstate's settings (``manage.py check``): the values of
``settings.JOBSTATE`` against what each key takes (``jobstate.conf``), and the
storage it names for asset files."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from jobstate.conf import (
    CAPS,
    CHECKS_DOCS,
    CHOICES,
    DEFAULTS,
    FRACTIONS,
    MAXIMUM,
    MINIMUM,
    REMOVED,
    SECONDS_FROM_ZERO,
    accepts,
    allowed_types,
    get,
    seconds_in_range,
)


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join("None" if t is type(None) else t.__name__ for t in types)


def problems(user: Any) -> list[CheckMessage]:
    """What is wrong with a ``JOBSTATE`` value (empty when nothing)."""
    if user is None:
        return []
    if not isinstance(user, dict):
        return [
            Error(
                f"settings.JOBSTATE is a {type(user).__name__}; it must be a dict.",
                hint="JOBSTATE = {'LEASE_SECONDS': 60, ...}; see jobstate.conf.DEFAULTS. " + CHECKS_DOCS,
                id="jobstate.E001",
            )
        ]
    table = ", ".join(f"{k} ({_type_names(allowed_types(k))})" for k in sorted(DEFAULTS))
    found: list[CheckMessage] = []
    for key, value in user.items():
        if key in REMOVED:
            found.append(
                Warning(
                    f"settings.JOBSTATE[{key!r}] is no longer used: {REMOVED[key]}",
                    hint=f"Remove it from settings.JOBSTATE. {CHECKS_DOCS}",
                    obj=key,
                    id="jobstate.W010",
                )
            )
        elif key not in DEFAULTS:
            found.append(
                Error(
                    f"Unknown key {key!r} in settings.JOBSTATE.",
                    hint=f"Allowed keys and types: {table}. {CHECKS_DOCS}",
                    obj=key,
                    id="jobstate.E002",
                )
            )
        elif not accepts(allowed_types(key), value):
            found.append(
                Error(
                    f"settings.JOBSTATE[{key!r}] is {value!r} ({type(value).__name__}); "
                    f"expected {_type_names(allowed_types(key))}.",
                    hint=f"Default: {DEFAULTS[key]!r}. Allowed keys and types: {table}. {CHECKS_DOCS}",
                    obj=key,
                    id="jobstate.E003",
                )
            )
        elif key in MINIMUM and value is not None and not (value >= MINIMUM[key] and math.isfinite(value)):
            # NaN fails the comparison; infinity passed it (RETENTION_DAYS: timedelta raised).
            found.append(
                Error(
                    f"settings.JOBSTATE[{key!r}] is {value!r}; it must be a finite number, "
                    f"{MINIMUM[key]:g} or more.",
                    hint=f"Default: {DEFAULTS[key]!r}. {CHECKS_DOCS}",
                    obj=key,
                    id="jobstate.E005",
                )
            )
        elif key in MAXIMUM and value is not None and value > MAXIMUM[key]:
            found.append(
                Error(
                    f"settings.JOBSTATE[{key!r}] is {value!r}; it must be {MAXIMUM[key]:g} or less.",
                    hint=f"Default: {DEFAULTS[key]!r}. {CHECKS_DOCS}",
                    obj=key,
                    id="jobstate.E012",
                )
            )
        elif not seconds_in_range(key, value):
            least = "0 or more" if key in SECONDS_FROM_ZERO else "greater than 0"
            found.append(
                Error(
                    f"settings.JOBSTATE[{key!r}] is {value!r}; it must be a finite number of seconds, "
                    f"{least}.",
                    hint=f"Default: {DEFAULTS[key]!r}. {CHECKS_DOCS}",
                    obj=key,
                    id="jobstate.E009",
                )
            )
        elif key in CHOICES and value not in CHOICES[key]:
            found.append(
                Error(
                    f"settings.JOBSTATE[{key!r}] is {value!r}; it must be one of "
                    f"{', '.join(map(repr, CHOICES[key]))}.",
                    hint=f"Default: {DEFAULTS[key]!r}. {CHECKS_DOCS}",
                    obj=key,
                    id="jobstate.E006",
                )
            )
        elif key in FRACTIONS and not 0 <= value <= 1:  # NaN fails it too
            found.append(
                Error(
                    f"settings.JOBSTATE[{key!r}] is {value!r}; it must be a fraction from 0 to 1 "
                    "(0.25 adds up to 25 %).",
                    hint=f"Default: {DEFAULTS[key]!r}. {CHECKS_DOCS}",
                    obj=key,
                    id="jobstate.E010",
                )
            )
    return found + _caps_below_base(user, {m.obj for m in found})


def _caps_below_base(user: dict[str, Any], wrong: set[Any]) -> list[CheckMessage]:
    found: list[CheckMessage] = []
    for cap, base in CAPS.items():
        if (cap in user or base in user) and not {cap, base} & wrong:
            cap_value, base_value = user.get(cap, DEFAULTS[cap]), user.get(base, DEFAULTS[base])
            if cap_value < base_value:
                found.append(
                    Error(
                        f"settings.JOBSTATE[{cap!r}] is {cap_value!r}, below {base} ({base_value!r}): "
                        "every delay would be the cap.",
                        hint=f"Set {cap} to {base} or more (defaults: {DEFAULTS[base]!r}, "
                        f"{DEFAULTS[cap]!r}). {CHECKS_DOCS}",
                        obj=cap,
                        id="jobstate.E011",
                    )
                )
    return found


@register("jobstate")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Unknown keys and wrong types in ``settings.JOBSTATE`` are errors; removed keys warn."""
    return problems(getattr(settings, "JOBSTATE", None))


@register("jobstate")
def check_storage(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``JOBSTATE["STORAGE"]`` names a storage of ``settings.STORAGES``."""
    from django.core.files.storage import storages

    alias = get("STORAGE")
    if not isinstance(alias, str):
        return []  # a wrong type is E003's
    if alias in storages.backends:
        return _relative_files(alias)
    return [
        Error(
            f"settings.JOBSTATE['STORAGE'] is {alias!r}, which is not a key of settings.STORAGES "
            f"({', '.join(sorted(storages.backends))}).",
            hint=f"Name one of settings.STORAGES, or add {alias!r} to it. {CHECKS_DOCS}",
            id="jobstate.E004",
        )
    ]


def _relative_files(alias: str) -> list[CheckMessage]:
    """A file-system storage with no location and no ``MEDIA_ROOT`` stores each asset
    under the current directory of the process that writes it (a worker's, the web
    server's): files a download then looks for elsewhere."""
    from django.core.files.storage import FileSystemStorage, storages

    storage = storages[alias]
    if not isinstance(storage, FileSystemStorage) or storage.base_location:
        return []
    return [
        Warning(
            f"Job assets go to settings.STORAGES[{alias!r}], a FileSystemStorage with no location, and "
            "settings.MEDIA_ROOT is empty: each process would store files under its own current "
            "directory.",
            hint=f"Set MEDIA_ROOT (or the storage's OPTIONS location) to an absolute path. {CHECKS_DOCS}",
            id="jobstate.W011",
        )
    ]
