"""``manage.py jobstate pause``, ``resume`` and ``paused``."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from jobstate import services
from jobstate.models import KindPause

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("jobstate", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as info:
        run(*args)
    return str(info.value)


def test_pause_list_and_resume_a_kind(monkeypatch):
    monkeypatch.setattr("getpass.getuser", lambda: "ops")
    services.enqueue("test.echo", {})
    services.enqueue("test.echo", {})
    assert run("paused") == "No kind is paused.\n"
    out = run("pause", "test.echo", "--reason", "mail API down")
    assert out.startswith("paused test.echo: 2 queued job(s) stay queued until")
    listed = run("paused")
    assert listed.startswith("test.echo  2 queued, paused by cli:ops since ") and listed.rstrip().endswith(
        ": mail API down"
    )
    assert services.claim("w") == []
    out = run("resume", "test.echo", "--reason", "back up")
    assert out.startswith("resumed test.echo (paused by cli:ops since ")
    pause = KindPause.objects.get()
    assert (pause.paused_by_label, pause.reason, pause.resumed_by_label, pause.resume_reason) == (
        "cli:ops",
        "mail API down",
        "cli:ops",
        "back up",
    )
    assert len(services.claim("w", limit=5)) == 2


def test_refusals_are_one_line_and_write_nothing():
    assert refused("resume", "test.echo") == "resume refused: 'test.echo' is not paused"
    assert "Unknown job kind 'test.ecoh'" in refused("pause", "test.ecoh", "--reason", "typo")
    assert refused("pause", "test.echo", "--reason", " ") == "--reason is empty: say why the kind is paused"
    assert not KindPause.objects.exists()
    run("pause", "test.echo", "--reason", "incident")
    message = refused("pause", "test.echo", "--reason", "again")
    assert message.startswith("pause refused: 'test.echo' is already paused (by cli:") and message.endswith(
        ": incident)"
    )
    assert KindPause.objects.count() == 1
