"""Idle workers wake on enqueue: LISTEN/NOTIFY on PostgreSQL, polling on SQLite."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from jobstate import services
from jobstate.worker.listen import Listener
from tests.e2e.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_listener_wakes_when_an_enqueue_commits():
    if connection.vendor != "postgresql":
        assert not Listener.available()  # SQLite: the broker sleeps the poll interval
        return
    listener = Listener()
    try:
        assert listener.drain() == 0  # connects and LISTENs
        assert listener.wait(0.05) is False
        with transaction.atomic():
            services.enqueue("test.echo", {})
            assert listener.wait(0.2) is False  # not visible, not announced, until commit
        assert listener.wait(30) is True
        assert listener.wait(0.05) is False
        services.enqueue("test.echo", {})
        services.enqueue("test.echo", {})
        received = 0

        def both_arrived() -> bool:
            # drain() discards what has arrived (a claim follows and covers those jobs).
            nonlocal received
            received += listener.drain()
            return received >= 2

        wait_for(both_arrived, 30)
        assert listener.wait(0.05) is False
    finally:
        listener.close()


def test_listener_survives_a_lost_connection():
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL only")
    listener = Listener()
    try:
        listener.drain()
        pid = listener._conn.info.backend_pid
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])

        def gone() -> bool:
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
                return cursor.fetchone()[0] == 0

        # Only once the backend is gone is the dead connection seen as dead (under
        # load, a wait could otherwise end quietly on it and the next enqueue's
        # notification go to nobody).
        wait_for(gone, 30)
        assert listener.wait(0.2) is False  # logs, drops the dead connection

        def listening_again() -> bool:
            listener.drain()  # reconnects and listens again (a first call may find it dead)
            return listener._conn is not None and not listener._conn.closed

        wait_for(listening_again, 30)
        services.enqueue("test.echo", {})
        assert listener.wait(30) is True
    finally:
        listener.close()
