"""On PostgreSQL, a trigger refuses UPDATE and DELETE of audit events.

TRUNCATE is left alone on purpose: it is a table-owner operation, and the test suite flushes
tables with it. SQLite (the embedded default) gets no trigger.
"""

from django.db import migrations

INSTALL = """
CREATE OR REPLACE FUNCTION registry_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only: % of event % refused', TG_OP, OLD.seq;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS registry_auditevent_append_only ON registry_auditevent;
CREATE TRIGGER registry_auditevent_append_only
    BEFORE UPDATE OR DELETE ON registry_auditevent
    FOR EACH ROW EXECUTE FUNCTION registry_auditevent_append_only();
"""

REMOVE = """
DROP TRIGGER IF EXISTS registry_auditevent_append_only ON registry_auditevent;
DROP FUNCTION IF EXISTS registry_auditevent_append_only();
"""


def install(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(INSTALL, params=None)


def remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REMOVE, params=None)


class Migration(migrations.Migration):
    dependencies = [("registry", "0002_audit_chain_head")]

    operations = [migrations.RunPython(install, remove)]
