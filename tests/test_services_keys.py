"""Idempotency keys are scoped per owner: per (kind, owner, key) for owned jobs,
per (kind, key) for system jobs (no owner)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from jobstate import services
from jobstate.models import Job
from jobstate.states import Status

pytestmark = pytest.mark.django_db


def finish(job: Job) -> Job:
    started = services.start(job, "w")
    services.complete(started, started.lease_token)
    return Job.objects.get(pk=job.pk)


def test_owners_do_not_share_keys(user, other_user):
    mine, created_mine = services.get_or_enqueue("test.echo", {}, owner=user, key="k", watermark=1)
    theirs, created_theirs = services.get_or_enqueue("test.echo", {}, owner=other_user, key="k", watermark=9)
    system, created_system = services.get_or_enqueue("test.echo", {}, key="k", watermark=5)
    assert created_mine and created_theirs and created_system
    assert len({mine.pk, theirs.pk, system.pk}) == 3
    mine.refresh_from_db()
    assert mine.input_watermark == 1  # not raised by the other owner's enqueue


def test_an_owner_deduplicates_onto_their_own_job(user):
    first, _ = services.get_or_enqueue("test.echo", {}, owner=user, key="k", watermark=1)
    again, created = services.get_or_enqueue("test.echo", {}, owner=user, key="k", watermark=4)
    assert not created and again.pk == first.pk and again.input_watermark == 4


def test_another_owners_completed_job_does_not_answer_for_mine(user, other_user):
    done = finish(services.enqueue("test.echo", {}, owner=other_user, key="k"))
    job, created = services.get_or_enqueue("test.echo", {}, owner=user, key="k")
    assert created and job.pk != done.pk and job.owner == user
    same, created = services.get_or_enqueue("test.echo", {}, owner=other_user, key="k")
    assert not created and same.pk == done.pk


def test_the_database_allows_one_active_job_per_owner_and_key(user, other_user):
    services.enqueue("test.echo", {}, owner=user, key="k")
    services.enqueue("test.echo", {}, key="k")
    Job.objects.create(kind="test.echo", owner=other_user, key="k")  # another owner: allowed
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(kind="test.echo", owner=user, key="k")
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(kind="test.echo", key="k")
    assert Job.objects.filter(key="k", status=Status.QUEUED).count() == 3


def test_retry_of_a_keyed_job_only_checks_its_owners_key(user, other_user):
    earlier = services.force_fail(services.enqueue("test.echo", {}, owner=user, key="k"), "admin", "no")
    done = finish(services.enqueue("test.echo", {}, owner=user, key="k"))  # replaces the failed one
    theirs = services.enqueue("test.echo", {}, owner=other_user, key="k")
    assert theirs.owner == other_user and theirs.status == Status.QUEUED
    new = services.retry(done, "admin")
    assert new.owner == user and new.key == "k" and new.retry_of_id == done.pk
    with pytest.raises(services.DuplicateActiveKey):
        services.retry(earlier, "admin")  # now the owner's key is active again


def test_deleting_a_user_keeps_their_jobs_but_forgets_their_keys(user):
    # An active system job and the user's active job share (kind, key): if the
    # user's job kept its key once ownerless, it would collide with the system one.
    system = services.enqueue("test.echo", {}, key="k")
    theirs = services.enqueue("test.echo", {}, owner=user, key="k")
    done = finish(services.enqueue("test.echo", {}, owner=user, key="done"))
    user.delete()
    theirs.refresh_from_db()
    done.refresh_from_db()
    assert theirs.owner_id is None and theirs.key is None and theirs.status == Status.QUEUED
    assert done.owner_id is None and done.key is None
    # A system enqueue with the deleted user's old key is not answered by their result.
    job, created = services.get_or_enqueue("test.echo", {}, key="done")
    assert created and job.pk != done.pk
    again, created_again = services.get_or_enqueue("test.echo", {}, key="k")
    assert not created_again and again.pk == system.pk


@pytest.mark.parametrize("watermark", [None, 7])
def test_a_key_whose_active_job_is_being_cancelled_is_refused(user, watermark):
    """That job ends cancelled: answering with it would drop this request's work."""
    job = services.enqueue("test.echo", {}, owner=user, key="k", watermark=1)
    services.start(job, "w")
    services.request_cancel(job, reason="stop it")
    with pytest.raises(services.DuplicateActiveKey, match="being cancelled"):
        services.get_or_enqueue("test.echo", {}, owner=user, key="k", watermark=watermark)
    job.refresh_from_db()
    assert job.input_watermark == 1 and Job.objects.count() == 1
    # Once it has ended, the key takes a new job.
    services.cancel_now(job, job.lease_token)
    again, created = services.get_or_enqueue("test.echo", {}, owner=user, key="k", watermark=watermark)
    assert created and again.pk != job.pk


def test_a_key_answers_with_its_completed_job_until_retention_deletes_it(user):
    # As the docs say: once pruned, the same key queues the work again.
    from datetime import timedelta

    from django.utils import timezone

    from jobstate.worker.retention import prune

    done = finish(services.enqueue("test.echo", {}, owner=user, key="k"))
    job, created = services.get_or_enqueue("test.echo", {}, owner=user, key="k")
    assert not created and job.pk == done.pk
    Job.objects.filter(pk=done.pk).update(finished_at=timezone.now() - timedelta(days=31))
    assert prune(30).jobs == 1
    job, created = services.get_or_enqueue("test.echo", {}, owner=user, key="k")
    assert created and job.pk != done.pk


@pytest.mark.parametrize("key", [" ", "   ", "\t\n", "\u3000"])
def test_a_blank_key_is_refused_and_writes_nothing(user, key):
    # "  " was stored as a key: every caller whose key came out blank shared one job.
    with pytest.raises(ValidationError) as info:
        services.get_or_enqueue("test.echo", {}, owner=user, key=key)
    assert info.value.message_dict == {"key": ["A key cannot be blank (only whitespace)."]}
    assert services.key_problem(key) == "A key cannot be blank (only whitespace)."
    assert not Job.objects.exists()


def test_a_key_is_taken_as_given_not_stripped(user):
    plain = services.enqueue("test.echo", {}, owner=user, key="k")
    spaced = services.enqueue("test.echo", {}, owner=user, key=" k ")
    assert plain.pk != spaced.pk and spaced.key == " k "
    assert services.key_problem(" k ") is None
