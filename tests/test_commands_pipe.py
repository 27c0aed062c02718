"""``manage.py jobstate ... | head``: a reader that leaves early ends the command
quietly, with the exit status of a process that SIGPIPE ended, not a traceback. So do
``jobstate_stuck`` (not its "could not run" 3), ``jobstate_workflow`` and ``jobstate_diagram``."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading

import pytest

from jobstate import services
from jobstate.models import Job
from tests.admin_support import expired, processing
from tests.test_claim_concurrency import ROOT, database_env

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux


def run_piped(*args: str, lines: int = 1, unbuffered: bool = False) -> tuple[list[bytes], int, str]:
    """``manage.py ARGS`` writing into a pipe of one page whose reader takes ``lines`` lines,
    then closes it (as ``head -N``); with 0 it is closed before the command starts (a reader
    already gone). Buffered, a short output fails at the last flush; ``unbuffered``
    (PYTHONUNBUFFERED, as some containers set it) each write reaches the pipe, so the one that
    fails is in ``handle``. The lines read, the exit status and stderr."""
    read_end, write_end = os.pipe()
    if F_SETPIPE_SZ is not None:
        fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)  # the writer waits for the reader after one page
    if not lines:
        os.close(read_end)
    env = database_env()
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    command = [sys.executable, "manage.py", *args]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    killer = threading.Timer(60, proc.kill)  # a hung command fails the test instead of blocking it
    killer.start()
    try:
        read: list[bytes] = []
        if lines:
            with os.fdopen(read_end, "rb") as reader:
                read = [reader.readline() for _ in range(lines)]
        _, err = proc.communicate(timeout=60)
    finally:
        killer.cancel()
    return read, proc.returncode, err.decode()


def job_with_long_output() -> Job:
    job = processing()
    for i in range(50):  # about 20 KB of lines: more than the pipe, the reader and Python's buffer hold
        services.add_asset(
            job, asset_type="link", url=f"https://example.org/{i}.json", content_type="text/x-" + "x" * 190
        )
    return job


@pytest.mark.skipif(F_SETPIPE_SZ is None, reason="a pipe of one page: Linux")
@pytest.mark.django_db(transaction=True)
def test_a_reader_that_closes_the_pipe_ends_show_quietly() -> None:
    # It ended with a BrokenPipeError traceback (exit status 1), or "Exception ignored
    # ... BrokenPipeError" when the last write failed at exit (exit status 120).
    job = job_with_long_output()
    first, status, err = run_piped("jobstate", "show", str(job.pk))
    assert first == [f"job        {job.pk}\n".encode()]
    assert (status, err) == (141, "")


@pytest.mark.skipif(F_SETPIPE_SZ is None, reason="a pipe of one page: Linux")
@pytest.mark.django_db(transaction=True)
def test_a_reader_that_closes_the_pipe_ends_show_json_with_141() -> None:
    # Unbuffered, the JSON was one write: the pipe took a page, the reader left, and the rest
    # was dropped without an error (stdout's text layer ignores a short write): status 0.
    job = job_with_long_output()
    first, status, err = run_piped("jobstate", "show", str(job.pk), "--json", unbuffered=True)
    assert first == [b"{\n"]
    assert (status, err) == (141, "")


BUFFERING = pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])


@BUFFERING
@pytest.mark.django_db(transaction=True)
def test_a_closed_pipe_ends_jobstate_stuck_with_141_not_its_monitoring_codes(unbuffered: bool) -> None:
    # Buffered, the stuck job's exit status 2 went on and the flush at exit failed:
    # "Exception ignored ... BrokenPipeError", status 120. A write that failed in handle()
    # was caught as a check that could not run: a traceback and status 3.
    expired()
    assert run_piped("jobstate_stuck", lines=0, unbuffered=unbuffered)[1:] == (141, "")


@BUFFERING
@pytest.mark.django_db(transaction=True)
def test_a_closed_pipe_ends_jobstate_workflow_state_quietly(unbuffered: bool) -> None:
    # Status 120 ("Exception ignored") buffered; a traceback and status 1 unbuffered.
    job = services.enqueue("wf.fixable", {})
    assert run_piped("jobstate_workflow", "state", str(job.pk), lines=0, unbuffered=unbuffered)[1:] == (
        141,
        "",
    )


@BUFFERING
def test_a_closed_pipe_ends_jobstate_diagram_quietly(unbuffered: bool) -> None:
    assert run_piped("jobstate_diagram", lines=0, unbuffered=unbuffered)[1:] == (141, "")
