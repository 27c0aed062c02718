"""The long-poll behind ``GET /jobs/{id}/?wait=&since=``: the detail view answers
``WaitFirst`` when it wants to wait; ``long_poll_view`` waits for the job to change
(``wait_for_change`` under WSGI, ``await_change`` in the event loop under ASGI,
holding no thread and no connection between polls), outside any transaction, then
asks the view again for the detail. Bounded by ``LONGPOLL_MAX_SECONDS``; each poll
is one autocommit query of one small row. Access is checked again once the wait is
over (``WaitFirst.access``, ``jobstate.api.access``)."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import wraps
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse

from jobstate import conf
from jobstate.api.errors import is_busy, is_unavailable, one_line
from jobstate.api.stream import polled
from jobstate.models import Job
from jobstate.states import TERMINAL

if TYPE_CHECKING:
    from jobstate.api.access import StreamAccess
    from jobstate.api.throttling import StreamSlot

logger = logging.getLogger("jobstate.api")


def _changed(job_id: Any, since: datetime) -> bool:
    # Not ``>``: after the server's clock stepped back a change is earlier than ``since``.
    row = Job.objects.filter(pk=job_id).values_list("updated_at", "status").first()
    return row is None or row[0] != since or row[1] in TERMINAL


def wait_for_change(
    job_id: Any,
    since: datetime,
    seconds: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once the job's ``updated_at`` is other than ``since`` (it changed), it
    is terminal or gone, or ``seconds`` (capped by LONGPOLL_MAX_SECONDS) passed."""
    seconds = min(seconds, float(conf.get("LONGPOLL_MAX_SECONDS")))
    poll = max(float(conf.get("SSE_POLL_SECONDS")), 0.01)
    deadline = clock() + seconds
    while not _changed(job_id, since):
        remaining = deadline - clock()
        if remaining <= 0:
            return
        sleep(min(poll, remaining))


async def await_change(
    job_id: Any,
    since: datetime,
    seconds: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    asgi: bool = True,
) -> None:
    """``wait_for_change`` without holding a thread while it waits (under ASGI; under
    WSGI the request's thread is held anyway, and so is its connection)."""
    seconds = min(seconds, float(conf.get("LONGPOLL_MAX_SECONDS")))
    poll = max(float(conf.get("SSE_POLL_SECONDS")), 0.01)
    deadline = clock() + seconds
    changed = sync_to_async(polled(_changed) if asgi else _changed)
    while not await changed(job_id, since):
        remaining = deadline - clock()
        if remaining <= 0:
            return
        await sleep(min(poll, remaining))


class WaitFirst(HttpResponse):
    """What the detail view answers when it wants to wait before answering: the
    checks passed and the slot is held; ``long_poll_view`` waits, then asks the
    view again for the detail."""

    def __init__(
        self, job_id: Any, since: datetime, seconds: float, slot: StreamSlot | None, access: StreamAccess
    ) -> None:
        super().__init__(status=202)
        self.job_id, self.since, self.seconds, self.slot = job_id, since, seconds, slot
        if slot is not None:
            # Under ASGI a client that goes away while the view runs cancels the request's
            # task: the view's thread still returns this answer, which nobody waits on.
            weakref.finalize(self, slot.release)
        # After the wait the view asks it again: the view's second run authenticates with the
        # user its first run set on the request (cached, permissions and all), not afresh.
        self.access = access


WAITED = "jobstate_waited"  # set on the Django request once the wait is over: the WaitFirst


def long_poll_view(view: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap the (sync) DRF detail view in an async view: a ``?wait=`` long-poll
    awaits the change in the event loop (no thread held under ASGI) and outside
    any transaction (``ATOMIC_REQUESTS`` does not apply to it), then the view
    renders the detail. Under WSGI Django runs it in the request's thread."""
    call = sync_to_async(view)

    @wraps(view)
    async def detail(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        response = await call(request, *args, **kwargs)
        if not isinstance(response, WaitFirst):
            return response
        try:
            asgi = isinstance(request, ASGIRequest)
            await await_change(response.job_id, response.since, response.seconds, asgi=asgi)
        except Exception as exc:
            # E.g. the database went away while waiting: answer now; the detail
            # view reports what it finds, in the API's error shape if it fails too
            # (a 503 while the database is busy or unavailable, logged there).
            if is_busy(exc) or is_unavailable(exc):
                logger.warning("Long-poll of job %s stopped waiting: %s", response.job_id, one_line(exc))
            else:
                logger.warning("Long-poll of job %s stopped waiting", response.job_id, exc_info=True)
        finally:
            if response.slot is not None:
                response.slot.release()
        setattr(request, WAITED, response)
        return await call(request, *args, **kwargs)

    for alias in connections:
        detail = transaction.non_atomic_requests(using=alias)(detail)
    return detail
