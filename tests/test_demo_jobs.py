"""The demo handlers (project/jobs.py) do what `make demo` promises."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from jobstate import services
from jobstate.exceptions import InvalidParameters
from jobstate.models import Job
from jobstate.states import Status
from jobstate.worker.runner import drain
from tests.api_support import JOBS, assert_error, client_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_chart_renders_a_real_png_and_csv_linked_to_the_job(settings, tmp_path, user):
    settings.MEDIA_ROOT = tmp_path
    job = services.enqueue("demo.chart", {"title": "t", "values": [1, 5, 3], "delay": 0}, owner=user)
    drain()
    job.refresh_from_db()
    assert job.status == Status.COMPLETED and job.result["bars"] == 3
    png, data = job.assets.order_by("created_at")
    assert (png.name, png.content_type, png.owner_id) == ("chart.png", "image/png", user.pk)
    image = Image.open(io.BytesIO((Path(tmp_path) / png.file.name).read_bytes()))
    assert image.format == "PNG" and image.size == (640, 360)
    assert (Path(tmp_path) / data.file.name).read_text().splitlines() == ["bar,value", "1,1", "2,5", "3,3"]


def test_chart_parameters_are_validated_before_anything_is_stored():
    with pytest.raises(InvalidParameters) as caught:
        services.enqueue("demo.chart", {"values": [1, -2]})
    assert "values" in caught.value.errors
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("kind", "parameters"),
    [
        ("demo.countdown", {"steps": "30", "delay": True}),
        ("demo.flaky", {"failures": 1.0, "delay": "0"}),
        ("demo.import", {"rows": [30], "delay": False}),
        ("demo.chart", {"title": 5, "values": ["1"], "delay": "0.1"}),
        ("demo.etl", {"rows": "100", "chunk_size": 100.0, "delay": True, "fail_validation": "yes"}),
    ],
)
def test_demo_parameters_are_json_types_as_sent(user, kind, parameters):
    # The demo kinds are the example of a schema: DRF's plain fields took "30" for a
    # number, true for 1.0 and 30 for "30", and stored them converted.
    client = client_for(user)
    response = client.post(JOBS, {"kind": kind, "parameters": parameters}, format="json")
    error = assert_error(response, 400, "invalid_parameters")
    assert set(error["fields"]["parameters"]) == set(parameters), error
    assert not Job.objects.exists()
    sent = {"demo.import": {"rows": ["a,1"], "delay": 0}, "demo.chart": {"values": [1], "delay": 0}}
    response = client.post(JOBS, {"kind": kind, "parameters": sent.get(kind, {"delay": 0})}, format="json")
    assert response.status_code == 201, response.content


def test_countdown_reports_progress_and_flaky_succeeds_on_retry():
    countdown = services.enqueue("demo.countdown", {"steps": 3, "delay": 0})
    flaky = services.enqueue("demo.flaky", {"failures": 1, "delay": 0})
    drain()  # the retry waits for its backoff: run it when due
    Job.objects.filter(pk=flaky.pk, status=Status.QUEUED).update(run_after=flaky.created_at)
    drain()
    countdown.refresh_from_db()
    flaky.refresh_from_db()
    assert countdown.status == Status.COMPLETED and countdown.result == {"counted": 3}
    assert flaky.status == Status.COMPLETED and flaky.result == {"succeeded_on_attempt": 2}
    assert flaky.events.get(transition="requeue").metadata["error"] == "upstream not ready (attempt 1)"


def test_import_ends_partial_with_the_rejected_rows():
    job = services.enqueue("demo.import", {"delay": 0})
    drain()
    job.refresh_from_db()
    assert job.status == Status.PARTIAL
    assert job.result == {"imported": ["alice", "carol"], "rejected": ["bob", "dave"]}
    assert job.error_message == "2 of 4 rows rejected: bob, dave"


def test_make_demo_names_a_taken_port_and_how_to_pick_another():
    """Before it migrates or starts anything: runserver's own error came after the setup,
    and the cluster ran on without a web server."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "demo.py"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = subprocess.run(
            [sys.executable, str(script)],
            env={"PATH": "/usr/bin:/bin", "DEMO_PORT": str(port)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert run.returncode == 1, run.stderr
    assert f"127.0.0.1:{port}" in run.stderr and f"DEMO_PORT={port + 1} make demo" in run.stderr
    bad = subprocess.run(
        [sys.executable, str(script)], env={"DEMO_PORT": "http"}, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "not a port number" in bad.stderr


def test_a_second_interrupt_while_the_demo_stops_kills_what_is_left(monkeypatch):
    """Ctrl-C twice: the second interrupt came while stop() waited for the cluster, ended
    the script and left the cluster running, orphaned. Now it cuts the wait short and
    every process group is killed."""
    import importlib.util
    import signal
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "demo.py"
    spec = importlib.util.spec_from_file_location("demo_script", path)
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)

    class Proc:
        def __init__(self, name: str) -> None:
            self.args = ["python", "manage.py", name]
            self.pid = -1
            self.waits = 0

        def send_signal(self, sig: int) -> None:
            pass

        def wait(self, timeout: float | None = None) -> int:
            self.waits += 1
            if self.args[2] == "qcluster" and self.waits == 1:
                raise KeyboardInterrupt  # the second Ctrl-C, while the cluster stops
            return 0

    signalled: list[tuple[str, int]] = []
    monkeypatch.setattr(demo, "signal_group", lambda proc, sig: signalled.append((proc.args[2], sig)))
    procs = [Proc("qcluster"), Proc("runserver")]
    try:
        demo.stop(procs)
    except KeyboardInterrupt:  # uncaught, it would end the whole test session
        pytest.fail("the second interrupt escaped stop(): the cluster was left running")
    assert ("qcluster", signal.SIGKILL) in signalled and ("runserver", signal.SIGKILL) in signalled
