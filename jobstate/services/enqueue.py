"""Creating jobs: validated, idempotent by (kind, owner, key), with their first event."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Model
from django.utils import timezone

from jobstate import conf
from jobstate.exceptions import DuplicateActiveKey, KeyReused
from jobstate.models import Job
from jobstate.registry import HandlerSpec, get_handler
from jobstate.services._rows import create_job as _create
from jobstate.services.actors import Actor
from jobstate.states import ACTIVE, Status
from jobstate.storable import clean_key, json_text, text

SMALLINT = (-32768, 32767)
# Lookups-then-inserts of a keyed job before giving up: each retry follows an
# active job that took the key and ended between our lookup and our insert.
KEY_ATTEMPTS = 3


def cleaned_input(
    kind: str,
    parameters: Any,
    *,
    key: str | None,
    watermark: int | None,
    priority: int,
    run_after: datetime | None,
    max_attempts: int | None,
    stored: bool = False,
) -> tuple[HandlerSpec, dict[str, Any]]:
    """The handler of ``kind`` and the cleaned parameters, or ``ValidationError``
    (``UnknownKind``): every check ``enqueue`` makes of its arguments. The cleaned
    parameters are the JSON that was checked, read back: never the caller's object,
    which later changes would reach, nor values the JSON column cannot take (a
    schema-less kind's datetime, Decimal or tuple read as a schema's are,
    ``HandlerSpec.validate``). ``stored``: parameters a job was enqueued with
    (a retry's), already a schema's output, so a key it added is not refused."""
    if not isinstance(kind, str) or not kind:
        raise ValidationError({"kind": ["A job kind is required."]})
    spec = get_handler(kind)
    cleaned = spec.validate(parameters, strict=not stored)
    encoded = json_text(cleaned, "parameters")
    if cleaned is parameters:
        cleaned = json.loads(encoded)
    size = len(encoded.encode())
    if size > conf.get("MAX_PARAMETERS_BYTES"):
        raise ValidationError(
            {"parameters": [f"Parameters are {size} bytes; the limit is {conf.get('MAX_PARAMETERS_BYTES')}."]}
        )
    errors: dict[str, list[str]] = {}
    if key is not None and (problem := key_problem(key)) is not None:
        errors["key"] = [problem]
    if watermark is not None and (isinstance(watermark, bool) or not isinstance(watermark, int)):
        errors["watermark"] = ["A watermark is an integer."]
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not SMALLINT[0] <= priority <= SMALLINT[1]
    ):
        errors["priority"] = [f"Priority is an integer between {SMALLINT[0]} and {SMALLINT[1]}."]
    if run_after is not None and not settings.USE_TZ and not connection.features.supports_timezones:
        # Django would raise ValueError at the INSERT (an aware one; a naive one is refused below).
        errors["run_after"] = [
            "run_after cannot be stored with USE_TZ = False: jobstate needs a timezone-aware run_after, "
            f"which Django stores in {connection.display_name} only with USE_TZ = True. Set USE_TZ = True "
            "(Django's default) to defer jobs, or enqueue without run_after."
        ]
    elif run_after is not None and (not isinstance(run_after, datetime) or timezone.is_naive(run_after)):
        errors["run_after"] = ["run_after is a timezone-aware datetime."]
    elif run_after is not None and not _storable_time(run_after):
        # In UTC, as both databases store it: year 10000 is written by PostgreSQL
        # and then cannot be read back; SQLite's conversion overflows.
        errors["run_after"] = ["run_after is between the years 1 and 9999 in UTC."]
    if max_attempts is not None and (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= conf.MAX_ATTEMPTS_LIMIT
    ):
        errors["max_attempts"] = [f"max_attempts is an integer between 1 and {conf.MAX_ATTEMPTS_LIMIT}."]
    if errors:
        raise ValidationError(errors)
    return spec, cleaned


def key_problem(key: Any) -> str | None:
    """Why ``key`` cannot be an idempotency key (None: it can), the one rule of every
    entry point. A blank key is refused, not stripped: stripping would make keys
    that differ only in spaces share one job, and "  " is no key anyone meant."""
    if not isinstance(key, str) or not key or len(key) > 255:
        return "A key is a non-empty string of at most 255 characters."
    if not key.strip():
        return "A key cannot be blank (only whitespace)."
    if text(key) != key:
        return "A key holds no NUL character or lone surrogate."
    return None


def check_job(
    kind: str,
    parameters: Any = None,
    *,
    priority: int = 0,
    run_after: datetime | None = None,
    max_attempts: int | None = None,
) -> dict[str, Any]:
    """What ``enqueue`` would check, writing nothing: the cleaned parameters, or
    ``ValidationError`` (``UnknownKind`` for a kind not registered here)."""
    return cleaned_input(
        kind,
        parameters,
        key=None,
        watermark=None,
        priority=priority,
        run_after=run_after,
        max_attempts=max_attempts,
    )[1]


def _storable_time(moment: datetime) -> bool:
    try:
        moment.astimezone(UTC)  # raises past year 9999 or before year 1
    except OverflowError:
        return False
    return True


def get_or_enqueue(
    kind: str,
    parameters: Mapping[str, Any] | None = None,
    *,
    owner: Any = None,
    key: str | None = None,
    watermark: int | None = None,
    priority: int = 0,
    run_after: datetime | None = None,
    max_attempts: int | None = None,
    parent: Job | None = None,
    retry_of: Job | None = None,
    actor: Actor | str | Any | None = None,
    reason: str = "",
    match_request: bool = False,
) -> tuple[Job, bool]:
    """Queue a job, or return the one its key already names.

    Keys are scoped per owner (system jobs, with no owner, share one scope). A key is
    taken as given; one that is empty, only whitespace, longer than 255 characters or
    holds a NUL is a ``ValidationError`` (``key_problem``).
    With a key: an active job with that (kind, owner, key) is returned, its
    watermark raised (never lowered). Otherwise, when the last completed job
    with that key has processed input at least as new as ``watermark``, that
    job is returned and nothing runs; else a new job is queued. Retention ends
    that: once it deletes the completed job (``RETENTION_DAYS`` after it
    finished), the same key queues the work again. Returns
    ``(job, created)``. Raises ``DuplicateActiveKey`` (never ``IntegrityError``)
    if the key keeps changing hands under it, or if its active job is being
    cancelled (it would end cancelled with this request's work).

    The job a key names is returned whatever it was enqueued with. With
    ``match_request`` (the REST API's rule) a job whose parameters (as the kind's
    schema cleaned them) or priority differ from this request's raises
    ``jobstate.exceptions.KeyReused`` instead, before its watermark is raised: the
    key names other work. Its ``run_after`` and watermark are not compared
    (retries, requeues and re-runs move the one; a newer watermark is what a key
    is reused with).

    ``run_after`` is a timezone-aware datetime; with ``USE_TZ = False`` only
    PostgreSQL stores one (a ``ValidationError`` elsewhere). ``parent`` and
    ``retry_of`` are jobs or None, else ``TypeError``.
    """
    for name, job in (("parent", parent), ("retry_of", retry_of)):
        if job is not None and not isinstance(job, Job):
            raise TypeError(f"{name} is a Job or None, not {job!r:.100}")
    spec, cleaned = cleaned_input(
        kind,
        parameters,
        key=key,
        watermark=watermark,
        priority=priority,
        run_after=run_after,
        max_attempts=max_attempts,
        stored=retry_of is not None,
    )
    owner = user_of(owner)
    who = Actor.of(actor if actor is not None else owner)
    conflict: IntegrityError | None = None
    with transaction.atomic():
        for _attempt in range(KEY_ATTEMPTS):
            if key is not None:
                request = (cleaned, priority) if match_request else None
                existing = _existing_for_key(kind, key, watermark, _owner_id(owner), request)
                if existing is not None:
                    return existing, False
            try:
                with transaction.atomic():
                    job = _create(
                        spec,
                        cleaned,
                        owner,
                        key,
                        watermark,
                        priority,
                        run_after,
                        max_attempts,
                        parent,
                        retry_of,
                        who,
                        reason,
                    )
                return job, True
            except IntegrityError as exc:
                if key is None:
                    raise
                conflict = exc  # a job took the key after our lookup: look again
    raise DuplicateActiveKey(f"Another active '{kind}' job holds key '{key}'; try again") from conflict


def enqueue(kind: str, parameters: Mapping[str, Any] | None = None, **options: Any) -> Job:
    """Queue a job (see ``get_or_enqueue``) and return it."""
    return get_or_enqueue(kind, parameters, **options)[0]


def user_of(owner: Any) -> Any:
    """The owner as a user: None, a saved user, or the primary key of one (checked: a
    value of another type, another model's instance, an unsaved user, or a key out of
    range or naming no user is a ValidationError, not a database error at the insert or
    at the commit)."""
    if owner is None:
        return owner
    User = get_user_model()
    if isinstance(owner, Model):
        # Else an AttributeError (naming the actor) or a ValueError at the insert.
        if not isinstance(owner, User):
            raise ValidationError({"owner": [f"Not a user: a {type(owner).__name__}."]})
        if owner.pk is None:
            raise ValidationError({"owner": ["The user is not saved (it has no id yet)."]})
        return owner
    try:
        if isinstance(owner, bool) or not isinstance(owner, int | str | uuid.UUID):
            raise ValidationError("not a key")  # 1.5 would be read as 1
        user = User._default_manager.filter(pk=clean_key(User._meta.pk, owner)).first()
    except ValidationError:
        user = None
    if user is None:
        raise ValidationError({"owner": [f"No user with the id {str(owner)[:100]!r}."]})
    return user


def _owner_id(owner: Any) -> Any:
    return owner.pk if isinstance(owner, Model) else owner


def _existing_for_key(
    kind: str, key: str, watermark: int | None, owner_id: Any, request: tuple[dict[str, Any], int] | None
) -> Job | None:
    same_key = Job.objects.filter(kind=kind, key=key, owner_id=owner_id)  # owner_id=None: IS NULL
    active = same_key.select_for_update().filter(status__in=ACTIVE).first()
    if active is not None:
        if active.cancel_requested_at is not None:
            # It ends cancelled: answering with it (or raising its watermark) would
            # drop this request's work without a word.
            raise DuplicateActiveKey(
                f"The active '{kind}' job holding key '{key}' is being cancelled; try again once it has ended"
            )
        _refuse_other_work(active, key, request)
        if watermark is not None and (active.input_watermark is None or active.input_watermark < watermark):
            Job.objects.filter(pk=active.pk).update(input_watermark=watermark)
            active.input_watermark = watermark
        return active
    last = same_key.filter(status=Status.COMPLETED).order_by("-finished_at").first()
    if last is None:
        return None
    dirty = watermark is not None and (
        last.last_success_watermark is None or watermark > last.last_success_watermark
    )
    if dirty:
        return None
    _refuse_other_work(last, key, request)
    return last


def _refuse_other_work(job: Job, key: str, request: tuple[dict[str, Any], int] | None) -> None:
    if request is None:
        return
    parameters, priority = request
    same = {"parameters": _same_json(job.parameters, parameters), "priority": job.priority == priority}
    fields = tuple(name for name, matches in same.items() if not matches)
    if fields:
        raise KeyReused(job.pk, job.kind, key, fields)


def _same_json(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are the same JSON: objects whatever their key
    order, numbers by value (PostgreSQL's jsonb reads a stored 1e20 back as an
    integer), ``true`` never ``1``. Iterative: a value as deep as ``json.dumps`` took
    is no RecursionError here."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return False
            pending.extend((x[k], y[k]) for k in x)
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                return False
            pending.extend(zip(x, y, strict=True))
        elif _number(x) and _number(y):
            if _decimal(x) != _decimal(y):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _decimal(number: int | float) -> Decimal:
    """The value a JSON number's text states: a float by its shortest text (``1e23``,
    which PostgreSQL's jsonb reads back as the integer 10**23, while the float's
    binary value is 99999999999999991611392)."""
    return Decimal(repr(number)) if isinstance(number, float) else Decimal(number)
