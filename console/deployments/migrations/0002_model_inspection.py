# Written for ModelInspection alone (issue 14, item 4): the Deployment fields being changed
# alongside get their own migration.

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("deployments", "0001_initial"),
        ("inventory", "0007_node_identity"),
    ]

    operations = [
        migrations.CreateModel(
            name="ModelInspection",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("path", models.CharField(max_length=500)),
                (
                    "status",
                    models.CharField(
                        choices=[("pending", "Pending"), ("done", "Done"), ("failed", "Failed")],
                        default="pending",
                        max_length=8,
                    ),
                ),
                ("fingerprint", models.CharField(blank=True, max_length=64)),
                ("mtime", models.DateTimeField(blank=True, null=True)),
                ("info", models.JSONField(blank=True, default=dict)),
                ("error", models.TextField(blank=True)),
                (
                    "requested_at",
                    models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                ),
                ("answered_at", models.DateTimeField(blank=True, null=True)),
                (
                    "node",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="model_inspections",
                        to="inventory.node",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        fields=["node", "path", "requested_at"],
                        name="deployments_node_id_076e40_idx",
                    )
                ],
            },
        ),
    ]
