"""Handlers registered by name. Jobs store the name; nothing is imported from a
dotted path that came from a client."""

from __future__ import annotations

import inspect
import json
import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from django.core.exceptions import ValidationError
from django.core.serializers.json import DjangoJSONEncoder

from jobstate.conf import MAX_ATTEMPTS_LIMIT
from jobstate.exceptions import InvalidParameters, UnknownKind

Backoff = float | Callable[[int], float]

# Who may enqueue a kind through the REST API: nobody (False, the default), any
# authenticated user (True), or users holding this permission ("app.codename").
ApiPolicy = bool | str


@dataclass(frozen=True)
class HandlerSpec:
    name: str
    func: Callable[..., Any]
    max_attempts: int | None = None
    timeout: float | None = None
    concurrency: int | None = None
    retry_backoff: Backoff | None = None
    schema: Any = None
    description: str = ""
    api: ApiPolicy = False
    options: dict[str, Any] = field(default_factory=dict)

    def validate(self, parameters: Any, *, strict: bool = True) -> dict[str, Any]:
        """Return cleaned parameters or raise ``ValidationError`` keyed by field.

        ``strict``: a serializer schema refuses a key it takes no input for
        (``jobstate.parameter_keys``). A retry passes False: the stored parameters are
        a serializer's output, which may hold keys it adds itself (in ``validate``, or
        under a field's ``source``)."""
        if parameters is None:
            parameters = {}
        if not isinstance(parameters, dict):
            raise ValidationError({"parameters": ["Parameters must be a JSON object."]})
        if self.schema is None:
            return parameters
        if _is_serializer_class(self.schema):
            serializer = self.schema(data=parameters)
            valid = serializer.is_valid()
            # A key the serializer has no field for is refused, not dropped: a typo
            # would run the job with a default instead.
            from jobstate import parameter_keys

            refused = parameter_keys.refused(serializer, parameters) if strict else {}
            if refused or not valid:
                errors = InvalidParameters(serializer.errors).errors if not valid else {}
                raise InvalidParameters(parameter_keys.merged(refused, errors))
            cleaned = serializer.validated_data
        else:
            cleaned = self.schema(parameters)
        plain: dict[str, Any] = json.loads(json.dumps(dict(cleaned), cls=DjangoJSONEncoder))
        return plain


# Inline markup of reStructuredText and Markdown, unwrapped by ``summary``: a role
# (:func:`x`, :py:class:`~a.B`), an inline literal (``x``), interpreted text or a
# Markdown code span (`x`), a hyperlink reference (`text <url>`_).
_ROLE = re.compile(r"(?<![\w`]):(?:[A-Za-z][\w+.-]*:)+`([^`]+)`")
_LITERAL = re.compile(r"(?<![\w`])``([^`]+?)``(?![\w`])")
_INTERPRETED = re.compile(r"(?<![\w`])`([^`]+)`(?:__?)?(?![\w`])")
_TITLED = re.compile(r"(.*?\S)\s*<[^<>]+>", re.S)


def _role_text(target: str) -> str:
    """The text Sphinx shows for a role's target: its title, or the target without
    ``!`` (no link) and, after ``~``, its last dotted part."""
    titled = _TITLED.fullmatch(target)
    if titled:
        return titled.group(1)
    target = target.lstrip("!")
    return target[1:].rsplit(".", 1)[-1] if target.startswith("~") else target


def summary(doc: str | None) -> str:
    """A docstring's summary as plain text: its first paragraph, lines joined, inline
    markup unwrapped (``_ROLE``, ``_LITERAL``, ``_INTERPRETED``); anything else is left
    as written."""
    paragraph = inspect.cleandoc(doc or "").split("\n\n", 1)[0]
    text = " ".join(paragraph.split())
    text = _ROLE.sub(lambda m: _role_text(m.group(1)), text)
    text = _LITERAL.sub(r"\1", text)
    return _INTERPRETED.sub(lambda m: _role_text(m.group(1)) if "<" in m.group(1) else m.group(1), text)


def _is_serializer_class(obj: Any) -> bool:
    try:
        from rest_framework.serializers import BaseSerializer
    except ImportError:  # pragma: no cover - DRF is a dependency
        return False
    return isinstance(obj, type) and issubclass(obj, BaseSerializer)


_registry: dict[str, HandlerSpec] = {}

# Options set by jobstate itself, kept in the spec's ``options`` (``jobstate.workflow``
# passes its class, and ``undo_on_cancel``): only through ``internal_handler``. ``handler``
# refuses them, as a typo.
_INTERNAL_OPTIONS = frozenset({"workflow", "undo_on_cancel"})
_OPTIONS = "max_attempts, timeout, concurrency, retry_backoff, schema and api"

F = TypeVar("F", bound=Callable[..., Any])


class Decorator(Protocol):
    """Registers the function and returns it, its type kept (a strict project's
    handlers stay typed)."""

    def __call__(self, func: F, /) -> F: ...


def handler(
    name: str,
    *,
    max_attempts: int | None = None,
    timeout: float | None = None,
    concurrency: int | None = None,
    retry_backoff: Backoff | None = None,
    schema: Any = None,
    api: ApiPolicy = False,
    **options: Any,
) -> Decorator:
    """Register a handler under ``name``.

    ``schema`` is a DRF serializer class (or a callable returning cleaned
    parameters) that ``enqueue`` validates parameters against.

    ``api`` says who may enqueue the kind through the REST API: ``False``
    (the default: nobody; code, workflows and the admin still can), ``True``
    (any authenticated user) or a permission name such as
    ``"reports.run_report"`` (users holding it). See docs/reference/api-access.md.
    """
    validate_name(name)
    unknown = sorted(options)
    if unknown:
        # A typo (max_attemps=5) would otherwise be kept and never read.
        raise TypeError(
            f"Handler '{name}': unknown option(s) {', '.join(unknown)}; the options are {_OPTIONS}"
        )
    validate_api_policy(name, api)
    validate_max_attempts(name, max_attempts)
    # "not >= 1" and isfinite(): NaN compares false, and int(inf) raises at the first claim.
    if concurrency is not None and not (concurrency >= 1 and math.isfinite(concurrency)):
        raise ValueError("concurrency must be at least 1")
    if timeout is not None and not timeout > 0:
        raise ValueError("timeout must be a positive number of seconds")
    if retry_backoff is not None and not callable(retry_backoff) and not retry_backoff >= 0:
        raise ValueError("retry_backoff is a number of seconds >= 0 or a callable attempt -> seconds")

    def register(func: F) -> F:
        if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func):
            # The worker stores what the handler returns: a coroutine would never run.
            raise TypeError(
                f"Handler '{name}': {getattr(func, '__qualname__', func)!r} is an async function; a "
                "handler is a plain def (run a coroutine inside it with asgiref.sync.async_to_sync, "
                "or write it as a django.tasks task, which may be async)"
            )
        existing = _registry.get(name)
        if (
            existing is not None
            and existing.func is not func
            and (
                getattr(existing.func, "__qualname__", None) != getattr(func, "__qualname__", None)
                or getattr(existing.func, "__module__", None) != getattr(func, "__module__", None)
            )
        ):
            raise ValueError(f"A handler is already registered as '{name}'")
        _registry[name] = HandlerSpec(
            name=name,
            func=func,
            max_attempts=max_attempts,
            timeout=timeout,
            concurrency=concurrency,
            retry_backoff=retry_backoff,
            schema=schema,
            description=summary(func.__doc__),
            api=api,
        )
        return func

    return register


def internal_handler(name: str, internal: dict[str, Any], /, **options: Any) -> Decorator:
    """``handler``, with options jobstate itself sets (``internal``, keys among
    ``_INTERNAL_OPTIONS``: ``jobstate.workflow`` passes its class as ``workflow``),
    kept in the spec's ``options``."""
    wrong = sorted(set(internal) - _INTERNAL_OPTIONS)
    if wrong:
        raise ValueError(f"Handler '{name}': not internal options: {', '.join(wrong)}")
    register = handler(name, **options)

    def register_internal(func: F) -> F:
        register(func)
        _registry[name] = replace(_registry[name], options=dict(internal))
        return func

    return register_internal


# The most characters a kind name has: the width of the ``kind`` columns (jobs,
# pauses, spawns). A longer name could be registered, but no job of it stored.
KIND_MAX_LENGTH = 200


def validate_name(name: str) -> None:
    """A kind name is text without control characters: they cannot be typed, the
    admin and logs show them badly, and the metrics join labels with one (\\x1f)."""
    if not isinstance(name, str) or not name or any(unicodedata.category(c) == "Cc" for c in name):
        raise ValueError(f"A job kind is a non-empty name without control characters, not {name!r}")
    if len(name) > KIND_MAX_LENGTH:
        raise ValueError(
            f"A job kind is at most {KIND_MAX_LENGTH} characters (the database's kind column); "
            f"{name[:40]!r}... has {len(name)}"
        )


def validate_max_attempts(name: str, max_attempts: Any) -> None:
    """What ``enqueue(max_attempts=...)`` takes: a kind registered with another value
    made jobs that enqueue itself refused (5000 runs, 2.5, True)."""
    if max_attempts is None:
        return
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise ValueError(
            f"Handler '{name}': max_attempts must be a whole number (an int) between 1 and "
            f"{MAX_ATTEMPTS_LIMIT}, not {max_attempts!r}"
        )


def validate_api_policy(name: str, api: Any) -> None:
    if isinstance(api, bool):
        return
    if isinstance(api, str):
        app_label, dot, codename = api.partition(".")
        if dot and app_label and codename and not any(c.isspace() for c in api):
            return
    raise ValueError(
        f"Handler '{name}': api must be False, True or a permission name like 'app_label.codename', "
        f"not {api!r}"
    )


def get_handler(name: str) -> HandlerSpec:
    try:
        return _registry[name]
    except KeyError:
        raise UnknownKind(name) from None


def all_handlers() -> dict[str, HandlerSpec]:
    return dict(_registry)


def concurrency_limits() -> dict[str, int]:
    return {n: s.concurrency for n, s in _registry.items() if s.concurrency}


def unregister(name: str) -> None:
    """Remove a handler (for tests)."""
    _registry.pop(name, None)


def autodiscover() -> None:
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("jobs")
