"""Cheaper job writes (issue 9), second part.

The status index leaves completed jobs out: they are most of any table, the
created_at index lists them newest first as fast, and so the outcome of most
jobs writes one index entry fewer.

On PostgreSQL the columns written while a job runs move to the end of the row,
next to each other.

An update whose new row version stays on its page logs only the bytes between
the first and the last column it changed (PostgreSQL compresses the common
prefix and suffix of the two versions). A progress write changes ``progress``,
``progress_message``, ``heartbeat_at``, ``lease_expires_at`` and
``updated_at``; spread over the row they made each write log almost the whole
row (about 200 bytes of WAL), side by side they log about 110.

PostgreSQL cannot reorder columns, so each moves: renamed aside, added again at
the end with Django's own definition, copied, and the old one dropped (with the
checks that named it, which are added again). The copy is one UPDATE of every
row, inside the migration's transaction: on a large table plan for that once.
SQLite logs whole rows anyway, and the column order means nothing to Django, so
there and backwards this does nothing.
"""

from django.db import migrations, models

# Job.HOT_COLUMNS, in the order they end the row: first those written once per
# attempt (begin), then those every progress write changes, the variable-length
# ones last so that a message of another length shifts nothing after it.
HOT_COLUMNS_ORDER = (
    "worker_id",
    "attempts",
    "started_at",
    "lease_expires_at",
    "heartbeat_at",
    "updated_at",
    "progress",
    "progress_message",
    "current_step",
)


def move_hot_columns_last(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    Job = apps.get_model("jobstate", "Job")
    table = schema_editor.quote_name(Job._meta.db_table)
    fields = [Job._meta.get_field(name) for name in HOT_COLUMNS_ORDER]
    columns = {field.column for field in fields}
    checks = [
        c
        for c in Job._meta.constraints
        if hasattr(c, "condition") and not hasattr(c, "fields") and _names(c.condition) & columns
    ]
    qn = schema_editor.quote_name
    for field in fields:
        schema_editor.execute(f"ALTER TABLE {table} RENAME COLUMN {qn(field.column)} TO {qn(_aside(field))}")
    for field in fields:
        schema_editor.add_field(Job, field)
    copies = ", ".join(f"{qn(f.column)} = {qn(_aside(f))}" for f in fields)
    schema_editor.execute(f"UPDATE {table} SET {copies}")
    drops = ", ".join(f"DROP COLUMN {qn(_aside(f))}" for f in fields)
    schema_editor.execute(f"ALTER TABLE {table} {drops}")
    for check in checks:
        schema_editor.add_constraint(Job, check)


def _aside(field):  # type: ignore[no-untyped-def]
    return f"{field.column}__moving"


def _names(condition):  # type: ignore[no-untyped-def]
    """The columns a check's condition names (``F()`` references included)."""
    found = set()
    for child in condition.children:
        if hasattr(child, "children"):
            found |= _names(child)
            continue
        lookup, value = child
        found.add(lookup.split("__")[0])
        if hasattr(value, "name"):
            found.add(value.name)
    return found


class Migration(migrations.Migration):
    dependencies = [
        ("jobstate", "0014_cheaper_job_writes"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="job",
            name="jobstate_job_status_idx",
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "completed"), _negated=True),
                fields=["status", "-created_at"],
                name="jobstate_job_status_idx",
            ),
        ),
        migrations.RunPython(move_hot_columns_last, migrations.RunPython.noop, elidable=False),
    ]
