"""Small HTML fragments shared by the admin pages: badges, bars, durations, JSON."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.template.defaultfilters import filesizeformat
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobstate.states import Status

# Badge colours per status; also used by the dashboard charts.
STATUS_COLOURS: dict[str, str] = {
    Status.QUEUED: "#6b7280",
    Status.WAITING: "#0e7490",
    Status.PROCESSING: "#2563eb",
    Status.COMPLETED: "#15803d",
    Status.PARTIAL: "#b45309",
    Status.FAILED: "#b91c1c",
    Status.CANCELLED: "#7c3aed",
}


# JSON up to this many characters is shown on one line (parameters, results).
COMPACT_JSON = 100

# Enum lookups are slow enough to matter at 50 rows x several columns.
STATUS_LABELS: dict[str, str] = {str(value): str(label) for value, label in Status.choices}


def status_badge(status: str, extra: str = "") -> SafeString:
    label = STATUS_LABELS.get(status, status)
    return format_html(
        '<span class="js-badge js-badge-{}" title="{}">{}</span>', status, extra or label, label
    )


def progress_bar(percent: int | None, message: str = "", status: str = "") -> SafeString:
    value = max(0, min(100, int(percent or 0)))
    return format_html(
        '<div class="js-progress js-progress-{}" role="progressbar" aria-valuenow="{}" '
        'aria-valuemin="0" aria-valuemax="100" title="{}">'
        '<div class="js-progress-fill" style="width: {}%"></div>'
        '<span class="js-progress-label">{}%</span></div>',
        status,
        value,
        message or f"{value}%",
        value,
        value,
    )


def short_duration(delta: timedelta | None) -> str:
    """Every admin page's durations: ``2d 03h``, ``2h 05m``, ``3m 07s``, ``41s``, ``7.2s``,
    ``0.3s``, ``12ms`` (a webhook delivery's)."""
    if delta is None:
        return "-"
    seconds = delta.total_seconds()
    if seconds < 0:
        return "-"
    if seconds < 0.1:
        return f"{round(seconds * 1000)}ms"
    if round(seconds, 1) < 10:
        return f"{seconds:.1f}s"
    whole = max(10, int(seconds))  # 9.96 rounds to 10.0 above
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def seconds_label(seconds: float | None) -> str:
    return "-" if seconds is None else short_duration(timedelta(seconds=seconds))


def local(moment: datetime) -> datetime:
    """``moment`` in the current time zone; a naive one (``USE_TZ = False``, stored in
    TIME_ZONE) as it is: ``timezone.localtime`` refuses it."""
    return timezone.localtime(moment) if timezone.is_aware(moment) else moment


def exact_time(moment: datetime | None) -> str:
    """``2026-11-30 14:03:27.315``: the job page's times, its summary's as its history's,
    so the start it shows is found in the history to the millisecond."""
    if moment is None:
        return "-"
    return local(moment).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def compact_time(moment: datetime | None) -> SafeString:
    """A list cell's time: ``14:03:27`` today, else ``2026-11-30 14:03``; the full one
    on hover. Django's ``Nov. 30, 2026, 2:03 p.m.`` took a fifth of a 1440 px list."""
    if moment is None:
        return format_html("{}", "-")
    moment = local(moment)
    today = local(timezone.now()).date() == moment.date()
    text = moment.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M")
    return format_html('<span title="{}">{}</span>', moment.isoformat(timespec="seconds"), text)


def since(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    return short_duration(now - moment)


def pretty_json(value: Any) -> SafeString:
    if value is None or value == {} or value == []:
        return format_html('<span class="js-muted">{}</span>', "(empty)" if value is not None else "-")
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)
    if len(text) > COMPACT_JSON:  # short values stay on one line
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)
    return format_html('<pre class="js-pre js-json">{}</pre>', text)


def pre(text: str) -> SafeString:
    if not text:
        return format_html('<span class="js-muted">{}</span>', "-")
    return format_html('<pre class="js-pre">{}</pre>', text)


def file_size(size: int | None) -> str:
    return str(filesizeformat(size or 0))
