"""The columns of running jobs at the end of jobstate_job's rows (jobstate.models.layout)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction

from jobstate.models import layout

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the column order matters on PostgreSQL only"
    ),
]


def scratch() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE layout_t (id int PRIMARY KEY, hot1 int NOT NULL, a int NOT NULL, hot2 varchar(20),"
            " b text, CONSTRAINT hot1_small CHECK (hot1 < a), CONSTRAINT a_positive CHECK (a > 0))"
        )
        cursor.execute(
            "INSERT INTO layout_t VALUES (1, 1, 5, 'x', 'one'), (2, 2, 6, NULL, 'two'), (3, 3, 7, 'z', NULL)"
        )


def rows() -> list[tuple[object, ...]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, hot1, a, hot2, b FROM layout_t ORDER BY id")
        return cursor.fetchall()


def not_null() -> dict[str, bool]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname, attnotnull FROM pg_attribute WHERE attrelid = 'layout_t'::regclass"
            " AND attnum > 0 AND NOT attisdropped"
        )
        return dict(cursor.fetchall())


def test_columns_move_last_with_their_values_types_and_checks():
    scratch()
    before, nulls = rows(), not_null()
    assert layout.move_last(connection, "layout_t", ("hot1", "hot2")) == "moved"
    assert layout.column_order(connection, "layout_t") == ["id", "a", "b", "hot1", "hot2"]
    assert rows() == before and not_null() == nulls
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE layout_t SET hot1 = 9 WHERE id = 1")  # hot1 < a
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE layout_t SET hot1 = NULL WHERE id = 1")
    assert layout.move_last(connection, "layout_t", ("hot1", "hot2")) == "in place"


def test_a_table_over_the_limit_is_left_as_it_is():
    scratch()
    assert (
        layout.move_last(connection, "layout_t", ("hot1", "hot2"), max_rows=2) == "skipped: more than 2 rows"
    )
    assert layout.column_order(connection, "layout_t") == ["id", "hot1", "a", "hot2", "b"]
    assert layout.move_last(connection, "layout_t", ("hot1", "hot2"), max_rows=3) == "moved"


def test_nothing_moves_when_something_would_be_lost_with_a_column():
    scratch()
    with connection.cursor() as cursor:
        cursor.execute("COMMENT ON COLUMN layout_t.hot1 IS 'kept by the operator'")
        cursor.execute("CREATE INDEX layout_t_hot2 ON layout_t (hot2)")
        cursor.execute("CREATE VIEW layout_v AS SELECT hot2 FROM layout_t")
        cursor.execute("ALTER TABLE layout_t ALTER hot2 SET STATISTICS 500")
    outcome = layout.move_last(connection, "layout_t", ("hot1", "hot2"))
    assert outcome.startswith("refused: ")
    for named in ("comment on column 2", "index layout_t_hot2", "view layout_v", "statistics target on hot2"):
        assert named in outcome
    assert layout.column_order(connection, "layout_t") == ["id", "hot1", "a", "hot2", "b"]


def test_the_job_table_has_them_last_and_nothing_a_move_would_lose():
    assert layout.in_place(connection)
    assert layout.attached(connection, layout.TABLE, layout.HOT_COLUMNS_LAST) == []
    call_command("jobstate_move_hot_columns", "--check")
    call_command("jobstate_move_hot_columns")  # in place already: nothing to do


def test_the_command_refuses_and_names_what_would_be_lost():
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobstate_job ADD COLUMN added_later int")  # now they are not last
        cursor.execute("CREATE VIEW layout_progress AS SELECT id, progress FROM jobstate_job")
    with pytest.raises(CommandError, match="not at the end"):
        call_command("jobstate_move_hot_columns", "--check")
    with pytest.raises(CommandError, match="view layout_progress"):
        call_command("jobstate_move_hot_columns")
    assert layout.column_order(connection)[-1] == "added_later"
