"""The history's actor index, as 0014 meant it (PostgreSQL, a user model whose
primary key is a string).

Django gives a foreign key to a string key a second index, for ``LIKE`` (its name
ends in ``_like``). Migration 0014 dropped only the plain index of
``jobstate_jobevent.actor_id`` (the partial ``jobstate_event_actor_idx`` serves
its lookups), so with such a user model every history row still wrote an entry
in a full index of the column. Dropping an index takes the table's lock only
for a moment; nothing changes elsewhere.
"""

from django.db import migrations

LIKE_INDEX = "jobstate_jobevent_actor_id_ceac7fe1_like"


def drop_like_index(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f'DROP INDEX IF EXISTS "{LIKE_INDEX}"')


def restore_like_index(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Back: the index again where Django would have made it (a text column)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = 'jobstate_jobevent'::regclass AND attname = 'actor_id'"
        )
        (kind,) = cursor.fetchone()
    ops = {"text": "text_pattern_ops"}.get(
        kind, "varchar_pattern_ops" if kind.startswith("character varying") else None
    )
    if ops is not None:
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS "{LIKE_INDEX}" ON "jobstate_jobevent" ("actor_id" {ops})'
        )


class Migration(migrations.Migration):
    dependencies = [
        ("jobstate", "0018_delivery_job_index"),
    ]

    operations = [
        migrations.RunPython(drop_like_index, restore_like_index, elidable=False),
    ]
