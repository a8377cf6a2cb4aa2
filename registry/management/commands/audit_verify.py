"""``modelyard manage audit_verify``: check the audit hash chain; exit status 1 when it is broken."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from registry.audit.verify import audit_verify


class Command(BaseCommand):
    help = "Recompute the audit hash chain and report the first event that does not match."

    def handle(self, *args: Any, **options: Any) -> None:
        result = audit_verify()
        if not result.ok:
            raise CommandError(f"audit chain BROKEN at event {result.first_bad_seq}: {result.reason}", returncode=1)
        self.stdout.write(f"audit chain ok: {result.checked} events verified")
