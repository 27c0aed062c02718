"""Queue a few demo jobs (project/jobs.py) owned by the demo user."""

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.utils import timezone

from jobstate import services
from project.management.commands.jobstate_demo_user import USERNAME


class Command(BaseCommand):
    help = "Queue demo jobs: a chart (PNG asset), a slow countdown, a flaky job, a partial import."

    def handle(self, *args: Any, **options: Any) -> None:
        owner = get_user_model().objects.filter(username=USERNAME).first()
        soon = timezone.now() + timedelta(seconds=20)
        jobs = [
            services.enqueue(
                "demo.chart", {"title": "Jobs per day", "values": [3, 7, 4, 9, 12, 6, 10]}, owner=owner
            ),
            services.enqueue("demo.countdown", {"steps": 40, "delay": 1.0}, owner=owner),
            services.enqueue("demo.flaky", {"failures": 1}, owner=owner),
            services.enqueue("demo.import", {}, owner=owner),
            services.enqueue(
                "demo.chart", {"title": "Scheduled", "values": [5, 1, 8]}, owner=owner, run_after=soon
            ),
        ]
        for job in jobs:
            self.stdout.write(f"queued {job.kind:<15} {job.pk}")
