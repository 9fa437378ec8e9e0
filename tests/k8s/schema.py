"""OpenAPI v3 structural-schema handling for custom resources, as the API server does it.

One pass over an object (``apply_schema``) does what kube-apiserver does for a CRD
with a structural schema, in the same order:

1. **prune** fields not declared in ``properties`` (unless the schema says
   ``x-kubernetes-preserve-unknown-fields: true``); the pruned paths are returned
   so the caller can reject them when the client asked for ``fieldValidation=Strict``;
2. **default** missing fields from ``default``;
3. **validate**: ``type`` (with ``nullable`` and ``x-kubernetes-int-or-string``),
   ``required``, ``enum``, ``minimum``/``maximum`` (and ``exclusive*``),
   ``minLength``/``maxLength``, ``pattern``, ``minItems``/``maxItems``,
   ``uniqueItems``, ``minProperties``/``maxProperties``, ``additionalProperties``
   (maps), ``items``.

CEL rules (``x-kubernetes-validations``) are **not** evaluated, except the one
transition rule worth having in tests: ``self == oldSelf`` (immutability), checked on
updates.  Other rules are ignored silently.  ``format``, ``oneOf``/``anyOf``/``allOf``
/``not`` are ignored as well.

Errors are ``Cause`` tuples shaped like the API server's ``StatusCause``, with the
same message wording (``spec.x: Required value``, ``spec.x: Unsupported value: ...``,
``spec.x: Invalid value: ...: spec.x in body should be greater than or equal to 1``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

Json = Any  # a decoded JSON value
Schema = dict[str, Any]

_TYPE_NAMES = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
}


@dataclass(frozen=True)
class Cause:
    """One field error, as in the ``details.causes`` of a 422 Status."""

    reason: str  # FieldValueRequired, FieldValueInvalid, FieldValueNotSupported, ...
    field: str  # dotted path, e.g. "spec.parallelism"
    message: str  # the full message, prefixed with the field path

    def as_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


@dataclass
class SchemaResult:
    causes: list[Cause] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)  # paths of unknown fields (dropped)


def apply_schema(obj: dict[str, Any], schema: Schema, old: dict[str, Any] | None) -> SchemaResult:
    """Prune, default and validate a custom resource *in place* against its version's schema.

    ``metadata``, ``apiVersion`` and ``kind`` are never pruned (the server owns them).
    ``old`` is the stored object on updates (for ``self == oldSelf`` rules), else None.
    """
    result = SchemaResult()
    props: dict[str, Schema] = schema.get("properties", {})
    for key in list(obj):
        if key in ("apiVersion", "kind", "metadata"):
            continue
        if key in props:
            obj[key] = _prune_default(obj[key], props[key], key, result)
        elif not schema.get("x-kubernetes-preserve-unknown-fields"):
            result.pruned.append(key)
            del obj[key]
    _apply_defaults(obj, props, "", result)
    top = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    top_schema = {k: v for k, v in schema.items() if k != "required"}
    _validate(top, top_schema, "", result.causes)
    for req in schema.get("required", []):
        if req not in obj:
            result.causes.append(Cause("FieldValueRequired", req, f"{req}: Required value"))
    if old is not None:
        _check_transitions(obj, old, schema, "", result.causes)
    return result


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _prune_default(value: Json, schema: Schema, path: str, result: SchemaResult) -> Json:
    if isinstance(value, dict):
        if schema.get("x-kubernetes-embedded-resource"):
            pass  # apiVersion/kind/metadata of embedded objects are kept
        props: dict[str, Schema] = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        for key in list(value):
            sub = _join(path, key)
            if key in props:
                value[key] = _prune_default(value[key], props[key], sub, result)
            elif isinstance(additional, dict):
                value[key] = _prune_default(value[key], additional, sub, result)
            elif (
                additional is True
                or schema.get("x-kubernetes-preserve-unknown-fields")
                or (
                    schema.get("x-kubernetes-embedded-resource")
                    and key
                    in (
                        "apiVersion",
                        "kind",
                        "metadata",
                    )
                )
            ):
                pass
            else:
                result.pruned.append(sub)
                del value[key]
        _apply_defaults(value, props, path, result)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [
            _prune_default(item, schema["items"], f"{path}[{i}]", result)
            for i, item in enumerate(value)
        ]
    return value


def _apply_defaults(value: dict[str, Any], props: dict[str, Schema], path: str, r: Any) -> None:
    for key, sub in props.items():
        if key not in value and "default" in sub:
            value[key] = _prune_default(json.loads(json.dumps(sub["default"])), sub, path, r)


def _type_ok(value: Json, schema: Schema) -> bool:
    if value is None:
        return bool(schema.get("nullable"))
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, str | int) and not isinstance(value, bool)
    kind = schema.get("type")
    if kind is None:
        return True
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    expected = _TYPE_NAMES.get(kind)
    return expected is None or isinstance(value, expected)


def _show(value: Json) -> str:
    return json.dumps(value) if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _invalid(path: str, value: Json, detail: str) -> Cause:
    return Cause("FieldValueInvalid", path, f"{path}: Invalid value: {_show(value)}: {detail}")


def _validate(value: Json, schema: Schema, path: str, causes: list[Cause]) -> None:
    if not _type_ok(value, schema):
        kind = schema.get("type", "int-or-string")
        causes.append(
            _invalid(path, value, f"{path} in body must be of type {kind}: {_show(value)}")
        )
        return
    if value is None:
        return
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_show(v) for v in schema["enum"])
        causes.append(
            Cause(
                "FieldValueNotSupported",
                path,
                f"{path}: Unsupported value: {_show(value)}: supported values: {supported}",
            )
        )
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema:
            low = schema["minimum"]
            if value < low or (schema.get("exclusiveMinimum") and value == low):
                op = (
                    "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
                )
                causes.append(_invalid(path, value, f"{path} in body should be {op} {low}"))
        if "maximum" in schema:
            high = schema["maximum"]
            if value > high or (schema.get("exclusiveMaximum") and value == high):
                op = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
                causes.append(_invalid(path, value, f"{path} in body should be {op} {high}"))
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            causes.append(
                _invalid(
                    path,
                    value,
                    f"{path} in body should be at least {schema['minLength']} chars long",
                )
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            causes.append(
                Cause(
                    "FieldValueTooLong",
                    path,
                    f"{path}: Too long: may not be more than {schema['maxLength']} bytes",
                )
            )
        if "pattern" in schema and not re.search(schema["pattern"], value):
            causes.append(
                _invalid(path, value, f"{path} in body should match '{schema['pattern']}'")
            )
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            causes.append(
                _invalid(
                    path, value, f"{path} in body should have at least {schema['minItems']} items"
                )
            )
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            causes.append(
                Cause(
                    "FieldValueTooMany",
                    path,
                    f"{path}: Too many: {len(value)}: must have at most {schema['maxItems']} items",
                )
            )
        if schema.get("uniqueItems"):
            seen = [json.dumps(v, sort_keys=True) for v in value]
            if len(set(seen)) != len(seen):
                causes.append(Cause("FieldValueDuplicate", path, f"{path}: Duplicate value"))
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(value):
                _validate(item, schema["items"], f"{path}[{i}]", causes)
    if isinstance(value, dict):
        for req in schema.get("required", []):
            if req not in value:
                sub = _join(path, req)
                causes.append(Cause("FieldValueRequired", sub, f"{sub}: Required value"))
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            causes.append(
                _invalid(
                    path,
                    value,
                    f"{path} in body should have at least {schema['minProperties']} properties",
                )
            )
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            causes.append(
                Cause(
                    "FieldValueTooMany",
                    path,
                    f"{path}: Too many: {len(value)}: must have at most "
                    f"{schema['maxProperties']} items",
                )
            )
        props: dict[str, Schema] = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                _validate(item, props[key], _join(path, key), causes)
            elif isinstance(additional, dict):
                _validate(item, additional, _join(path, key), causes)


def _check_transitions(
    new: Json, old: Json, schema: Schema, path: str, causes: list[Cause]
) -> None:
    """The only CEL supported: ``self == oldSelf`` (field immutable once set)."""
    for rule in schema.get("x-kubernetes-validations", []):
        if rule.get("rule", "").replace(" ", "") == "self==oldSelf" and new != old:
            message = rule.get("message") or 'Invalid value: "object": failed rule: self == oldSelf'
            where = path or "<root>"
            causes.append(Cause("FieldValueInvalid", where, f"{where}: {message}"))
    if isinstance(new, dict) and isinstance(old, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in new and key in old and key != "metadata":
                _check_transitions(new[key], old[key], sub, _join(path, key), causes)
