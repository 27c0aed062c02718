"""What ``JobstateBackend.check()`` finds wrong with a backend's ``OPTIONS``
(``jobstate.tasks.check_backends`` runs that check on Django 5.2)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeGuard

from django.core import checks

from jobstate import conf
from jobstate.conf import MAX_ATTEMPTS_LIMIT

# The OPTIONS keys JobstateBackend reads (its docstring and docs/howto/django-tasks.md say what).
OPTION_KEYS = ("MAX_ATTEMPTS", "MODULES")


def names_modules(value: Any) -> TypeGuard[list[str] | tuple[str, ...]]:
    """Whether ``OPTIONS["MODULES"]`` is a list (or tuple) of module names."""
    return isinstance(value, list | tuple) and all(isinstance(module, str) for module in value)


def options_problems(alias: str, options: Any) -> Iterable[checks.CheckMessage]:
    """What is wrong with ``TASKS[alias]["OPTIONS"]`` of a jobstate backend."""
    where = f"TASKS[{alias!r}]['OPTIONS']"
    if not isinstance(options, dict):
        yield checks.Error(
            f"{where} is a {type(options).__name__}; it must be a dict.",
            hint=f"Keys: {', '.join(OPTION_KEYS)}. {conf.CHECKS_DOCS}",
            id="jobstate.E903",
        )
        return
    for key in options:
        if key not in OPTION_KEYS:
            yield checks.Error(
                f"Unknown key {key!r} in {where}.",
                hint=f"jobstate's backend reads {', '.join(OPTION_KEYS)}. {conf.CHECKS_DOCS}",
                obj=key,
                id="jobstate.E903",
            )
    attempts = options.get("MAX_ATTEMPTS")
    if attempts is not None and (
        isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT
    ):
        yield checks.Error(
            f"{where}['MAX_ATTEMPTS'] is {attempts!r}; it must be a whole number (an int) between 1 "
            f"and {MAX_ATTEMPTS_LIMIT}: every enqueue of a task without its own max_attempts would raise "
            "ValidationError.",
            hint="Leave it out for JOBSTATE['DEFAULT_MAX_ATTEMPTS'], or set 1 for no retries. "
            + conf.CHECKS_DOCS,
            obj="MAX_ATTEMPTS",
            id="jobstate.E902",
        )
    modules = options.get("MODULES")
    if modules is not None and not names_modules(modules):
        yield checks.Error(
            f"{where}['MODULES'] is {modules!r}; it must be a list of module names (strings): no module "
            "in it was imported.",
            hint='Write "MODULES": ["myapp.tasks"], not "MODULES": "myapp.tasks". ' + conf.CHECKS_DOCS,
            obj="MODULES",
            id="jobstate.E904",
        )
