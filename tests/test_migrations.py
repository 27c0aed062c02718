"""Data migrations, run for real: back to the state before, rows written there, then forward."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from importlib import import_module
from typing import Any

import pytest
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.utils import load_backend
from django.test.utils import CaptureQueriesContext

BEFORE_WAITING = [("jobstate", "0009_worker_processes")]


def migrate(targets: list[tuple[str, str]]) -> Any:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_jobs_waiting_behind_a_far_future_date_become_waiting_with_a_history_row():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    old = migrate(BEFORE_WAITING)
    try:
        Job = old.get_model("jobstate", "Job")
        far = dt.datetime(2999, 1, 1, tzinfo=dt.UTC)
        soon = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        waiting = Job.objects.create(kind="wf.parent", status="queued", run_after=far)
        queued = Job.objects.create(kind="wf.plain", status="queued", run_after=soon)
        done = Job.objects.create(kind="wf.done", status="completed", run_after=far, finished_at=soon)
    finally:
        new = migrate(latest)
    Job, JobEvent = new.get_model("jobstate", "Job"), new.get_model("jobstate", "JobEvent")
    assert Job.objects.get(pk=waiting.pk).status == "waiting"
    assert Job.objects.get(pk=waiting.pk).run_after.year < 2500
    assert Job.objects.get(pk=queued.pk).status == "queued"
    assert Job.objects.get(pk=queued.pk).run_after == soon
    assert Job.objects.get(pk=done.pk).status == "completed"
    (event,) = JobEvent.objects.filter(job_id=waiting.pk)
    assert (event.from_status, event.to_status, event.transition) == ("queued", "waiting", "suspend")
    assert not JobEvent.objects.filter(job_id__in=[queued.pk, done.pk]).exists()


BEFORE_HOT_LAST = [("jobstate", "0014_cheaper_job_writes")]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_hot_columns_move_to_the_end_of_the_row_with_their_values_and_checks():
    # The test database was built by every migration, so on PostgreSQL the columns
    # already end the row and this round trip keeps them there; the move itself,
    # from the old order, is tested in tests/test_layout.py.
    from django.db import IntegrityError, transaction

    from jobstate.models.job import HOT_COLUMNS

    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    old = migrate(BEFORE_HOT_LAST)
    try:
        Job = old.get_model("jobstate", "Job")
        at = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
        running = Job.objects.create(
            kind="mig.hot",
            status="processing",
            progress=42,
            progress_message="half way",
            current_step="load",
            worker_id="w-1",
            attempts=2,
            started_at=at,
            lease_token="0c7d4a52-8a1e-4b43-9f0b-6b1f4a2e9d11",
            lease_expires_at=at + dt.timedelta(minutes=5),
            heartbeat_at=at,
        )
        stamped = Job.objects.filter(pk=running.pk).values_list("updated_at", flat=True).get()
    finally:
        new = migrate(latest)
    Job = new.get_model("jobstate", "Job")
    row = Job.objects.values(*HOT_COLUMNS).get(pk=running.pk)
    assert row == {
        "progress": 42,
        "progress_message": "half way",
        "current_step": "load",
        "heartbeat_at": at,
        "lease_expires_at": at + dt.timedelta(minutes=5),
        "updated_at": stamped,
        "started_at": at,
        "attempts": 2,
        "worker_id": "w-1",
    }
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'jobstate_job' ORDER BY ordinal_position"
            )
            order = [name for (name,) in cursor.fetchall()]
        assert set(order[-len(HOT_COLUMNS) :]) == set(HOT_COLUMNS)
        assert order[-3:] == ["progress", "progress_message", "current_step"]
    # The checks that named a moved column hold again.
    for bad in ({"progress": 101}, {"attempts": 9}, {"lease_expires_at": None}):
        with pytest.raises(IntegrityError), transaction.atomic():
            Job.objects.filter(pk=running.pk).update(**bad)


BEFORE_PARTIAL_FK_INDEXES = [("jobstate", "0013_worker_lease_renewals")]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="a PostgreSQL index")
def test_history_actor_keeps_no_full_index_with_a_string_user_key():
    # With a user model whose primary key is a string, Django gives the actor
    # foreign key a second index for LIKE (suffix "_like"); 0014 dropped only the
    # plain one, so every history row still wrote a full index of actor_id.
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    migrate(BEFORE_PARTIAL_FK_INDEXES)
    try:
        with connection.schema_editor() as editor:
            like = editor._create_index_name("jobstate_jobevent", ["actor_id"], suffix="_like")
            editor.execute(f'CREATE INDEX "{like}" ON "jobstate_jobevent" ("actor_id")')
    finally:
        migrate(latest)
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'jobstate_jobevent'")
        indexes = {name for (name,) in cursor.fetchall()}
    assert like == "jobstate_jobevent_actor_id_ceac7fe1_like"
    assert like not in indexes
    assert "jobstate_event_actor_idx" in indexes


def asset_indexes() -> set[str]:
    with connection.cursor() as cursor:
        return {
            name
            for name, info in connection.introspection.get_constraints(cursor, "jobstate_asset").items()
            if info["index"] and not info["primary_key"]
        }


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_asset_fk_indexes_are_dropped_by_name_and_come_back_when_reversed():
    # 0024 drops the foreign keys' own indexes by the names Django gave them: a name
    # that drifted would make its DROP INDEX IF EXISTS a silent no-op.
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    own = {"jobstate_asset_job_id_fbe1e004", "jobstate_asset_owner_id_e8e5f3b6"}
    migrate([("jobstate", "0023_status_index_without_processing")])
    try:
        before = asset_indexes()
    finally:
        migrate(latest)
    after = asset_indexes()
    assert own <= before and "jobstate_asset_lost_idx" not in before
    assert not own & after and "jobstate_asset_lost_idx" in after
    assert {"jobstate_asset_job_idx", "jobstate_asset_owner_idx"} <= after


OWNER_KEYS = "0006_owner_scoped_keys_claimed_watermark"
WAITING = "0010_waiting_status_step_fsm_asset_attempt"


@pytest.fixture
def other_database() -> Iterator[Any]:
    """A second alias, "other": the test database through a second connection (a
    database of its own would need its own test database). It tells which connection a
    data step queries, which is what `migrate --database other` depends on. Made here,
    not in DATABASES: Django's tests allow such a connection."""
    settings = {**connection.settings_dict}
    other = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, "other")
    connections["other"] = other
    try:
        yield other
    finally:
        other.close()
        del connections["other"]


@pytest.mark.django_db(transaction=True)
def test_data_steps_query_the_database_being_migrated(other_database):
    # They used Job.objects (the default database) whatever `migrate --database` named.
    from jobstate import services
    from jobstate.models import Job

    owner_keys, waiting = (import_module(f"jobstate.migrations.{name}") for name in (OWNER_KEYS, WAITING))
    loader = MigrationExecutor(connection).loader
    apps6, apps10 = (loader.project_state(("jobstate", name)).apps for name in (OWNER_KEYS, WAITING))
    running = services.enqueue("test.echo", {}, watermark=7)
    services.claim("w1")
    Job.objects.filter(pk=running.pk).update(claimed_watermark=None)
    parent = services.enqueue("test.echo", {}, run_after=dt.datetime(2999, 1, 1, tzinfo=dt.UTC))
    with CaptureQueriesContext(connection) as on_default, CaptureQueriesContext(other_database) as on_other:
        with other_database.schema_editor() as editor:
            owner_keys.claimed_at_current_watermark(apps6, editor)
            waiting.queued_far_future_to_waiting(apps10, editor)
        after_forward = Job.objects.using("other").get(pk=parent.pk).status
        with other_database.schema_editor() as editor:
            waiting.waiting_to_queued_far_future(apps10, editor)
    assert on_default.captured_queries == []
    assert len(on_other.captured_queries) > 3
    assert Job.objects.using("other").get(pk=running.pk).claimed_watermark == 7
    assert after_forward == "waiting"
    assert Job.objects.using("other").get(pk=parent.pk).status == "queued"
    (event,) = Job.objects.using("other").get(pk=parent.pk).events.filter(transition="suspend")
    assert (event.from_status, event.to_status) == ("queued", "waiting")


BEFORE_OWNER_KEYS = [("jobstate", "0005_api_owner_list_index")]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_going_back_before_owner_scoped_keys_names_the_jobs_that_share_a_key(django_user_model):
    # Since 0006 a key is unique per owner; before it, per kind among all active jobs.
    # Going back with two owners' active jobs on one key was a bare IntegrityError.
    from django.db.migrations.exceptions import IrreversibleError

    from jobstate import services
    from jobstate.models import Job

    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    alice = django_user_model.objects.create(username="alice")
    mine = services.enqueue("test.echo", {}, key="daily", owner=alice)
    system = services.enqueue("test.echo", {}, key="daily")
    services.enqueue("test.echo", {}, key="weekly", owner=alice)
    done = services.enqueue("test.echo", {}, key="weekly")
    Job.objects.filter(pk=done.pk).update(status="completed", finished_at=dt.datetime.now(dt.UTC))
    try:
        with pytest.raises(IrreversibleError) as refused:
            migrate(BEFORE_OWNER_KEYS)
        assert str(refused.value) == (
            "Cannot migrate jobstate back before 0006: before it, a key was unique per kind among "
            "the active (queued or processing) jobs of all owners, and 1 key is held by several: "
            f"kind 'test.echo', key 'daily': jobs {mine.pk}, {system.pk}. Let them end (or cancel "
            "them), or clear the key of all but one (Job.objects.filter(pk__in=[...]).update(key=None)), "
            "then migrate again."
        )
        old = migrate([("jobstate", "0006_owner_scoped_keys_claimed_watermark")])  # where it stopped
        old.get_model("jobstate", "Job").objects.filter(pk=system.pk).update(key=None)
        migrate(BEFORE_OWNER_KEYS)  # nothing shared any more
    finally:
        migrate(latest)
    assert Job.objects.filter(key="daily").get().pk == mine.pk


BEFORE_CHECKS = [("jobstate", "0019_drop_actor_like_index")]
CHECKS = ("jobstate_event_statuses_valid", "jobstate_step_failed_has_error", "jobstate_delivery_ok_is_2xx")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_history_step_and_delivery_checks_take_the_services_rows_and_run_again_once_fixed():
    # 0020: checks that only Python guarded. Rows the services write fit them; a row
    # that breaks one stops the migration, which runs again once the row is fixed
    # (on PostgreSQL the constraint is then already there, NOT VALID: it is validated).
    from django.db import IntegrityError, transaction

    from jobstate import services

    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    job = services.enqueue("test.echo", {})
    services.claim("w1")
    services.request_cancel(job, "test", "stop")  # a history row with equal ends
    old = migrate(BEFORE_CHECKS)
    try:
        JobEvent, JobStep = (old.get_model("jobstate", name) for name in ("JobEvent", "JobStep"))
        Endpoint, Delivery = (
            old.get_model("jobstate", name) for name in ("WebhookEndpoint", "WebhookDelivery")
        )
        now = dt.datetime.now(dt.UTC)
        JobStep.objects.create(
            job_id=job.pk, position=0, name="load", status="failed", error_message="boom", finished_at=now
        )
        JobStep.objects.create(job_id=job.pk, position=1, name="save")
        endpoint = Endpoint.objects.create(url="https://hooks.example.com/in")
        for webhook_id, ok, code in (("m1", True, 200), ("m2", False, None), ("m3", False, 503)):
            Delivery.objects.create(
                endpoint=endpoint,
                webhook_id=webhook_id,
                event="job.failed",
                job_id=job.pk,
                ok=ok,
                status_code=code,
            )
        bad = JobEvent.objects.create(job_id=job.pk, from_status="queued", to_status="bogus", transition="x")
        with pytest.raises(IntegrityError):
            migrate(latest)
        JobEvent.objects.filter(pk=bad.pk).delete()
    finally:
        new = migrate(latest)
    JobEvent, JobStep = (new.get_model("jobstate", name) for name in ("JobEvent", "JobStep"))
    Delivery = new.get_model("jobstate", "WebhookDelivery")
    assert JobEvent.objects.filter(job_id=job.pk).count() == 3
    assert JobStep.objects.filter(job_id=job.pk).count() == 2
    assert Delivery.objects.count() == 3
    for write in (
        lambda: JobEvent.objects.filter(job_id=job.pk).update(to_status="bogus"),
        lambda: JobStep.objects.filter(job_id=job.pk, name="load").update(error_message=""),
        lambda: Delivery.objects.filter(webhook_id="m3").update(ok=True),
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            write()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT conname, convalidated FROM pg_constraint WHERE conname = ANY(%s)", [list(CHECKS)]
            )
            assert dict(cursor.fetchall()) == dict.fromkeys(CHECKS, True)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_checks_give_up_the_table_lock_behind_a_long_transaction(monkeypatch):
    # 0020's ADD CONSTRAINT takes the history table's exclusive lock for a moment; queued
    # behind a long transaction that reads the table, it held up every transition (each
    # writes a history row) until that transaction ended. It gives up after a lock timeout
    # now, and runs again later.
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's lock queue")
    import threading

    import psycopg
    from django.db import OperationalError

    checks = import_module("jobstate.migrations.0020_history_step_delivery_checks")
    monkeypatch.setattr(checks, "LOCK_TIMEOUT", "200ms")
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    migrate(BEFORE_CHECKS)
    reader = psycopg.connect(
        host=connection.settings_dict["HOST"] or None,
        port=connection.settings_dict["PORT"] or None,
        user=connection.settings_dict["USER"],
        dbname=connection.settings_dict["NAME"],
        autocommit=False,
    )
    reader.execute("SELECT count(*) FROM jobstate_jobevent")  # its transaction holds the table
    ender = threading.Timer(10, reader.rollback)  # without the timeout: the ALTER waits this long
    ender.start()
    try:
        with pytest.raises(OperationalError, match="lock timeout"):
            migrate(latest)
    finally:
        ender.cancel()
        reader.rollback()
        reader.close()
        migrate(latest)


BEFORE_SPAWN_ROWS = [("jobstate", "0021_worker_clock_offset")]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_going_back_before_spawn_rows_puts_the_stored_spawns_back_in_the_steps_detail():
    # 0022: an iteration's spawns are JobStepSpawn rows; the release before reads them
    # from the step's detail only, as a list.
    from jobstate import services
    from jobstate.models import JobStep
    from jobstate.workflows import spawns

    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    job = services.enqueue("test.echo", {})
    when = dt.datetime(2026, 5, 1, 12, 0, 0, 123457, tzinfo=dt.UTC)
    made = [spawns.ChildSpec("test.echo", {"n": i}, {"run_after": when} if i else {}) for i in range(3)]
    stored = spawns.Stored(6, 0, made, fresh=True)
    spawns.save(job.pk, "split", stored)
    spawns.save(job.pk, "other", spawns.Stored(2, 0, made[:1], fresh=True))  # not counted: left
    JobStep.objects.create(
        job_id=job.pk,
        name="split",
        position=0,
        status="failed",
        error_message="x",
        finished_at=when,
        detail={"keep": 1, **stored.entry()},
    )
    untouched = {spawns.SPAWNED: {"at": 4, "children": [["test.echo", {"n": 9}, {}]]}}
    JobStep.objects.create(job_id=job.pk, name="older", position=1, detail=untouched)
    try:
        old = migrate(BEFORE_SPAWN_ROWS)
        OldStep = old.get_model("jobstate", "JobStep")
        back = OldStep.objects.get(job_id=job.pk, name="split").detail
        assert back == {
            "keep": 1,
            spawns.SPAWNED: {
                "at": 6,
                "children": [
                    ["test.echo", {"n": 0}, {}],
                    ["test.echo", {"n": 1}, {"run_after": when.isoformat()}],
                    ["test.echo", {"n": 2}, {"run_after": when.isoformat()}],
                ],
            },
        }
        assert OldStep.objects.get(job_id=job.pk, name="older").detail == untouched
    finally:
        migrate(latest)
    # The release after reads such a list as it is.
    assert spawns.restored(job.pk, "split", back, 6) == (made, 0)


BEFORE_ANSWERABLE = [("jobstate", "0024_asset_indexes")]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_global_endpoints_no_one_answers_for_are_disabled_saying_how_to_resume(django_user_model):
    from jobstate.webhooks import answerable

    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    alice = django_user_model.objects.create_user("alice-mig")
    old = migrate(BEFORE_ANSWERABLE)
    try:
        Endpoint = old.get_model("jobstate", "WebhookEndpoint")
        url = "https://hooks.example.com/"
        global_on = Endpoint.objects.create(owner_id=None, url=url + "on", enabled=True)
        failing = {"enabled": False, "disabled_reason": "disabled after 20 failed attempts"}
        global_off = Endpoint.objects.create(owner_id=None, url=url + "off", **failing)
        owned = Endpoint.objects.create(owner_id=alice.pk, url=url + "alice", enabled=True)
    finally:
        new = migrate(latest)
    Endpoint = new.get_model("jobstate", "WebhookEndpoint")
    stopped = Endpoint.objects.get(pk=global_on.pk)
    assert not stopped.enabled and stopped.disabled_at is not None
    assert stopped.disabled_reason == answerable.reason(None) and stopped.answerable_id is None
    assert Endpoint.objects.get(pk=global_off.pk).disabled_reason == failing["disabled_reason"]
    assert Endpoint.objects.get(pk=owned.pk).enabled
    # Back: enabled again (those it disabled only).
    back = migrate(BEFORE_ANSWERABLE)
    try:
        Endpoint = back.get_model("jobstate", "WebhookEndpoint")
        assert Endpoint.objects.get(pk=global_on.pk).enabled
        assert Endpoint.objects.get(pk=global_on.pk).disabled_reason == ""
        assert not Endpoint.objects.get(pk=global_off.pk).enabled
    finally:
        migrate(latest)


# Each migration since 0021 and the table it takes a lock on that a long transaction
# (a pg_dump, a report; a writer for 0022's foreign key and the index builds) holds up.
LOCKING = [
    ("0021_worker_clock_offset", "jobstate_workerprocess", "ACCESS SHARE"),
    ("0022_step_spawns", "jobstate_job", "ROW EXCLUSIVE"),
    ("0023_status_index_without_processing", "jobstate_job", "ACCESS SHARE"),
    ("0024_asset_indexes", "jobstate_asset", "ACCESS SHARE"),
    ("0025_webhook_answerable", "jobstate_webhookendpoint", "ACCESS SHARE"),
    ("0026_job_parent_status_index", "jobstate_job", "ACCESS SHARE"),
]


def migrate_apart(targets: list[tuple[str, str]]) -> None:
    """Migrate through a connection of its own, closed after: a statement that Django's
    schema editor defers to its end (a foreign key) and that fails leaves its transaction open."""
    settings = {**connection.settings_dict}
    apart = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, "apart")
    connections["apart"] = apart
    try:
        MigrationExecutor(apart).migrate(targets)
    finally:
        apart.close()
        del connections["apart"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("name", "table", "mode"), LOCKING)
def test_migrations_give_up_a_lock_held_by_a_long_transaction(monkeypatch, name, table, mode):
    # Queued behind a long transaction that holds the table, each of these held up every
    # later query of it (workers, enqueues, the admin: a read by primary key waited as long)
    # until that transaction ended. They give up after a lock timeout now, both ways.
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's lock queue")
    import threading

    import psycopg
    from django.db import OperationalError

    from jobstate.migrations import _lock_limited as migration

    monkeypatch.setattr(migration, "LOCK_TIMEOUT", "200ms")
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes()
    (before,) = executor.loader.get_migration("jobstate", name).dependencies[:1]
    migrate([before])
    holder = psycopg.connect(
        host=connection.settings_dict["HOST"] or None,
        port=connection.settings_dict["PORT"] or None,
        user=connection.settings_dict["USER"],
        dbname=connection.settings_dict["NAME"],
        autocommit=False,
    )
    try:
        for target, back in (([("jobstate", name)], [before]), ([before], [("jobstate", name)])):
            holder.execute(f"LOCK TABLE {table} IN {mode} MODE")
            ender = threading.Timer(10, holder.rollback)  # without the timeout: it waits this long
            ender.start()
            try:
                with pytest.raises(OperationalError, match="lock timeout"):
                    migrate_apart(target)
            finally:
                ender.cancel()
                holder.rollback()
            migrate(target)
            migrate(back)
            migrate(target)
    finally:
        holder.close()
        migrate(latest)


def test_every_migration_since_0021_limits_its_lock_waits():
    # A new migration made by makemigrations subclasses migrations.Migration: switch it.
    from django.db.migrations.loader import MigrationLoader

    from jobstate.migrations._lock_limited import LockLimitedMigration

    found = MigrationLoader(None).disk_migrations
    since = {name: m for (app, name), m in found.items() if app == "jobstate" and name >= "0021"}
    assert since and [n for n, m in since.items() if not isinstance(m, LockLimitedMigration)] == []
