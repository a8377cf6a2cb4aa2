"""The API's own OpenAPI description (``/api/schema/``) read as a test needs it: operations, and request bodies
holding only the required fields, with the optional ones sent empty as clients send them.

A body is built from what the schema documents, never from the serializers, so a field the schema
leaves out or describes wrongly shows up as a failed request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.core.files.uploadedfile import SimpleUploadedFile
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart

METHODS = ("get", "post", "put", "patch", "delete")
JSON = "application/json"
MULTIPART = "multipart/form-data"
URLENCODED = "application/x-www-form-urlencoded"

# How each documented content type is sent: JSON as a program sends it; forms as `curl -F name=` or a
# browser sends a field left empty, the name present with nothing after it.
REQUIRED_ONLY = "required fields only"
EMPTY_STRINGS = 'optional strings ""'
EMPTY_FIELDS = "optional fields empty"


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str  # as documented: /api/v1/models/{name}
    spec: Mapping[str, Any] = field(repr=False)

    @property
    def statuses(self) -> set[int]:
        return {int(code) for code in self.spec.get("responses", {}) if str(code).isdigit()}


@dataclass(frozen=True)
class Body:
    """One request body: its variant, its content type, the fields sent, and which are optional ones sent empty."""

    variant: str
    content_type: str
    fields: dict[str, Any]
    empty: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.content_type}, {self.variant}"

    def encode(self) -> tuple[bytes, str]:
        """(the body's bytes, its Content-Type header)."""
        if self.content_type == JSON:
            return json.dumps(self.fields).encode(), JSON
        if self.content_type == MULTIPART:
            parts = {name: _form_value(value) for name, value in self.fields.items()}
            return encode_multipart(BOUNDARY, parts), MULTIPART_CONTENT
        if self.content_type == URLENCODED:
            pairs = {name: _form_value(value) for name, value in self.fields.items()}
            return urlencode(pairs, doseq=True).encode(), URLENCODED
        raise AssertionError(f"no encoder for {self.content_type}")


def _form_value(value: Any) -> Any:
    """A JSON value as a form field holds it: lists as repeated fields, objects as JSON text, the rest as text."""
    if isinstance(value, list):
        return [_form_value(item) for item in value]
    if isinstance(value, (SimpleUploadedFile, str)):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


_SCHEMA: dict[str, Any] = {}


def api_schema() -> dict[str, Any]:
    """What ``/api/schema/`` serves, made by its generator once per test process: tests are collected
    before any database or server exists (``test_the_schema_a_client_reads_is_the_one_the_tests_walk``
    checks it is the same)."""
    if not _SCHEMA:
        from drf_spectacular.generators import SchemaGenerator
        from drf_spectacular.renderers import OpenApiJsonRenderer

        schema = SchemaGenerator().get_schema(request=None, public=True)
        _SCHEMA.update(json.loads(OpenApiJsonRenderer().render(schema)))
    return _SCHEMA


def operations(schema: Mapping[str, Any]) -> Iterator[Operation]:
    for path, item in schema["paths"].items():
        for method in METHODS:
            if method in item:
                yield Operation(item[method]["operationId"], method, path, item[method])


def resolve(schema: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    """A schema node with its ``$ref`` followed (``#/components/schemas/Name``)."""
    while "$ref" in node:
        *_, kind, name = node["$ref"].split("/")
        node = schema["components"][kind][name]
    return node


def allows_empty_string(schema: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the schema lets a client send "" for this property: a plain string, with no enum, pattern,
    format or minimum length that "" would break."""
    node = resolve(schema, node)
    if node.get("type") != "string" or node.get("readOnly"):
        return False
    return not (node.get("enum") or node.get("pattern") or node.get("format") or node.get("minLength", 0) > 0)


def request_bodies(schema: Mapping[str, Any], operation: Operation, values: Mapping[str, Any]) -> list[Body]:
    """Every body a client may send with only the required fields (``values`` gives them), one list per content type:

    - JSON: the required fields alone; then, if the operation has optional string fields that may be
      empty, again with each of them "".
    - multipart/form-data and x-www-form-urlencoded: the required fields with every optional field
      present and empty.
    """
    request = operation.spec.get("requestBody")
    if request is None:
        return []
    bodies = []
    for content_type, media in request["content"].items():
        node = resolve(schema, media["schema"])
        properties = {name: prop for name, prop in node.get("properties", {}).items() if not prop.get("readOnly")}
        required = [name for name in node.get("required", []) if name in properties]
        missing = [name for name in required if name not in values]
        assert not missing, f"{operation.operation_id}: the table gives no value for required field(s) {missing}"
        sent = {name: values[name] for name in required}
        optional = [name for name in properties if name not in required]
        if content_type == JSON:
            bodies.append(Body(REQUIRED_ONLY, content_type, sent, ()))
            blank = [name for name in optional if allows_empty_string(schema, properties[name])]
            if blank:
                bodies.append(Body(EMPTY_STRINGS, content_type, {**sent, **dict.fromkeys(blank, "")}, tuple(blank)))
        elif content_type in (MULTIPART, URLENCODED):
            bodies.append(Body(EMPTY_FIELDS, content_type, {**sent, **dict.fromkeys(optional, "")}, tuple(optional)))
        else:
            raise AssertionError(f"{operation.operation_id}: no body builder for {content_type}")
    return bodies


def body_kinds(schema: Mapping[str, Any], operation: Operation) -> list[tuple[str, str]]:
    """(variant, content type) of each body ``request_bodies`` makes for the operation, without its values."""
    request = operation.spec.get("requestBody")
    if request is None:
        return []
    required: set[str] = set()
    for media in request["content"].values():
        required |= set(resolve(schema, media["schema"]).get("required", []))
    return [(body.variant, body.content_type) for body in request_bodies(schema, operation, dict.fromkeys(required))]


def query_parameters(operation: Operation) -> tuple[list[str], list[str]]:
    """(required, optional) query parameters of the operation, by name."""
    query = [parameter for parameter in operation.spec.get("parameters", []) if parameter["in"] == "query"]
    return (
        [parameter["name"] for parameter in query if parameter.get("required")],
        [parameter["name"] for parameter in query if not parameter.get("required")],
    )


def query_string(operation: Operation, values: Mapping[str, Any], *, optional_empty: bool) -> str:
    """The required query parameters from ``values``; with ``optional_empty``, every optional one present and
    empty as well, as a browser sends a GET form's empty boxes (``?q=&tag=``)."""
    required, optional = query_parameters(operation)
    missing = [name for name in required if name not in values]
    assert not missing, f"{operation.operation_id}: the table gives no value for query parameter(s) {missing}"
    pairs = [(name, str(values[name])) for name in required]
    if optional_empty:
        pairs += [(name, "") for name in optional]
    return f"?{urlencode(pairs)}" if pairs else ""


def response_schema(schema: Mapping[str, Any], operation: Operation, status: int, content_type: str) -> Any:
    """The JSON Schema of the documented answer (``status``, ``content_type``), or None if it documents no body.

    OpenAPI 3.0 is not quite JSON Schema: ``nullable: true`` becomes a ``null`` alternative, and
    ``$ref`` to a component is followed where it stands (the components hold no cycles).
    """
    documented = operation.spec.get("responses", {}).get(str(status))
    assert documented is not None, f"{operation.operation_id} does not document the status {status}"
    media = documented.get("content", {}).get(content_type.split(";")[0].strip())
    if media is None:
        assert not documented.get("content"), (
            f"{operation.operation_id} answered {status} as {content_type!r}; "
            f"the schema documents {sorted(documented['content'])}"
        )
        return None
    return _json_schema(schema, media.get("schema", {}))


def _json_schema(schema: Mapping[str, Any], node: Any) -> Any:
    if isinstance(node, list):
        return [_json_schema(schema, item) for item in node]
    if not isinstance(node, Mapping):
        return node
    if "$ref" in node:
        return _json_schema(schema, resolve(schema, node))
    converted = {key: _json_schema(schema, value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable"):
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


def response_problems(schema: Mapping[str, Any], operation: Operation, response: Any) -> list[str]:
    """What in a Django test response contradicts the schema's description of it: its status, its content
    type, and its JSON body against the documented schema. Empty when it agrees."""
    import jsonschema

    content_type = response.get("Content-Type", "")
    expected = response_schema(schema, operation, response.status_code, content_type)
    if expected is None or not content_type.startswith(JSON):
        return []
    validator = jsonschema.Draft7Validator(expected)
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '(the body)'}: {error.message[:300]}"
        for error in validator.iter_errors(json.loads(response.content))
    ]
