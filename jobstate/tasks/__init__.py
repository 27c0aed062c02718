"""jobstate as a backend of Django's tasks framework (``django.tasks`` on Django
6.0+, the ``django-tasks`` backport on 5.2)::

    TASKS = {"default": {"BACKEND": "jobstate.tasks.JobstateBackend"}}

See docs/howto/django-tasks.md. Importing this package does not import the
tasks framework; its names are loaded on first use.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from django.core import checks

if TYPE_CHECKING:  # the real types for type checkers; at runtime, loaded on first use
    from jobstate.tasks.backend import JobstateBackend, enqueue_on_commit
    from jobstate.tasks.decorator import task
    from jobstate.tasks.handlers import current
    from jobstate.tasks.task_types import JobstateTask, JobstateTaskContext

__all__ = [
    "JobstateBackend",
    "JobstateTask",
    "JobstateTaskContext",
    "current",
    "enqueue_on_commit",
    "install",
    "task",
]

# Each name's module, imported on first use.
_LAZY = {
    "JobstateBackend": "backend",
    "enqueue_on_commit": "backend",
    "task": "decorator",
    "current": "handlers",
    "JobstateTask": "task_types",
    "JobstateTaskContext": "task_types",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        _require_installed(name)
        return getattr(importlib.import_module(f"jobstate.tasks.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'jobstate.tasks' has no attribute {name!r}")


def _require_installed(name: str) -> None:
    """These names need jobstate's models, which Django refuses to load for an app not in
    ``INSTALLED_APPS`` with an error about ``Asset``'s app_label. No system check can say
    it first: with the app not installed, none of jobstate's code runs before this import
    (at ``TASKS``' first use or a ``@task``'s decoration)."""
    from django.apps import apps

    if apps.apps_ready and not apps.is_installed("jobstate"):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            f"jobstate.tasks.{name} needs 'jobstate' (and 'django_q') in INSTALLED_APPS: "
            "TASKS names jobstate's backend, but the app is not installed."
        )


def configured_aliases() -> list[str]:
    """Aliases in ``settings.TASKS`` whose backend is jobstate's (or a subclass of it)."""
    from django.conf import settings

    tasks = getattr(settings, "TASKS", None) or {}
    return [alias for alias, config in tasks.items() if isinstance(config, dict) and _is_jobstates(config)]


def _is_jobstates(config: dict[str, Any]) -> bool:
    path = config.get("BACKEND")
    if not isinstance(path, str):
        return False
    if path.startswith("jobstate.tasks."):
        return True
    from django.utils.module_loading import import_string

    try:
        backend = import_string(path)
    except ImportError:  # Django raises InvalidTaskBackend when the alias is used
        return False
    # Compared by name: importing jobstate's backend would import the tasks framework.
    return isinstance(backend, type) and any(
        f"{cls.__module__}.{cls.__qualname__}" == "jobstate.tasks.backend.JobstateBackend"
        for cls in backend.__mro__
    )


@checks.register("jobstate")
def check_backends(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Run jobstate's backends' ``check()`` where nothing else does. Django 6's
    ``django.tasks`` registers a check that runs every backend's; the django-tasks
    backport (Django 5.2) registers it only when ``"django_tasks"`` is an installed app,
    which jobstate does not need."""
    aliases = configured_aliases()
    # Importing the framework's checks module registers its check (django.tasks imports
    # it; the backport's is imported by its app's ready()).
    if not aliases or {"django.tasks.checks", "django_tasks.checks"} & sys.modules.keys():
        return []
    from jobstate.tasks.compat import task_backends

    return [message for alias in aliases for message in task_backends[alias].check()]


def install() -> None:
    """Called from ``JobstateConfig.ready()``: when a ``TASKS`` backend is
    jobstate's, import every installed app's ``tasks`` module and the backends'
    ``OPTIONS["MODULES"]``, so that each process (workers included) has every
    task's kind registered before it claims or reads jobs."""
    from django.conf import settings
    from django.utils.module_loading import autodiscover_modules

    aliases = configured_aliases()
    if not aliases:
        return
    from jobstate import hooks
    from jobstate.tasks.checks import names_modules
    from jobstate.tasks.handlers import on_transition

    # It only reads, after the commit (task_finished): no transaction needed.
    hooks.transitioned.register(on_transition, writes=lambda change: False)
    autodiscover_modules("tasks")
    for alias in aliases:
        options = settings.TASKS[alias].get("OPTIONS") or {}
        modules = options.get("MODULES") if isinstance(options, dict) else None
        # OPTIONS that is not a dict (jobstate.E903) or MODULES not a list of names (E904,
        # a string's characters were imported one by one) is a check's to report, not a
        # crash at startup.
        for module in modules if names_modules(modules) else []:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name is None or not (module == exc.name or module.startswith(f"{exc.name}.")):
                    raise  # a module the task module imports: its own error
                from django.core.exceptions import ImproperlyConfigured

                raise ImproperlyConfigured(
                    f"TASKS[{alias!r}]['OPTIONS']['MODULES'] names {module!r}, which cannot be "
                    f"imported: no module named {exc.name!r}."
                ) from exc
