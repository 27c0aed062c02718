"""The columns of running jobs at the end of jobstate_job's rows (jobstate.models.layout)."""

from __future__ import annotations

import re
import time

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
        cursor.execute("ALTER TABLE layout_t ADD CONSTRAINT layout_t_one_b UNIQUE (hot2, b)")
        cursor.execute("CREATE VIEW layout_v AS SELECT hot2 FROM layout_t")
        cursor.execute("ALTER TABLE layout_t ALTER hot2 SET STATISTICS 500")
    outcome = layout.move_last(connection, "layout_t", ("hot1", "hot2"))
    assert outcome.startswith("refused: ")
    for named in (
        "comment on column 2",
        "constraint layout_t_one_b",
        "view layout_v",
        "statistics target on hot2",
    ):
        assert named in outcome
    assert layout.column_order(connection, "layout_t") == ["id", "hot1", "a", "hot2", "b"]


def index_definitions(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = %s::regclass", [table]
        )
        return sorted(definition for (definition,) in cursor.fetchall())


def check_definitions(table: str) -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass",
            [table],
        )
        return sorted(cursor.fetchall())


def test_the_indexes_that_name_a_moved_column_are_built_again():
    scratch()
    with connection.cursor() as cursor:
        cursor.execute("CREATE INDEX layout_t_hot2 ON layout_t (hot2)")
        cursor.execute("CREATE INDEX layout_t_b_where ON layout_t (b) WHERE hot1 > 1")
        cursor.execute("CREATE UNIQUE INDEX layout_t_one ON layout_t (a) WHERE hot2 IS NOT NULL")
        cursor.execute("CREATE INDEX layout_t_a ON layout_t (a)")  # names no moved column
    indexes = index_definitions("layout_t")
    assert layout.move_last(connection, "layout_t", ("hot1", "hot2")) == "moved"
    assert layout.column_order(connection, "layout_t") == ["id", "a", "b", "hot1", "hot2"]
    assert index_definitions("layout_t") == indexes
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE layout_t SET a = 5 WHERE id = 3")  # the unique partial index holds


def shape(definition: str) -> tuple[str, list[str]]:
    """A definition without its casts and parentheses, and the constants it names:
    a definition read back and run again can nest its casts differently
    (``ARRAY['a'::varchar, ...]::text[]`` becomes ``ARRAY[('a'::varchar)::text, ...]``)."""
    literals = sorted(set(re.findall(r"'([^']*)'", definition)))
    bare = re.sub(r"'[^']*'|::[\w ]+(\[\])?|[()]", "", definition)
    return " ".join(bare.split()), literals


def test_the_job_table_moves_back_in_place_with_every_index_and_check():
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobstate_job ADD COLUMN added_later int")  # now they are not last
    assert not layout.in_place(connection)
    indexes, checks = index_definitions(layout.TABLE), check_definitions(layout.TABLE)
    assert layout.move_last(connection) == "moved"
    assert layout.in_place(connection)
    order = layout.column_order(connection)
    assert order[-len(layout.WRITTEN_COLUMNS_LAST) :] == list(layout.WRITTEN_COLUMNS_LAST)
    assert order.index("parameters") < order.index("status")
    assert [shape(d) for d in index_definitions(layout.TABLE)] == [shape(d) for d in indexes]
    assert [(n, shape(d)) for n, d in check_definitions(layout.TABLE)] == [(n, shape(d)) for n, d in checks]


def test_the_job_table_has_them_last_and_nothing_a_move_would_lose():
    assert layout.in_place(connection)
    assert layout.attached(connection, layout.TABLE, layout.WRITTEN_COLUMNS_LAST) == []
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


@pytest.mark.parametrize(
    ("setup", "named"),
    [
        (
            [
                "CREATE FUNCTION layout_touch() RETURNS trigger LANGUAGE plpgsql"
                " AS $$ BEGIN NEW.b := 'touched'; RETURN NEW; END $$",
                "CREATE TRIGGER layout_touch BEFORE UPDATE ON layout_t FOR EACH ROW"
                " EXECUTE FUNCTION layout_touch()",
            ],
            "trigger layout_touch",  # the copying UPDATE fired it on every row
        ),
        (["CREATE RULE layout_also AS ON UPDATE TO layout_t DO ALSO NOTIFY layout"], "rule layout_also"),
        (["ALTER TABLE layout_t ALTER COLUMN hot2 SET (n_distinct = 7)"], "column options on hot2"),
        (["ALTER TABLE layout_t ALTER COLUMN b SET STORAGE EXTERNAL"], None),  # b is not moved
        (["ALTER TABLE layout_t ALTER COLUMN hot2 SET STORAGE EXTERNAL"], "a storage setting on hot2"),
        (["ALTER TABLE layout_t ALTER COLUMN hot2 SET COMPRESSION pglz"], "a compression setting on hot2"),
        (
            [
                "CREATE UNIQUE INDEX layout_t_ri ON layout_t (id, hot1)",
                "ALTER TABLE layout_t REPLICA IDENTITY USING INDEX layout_t_ri",
            ],
            "the replica identity of index layout_t_ri",  # every later UPDATE failed under a publication
        ),
        (
            ["CREATE INDEX layout_t_h ON layout_t (hot1)", "ALTER TABLE layout_t CLUSTER ON layout_t_h"],
            "the cluster mark of index layout_t_h",
        ),
        (
            ["CREATE INDEX layout_t_h ON layout_t (hot1)", "COMMENT ON INDEX layout_t_h IS 'kept'"],
            "a comment of index layout_t_h",
        ),
        (["COMMENT ON CONSTRAINT hot1_small ON layout_t IS 'kept'"], "comment on constraint hot1_small"),
        # Logical replication: the copy sends every row with the columns renamed aside
        # ("hot1__moving"), which a subscriber's table lacks, and its apply stops there.
        (["CREATE PUBLICATION layout_pub FOR TABLE layout_t"], "publication layout_pub"),
        (["CREATE PUBLICATION layout_all FOR ALL TABLES"], "publication layout_all"),
    ],
)
def test_nothing_moves_when_a_rebuild_or_the_copy_would_change_something(setup, named):
    scratch()
    with connection.cursor() as cursor:
        for statement in setup:
            cursor.execute(statement)
    before = rows()
    outcome = layout.move_last(connection, "layout_t", ("hot1", "hot2"))
    if named is None:
        assert outcome == "moved"
        return
    assert outcome.startswith("refused: ") and named in outcome, outcome
    assert layout.column_order(connection, "layout_t") == ["id", "hot1", "a", "hot2", "b"]
    assert rows() == before


@pytest.fixture
def committed_scratch():
    """layout_t, committed, so that another connection can hold it."""
    scratch()
    with connection.cursor() as cursor:
        cursor.execute("COMMIT")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS layout_t")


@pytest.mark.django_db(transaction=True)
def test_a_migration_moves_nothing_and_waits_little_on_a_table_in_use(committed_scratch):
    import psycopg

    dsn = _dsn()
    with psycopg.connect(dsn) as reader:  # a long query on the table: its lock is held
        reader.execute("SELECT count(*) FROM layout_t")
        with transaction.atomic(), connection.cursor() as cursor:
            # The old order locked first and waited for the reader before deciding
            # anything, with every later query on the table queued behind it.
            cursor.execute("SET LOCAL lock_timeout = '10s'")
            started = time.monotonic()
            skipped = layout.move_last(connection, "layout_t", ("hot1", "hot2"), max_rows=2)
            busy = layout.move_last(connection, "layout_t", ("hot1", "hot2"), max_rows=10)
            waited = time.monotonic() - started
        assert skipped == "skipped: more than 2 rows"
        assert busy == f"skipped: the table was in use for {layout.MIGRATION_LOCK_WAIT}"
        assert waited < 9, waited
        reader.rollback()
    assert layout.column_order(connection, "layout_t") == ["id", "hot1", "a", "hot2", "b"]


@pytest.mark.django_db(transaction=True)
def test_the_command_gives_up_within_its_lock_timeout_on_a_table_in_use():
    # Without a limit it waited for the long query, and every later query on the
    # table (workers, the admin, the API) queued behind it.
    import psycopg

    dsn = _dsn()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobstate_job ADD COLUMN added_later int")  # now they are not last
    try:
        with psycopg.connect(dsn) as reader:
            reader.execute("SELECT count(*) FROM jobstate_job")  # holds its lock until rollback
            started = time.monotonic()
            with pytest.raises(CommandError, match=r"in use for 0.3 s \(--lock-timeout\)"):
                call_command("jobstate_move_hot_columns", "--lock-timeout", "0.3")
            assert time.monotonic() - started < 5
            reader.rollback()
        assert layout.column_order(connection)[-1] == "added_later"
        with pytest.raises(CommandError, match="--lock-timeout: a number of seconds"):
            call_command("jobstate_move_hot_columns", "--lock-timeout", "-0.5")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE jobstate_job DROP COLUMN added_later")


@pytest.mark.django_db(transaction=True)
def test_the_command_gives_up_by_default_on_a_table_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without --lock-timeout it waited for the long query for as long as it ran, and
    # every later query on the table (workers, the admin, the API) queued behind it.
    import psycopg

    from jobstate.management.commands import jobstate_move_hot_columns as command

    assert command.DEFAULT_LOCK_TIMEOUT == 5
    monkeypatch.setattr(command, "DEFAULT_LOCK_TIMEOUT", 0.3)  # the test waits less than 5 s
    dsn = _dsn()
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobstate_job ADD COLUMN added_later int")  # now they are not last
        cursor.execute("SET lock_timeout = '10s'")  # a failure, not a hang, if the command waited
    try:
        with psycopg.connect(dsn) as reader:
            reader.execute("SELECT count(*) FROM jobstate_job")  # holds its lock until rollback
            started = time.monotonic()
            with pytest.raises(CommandError) as info:
                call_command("jobstate_move_hot_columns")
            assert time.monotonic() - started < 5
            reader.rollback()
        message = str(info.value)
        assert message.startswith("Nothing moved: the table was in use for 0.3 s (--lock-timeout by default)")
        assert "pg_stat_activity" in message and "0 waits for as long as it takes" in message
        assert layout.column_order(connection)[-1] == "added_later"
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
            cursor.execute("ALTER TABLE jobstate_job DROP COLUMN added_later")


@pytest.mark.parametrize(
    ("args", "lock_wait"),
    [((), "5000ms"), (("--lock-timeout", "0.25"), "250ms"), (("--lock-timeout", "0"), None)],
)
def test_the_commands_lock_wait(
    monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], lock_wait: str | None
) -> None:
    # 0 waits as long as it takes (PostgreSQL's lock_timeout = 0); --check takes no lock.
    asked: list[str | None] = []

    def move_last(connection: object, *, lock_wait: str | None = None) -> str:
        asked.append(lock_wait)
        return "in place"

    monkeypatch.setattr(layout, "move_last", move_last)
    call_command("jobstate_move_hot_columns", *args)
    call_command("jobstate_move_hot_columns", "--check", *args)
    assert asked == [lock_wait]


def _dsn() -> str:
    """The test database's libpq connection string (a second session of its own)."""
    settings = connection.settings_dict
    return (
        f"host={settings['HOST']} port={settings['PORT'] or 5432}"
        f" user={settings['USER']} dbname={settings['NAME']}"
    )
