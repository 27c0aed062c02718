"""``manage.py jobstate ... | head``: a reader that leaves early ends the command
quietly, with the exit status of a process that SIGPIPE ended, not a traceback."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading

import pytest

from jobstate import services
from tests.admin_support import processing
from tests.test_claim_concurrency import ROOT, database_env

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux


@pytest.mark.skipif(F_SETPIPE_SZ is None, reason="a pipe of one page: Linux")
@pytest.mark.django_db(transaction=True)
def test_a_reader_that_closes_the_pipe_ends_show_quietly() -> None:
    # It ended with a BrokenPipeError traceback (exit status 1), or "Exception ignored
    # ... BrokenPipeError" when the last write failed at exit (exit status 120).
    job = processing()
    for i in range(50):  # about 20 KB of lines: more than the pipe, the reader and Python's buffer hold
        services.add_asset(
            job, asset_type="link", url=f"https://example.org/{i}.json", content_type="text/x-" + "x" * 190
        )
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)  # the writer waits for the reader after one page
    command = [sys.executable, "manage.py", "jobstate", "show", str(job.pk)]
    proc = subprocess.Popen(command, cwd=ROOT, env=database_env(), stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    killer = threading.Timer(60, proc.kill)  # a hung command fails the test instead of blocking it
    killer.start()
    try:
        with os.fdopen(read_end, "rb") as reader:
            first = reader.readline()  # as `head -1`, then the pipe is closed
        _, err = proc.communicate(timeout=60)
    finally:
        killer.cancel()
    assert first == f"job        {job.pk}\n".encode()
    assert (proc.returncode, err.decode()) == (141, "")
