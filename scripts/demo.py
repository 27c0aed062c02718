"""`make demo`: set up the embedded SQLite database, seed demo jobs, and run the
web server (127.0.0.1:8000) and a django-q2 worker cluster together.

Ctrl-C stops both. Within a minute the seeded jobs have gone through their
states; watch them in the admin.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
env.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
env["PYTHONUNBUFFERED"] = "1"


def manage(*args: str) -> None:
    subprocess.run([PY, "manage.py", *args], cwd=ROOT, env=env, check=True)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 15
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    manage("migrate", "--verbosity", "0")
    manage("jobstate_demo_user")
    manage("jobstate_schedule")
    manage("jobstate_demo_seed")
    print(
        "\nStarting the web server on http://127.0.0.1:8000/admin/ and a worker cluster "
        "(python manage.py qcluster).\n"
        "Watch the jobs at http://127.0.0.1:8000/admin/jobstate/job/ (log in as above).\n"
        "Ctrl-C stops both.\n",
        flush=True,
    )
    procs = [
        subprocess.Popen([PY, "manage.py", "runserver", "127.0.0.1:8000"], cwd=ROOT, env=env),
        subprocess.Popen([PY, "manage.py", "qcluster"], cwd=ROOT, env=env),
    ]
    # A SIGTERM (e.g. from a process manager) stops the demo like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while all(proc.poll() is None for proc in procs):
            time.sleep(0.5)
        failed = [p for p in procs if p.poll() not in (None, 0)]
        print(f"\n{' and '.join(str(p.args[2]) for p in failed) or 'a process'} stopped; stopping the demo")
        return 1
    except KeyboardInterrupt:
        print("\nStopping the web server and the workers...", flush=True)
        return 0
    finally:
        stop(procs)


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
