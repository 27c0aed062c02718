"""Several processes claim from the same queue at once: each job exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from jobstate import services
from jobstate.models import JobEvent

ROOT = Path(__file__).resolve().parent.parent
JOBS = 2000
PROCESSES = 4

CLAIMER = """
import json, os, sys, time
import django
django.setup()
from jobstate import services
worker = sys.argv[1]
claimed = []
print("ready", flush=True)
sys.stdin.readline()  # start together: a claimer that began alone could drain the queue
while True:
    batch = services.claim(worker, limit=int(sys.argv[2]))
    if not batch:
        break
    claimed.extend(str(job.pk) for job in batch)
    time.sleep(0.002)  # as a worker would, running them: SQLite's lock is not fair to waiters
print(json.dumps(claimed))
"""


def database_env() -> dict[str, str]:
    settings = connection.settings_dict
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["DJANGO_SETTINGS_MODULE"] = "project.test_settings"
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = (
            f"postgres://{settings['USER']}@{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}"
            f"/{settings['NAME']}"
        )
    else:
        env["DATABASE_URL"] = f"sqlite:///{settings['NAME']}"
    return env


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_each_job_claimed_exactly_once_across_processes() -> None:
    services.enqueue_many([("test.echo", {"i": i}) for i in range(JOBS)])
    env = database_env()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, f"p{n}", str(5 + n * 7)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(PROCESSES)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", (
            proc.stderr.read()[-3000:] if proc.stderr else ""
        )
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    claimed: list[str] = []
    per_process = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        ids = json.loads(out.strip().splitlines()[-1])
        per_process.append(len(ids))
        claimed.extend(ids)
    assert len(claimed) == JOBS
    assert len(set(claimed)) == JOBS
    assert JobEvent.objects.filter(transition="claim").count() == JOBS
    assert sum(1 for n in per_process if n > 0) >= 2, per_process  # they really competed
