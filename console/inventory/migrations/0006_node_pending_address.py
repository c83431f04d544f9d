from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0005_fleet_count_indexes"),
    ]

    operations = [
        migrations.AlterField(
            model_name="node",
            name="address",
            field=models.CharField(blank=True, help_text="an IP address, or empty", max_length=253),
        ),
        migrations.AddField(
            model_name="node",
            name="pending_address",
            field=models.CharField(
                blank=True,
                help_text="a changed address the agent reports; an admin accepts it",
                max_length=253,
            ),
        ),
    ]
