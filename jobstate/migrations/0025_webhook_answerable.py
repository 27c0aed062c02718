"""Who answers for a global webhook endpoint (``jobstate.webhooks.answerable``).

A global endpoint hears about every job: it now receives only while the staff user
answerable for it (who made it global or last changed it) may view every job. The
endpoints global before this migration have no one recorded: the enabled ones are
disabled here, with a reason that says how to resume them (enabling one again makes
whoever does it answerable). Reversed, they are enabled again.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone

from jobstate.migrations._lock_limited import LockLimitedMigration

# jobstate.webhooks.answerable.reason(None) when written (a migration keeps its own copy).
NO_ONE = (
    "disabled: no one answers for this global endpoint, which hears about every job (it was made "
    "before jobstate recorded who answers for one, or that user was deleted). Deliveries resume "
    "once staff who may view every job enable it again, who then answer for it: "
    'PATCH {"enabled": true} on the endpoint in the webhooks API, or tick "Enabled" on its admin page.'
)


def disable_unanswered(apps, schema_editor):
    Endpoint = apps.get_model("jobstate", "WebhookEndpoint")
    Endpoint.objects.using(schema_editor.connection.alias).filter(owner__isnull=True, enabled=True).update(
        enabled=False, disabled_at=timezone.now(), disabled_reason=NO_ONE
    )


def enable_again(apps, schema_editor):
    Endpoint = apps.get_model("jobstate", "WebhookEndpoint")
    Endpoint.objects.using(schema_editor.connection.alias).filter(
        owner__isnull=True, enabled=False, disabled_reason=NO_ONE
    ).update(enabled=True, disabled_at=None, disabled_reason="")


class Migration(LockLimitedMigration):  # waits 5 s at most for a lock
    dependencies = [
        ("jobstate", "0024_asset_indexes"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookendpoint",
            name="answerable",
            field=models.ForeignKey(
                blank=True,
                editable=False,
                help_text="Global endpoints only: the staff user who made it or last changed it. It is "
                "disabled at its next delivery once they may not view every job.",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="jobstate_answerable_webhooks",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddConstraint(
            model_name="webhookendpoint",
            constraint=models.CheckConstraint(
                condition=models.Q(("owner__isnull", True), ("answerable__isnull", True), _connector="OR"),
                name="jobstate_webhook_answerable_global",
            ),
        ),
        migrations.RunPython(disable_unanswered, enable_again, elidable=False),
    ]
