"""Audit review for auditors: list with filters, streaming export, and chain verification.

A JSONL export signs the chain's head first (``registry/audit/heads.py``) and ends with the signed
heads among its events, so the file checks itself offline (``modelyard audit verify-offline``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from django.conf import settings
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from modelyard.auditfile import signed_head_record
from registry.access.auth import has_role
from registry.api.pagination import MAX_PAGE_SIZE, page_size
from registry.api.responses import StreamingExportResponse
from registry.audit.chain import audit_event_list
from registry.audit.heads import audit_head_sign, audit_head_signature_list
from registry.audit.verify import audit_verify
from registry.errors import InvalidInput
from registry.models import AuditEvent, Role

# The largest seq a cursor may name (PositiveBigIntegerField).
MAX_SEQ = 2**63 - 1
BAD_CURSOR = "invalid 'cursor': follow a page's 'next' or 'previous' link unchanged"
# Rows fetched per database round trip and written per streamed chunk.
EXPORT_CHUNK = 2000
# Signed heads written per streamed chunk (each carries a bundle of about 1.5 KB).
SIGNED_HEAD_CHUNK = 200
# A CSV cell starting with one of these is a formula to spreadsheets (OWASP CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Field name in the database, column name in exports (the same names the hash covers).
EXPORT_COLUMNS = [
    ("seq", "seq"),
    ("at", "at"),
    ("actor", "actor"),
    ("actor_id", "actor_id"),
    ("token_id", "token_id"),
    ("action", "action"),
    ("target_type", "target_type"),
    ("target", "target"),
    ("model_name", "model"),
    ("before", "before"),
    ("after", "after"),
    ("ip", "ip"),
    ("user_agent", "user_agent"),
    ("request_id", "request_id"),
    ("prev_hash", "prev_hash"),
    ("hash", "hash"),
]


class IsAuditor(BasePermission):
    """Only auditors and admins read the audit log, whatever the method."""

    message = "reading the audit log needs the auditor or admin role"

    def has_permission(self, request: Request, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated and has_role(request.user, Role.AUDITOR))


class IsoTimeField(serializers.DateTimeField):
    """An ISO 8601 time; a '+' offset that arrived unescaped in a query string (as a space) still parses."""

    def to_internal_value(self, value: Any) -> Any:
        try:
            return super().to_internal_value(value)
        except serializers.ValidationError:
            if isinstance(value, str) and " " in value.strip():
                return super().to_internal_value(value.strip().replace(" ", "+"))
            raise


class AuditFilterInput(serializers.Serializer[Any]):
    actor = serializers.CharField(default="", allow_blank=True, max_length=150)
    action = serializers.CharField(default="", allow_blank=True, max_length=64)
    model = serializers.CharField(default="", allow_blank=True, max_length=64)
    since = IsoTimeField(default=None)
    until = IsoTimeField(default=None)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["since"] is not None and attrs["until"] is not None and attrs["since"] >= attrs["until"]:
            raise serializers.ValidationError({"until": "must be later than since"})
        return attrs


FILTER_PARAMETERS = [
    OpenApiParameter("actor", str, description="exact username, or 'system' / 'anonymous'"),
    OpenApiParameter("action", str, description="exact action, or a prefix ending in '.' such as 'version.'"),
    OpenApiParameter("model", str, description="model name"),
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="ISO 8601 time, inclusive"),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="ISO 8601 time, exclusive"),
]


def _validated(request: Request, serializer_class: type[AuditFilterInput]) -> dict[str, Any]:
    data = serializer_class(data=request.query_params)
    data.is_valid(raise_exception=True)
    return dict(data.validated_data)


def _events(filters: dict[str, Any]) -> QuerySet[AuditEvent]:
    return audit_event_list(**{key: filters[key] for key in ("actor", "action", "model", "since", "until")})


class AuditEventSerializer(serializers.ModelSerializer[AuditEvent]):
    model = serializers.CharField(source="model_name", read_only=True)

    class Meta:
        model = AuditEvent
        fields = [column for _, column in EXPORT_COLUMNS]
        read_only_fields = fields


class AuditPageSerializer(serializers.Serializer[Any]):
    """A page of :class:`AuditPagination`: no count, which would be a COUNT over the whole log."""

    next = serializers.URLField(allow_null=True, help_text="the next page, or null on the last")
    previous = serializers.URLField(allow_null=True, help_text="the previous page, or null on the first")
    results = AuditEventSerializer(many=True)


class AuditPagination(CursorPagination):
    """Cursor pages over ``seq``: stable while new events arrive, and no COUNT over a huge table."""

    ordering = "-seq"
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE

    def get_page_size(self, request: Request) -> int | None:
        return page_size(request, self.page_size)

    def get_ordering(self, request: Request, queryset: Any, view: Any) -> tuple[str, ...]:
        return (getattr(view, "audit_ordering", self.ordering),)

    def decode_cursor(self, request: Request) -> Cursor | None:
        """A cursor the client garbled is a 400; DRF answers 404, or 500 when its position is not a number."""
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            raise InvalidInput(BAD_CURSOR) from None
        if cursor is not None and cursor.position is not None and not _is_seq(cursor.position):
            raise InvalidInput(BAD_CURSOR)
        return cursor


def _is_seq(position: object) -> bool:
    text = str(position)  # the text of the query string, whatever DRF's type hints say
    return text.isascii() and text.isdigit() and int(text) <= MAX_SEQ


class AuditList(APIView):
    permission_classes = [IsAuditor]

    class InputSerializer(AuditFilterInput):
        order = serializers.ChoiceField(
            choices=["-seq", "seq"], default="-seq", error_messages={"invalid_choice": "use -seq or seq"}
        )

    @extend_schema(
        parameters=[
            *FILTER_PARAMETERS,
            OpenApiParameter("order", str, enum=["-seq", "seq"], description="newest first (default) or oldest"),
            OpenApiParameter("page_size", int, description="events per page, at most 500"),
            OpenApiParameter("cursor", str, description="from a previous page's next or previous link"),
        ],
        responses=AuditPageSerializer,
        operation_id="v1_audit_list",  # a list, though its page is a serializer of its own
    )
    def get(self, request: Request) -> Response:
        filters = _validated(request, self.InputSerializer)
        self.audit_ordering = filters["order"]
        paginator = AuditPagination()
        page = paginator.paginate_queryset(_events(filters), request, view=self)
        return paginator.get_paginated_response(AuditEventSerializer(page, many=True).data)


class IgnoreFormatParameter(DefaultContentNegotiation):
    """Here ``?format=`` names the export's file type, not a DRF renderer; errors always render as JSON."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, str(renderer.media_type)


def _export_rows(events: QuerySet[AuditEvent]) -> Iterator[tuple[Any, ...]]:
    fields = [field for field, _ in EXPORT_COLUMNS]
    yield from events.order_by("seq").values_list(*fields).iterator(chunk_size=EXPORT_CHUNK)


def _csv_chunks(events: QuerySet[AuditEvent]) -> Iterator[bytes]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([column for _, column in EXPORT_COLUMNS])
    for count, row in enumerate(_export_rows(events), start=1):
        writer.writerow([_csv_cell(value) for value in row])
        if count % EXPORT_CHUNK == 0:
            yield _drain(buffer)
    yield _drain(buffer)


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        # OWASP CSV injection: a spreadsheet would run "=HYPERLINK(...)" from an actor, target or
        # user agent a client chose. The quote makes it text; JSONL stays exact for recomputing hashes.
        return "'" + value
    return value


def _jsonl_chunks(events: QuerySet[AuditEvent]) -> Iterator[bytes]:
    """The events, one a line, then the signed heads whose seq lies between the first and the last of them."""
    columns = [column for _, column in EXPORT_COLUMNS]
    buffer = io.StringIO()
    first = last = 0
    for count, row in enumerate(_export_rows(events), start=1):
        record = dict(zip(columns, row, strict=True))
        record["at"] = record["at"].isoformat()
        first, last = first or record["seq"], record["seq"]
        _write_line(buffer, record)
        if count % EXPORT_CHUNK == 0:
            yield _drain(buffer)
    if first:
        for count, head in enumerate(audit_head_signature_list(first=first, last=last), start=1):
            at = head.created_at.isoformat()
            _write_line(
                buffer,
                signed_head_record(seq=head.seq, chain_hash=head.hash, key_id=head.key_id, at=at, bundle=head.bundle),
            )
            if count % SIGNED_HEAD_CHUNK == 0:
                yield _drain(buffer)
    yield _drain(buffer)


def _write_line(buffer: io.StringIO, record: dict[str, Any]) -> None:
    # orjson: the same compact, key-sorted JSON as json.dumps(sort_keys=True, separators=(",", ":")), with
    # text as UTF-8 rather than escaped, in a fraction of the time (an export is mostly this call).
    buffer.write(orjson.dumps(record, option=orjson.OPT_SORT_KEYS, default=str).decode())
    buffer.write("\n")


def _drain(buffer: io.StringIO) -> bytes:
    data = buffer.getvalue().encode()
    buffer.seek(0)
    buffer.truncate()
    return data


EXPORTS = {
    "csv": ("text/csv; charset=utf-8", _csv_chunks),
    "jsonl": ("application/x-ndjson", _jsonl_chunks),
}


class AuditExport(APIView):
    permission_classes = [IsAuditor]
    content_negotiation_class = IgnoreFormatParameter

    class InputSerializer(AuditFilterInput):
        format = serializers.ChoiceField(
            choices=list(EXPORTS), error_messages={"invalid_choice": "use csv or jsonl", "required": "use csv or jsonl"}
        )

    @extend_schema(
        parameters=[*FILTER_PARAMETERS, OpenApiParameter("format", str, enum=list(EXPORTS), required=True)],
        responses={(200, "text/csv"): OpenApiTypes.STR, (200, "application/x-ndjson"): OpenApiTypes.STR},
    )
    def get(self, request: Request) -> StreamingExportResponse:
        filters = _validated(request, self.InputSerializer)
        content_type, chunks = EXPORTS[filters["format"]]
        events = _events(filters)
        if filters["format"] == "jsonl":
            # The head as of now, signed: the file holds the events up to it, and its signature.
            events = events.filter(seq__lte=audit_head_sign(max_events=settings.AUDIT_VERIFY_MAX_EVENTS).seq)
        response = StreamingExportResponse(chunks(events), content_type=content_type)
        response["Content-Disposition"] = f'attachment; filename="audit.{filters["format"]}"'
        return response


class AuditVerify(APIView):
    permission_classes = [IsAuditor]

    @extend_schema(
        responses={
            200: {
                "type": "object",
                "properties": {
                    "ok": {"type": "boolean"},
                    "checked": {"type": "integer"},
                    "first_bad_seq": {"type": "integer", "nullable": True},
                    "reason": {"type": "string"},
                },
            }
        }
    )
    def get(self, request: Request) -> Response:
        return Response(audit_verify().as_dict())
