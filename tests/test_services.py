from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from rest_framework import serializers

from jobstate import InvalidParameters, InvalidTransition, LeaseLost, UnknownKind, registry, services
from jobstate.exceptions import CancelRequested
from jobstate.models import Asset, Job, JobEvent
from jobstate.states import Status

pytestmark = pytest.mark.django_db


def history(job: Job) -> list[tuple[str, str, str]]:
    return list(JobEvent.objects.filter(job=job).values_list("from_status", "to_status", "transition"))


def test_enqueue_records_first_event(user):
    job = services.enqueue("test.echo", {"a": 1}, owner=user)
    assert job.status == Status.QUEUED
    assert job.max_attempts == 3
    assert history(job) == [("", "queued", "enqueue")]
    event = job.events.get()
    assert event.actor == user


def test_unknown_kind_writes_nothing():
    with pytest.raises(UnknownKind, match="Unknown job kind 'nope'"):
        services.enqueue("nope", {})
    assert Job.objects.count() == 0 and JobEvent.objects.count() == 0


@pytest.mark.parametrize(
    "options",
    [
        {"priority": 10**6},
        {"priority": "high"},
        {"key": ""},
        {"max_attempts": 0},
        {"watermark": "x"},
        {"run_after": "tomorrow"},
    ],
)
def test_bad_values_write_nothing(options):
    with pytest.raises(ValidationError):
        services.enqueue("test.echo", {}, **options)
    assert Job.objects.count() == 0


def test_invalid_parameters_read_as_one_message_per_error():
    with pytest.raises(InvalidParameters) as refused:
        services.enqueue("test.schema", {"width": 0, "label": "x" * 60})
    assert refused.value.messages == [
        "width: Ensure this value is greater than or equal to 1.",
        "label: Ensure this field has no more than 50 characters.",
    ]
    assert refused.value.errors == {
        "width": ["Ensure this value is greater than or equal to 1."],
        "label": ["Ensure this field has no more than 50 characters."],
    }
    assert Job.objects.count() == 0


class Row(serializers.Serializer):
    name = serializers.CharField()


class Nested(serializers.Serializer):
    rows = Row(many=True)
    sizes = serializers.ListField(child=serializers.IntegerField())
    first = Row()


def test_nested_invalid_parameters_name_their_path():
    spec = registry.HandlerSpec(name="nested", func=lambda ctx: None, schema=Nested)
    with pytest.raises(InvalidParameters) as refused:
        spec.validate({"rows": [{"name": "a"}, {}], "sizes": [1, "x"], "first": {}})
    assert refused.value.messages == [
        "rows.1.name: This field is required.",
        "sizes.1: A valid integer is required.",
        "first.name: This field is required.",
    ]
    assert refused.value.errors == {
        "rows": {"1": {"name": ["This field is required."]}},
        "sizes": {"1": ["A valid integer is required."]},
        "first": {"name": ["This field is required."]},
    }
    # A validate() may raise one dict per item, empty for a valid one.
    assert InvalidParameters({"rows": [{}, {"name": ["Taken."]}]}).messages == ["rows.1.name: Taken."]


class WithReadOnly(serializers.Serializer):
    name = serializers.CharField()
    made = serializers.CharField(read_only=True)
    tags = serializers.DictField(child=Row())
    pairs = serializers.ListField(child=Row())


def test_unknown_parameters_are_refused_at_every_depth_and_nothing_is_written():
    # A misspelt key was dropped by the serializer: the job ran with the default.
    with pytest.raises(InvalidParameters) as refused:
        services.enqueue("test.schema", {"width": 3, "lable": "typo"})
    assert refused.value.messages == ["lable: Unknown field."]
    assert Job.objects.count() == 0
    spec = registry.HandlerSpec(name="nested", func=lambda ctx: None, schema=Nested)
    with pytest.raises(InvalidParameters) as refused:
        rows = [{"name": "a"}, {"name": "b", "nmae": "c"}]
        spec.validate({"rows": rows, "sizes": [1], "first": {"name": "x", "n": 1}})
    assert refused.value.errors == {
        "rows": {"1": {"nmae": ["Unknown field."]}},
        "first": {"n": ["Unknown field."]},
    }
    other = registry.HandlerSpec(name="other", func=lambda ctx: None, schema=WithReadOnly)
    with pytest.raises(InvalidParameters) as refused:
        other.validate({"name": "a", "made": "x", "tags": {"k": {"name": "b", "z": 1}}, "pairs": [{"zz": 1}]})
    assert refused.value.messages == [
        "made: This field is read-only.",
        "tags.k.z: Unknown field.",
        "pairs.0.zz: Unknown field.",
        "pairs.0.name: This field is required.",
    ]
    # Unknown and invalid keys are reported together; valid parameters still pass.
    with pytest.raises(InvalidParameters) as refused:
        services.enqueue("test.schema", {"width": 0, "x": 1})
    assert refused.value.messages == [
        "x: Unknown field.",
        "width: Ensure this value is greater than or equal to 1.",
    ]
    assert spec.validate({"rows": [], "sizes": [], "first": {"name": "x"}}) == {
        "rows": [],
        "sizes": [],
        "first": {"name": "x"},
    }


class Slugged(serializers.Serializer):
    title = serializers.CharField()
    owner = serializers.HiddenField(default="system")

    def validate(self, attrs):  # type: ignore[no-untyped-def]
        return {**attrs, "slug": attrs["title"].lower()}


def test_a_retry_takes_the_stored_parameters_a_schema_added_keys_to(temp_handler):
    temp_handler("test.slugged", schema=Slugged)
    # A HiddenField takes no input: a key naming one is refused, not replaced by its default.
    with pytest.raises(InvalidParameters) as refused:
        services.enqueue("test.slugged", {"title": "A", "owner": "mallory"})
    assert refused.value.messages == ["owner: This field is read-only."]
    job = services.enqueue("test.slugged", {"title": "A"})
    assert job.parameters == {"title": "A", "owner": "system", "slug": "a"}
    (claimed,) = services.claim("w1")
    services.begin(claimed, claimed.lease_token, "w1:1")
    services.fail(claimed, claimed.lease_token, "boom", retry=False)
    # The stored parameters hold the keys the schema itself added ("slug", the hidden
    # "owner"): a retry re-validates them without refusing those.
    retried = services.retry(Job.objects.get(pk=job.pk), "ops")
    assert retried.parameters == {"title": "A", "owner": "system", "slug": "a"}


def test_full_lifecycle_with_progress():
    job = services.enqueue("test.echo", {"x": 1})
    (claimed,) = services.claim("w1")
    # Claimed is reserved, not running: no attempt charged until a worker begins it.
    assert claimed.pk == job.pk and claimed.status == Status.PROCESSING and claimed.attempts == 0
    assert claimed.started_at is None and Job.objects.reserved().count() == 1
    begun = services.begin(claimed, claimed.lease_token, "w1:7")
    assert begun.attempt == 1 and not begun.cancel_requested and begun.job.worker_id == "w1:7"
    assert Job.objects.running().get().started_at is not None and not Job.objects.reserved().exists()
    with pytest.raises(LeaseLost):  # begun once per claim
        services.begin(claimed, claimed.lease_token, "w1:7")
    services.report_progress(claimed, claimed.lease_token, 40, "halfway")
    services.heartbeat(claimed, claimed.lease_token)
    services.complete(claimed, claimed.lease_token, {"ok": True})
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.progress == 100 and job.result == {"ok": True}
    assert job.finished_at is not None and job.lease_token is None
    assert history(job) == [
        ("", "queued", "enqueue"),
        ("queued", "processing", "claim"),
        ("processing", "completed", "complete"),
    ]
    assert job.events.get(transition="claim").actor_label == "worker:w1"


def test_invalid_transition_names_both_states_and_writes_nothing():
    job = services.enqueue("test.echo", {})
    (claimed,) = services.claim("w1")
    services.complete(claimed, claimed.lease_token, None)
    before = Job.objects.filter(pk=job.pk).values().get()
    events_before = history(job)
    with pytest.raises(InvalidTransition) as info:
        services.start(job.pk, "w2")
    assert info.value.current == "completed" and info.value.requested == "processing"
    assert "completed" in str(info.value) and "processing" in str(info.value)
    assert Job.objects.filter(pk=job.pk).values().get() == before
    assert history(job) == events_before


def test_stale_token_is_refused():
    services.enqueue("test.echo", {})
    (claimed,) = services.claim("w1", lease_seconds=1)
    stale = claimed.lease_token
    later = timezone.now() + timedelta(seconds=5)
    report = services.requeue_expired(later)
    assert report.requeued == [claimed.pk]
    (again,) = services.claim("w2", now=later)
    for call in (
        lambda: services.heartbeat(claimed.pk, stale),
        lambda: services.report_progress(claimed.pk, stale, 50),
        lambda: services.complete(claimed.pk, stale, {"late": True}),
        lambda: services.fail(claimed.pk, stale, "late"),
    ):
        with pytest.raises(LeaseLost):
            call()
    again.refresh_from_db()
    assert again.status == Status.PROCESSING and again.worker_id == "w2" and again.progress == 0


def test_progress_validation():
    services.enqueue("test.echo", {})
    (job,) = services.claim("w1")
    with pytest.raises(ValidationError):
        services.report_progress(job, job.lease_token, 101)
    with pytest.raises(ValidationError):
        services.report_progress(job, job.lease_token, -1)
    job.refresh_from_db()
    assert job.progress == 0


def test_retry_with_backoff_then_failed():
    job = services.enqueue("test.echo", {}, max_attempts=2)
    (c1,) = services.claim("w1")
    services.begin(c1, c1.lease_token, "w1")
    services.fail(c1, c1.lease_token, "boom", error_type="ValueError", retry_delay=30)
    job.refresh_from_db()
    assert job.status == Status.QUEUED and job.run_after > timezone.now() + timedelta(seconds=20)
    assert services.claim("w1") == []  # not before run_after
    (c2,) = services.claim("w1", now=timezone.now() + timedelta(seconds=31))
    assert services.begin(c2, c2.lease_token, "w1").attempt == 2
    services.fail(c2, c2.lease_token, "boom again", error_type="ValueError")
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_message == "boom again"
    requeue = job.events.get(transition="requeue")
    assert requeue.metadata["attempt"] == 1 and requeue.metadata["error"] == "boom"


def test_cancel_queued_and_processing():
    queued = services.enqueue("test.echo", {})
    services.request_cancel(queued, "api", "not needed")
    queued.refresh_from_db()
    assert queued.status == Status.CANCELLED
    with pytest.raises(InvalidTransition, match="cancelled"):
        services.request_cancel(queued, "api")

    services.enqueue("test.echo", {})
    (running,) = services.claim("w1")
    job = services.request_cancel(running.pk, "api", "stop please")
    assert job.status == Status.PROCESSING and job.cancel_requested_at is not None
    with pytest.raises(CancelRequested):
        services.report_progress(running, running.lease_token, 10)
    assert services.heartbeat(running, running.lease_token).cancel_requested
    services.cancel_now(running, running.lease_token)
    running.refresh_from_db()
    assert running.status == Status.CANCELLED


def test_reaper_fails_when_attempts_exhausted():
    job = services.enqueue("test.echo", {}, max_attempts=1)
    (claimed,) = services.claim("w1", lease_seconds=1)
    services.begin(claimed, claimed.lease_token, "w1:2", lease_seconds=1)
    report = services.requeue_expired(timezone.now() + timedelta(seconds=5))
    assert report.failed == [job.pk]
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.error_message == "worker lost"
    assert job.events.last().actor_label == "system:reaper"


def test_reaper_leaves_live_leases_alone():
    services.enqueue("test.echo", {})
    services.claim("w1", lease_seconds=60)
    assert services.requeue_expired().total == 0


def test_retry_creates_linked_job():
    job = services.enqueue("test.echo", {"p": 1})
    with pytest.raises(InvalidTransition):
        services.retry(job)
    services.request_cancel(job)
    new = services.retry(job, "admin", "again")
    assert new.retry_of_id == job.pk and new.status == Status.QUEUED and new.parameters == {"p": 1}
    job.refresh_from_db()
    assert job.status == Status.CANCELLED


def test_a_child_is_not_retried_under_a_parent_that_failed_or_is_cancelling():
    # The cancel's cascade had ended the parent's children; a retry queued a new one
    # that ran under the cancelled parent (and one queued while the cascade ran was missed).
    from jobstate.exceptions import ParentEnded

    def failed_child(parent: Job) -> Job:
        child = services.enqueue("test.echo", {}, parent=parent, max_attempts=1)
        services.start(child, "w")
        child.refresh_from_db()
        services.fail(child, child.lease_token, "boom")
        return child

    parent = services.enqueue("test.echo", {})
    services.start(parent, "w")
    parent.refresh_from_db()
    first = failed_child(parent)
    assert services.retry(first).parent_id == parent.pk  # a running parent: it goes on
    second = failed_child(parent)
    services.request_cancel(parent, "ops", "stop")
    with pytest.raises(ParentEnded, match=f"Its parent job {parent.pk} is being cancelled"):
        services.retry(second)
    services.cancel_now(parent, parent.lease_token, reason="now")
    before = Job.objects.count()
    with pytest.raises(ParentEnded, match="is cancelled: retry the parent instead"):
        services.retry(second)
    assert Job.objects.count() == before


def test_idempotent_key_and_watermark():
    a, created = services.get_or_enqueue("test.echo", {}, key="k", watermark=1)
    b, created_b = services.get_or_enqueue("test.echo", {}, key="k", watermark=5)
    assert created and not created_b and a.pk == b.pk
    a.refresh_from_db()
    assert a.input_watermark == 5
    services.get_or_enqueue("test.echo", {}, key="k", watermark=3)
    a.refresh_from_db()
    assert a.input_watermark == 5  # never lowered
    (c,) = services.claim("w")
    services.complete(c, c.lease_token)
    c.refresh_from_db()
    assert c.last_success_watermark == 5
    same, created = services.get_or_enqueue("test.echo", {}, key="k", watermark=5)
    assert not created and same.pk == a.pk
    newer, created = services.get_or_enqueue("test.echo", {}, key="k", watermark=6)
    assert created and newer.pk != a.pk


def test_watermark_raised_while_running_queues_a_rerun():
    services.enqueue("test.echo", {}, key="k", watermark=1)
    (c,) = services.claim("w")
    services.enqueue("test.echo", {}, key="k", watermark=2)
    services.complete(c, c.lease_token)
    rerun = Job.objects.get(key="k", status=Status.QUEUED)
    assert rerun.input_watermark == 2


def test_concurrency_limit_respected_by_claim():
    for _ in range(5):
        services.enqueue("test.limited", {})
    claimed = services.claim("w", limit=10)
    assert len(claimed) == 2
    assert services.claim("w2", limit=10) == []


def test_claim_refuses_a_string_for_its_kinds():
    job = services.enqueue("test.echo", {})
    # A string was taken as its characters: a claim of kinds 't', 'e', ... (none).
    with pytest.raises(TypeError, match=r"not a string: kinds=\[.test.echo.\]"):
        services.claim("w", kinds="test.echo")  # type: ignore[arg-type]
    # PostgreSQL refused the comparison with a database error.
    with pytest.raises(TypeError, match=r"kinds is a list of kind names \(strings\), not of 1"):
        services.claim("w", kinds=["test.echo", 1])  # type: ignore[list-item]
    assert Job.objects.get(pk=job.pk).status == Status.QUEUED and history(job) == [("", "queued", "enqueue")]
    (claimed,) = services.claim("w", kinds=(k for k in ["test.echo"]))  # type: ignore[arg-type]
    assert claimed.pk == job.pk


@pytest.mark.parametrize("seconds", [0, -5, float("nan"), float("inf"), 1e300, "60", True])
def test_lease_calls_refuse_a_bad_lease_seconds_and_write_nothing(seconds):
    # 0 was read as LEASE_SECONDS, less than 0 wrote a lease already run out (the reaper took
    # the job); NaN, infinity and 1e300 raised ValueError or OverflowError from the date
    # arithmetic (SQLite) or a DataError from the database (PostgreSQL: "interval out of range").
    queued = services.enqueue("test.echo", {})
    held = services.enqueue("test.echo", {}, priority=1)
    (claimed,) = services.claim("w", limit=1)
    assert claimed.pk == held.pk
    token = claimed.lease_token
    before = list(Job.objects.order_by("pk").values()), JobEvent.objects.count()
    calls = [
        lambda: services.claim("w", lease_seconds=seconds),
        lambda: services.start(queued, "w", lease_seconds=seconds),
        lambda: services.begin(held.pk, token, "w", lease_seconds=seconds),
        lambda: services.heartbeat(held.pk, token, lease_seconds=seconds),
        lambda: services.extend_leases("w", [(held.pk, token)], lease_seconds=seconds),
        lambda: services.extend_leases("w", [], lease_seconds=seconds),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="lease_seconds is a number of seconds greater than 0"):
            call()
    assert (list(Job.objects.order_by("pk").values()), JobEvent.objects.count()) == before
    assert services.begin(held.pk, token, "w", lease_seconds=0.5).attempt == 1


def test_claim_and_the_reaper_refuse_a_bad_limit_and_write_nothing():
    services.enqueue("test.echo", {})
    # A limit past a bigint was a DataError on PostgreSQL and an IntegrityError
    # ("datatype mismatch") on SQLite; one past MAX_LIMIT overflowed the claim's 4x.
    for limit in (2**31, 10**30, -1):
        with pytest.raises(ValueError, match=r"limit is between 0 and 2147483647, not"):
            services.claim("w", limit=limit)
        with pytest.raises(ValueError, match=r"limit is between 0 and 2147483647, not"):
            services.requeue_expired(limit=limit)
    for limit in ("5", 2.5, None, True):
        with pytest.raises(TypeError, match="limit is an integer, not"):
            services.claim("w", limit=limit)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="limit is an integer, not"):
            services.requeue_expired(limit=limit)  # type: ignore[arg-type]
    assert Job.objects.get().status == Status.QUEUED and JobEvent.objects.count() == 1
    assert services.claim("w", limit=0) == [] and services.requeue_expired(limit=0).total == 0
    assert len(services.claim("w", limit=2**31 - 1)) == 1


def test_a_worker_id_with_a_nul_is_stored_as_both_databases_store_text():
    # PostgreSQL refused it with a DataError (text fields cannot contain NUL); SQLite stored it.
    first, second = services.enqueue("test.echo", {}), services.enqueue("test.echo", {})
    assert services.claim("w", kinds=["test.echo\x00"]) == []
    (claimed,) = services.claim("w\x00a", limit=1)
    assert claimed.worker_id == "w\ufffda"
    assert services.extend_leases("w\x00a", [(claimed.pk, claimed.lease_token)]) == 1
    begun = services.begin(claimed, claimed.lease_token, "w\x00b").job
    assert begun.worker_id == "w\ufffdb"
    services.heartbeat(claimed.pk, claimed.lease_token, worker_id="w\x00c")
    assert Job.objects.get(pk=claimed.pk).worker_id == "w\ufffdc"
    other = first if claimed.pk == second.pk else second
    assert services.start(other.pk, "w\x00d").worker_id == "w\ufffdd"
    labels = set(JobEvent.objects.filter(transition="claim").values_list("actor_label", flat=True))
    assert labels == {"worker:w\ufffda", "worker:w\ufffdd"}


def test_priority_orders_claims():
    low = services.enqueue("test.echo", {}, priority=0)
    high = services.enqueue("test.echo", {}, priority=5)
    assert [j.pk for j in services.claim("w", limit=2)] == [high.pk, low.pk]


def test_database_rejects_bad_rows():
    job = services.enqueue("test.echo", {})
    for values in (
        {"status": "bogus"},
        {"progress": 101},
        {"status": "failed", "finished_at": timezone.now()},
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            Job.objects.filter(pk=job.pk).update(**values)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(status="completed")  # terminal without finished_at


def test_one_active_job_per_key_in_the_database():
    job = services.enqueue("test.echo", {}, key="same")
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(kind="test.echo", key="same")
    assert job.status == Status.QUEUED


def test_status_is_protected():
    job = services.enqueue("test.echo", {})
    with pytest.raises(AttributeError):
        job.status = Status.COMPLETED


def test_asset_files_removed_with_job_after_commit(tmp_path, settings, django_capture_on_commit_callbacks):
    settings.MEDIA_ROOT = tmp_path
    job = services.enqueue("test.echo", {})
    asset = services.add_asset(job, asset_type="report", name="../../etc/passwd", content=b"hello")
    assert asset.name == "passwd" and asset.size == 5 and len(asset.sha256) == 64
    path = tmp_path / asset.file.name
    assert path.exists()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        Job.objects.filter(pk=job.pk).delete()
    assert path.exists()  # nothing removed before the commit
    assert not Asset.objects.filter(pk=asset.pk).exists()
    for callback in callbacks:
        callback()
    assert not path.exists()


def test_asset_needs_live_lease_when_token_given():
    services.enqueue("test.echo", {})
    (job,) = services.claim("w1")
    token = job.lease_token
    services.complete(job, token)
    with pytest.raises(LeaseLost):
        services.add_asset(job, asset_type="x", content=b"1", token=token)
    assert not Asset.objects.exists()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"metadata": {"a": "\ud800"}}, "metadata"),  # stored by SQLite, then the API could not render it
        ({"metadata": {"a": float("nan")}}, "metadata"),
        ({"metadata": {"a": "x\x00"}}, "metadata"),
        ({"metadata": ["not", "an", "object"]}, "metadata"),
        ({"content_type": "text/html\r\nSet-Cookie: a=b"}, "content_type"),  # a header on download
        ({"content_type": "text/" + "x" * 200}, "content_type"),
        ({"content_type": "texte/é"}, "content_type"),
        ({"content_type": "csv"}, "content_type"),
        ({"asset_type": "re\x00port"}, "asset_type"),
        ({"asset_type": "r" * 101}, "asset_type"),
        ({"asset_type": " "}, "asset_type"),
        ({"url": "https://example.com/" + "a" * 2000}, "url"),
        ({"url": "https://example.com/\x00"}, "url"),
    ],
)
def test_asset_values_the_database_or_a_download_would_refuse_are_a_validation_error(
    tmp_path, settings, options, field
):
    settings.MEDIA_ROOT = tmp_path
    job = services.enqueue("test.echo", {})
    values = {"asset_type": "report", "name": "r.csv", "content": b"1", **options}
    with pytest.raises(ValidationError) as refused:
        services.add_asset(job, **values)
    assert field in refused.value.message_dict
    assert not Asset.objects.exists() and not any(tmp_path.rglob("*.*"))  # nothing stored


@pytest.mark.parametrize(
    "moment",
    ["9999-12-31T23:59:59-12:00", "0001-01-01T00:00:00+01:00"],  # years 10000 and 0 in UTC
)
def test_a_run_after_outside_the_storable_years_is_a_validation_error(moment):
    # PostgreSQL wrote year 10000 and then could not read the row back (DataError on
    # every list holding it); SQLite's conversion overflowed (a raw OverflowError).
    from django.utils.dateparse import parse_datetime

    with pytest.raises(ValidationError) as refused:
        services.enqueue("test.echo", {}, run_after=parse_datetime(moment))
    assert "run_after" in refused.value.message_dict and not Job.objects.exists()


def test_with_use_tz_false_a_run_after_the_database_cannot_store_is_a_validation_error(settings):
    # SQLite with USE_TZ = False: an aware run_after raised the database layer's ValueError
    # at the INSERT ("SQLite backend does not support timezone-aware datetimes when USE_TZ
    # is False"), a naive one a ValidationError naming no remedy.
    naive, aware = datetime(2030, 1, 1, 12, 0), datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    settings.USE_TZ = False
    if connection.features.supports_timezones:  # PostgreSQL stores an aware run_after
        job = services.enqueue("test.echo", {}, run_after=aware)
        assert Job.objects.get(pk=job.pk).run_after == timezone.make_naive(aware)  # in TIME_ZONE
        return
    for when in (aware, naive):
        for enqueue, options in (
            (services.enqueue, {}),
            (services.get_or_enqueue, {"key": "k"}),
            (services.check_job, {}),
        ):
            with pytest.raises(ValidationError) as refused:
                enqueue("test.echo", {}, run_after=when, **options)
            assert refused.value.message_dict == {
                "run_after": [
                    "run_after cannot be stored with USE_TZ = False: jobstate needs a timezone-aware "
                    f"run_after, which Django stores in {connection.display_name} only with USE_TZ = True. "
                    "Set USE_TZ = True (Django's default) to defer jobs, or enqueue without run_after."
                ]
            }
    assert not Job.objects.exists() and not JobEvent.objects.exists()
    services.enqueue("test.echo", {})  # without run_after, as ever
    assert Job.objects.count() == 1


def test_a_naive_run_after_is_a_validation_error():
    with pytest.raises(ValidationError) as refused:
        services.enqueue("test.echo", {}, run_after=datetime(2030, 1, 1, 12, 0))
    assert refused.value.message_dict == {"run_after": ["run_after is a timezone-aware datetime."]}
    assert not Job.objects.exists()


def test_a_key_with_a_nul_is_a_validation_error_and_a_reason_is_stored_as_text():
    with pytest.raises(ValidationError) as refused:
        services.enqueue("test.echo", {}, key="k\x00")
    assert "key" in refused.value.message_dict and not Job.objects.exists()
    job = services.enqueue("test.echo", {})
    services.request_cancel(job, "ops", "not\x00needed \ud800")
    assert job.events.get(transition="cancel").reason == "not\ufffdneeded \ufffd"
    again = services.retry(job, actor="ops", reason="once\x00more")
    assert again.events.get(transition="enqueue").reason == "once\ufffdmore"


def assert_owner_refused(owner: object) -> None:
    """Both enqueues refuse ``owner`` with a ValidationError keyed owner, writing nothing."""
    for enqueue in (
        lambda: services.enqueue("test.echo", {}, owner=owner),
        lambda: services.enqueue_many([("test.echo", {})], owner=owner),
    ):
        with pytest.raises(ValidationError) as refused:
            enqueue()
        assert "owner" in refused.value.message_dict
    assert not Job.objects.exists()


@pytest.mark.parametrize("owner", ["alice", 10**30, 987654, True, 1.5])
def test_an_owner_that_names_no_user_is_a_validation_error(owner):
    # A raw ValueError, OverflowError/DataError or IntegrityError (at the commit) before.
    assert_owner_refused(owner)


@pytest.mark.parametrize("which", ["another model's instance", "an unsaved user"])
def test_an_owner_that_is_no_saved_user_is_a_validation_error(which, django_user_model):
    # An AttributeError (the actor's get_username) or a ValueError at the insert before.
    unsaved = django_user_model(username="x")
    owner = Group.objects.create(name="ops") if which.startswith("another") else unsaved
    assert_owner_refused(owner)


def test_an_owner_given_by_id_is_the_user(user):
    job = services.enqueue("test.echo", {}, owner=user.pk)
    assert job.owner_id == user.pk
    assert job.events.get().actor_label == f"user:{user.get_username()}"
    (many,) = services.enqueue_many([("test.echo", {})], owner=str(user.pk))
    assert many.owner_id == user.pk
    with pytest.raises(ValidationError):
        services.enqueue("test.echo", {}, owner=user.pk + 0.5)  # not read as user.pk


def test_state_diagrams_in_the_docs_are_generated_from_the_code():
    from pathlib import Path

    from jobstate.diagram import mermaid, step_mermaid

    doc = (Path(__file__).resolve().parent.parent / "docs" / "explanation" / "states.md").read_text()
    assert f"```mermaid\n{mermaid()}\n```" in doc, "run: python manage.py jobstate_diagram"
    assert f"```mermaid\n{step_mermaid()}\n```" in doc, "regenerate with jobstate.diagram.step_mermaid()"


def test_extend_leases_renews_only_the_listed_leases_still_held_by_that_worker():
    for _ in range(3):
        services.enqueue("test.echo", {})
    a, b, c = services.claim("cluster-1", limit=3, lease_seconds=1)
    later = timezone.now() + timedelta(minutes=5)
    renewed = services.extend_leases(
        "cluster-1",
        [(a.pk, a.lease_token), (b.pk, "00000000-0000-0000-0000-000000000000")],
        lease_seconds=60,
        now=later,
    )
    assert renewed == 1  # b's token is not its lease; c was not listed
    expiry = dict(Job.objects.values_list("pk", "lease_expires_at"))
    assert expiry[a.pk] > later
    assert expiry[b.pk] < later and expiry[c.pk] < later
    assert services.extend_leases("cluster-2", [(c.pk, c.lease_token)], now=later) == 0
    assert services.extend_leases("cluster-1", []) == 0


def test_extend_leases_renews_the_jobs_of_a_worker_id_stored_cut_to_200_characters():
    # The claim stored the id cut to 200 characters; the renewal compared it whole and
    # never matched, so the reserved jobs of a long cluster id (host name) expired.
    long_id = "host-" + "x" * 300
    services.enqueue("test.echo", {})
    (job,) = services.claim(long_id, lease_seconds=1)
    later = timezone.now() + timedelta(minutes=5)
    assert services.extend_leases(long_id, [(job.pk, job.lease_token)], lease_seconds=60, now=later) == 1


def test_an_operator_requeue_holds_the_job_until_the_old_lease_would_have_run_out():
    # The next attempt could start at once while the old handler still ran: two attempts.
    services.enqueue("test.echo", {})
    (held,) = services.claim("w1", lease_seconds=600)
    services.begin(held, held.lease_token, "w1:1")
    lease = Job.objects.get(pk=held.pk).lease_expires_at
    job = services.requeue(held, "ops", "worker looks hung")
    assert (job.status, job.run_after, job.lease_token) == (Status.QUEUED, lease, None)
    assert services.claim("w2") == []
    assert services.claim("w2", now=lease - timedelta(seconds=1)) == []
    (again,) = services.claim("w2", now=lease)
    assert again.pk == held.pk


def test_an_operator_requeue_of_a_job_reserved_and_never_begun_is_immediate():
    # No handler ran (its old cluster cannot begin it once the token is gone): it was
    # held a whole lease for nothing.
    services.enqueue("test.echo", {})
    (reserved,) = services.claim("w1", lease_seconds=600)
    before = timezone.now()
    job = services.requeue(reserved, "ops", "cluster gone")
    assert job.status == Status.QUEUED and before <= job.run_after <= timezone.now()
    assert [j.pk for j in services.claim("w2")] == [reserved.pk]


def test_an_operator_requeue_of_a_job_whose_lease_expired_is_immediate():
    started = timezone.now() - timedelta(minutes=30)
    services.enqueue("test.echo", {}, run_after=started - timedelta(seconds=1))
    (held,) = services.claim("w1", lease_seconds=60, now=started)
    before = timezone.now()
    job = services.requeue(held, "ops", "worker lost")
    assert job.status == Status.QUEUED and before <= job.run_after <= timezone.now()
    assert [j.pk for j in services.claim("w2")] == [held.pk]
