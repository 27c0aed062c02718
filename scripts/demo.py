"""`make demo`: set up the embedded SQLite database, seed demo jobs, and run the
web server (127.0.0.1:8000, or DEMO_PORT) and a django-q2 worker cluster together.

Ctrl-C stops both. Within a minute the seeded jobs have gone through their
states; watch them in the admin.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
env.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
env["PYTHONUNBUFFERED"] = "1"
PORT = os.environ.get("DEMO_PORT") or "8000"


SETUP = """
import django
from django.core.management import call_command

django.setup()
call_command("migrate", verbosity=0)
call_command("jobstate_demo_user")
call_command("jobstate_schedule")
call_command("jobstate_demo_seed")
"""


def port_taken() -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", int(PORT))) == 0


def setup() -> None:
    """Migrate, demo user, schedules, seeded jobs: one process (Django starts once)."""
    subprocess.run([PY, "-c", SETUP], cwd=ROOT, env=env, check=True)


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the process and everything it started (runserver's autoreloader runs
    the server in a child process: signalling the parent alone can leave the child
    serving its port)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if "qcluster" in proc.args:
            # SIGTERM to the cluster's main process alone, which stops its workers in
            # turn; a signal to each of them at once can leave django-q2 1.11 hanging.
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        else:
            signal_group(proc, signal.SIGINT)
    deadline = time.monotonic() + 15
    try:
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
    except KeyboardInterrupt:
        # A second Ctrl-C (or SIGTERM) cuts the wait short. It ended this script and
        # left the worker cluster running, orphaned, with the jobs it held.
        print("Stopping now.", flush=True)
    # Whatever is left in each group (the parent or a child that ignored SIGINT) is killed.
    for proc in procs:
        signal_group(proc, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(KeyboardInterrupt):  # killed already: only reaped here
            proc.wait()


def main() -> int:
    if not PORT.isdigit() or not 0 < int(PORT) < 65536:
        print(f"DEMO_PORT={PORT!r} is not a port number.", file=sys.stderr)
        return 2
    if port_taken():
        print(
            f"Something already serves 127.0.0.1:{PORT}. Stop it, or pick another port: "
            f"DEMO_PORT={int(PORT) + 1} make demo",
            file=sys.stderr,
        )
        return 1
    setup()
    print(
        f"\nStarting the web server on http://127.0.0.1:{PORT}/admin/ and a worker cluster "
        "(python manage.py qcluster).\n"
        f"Watch the jobs at http://127.0.0.1:{PORT}/admin/jobstate/job/ (log in as above).\n"
        "Ctrl-C stops both.\n",
        flush=True,
    )
    # Ctrl-C stops the demo even when it was started in the background (where a shell
    # leaves SIGINT ignored); a SIGTERM (e.g. from a process manager) does the same.
    # Set before the servers start: they would inherit an ignored SIGINT, not a handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    procs = [
        # Each in its own process group, so that stop() reaches their children too.
        subprocess.Popen(
            [PY, "manage.py", "runserver", f"127.0.0.1:{PORT}"], cwd=ROOT, env=env, start_new_session=True
        ),
        subprocess.Popen([PY, "manage.py", "qcluster"], cwd=ROOT, env=env, start_new_session=True),
    ]
    try:
        while all(proc.poll() is None for proc in procs):
            time.sleep(0.5)
        failed = [p for p in procs if p.poll() not in (None, 0)]
        print(f"\n{' and '.join(str(p.args[2]) for p in failed) or 'a process'} stopped; stopping the demo")
        return 1
    except KeyboardInterrupt:
        print(
            "\nStopping the web server and the workers (running demo jobs get 15 s to finish;"
            " the reaper requeues any cut off)...",
            flush=True,
        )
        return 0
    finally:
        stop(procs)


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
