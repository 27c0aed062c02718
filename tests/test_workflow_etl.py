"""The demo ETL workflow (project/etl.py): files as assets, resume after a crash,
compensation when validation fails or the job is cancelled."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from jobstate import services
from jobstate.models import Job, JobStep
from jobstate.states import Status
from jobstate.worker.runner import drain, run_job
from project import etl
from tests.workflow_jobs import SimulatedCrash

pytestmark = pytest.mark.django_db(transaction=True)
PARAMS = {"rows": 1000, "chunk_size": 100, "delay": 0}


@pytest.fixture(autouse=True)
def dirs(settings, tmp_path):  # type: ignore[no-untyped-def]
    settings.MEDIA_ROOT = tmp_path / "media"
    settings.VAR_DIR = tmp_path / "var"
    return tmp_path


class CrashOnSleep:
    """Stands in for ``time`` in project.etl: the n-th sleep (one per chunk) crashes."""

    def __init__(self, n: int) -> None:
        self.calls = 0
        self.n = n

    def sleep(self, seconds: float) -> None:
        self.calls += 1
        if self.calls == self.n:
            raise SimulatedCrash(f"sleep {self.n}")


def run_clean() -> dict[str, Any]:
    job = services.enqueue("demo.etl", PARAMS)
    drain()
    job.refresh_from_db()
    assert job.status == Status.COMPLETED, job.error_message
    return job.result


def test_etl_writes_its_files_as_assets(dirs):
    result = run_clean()
    job = Job.objects.get()
    assert result["orders"] == 1000 and set(result["regions"]) == set(etl.REGIONS)
    assets = {a.name: a for a in job.assets.all()}
    assert set(assets) == {"sales.csv", "report.csv", "summary.json"}
    sales = assets["sales.csv"].file.read().decode().splitlines()
    assert sales[0] == "order,region,product,quantity,unit_price" and len(sales) == 1001
    assert json.loads(assets["summary.json"].file.read())["orders"] == 1000
    assert not (dirs / "var" / "etl-work" / str(job.pk)).exists()  # scratch files cleaned up


def test_etl_resumes_mid_step_after_a_crash(monkeypatch):
    expected = run_clean()
    Job.objects.all().delete()
    monkeypatch.setattr(etl, "time", CrashOnSleep(14))  # download: 10 chunks, then process chunk 3
    job = services.enqueue("demo.etl", PARAMS)
    with pytest.raises(SimulatedCrash):
        drain()
    process = JobStep.objects.get(job=job, name="process")
    assert process.status == "running" and process.cursor == 3
    services.requeue_expired(now=timezone.now() + timedelta(hours=1))
    run_job(services.start(job.pk, "w2"), "w2")
    job.refresh_from_db()
    assert job.status == Status.COMPLETED
    assert {k: v for k, v in job.result.items() if k != "report_asset"} == {
        k: v for k, v in expected.items() if k != "report_asset"
    }
    steps = dict(JobStep.objects.filter(job=job).values_list("name", "attempts"))
    assert steps == {"download": 1, "process": 2, "validate": 1, "finalize": 1}


def test_failed_validation_undoes_process_and_download(dirs):
    job = services.enqueue("demo.etl", {**PARAMS, "fail_validation": True})
    drain()
    job.refresh_from_db()
    assert job.status == Status.FAILED and job.attempts == 1
    assert job.error_message.endswith("undone: process, download")
    assert not (dirs / "var" / "etl-work" / str(job.pk)).exists()
    assert not job.assets.exists()


class CancelOnSleep:
    """Stands in for ``time`` in project.etl: an operator cancels the job at the n-th sleep."""

    def __init__(self, job: Job, n: int) -> None:
        self.calls, self.job, self.n = 0, job, n

    def sleep(self, seconds: float) -> None:
        self.calls += 1
        if self.calls == self.n:
            services.request_cancel(Job.objects.get(pk=self.job.pk), "operator", "wrong day")


def test_a_cancelled_etl_discards_its_files(monkeypatch, dirs):
    """demo.etl has undo_on_cancel: the demo shows a cancel compensating (the operator sees
    the undos in the history), and a cancelled run leaves no scratch files behind."""
    job = services.enqueue("demo.etl", PARAMS)
    monkeypatch.setattr(etl, "time", CancelOnSleep(job, 13))  # download: 10 chunks, then process
    drain()
    job.refresh_from_db()
    assert job.status == Status.CANCELLED
    steps = dict(JobStep.objects.filter(job=job).values_list("name", "status"))
    assert steps["download"] == "undone"
    assert not (dirs / "var" / "etl-work" / str(job.pk)).exists()


def test_cli_starts_shows_and_retries_a_workflow():
    out = StringIO()
    call_command("jobstate_workflow", "start", "demo.etl", "--params", json.dumps(PARAMS), stdout=out)
    job = Job.objects.get(pk=out.getvalue().strip())
    drain()
    out = StringIO()
    call_command("jobstate_workflow", "state", str(job.pk), stdout=out)
    data = json.loads(out.getvalue())
    assert data["status"] == "completed" and [s["name"] for s in data["steps"]] == [
        "download",
        "process",
        "validate",
        "finalize",
    ]
    out = StringIO()
    args = ("retry", str(job.pk), "--from", "finalize", "--reason", "redo")
    call_command("jobstate_workflow", *args, stdout=out)
    new = Job.objects.get(pk=out.getvalue().strip())
    assert new.retry_of_id == job.pk
    assert dict(JobStep.objects.filter(job=new).values_list("name", "status")) == {
        "download": "completed",
        "process": "completed",
        "validate": "completed",
        "finalize": "pending",
    }
    with pytest.raises(CommandError, match="not a registered workflow"):
        call_command("jobstate_workflow", "start", "test.echo")


class CrashAfterCleanup:
    """Stands in for ``shutil`` in project.etl: finalize's clean-up removes the work
    directory, then the worker dies before the step is recorded complete."""

    def __init__(self) -> None:
        self.crashed = False

    def rmtree(self, path: Any, ignore_errors: bool = False) -> None:
        shutil.rmtree(path, ignore_errors=ignore_errors)
        if not self.crashed:
            self.crashed = True
            raise SimulatedCrash("after rmtree")


def test_finalize_survives_a_crash_after_its_clean_up(monkeypatch, dirs):
    expected = run_clean()
    Job.objects.all().delete()
    monkeypatch.setattr(etl, "shutil", CrashAfterCleanup())
    job = services.enqueue("demo.etl", PARAMS)
    with pytest.raises(SimulatedCrash):
        drain()
    assert not (dirs / "var" / "etl-work" / str(job.pk)).exists()
    assert JobStep.objects.get(job=job, name="finalize").status == "running"
    services.requeue_expired(now=timezone.now() + timedelta(hours=1))
    assert run_job(services.start(job.pk, "w2"), "w2") == "completed"
    job.refresh_from_db()
    assert {k: v for k, v in job.result.items() if k != "report_asset"} == {
        k: v for k, v in expected.items() if k != "report_asset"
    }
    assets = {a.name: str(a.pk) for a in job.assets.all()}
    assert set(assets) == {"sales.csv", "report.csv", "summary.json"}  # attached once
    assert job.result["report_asset"] == assets["report.csv"]
    steps = dict(JobStep.objects.filter(job=job).values_list("name", "attempts"))
    assert steps == {"download": 1, "process": 1, "validate": 1, "finalize": 2}
