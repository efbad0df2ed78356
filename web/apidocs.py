"""`/docs`: the REST API's reference as one page rendered here from the app's own
OpenAPI document. No script and nothing from another site (FastAPI's Swagger UI
and ReDoc load theirs from a CDN): the page's style sheet is Rift's own, under the
Boxes page's Content-Security-Policy. The document itself stays at `/openapi.json`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

METHODS = ("get", "post", "put", "patch", "delete")
_WORDS = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Field:
    name: str
    where: str  # path, query, header, body
    type: str
    required: bool
    description: str


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    description: str
    fields: list[Field]
    body: str | None  # the request body's schema name
    answers: list[tuple[str, str, str]]  # status, description, schema

    @property
    def anchor(self) -> str:
        return f"{self.method}-{self.path}".replace("/", "-").replace("{", "").replace("}", "")


@dataclass(frozen=True)
class Schema:
    name: str
    description: str
    fields: list[Field]


def type_of(schema: dict[str, Any]) -> str:
    """A JSON schema as a short type: `TaskView`, `string`, `list of ExecView`,
    `"open" | "closed"`, `integer | null`."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return " | ".join(f'"{value}"' if isinstance(value, str) else str(value)
                          for value in values)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return " | ".join(type_of(part) for part in schema[key])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {type_of(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of {type_of(schema['additionalProperties'])}"
    return str(kind)


def _schema_name(content: dict[str, Any] | None) -> str:
    if not content:
        return ""
    first: Any = next(iter(content.values()), {})
    return type_of(first.get("schema", {})) if isinstance(first, dict) else ""


def operations(document: dict[str, Any]) -> list[Operation]:
    found = []
    for path, item in document.get("paths", {}).items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            fields = [Field(p["name"], p.get("in", ""), type_of(p.get("schema", {})),
                            bool(p.get("required")), p.get("description", ""))
                      for p in op.get("parameters", [])]
            body = op.get("requestBody", {}).get("content")
            answers = [(status, answer.get("description", ""), _schema_name(answer.get("content")))
                       for status, answer in op.get("responses", {}).items()]
            found.append(Operation(method.upper(), path, op.get("summary", ""),
                                   op.get("description", ""), fields,
                                   _schema_name(body) or None, answers))
    return found


def schemas(document: dict[str, Any]) -> list[Schema]:
    found = []
    for name, schema in sorted(document.get("components", {}).get("schemas", {}).items()):
        required = set(schema.get("required", []))
        fields = [Field(key, "body", type_of(value), key in required,
                        value.get("description", ""))
                  for key, value in schema.get("properties", {}).items()]
        found.append(Schema(name, schema.get("description", ""), fields))
    return found


def linked(type_text: str, known: set[str]) -> Markup:
    """A short type as HTML: each schema it names links to that schema's section."""
    parts = [Markup('<a href="#schema-{0}">{0}</a>').format(part) if part in known
             else escape(part) for part in _WORDS.split(type_text) if part]
    return Markup("<code>") + Markup("").join(parts) + Markup("</code>")
