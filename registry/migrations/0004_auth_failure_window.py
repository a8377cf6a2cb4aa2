"""Failed authentications counted per source and minute, beside the append-only audit chain."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0003_audit_append_only"),
    ]

    operations = [
        migrations.CreateModel(
            name="AuthFailureWindow",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("source", models.CharField(max_length=64)),
                ("window_start", models.DateTimeField()),
                ("count", models.PositiveIntegerField(default=1)),
                ("first_seq", models.PositiveBigIntegerField(null=True)),
            ],
            options={
                "indexes": [models.Index(fields=["window_start"], name="registry_au_window__18d50a_idx")],
                "constraints": [
                    models.UniqueConstraint(fields=("source", "window_start"), name="unique_auth_failure_window")
                ],
            },
        ),
    ]
