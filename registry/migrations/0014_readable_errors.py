"""Validation messages stored before line breaks were kept: their escaped ``\\x0a`` become real line breaks.

Until 0013 every control character of a library's message was escaped, so onnx.checker's two-part messages
were stored as one line with literal ``\\x0a`` in it. Messages are now stored with their line breaks (the
pages show the first line as the reason and the rest below); this brings the rows written before in line.
Written out here rather than imported, so that the migration stays as it is when the code moves.
"""

from django.db import migrations

_ESCAPED_BREAKS = ("\\x0d\\x0a", "\\x0a", "\\x0d")


def _readable(message):
    if not isinstance(message, str) or "\\x0" not in message:
        return message
    for escaped in _ESCAPED_BREAKS:
        message = message.replace(escaped, "\n")
    return "\n".join(line.rstrip() for line in message.split("\n") if line.strip())


def unescape_line_breaks(apps, schema_editor):
    ModelVersion = apps.get_model("registry", "ModelVersion")
    for version in ModelVersion.objects.exclude(errors=[], warnings=[]).only("pk", "errors", "warnings").iterator():
        errors = [_readable(message) for message in version.errors]
        warnings = [_readable(message) for message in version.warnings]
        if errors != version.errors or warnings != version.warnings:
            ModelVersion.objects.filter(pk=version.pk).update(errors=errors, warnings=warnings)


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0013_batching_check"),
    ]

    operations = [
        migrations.RunPython(unescape_line_breaks, migrations.RunPython.noop),
    ]
