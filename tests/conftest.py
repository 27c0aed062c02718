from __future__ import annotations

import gc
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django_q.conf import Conf

from jobstate import conf, registry, services
from jobstate.worker import cluster, counters, tasks
from jobstate.worker.broker import JobBroker
from jobstate.worker.outage import Outage

# Fixtures shared by several test modules, registered once here (no module imports
# a fixture by name).
pytest_plugins = ["tests.admin_support", "tests.api_support", "tests.tasks_support", "tests.webhook_support"]

# CPython before 3.12 can crash (SIGSEGV) when its cyclic garbage collector runs in
# the middle of a ContextVar.set and a finalizer it calls sets a context variable
# itself (python/cpython#148891). Under this suite that happened in asgiref's
# context restore, around the test client's async views, in a fraction of the runs
# on Python 3.11. There, the collector runs only between tests, where no context
# variable is being set; the tests themselves are the same.
if sys.version_info < (3, 12):

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(session: pytest.Session) -> None:
        gc.disable()

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
        # What the collector's own thresholds would do, young generation first
        # (a full collection after every test would double the suite's time).
        young, middle, _old = gc.get_count()
        if middle >= 10:
            gc.collect()
        elif young >= 700:
            gc.collect(0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow first (in their order), so that no worker starts a long
    one while the other has run out of tests."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# Left in place between transactional tests: post_migrate writes them, and only re-creates them.
STATIC_TABLES = frozenset({"django_content_type", "auth_permission"})


@pytest.fixture(scope="session", autouse=True)
def _cheap_flush(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    """Empty the tables after a transactional test with DELETE, not TRUNCATE.

    On PostgreSQL, TRUNCATE of these near-empty tables costs about 0.2 s a test (new
    files for every table and index), DELETE about 0.02 s; with the content types and
    permissions left in place, post_migrate has nothing to re-create (0.35 s -> 0.09 s
    per flush in all). Django's foreign keys are DEFERRABLE INITIALLY DEFERRED and the
    flush runs in one transaction, so the order of the DELETEs does not matter.
    """
    ops = connection.ops
    original = ops.sql_flush

    def sql_flush(
        self: Any,
        style: Any,
        tables: list[str],
        *,
        reset_sequences: bool = False,
        allow_cascade: bool = False,
    ) -> list[str]:
        if reset_sequences or allow_cascade:
            return original(style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return [f"DELETE FROM {self.quote_name(table)};" for table in tables if table not in STATIC_TABLES]

    ops.sql_flush = types.MethodType(sql_flush, ops)  # type: ignore[method-assign]
    yield
    ops.sql_flush = original  # type: ignore[method-assign]


@pytest.fixture
def vacuumed_jobs() -> Iterator[Any]:
    """For a plan test that commits many jobs (``django_db(transaction=True)``): call it
    after creating them. On PostgreSQL, VACUUM ANALYZE marks their pages all-visible, as
    autovacuum does a table's (an index-only scan then visits no row). Afterwards the
    jobs are deleted and the table vacuumed again, so that autovacuum does not come to
    analyze it while a later test plans a query on rows it has not committed."""

    def vacuum() -> None:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE jobstate_job")

    yield vacuum
    from jobstate.models import Job

    Job.objects.all().delete()
    vacuum()


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


@pytest.fixture
def broker(monkeypatch):  # type: ignore[no-untyped-def]
    """A fresh broker as the sentinel would build it, with a fast poll, and a
    worker chain that a loaded machine does not cut short: the 2 s default, counted
    from the first job's start, ran out on a busy CI machine before a test's
    chained claim (tests of the chain's end set their own)."""
    monkeypatch.setitem(conf.DEFAULTS, "WORKER_CHAIN_SECONDS", 120)  # an override_settings keeps it
    monkeypatch.setattr(counters, "pending", None)
    monkeypatch.setattr(counters, "busy", None)
    monkeypatch.setattr(cluster, "_cluster_id", None)
    monkeypatch.setattr(Conf, "POLL", 0.01)
    monkeypatch.setattr(Conf, "WORKERS", 2)
    monkeypatch.setattr(Conf, "QUEUE_LIMIT", 100)  # tests of the queue limit set their own
    monkeypatch.setattr(counters, "plain", None)
    monkeypatch.setattr(tasks, "claims_outage", Outage(tasks.logger, "jobstate worker"))  # no run of failures
    broker = JobBroker(list_key="jobstate-test")
    yield broker
    broker.close()


@pytest.fixture
def hung_heartbeat(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """services.heartbeat blocks (a row lock, a connection that no longer answers) until
    the test ends; yields the event set once a heartbeat entered the block."""
    release, entered = threading.Event(), threading.Event()
    real = services.heartbeat

    def hang(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "heartbeat", hang)
    yield entered
    release.set()
