"""Failed authentications counted per source and minute; the role groups, so the admin can grant each one."""

from django.db import migrations, models

# Role.values when this migration was written; a migration must not import code that may change.
ROLES = ["viewer", "maintainer", "approver", "auditor", "inference", "admin"]


def create_role_groups(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ROLES:
        Group.objects.get_or_create(name=name)


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0004_tokens_and_unprotect"),
        ("auth", "0012_alter_user_first_name_max_length"),
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
        migrations.RunPython(create_role_groups, migrations.RunPython.noop),
    ]
