"""Counters and histograms derived from the job history (``JobEvent`` rows).

Every transition already writes one history row in its own transaction; the
counters are folded in from those rows by whichever process serves a scrape,
by id, incrementally, into ``MetricTotal`` rows. So:

- the job hot path pays nothing (no extra write, no shared memory);
- every web process answers with the same totals, whatever worker process
  made the transitions, and a restart of any process resets nothing;
- a row whose transaction commits late is not skipped if it commits within
  METRICS_SETTLE_SECONDS of its insert: a fold stops before the first row
  younger than that (ids are taken at insert, rows become visible at commit),
  so counters lag real time by that many seconds (a longer transaction's rows
  can be missed: docs/howto/metrics.md);
- the work per scrape is three grouped queries over the rows since the last
  fold, whatever the size of the history.

Counting starts at the first fold: on a database that already holds more
history than METRICS_FOLD_BATCH rows, older rows are skipped, not counted (as
a Prometheus counter starting at zero would).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import (
    Case,
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Sum,
    Value,
    When,
)
from django.utils import timezone

from jobstate import conf
from jobstate.hooks import HistoryTaken
from jobstate.metrics.models import MetricTotal
from jobstate.models import JobEvent
from jobstate.states import TERMINAL, Status

CURSOR = "_cursor"
SEP = "\x1f"

WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, math.inf)
RUN_BUCKETS = (0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, math.inf)


def key(*parts: Any) -> str:
    return SEP.join(str(p) for p in parts)


def split(k: str) -> list[str]:
    return k.split(SEP)


@dataclass
class Totals:
    values: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cursor: int = 0

    def add(self, k: str, amount: float = 1.0) -> None:
        self.values[k] += amount


def _bucket(expression: Any, buckets: tuple[float, ...]) -> Case:
    """The index of the histogram bucket a duration falls in, computed by the database."""
    return Case(
        *[
            When(**{f"{expression}__lte": timedelta(seconds=bound)}, then=Value(i))
            for i, bound in enumerate(buckets[:-1])
        ],
        default=Value(len(buckets) - 1),
        output_field=IntegerField(),
    )


def _count(after: int, upto: int, totals: Totals) -> None:
    """Add the history rows ``after < id <= upto`` to ``totals``: three grouped
    queries over that id range, nothing per row in Python."""
    events = JobEvent.objects.filter(id__gt=after, id__lte=upto).order_by()
    reaper = Case(When(actor_label="system:reaper", then=Value(True)), default=Value(False))
    # An attempt that failed and will run again (services.fail with a retry left)
    # records its error; a Suspend, a hand-back or an operator's requeue do not. A
    # failure before the handler started records it too, but spent no attempt when
    # it was refunded (marked "unstarted"): no retry.
    failed = Case(
        When(metadata__has_key="unstarted", then=Value(False)),
        When(metadata__has_key="error_type", then=Value(True)),
        default=Value(False),
    )
    grouped = (
        events.annotate(by_reaper=reaper, failed=failed)
        .values_list("job__kind", "from_status", "to_status", "transition", "by_reaper", "failed")
        .annotate(n=Count("id"))
    )
    for kind, from_status, to_status, name, by_reaper, failed_attempt, n in grouped:
        totals.add(key("transitions", kind, from_status or "none", to_status, name), n)
        if by_reaper:
            totals.add(key("reaper", kind, name), n)
        if to_status in TERMINAL:
            totals.add(key("outcomes", kind, to_status), n)
        elif from_status == Status.PROCESSING and to_status == Status.QUEUED:
            if by_reaper:
                totals.add(key("outcomes", kind, "rescued"), n)
            elif failed_attempt:
                totals.add(key("outcomes", kind, "retried"), n)
    # Queue wait: enqueue to the job's first claim (an attempt refunded by a
    # Suspend or a hand-back is claimed again as attempt 1: not a first claim).
    earlier_claim = JobEvent.objects.filter(
        job_id=OuterRef("job_id"), id__lt=OuterRef("id"), transition="claim"
    )
    first_claims = events.filter(transition="claim").exclude(Exists(earlier_claim))
    waited = first_claims.annotate(
        d=ExpressionWrapper(F("created_at") - F("job__created_at"), output_field=DurationField())
    )
    _histogram(waited, "wait", WAIT_BUCKETS, totals, "job__kind")
    # Run time: the last attempt's start to the end (the job has ended, so started_at is that attempt's).
    ended = events.filter(
        from_status=Status.PROCESSING, to_status__in=list(TERMINAL), job__started_at__isnull=False
    ).annotate(d=ExpressionWrapper(F("created_at") - F("job__started_at"), output_field=DurationField()))
    _histogram(ended, "run", RUN_BUCKETS, totals, "job__kind", "to_status")


def _histogram(qs: Any, name: str, buckets: tuple[float, ...], totals: Totals, *labels: str) -> None:
    rows = qs.annotate(b=_bucket("d", buckets)).values_list(*labels, "b").annotate(n=Count("id"), s=Sum("d"))
    for *label_values, index, n, total in rows:
        seconds = max(0.0, total.total_seconds()) if total is not None else 0.0
        totals.add(key(name + "_bucket", *label_values, buckets[index]), n)
        totals.add(key(name + "_sum", *label_values), seconds)
        totals.add(key(name + "_count", *label_values), n)


def _settled_upto(cursor: int, now: datetime, limit: int | None) -> int:
    """The highest history id that may be folded in: below the first row younger
    than METRICS_SETTLE_SECONDS (its transaction may not be alone in flight) and
    at most ``limit`` existing rows past the cursor (None: any number).

    The window is counted in rows, not ids: ids have gaps (a rolled-back
    transaction's, retention's deletions), and a window of ids inside a gap
    would find nothing and hold the cursor there for good."""
    young_after = now - timedelta(seconds=float(conf.get("METRICS_SETTLE_SECONDS")))
    past = JobEvent.objects.filter(id__gt=cursor)
    # The limit-th row past the cursor, by the primary key's index (else the last one).
    edge = [] if limit is None else list(past.order_by("id").values_list("id", flat=True)[limit - 1 : limit])
    last: int | None = edge[0] if edge else past.aggregate(last=Max("id"))["last"]
    if last is None:
        return cursor
    window = past.filter(id__lte=last)
    young: int | None = window.filter(created_at__gte=young_after).aggregate(first=Min("id"))["first"]
    return young - 1 if young is not None else last


def fold(now: datetime | None = None, *, wait: bool = False) -> int | None:
    """Fold settled history rows (``METRICS_FOLD_BATCH`` at most) into the stored totals,
    one process at a time: a process that finds another folding skips it (None), or
    with ``wait`` waits for it to end. Returns the cursor after the fold."""
    now = now or timezone.now()
    limit = max(1, int(conf.get("METRICS_FOLD_BATCH")))
    with transaction.atomic():
        lock = MetricTotal.objects.filter(key=CURSOR)
        if connection.features.has_select_for_update_skip_locked:
            lock = lock.select_for_update(skip_locked=not wait)
        row = lock.values_list("value", flat=True).first()
        if row is None and not MetricTotal.objects.filter(key=CURSOR).exists():
            _first_cursor(limit)
            row = lock.values_list("value", flat=True).first()
        return None if row is None else _fold_locked(int(row), now, limit)


def catch_up(deadline: float | None) -> HistoryTaken | None:
    """Retention's turn (``hooks.history_pruning``): fold every settled row, batch after
    batch, until none is left or (between batches) ``time.monotonic()`` passes
    ``deadline``, so that the rows a prune deletes are counted first. None when no scrape
    has started counting (no cursor): the counters start at the first scrape anyway."""
    if not MetricTotal.objects.filter(key=CURSOR).exists():
        return None
    cursor = _stored_cursor()
    while True:
        # Waits for a scrape's fold under way (it holds the cursor's lock) rather than
        # skip it: each batch is counted once, by one of them.
        folded = fold(wait=True)
        if folded is None or folded == cursor:
            return HistoryTaken(upto=_stored_cursor() if folded is None else folded)
        cursor = folded
        if deadline is not None and time.monotonic() >= deadline:
            left = _settled_upto(cursor, timezone.now(), 1) > cursor
            return HistoryTaken(upto=cursor, more=left)


def reach() -> HistoryTaken | None:
    """A dry-run prune's question (``hooks.history_reach``): how far ``catch_up`` would
    fold now, with no deadline (every settled row), read only. None as ``catch_up``."""
    if not MetricTotal.objects.filter(key=CURSOR).exists():
        return None
    return HistoryTaken(upto=_settled_upto(_stored_cursor(), timezone.now(), None))


def _stored_cursor() -> int:
    return int(MetricTotal.objects.filter(key=CURSOR).values_list("value", flat=True).first() or 0)


def stored() -> Totals:
    """The stored totals, as every process sees them now (a small table: one row per
    series). Read at each scrape, not cached: a process must never report less than
    another process already reported from a later fold."""
    stored = dict(MetricTotal.objects.values_list("key", "value"))
    totals = Totals(cursor=int(stored.pop(CURSOR, 0)))
    totals.values.update(stored)
    return totals


def _first_cursor(limit: int) -> None:
    """Where counting starts: at the first row when the history is short, else
    at the last one (older history is not replayed)."""
    last = JobEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    first = JobEvent.objects.order_by("id").values_list("id", flat=True).first() or 0
    start = first - 1 if last - first < limit else last
    MetricTotal.objects.get_or_create(key=CURSOR, defaults={"value": max(start, 0)})


def _fold_locked(cursor: int, now: datetime, limit: int) -> int:
    upto = _settled_upto(cursor, now, limit)
    if upto <= cursor:
        return cursor
    totals = Totals()
    _count(cursor, upto, totals)
    # The cursor row is locked (or, on SQLite, the transaction holds the write
    # lock): no other fold runs, so read-add-write is exact. One upsert.
    totals.values[CURSOR] = upto
    stored = dict(MetricTotal.objects.filter(key__in=list(totals.values)).values_list("key", "value"))
    MetricTotal.objects.bulk_create(
        [
            MetricTotal(key=k, value=v if k == CURSOR else stored.get(k, 0.0) + v)
            for k, v in totals.values.items()
        ],
        update_conflicts=True,
        unique_fields=["key"],
        update_fields=["value"],
    )
    return upto
