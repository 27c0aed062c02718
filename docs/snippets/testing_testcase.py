# invoices/tests/test_jobs_testcase.py: Django's TestCase (manage.py test).
from datetime import timedelta

from django.test import TestCase, TransactionTestCase, override_settings
from django.utils import timezone
from invoices.tasks import send_receipt

from jobstate import services, testing
from jobstate.tasks import enqueue_on_commit


@override_settings(STORAGES={"default": {"BACKEND": "django.core.files.storage.InMemoryStorage"}})
class RenderTests(TestCase):
    def test_render(self):
        job = services.enqueue("invoices.render", {"lines": 2})
        self.assertEqual(testing.drain(), 1)  # the enqueue above is in this test's transaction: seen
        job.refresh_from_db()
        self.assertEqual(job.status, "completed")
        self.assertEqual(job.result, {"lines": 2})
        self.assertEqual(job.progress_message, "line 2 of 2")
        self.assertEqual(job.assets.get().name, "invoice.txt")
        self.assertEqual(testing.transitions(job), ["enqueue", "claim", "complete"])

    def test_retries_with_backoff(self):
        job = services.enqueue("invoices.send", {})
        testing.drain(now=timezone.now() + timedelta(hours=1))  # every attempt, backoff skipped
        job.refresh_from_db()
        self.assertEqual((job.status, job.attempts), ("completed", 3))

    def test_enqueue_on_commit(self):
        with self.captureOnCommitCallbacks(execute=True):
            enqueue_on_commit(send_receipt, 3)
        self.assertEqual(testing.drain(), 1)


class CommittedTests(TransactionTestCase):
    """Each statement commits, as in production: on_commit callbacks run by themselves."""

    def test_enqueue_on_commit(self):
        enqueue_on_commit(send_receipt, 4)  # outside a transaction: enqueued at once
        self.assertEqual(testing.drain(), 1)
