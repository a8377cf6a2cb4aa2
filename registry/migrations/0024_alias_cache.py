"""Alias.cache_max_bytes and cache_ttl_seconds: an alias's response cache, opt-in (inference/response_cache.py)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0023_oidc_identity"),
    ]

    operations = [
        migrations.AddField(
            model_name="alias",
            name="cache_max_bytes",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="alias",
            name="cache_ttl_seconds",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
