"""The StreamJob CustomResourceDefinition, generated from the one spec model.

:func:`streamjob_crd` turns ``StreamJobSpec.model_json_schema(by_alias=True)``
(JSON Schema, draft 2020-12) into the *structural* OpenAPI v3 schema the API
server requires: every ``$ref`` inlined, no ``title``, ``anyOf [X, null]`` as
``X`` with ``nullable: true``, the discriminated sink union folded into one
object with a ``type`` enum (CEL rules keep variant-only fields to their
variant), number-or-duration-string fields as ``x-kubernetes-int-or-string``,
free-form objects with ``x-kubernetes-preserve-unknown-fields``. Defaults,
enums, bounds, patterns and descriptions (the models' docstrings) are kept.
A JSON Schema keyword the conversion does not know is an error, so a change
of the model cannot produce a silently wrong CRD.

Rules the model checks in Python and the API server should check at
``kubectl apply`` time are added here as CEL (``x-kubernetes-validations``):
immutable ``job`` and ``keyGroups``, ``parallelism <= keyGroups``, the
autoscaler's bounds, no password in the store URL, the job name.

``keyshift crd --write`` renders it to ``crds/streamjob.yaml``; a test keeps
that file equal to what this module generates.
"""

from __future__ import annotations

import ast
import copy
import inspect
import re
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import BaseModel

from keyshift.api import spec as spec_models
from keyshift.api.names import API_VERSION, GROUP, KIND, PLURAL, SINGULAR, VERSION
from keyshift.api.spec import StreamJobSpec
from keyshift.errors import KeyshiftError
from keyshift.store.protocol import JOB_NAME

Schema = dict[str, Any]

NAME: Final = f"{PLURAL}.{GROUP}"
DEFAULT_PATH: Final = Path("crds") / "streamjob.yaml"
CHART_PATH: Final = Path("charts") / "keyshift" / "crds" / "streamjob.yaml"
"""The Helm chart's copy of ``DEFAULT_PATH``: ``keyshift crd --write`` writes both."""
WRITE_COMMAND: Final = "keyshift crd --write"

# Key order of a schema node in the rendered YAML (unknown keys are an error).
_KEY_ORDER: Final = (
    "description",
    "type",
    "format",
    "nullable",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "properties",
    "additionalProperties",
    "items",
    "required",
    "x-kubernetes-validations",
)
_DROPPED: Final = ("title", "discriminator", "$defs")
_NUMERIC: Final = ("integer", "number")


class SchemaConversionError(KeyshiftError, ValueError):
    """The model's JSON schema uses something a structural schema cannot express."""


# ------------------------------------------------------------------ CEL rules


def _null_or_absent(field: str) -> str:
    """CEL: an optional nullable field is absent or null (``has`` is true for a null)."""
    return f"!has(self.{field}) || type(self.{field}) == null_type"


_IMMUTABLE_JOB: Final = {
    "rule": "self == oldSelf",
    "message": "job is immutable: the job's state belongs to its code; "
    "create a new StreamJob to run other code",
}
_IMMUTABLE_KEY_GROUPS: Final = {
    "rule": "self == oldSelf",
    "message": "keyGroups is immutable: it fixes how input and state are partitioned; "
    "create a new StreamJob (and move the state with a savepoint) to change it",
}
_PARALLELISM_BOUND: Final = {
    "rule": "self.parallelism <= self.keyGroups",
    "message": "parallelism must not exceed keyGroups: each worker owns at least one key group",
    "messageExpression": "'parallelism (' + string(self.parallelism) + ') must not exceed "
    "keyGroups (' + string(self.keyGroups) + '): each worker owns at least one key group'",
}
_AUTOSCALER_MAX_BOUND: Final = {
    "rule": "!has(self.autoscaler) || !has(self.autoscaler.maxParallelism) || "
    "type(self.autoscaler.maxParallelism) == null_type || "
    "self.autoscaler.maxParallelism <= self.keyGroups",
    "message": "autoscaler.maxParallelism must not exceed keyGroups",
}
_AUTOSCALER_MIN_BOUND: Final = {
    "rule": "!has(self.autoscaler) || self.autoscaler.minParallelism <= self.keyGroups",
    "message": "autoscaler.minParallelism must not exceed keyGroups",
}
_AUTOSCALER_MIN_MAX: Final = {
    "rule": f"{_null_or_absent('maxParallelism')} || self.minParallelism <= self.maxParallelism",
    "message": "autoscaler.minParallelism must not exceed autoscaler.maxParallelism",
}
_NO_PASSWORD_IN_URL: Final = {
    "rule": f"{_null_or_absent('url')} || !self.url.matches('^[^:/]+://[^/@]*:[^/@]+@')",
    "message": "stateStore.url must not contain a password: "
    "put it in a Secret and name it in stateStore.secretRef",
}
_JOB_NAME: Final = {
    "rule": f"self.metadata.name.matches('{JOB_NAME.pattern}')",
    "message": "metadata.name must be at most 63 lower-case letters, digits and '-', "
    "starting and ending with a letter or digit (it names the job's pods and its state)",
}

# Rules added to the converted spec schema, by path of property names inside ``spec``.
_SPEC_RULES: Final[dict[tuple[str, ...], list[Schema]]] = {
    (): [_PARALLELISM_BOUND, _AUTOSCALER_MIN_BOUND, _AUTOSCALER_MAX_BOUND],
    ("job",): [_IMMUTABLE_JOB],
    ("keyGroups",): [_IMMUTABLE_KEY_GROUPS],
    ("autoscaler",): [_AUTOSCALER_MIN_MAX],
    ("stateStore",): [_NO_PASSWORD_IN_URL],
}


# ------------------------------------------------------------------ conversion


def structural_schema(json_schema: Schema) -> Schema:
    """A structural OpenAPI v3 schema from a pydantic JSON schema (``$defs`` inlined)."""
    defs: dict[str, Schema] = json_schema.get("$defs", {})
    return _convert(json_schema, defs, ())


def _where(path: tuple[str, ...]) -> str:
    return ".".join(path) or "<root>"


def _resolve(node: Schema, defs: dict[str, Schema], path: tuple[str, ...]) -> Schema:
    """``node`` with its ``$ref`` replaced by the definition (sibling keys win)."""
    ref = node["$ref"]
    prefix = "#/$defs/"
    if not ref.startswith(prefix) or ref[len(prefix) :] not in defs:
        raise SchemaConversionError(f"{_where(path)}: unresolvable $ref {ref!r}")
    merged = copy.deepcopy(defs[ref[len(prefix) :]])
    merged.update({k: v for k, v in node.items() if k != "$ref"})
    return merged


def _convert(node: Schema, defs: dict[str, Schema], path: tuple[str, ...]) -> Schema:
    if "$ref" in node:
        return _convert(_resolve(node, defs, path), defs, path)
    node = {k: v for k, v in node.items() if k not in _DROPPED}
    branches = node.pop("anyOf", None) or node.pop("oneOf", None)
    if branches is not None:
        out = _convert_union(node, branches, defs, path)
    else:
        out = _convert_keys(node, defs, path)
    if out.get("type") == "object" and not {"properties", "additionalProperties"} & set(out):
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "array" and "items" not in out:
        raise SchemaConversionError(f"{_where(path)}: an array needs items")
    if "type" not in out and not (
        out.get("x-kubernetes-preserve-unknown-fields") or out.get("x-kubernetes-int-or-string")
    ):
        raise SchemaConversionError(f"{_where(path)}: no type")
    return _ordered(out)


def _convert_keys(node: Schema, defs: dict[str, Schema], path: tuple[str, ...]) -> Schema:
    """The keywords of one node (no ``$ref``, no union) in their OpenAPI v3 form."""
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "description":
            out[key] = _description(value)
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            if isinstance(value, bool):
                out[key] = value
            else:  # draft 2020-12: a number; OpenAPI v3.0: a flag on minimum/maximum
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
        elif key == "properties":
            out[key] = {name: _convert(sub, defs, (*path, name)) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs, (*path, "[]"))
        elif key == "prefixItems":
            items = [_convert(sub, defs, (*path, "[]")) for sub in value]
            if any(item != items[0] for item in items) or "items" in node:
                raise SchemaConversionError(f"{_where(path)}: tuples must be homogeneous")
            out["items"] = items[0]
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out[key] = _convert(value, defs, (*path, "*"))
            # False: a structural schema prunes unknown fields anyway
        elif key == "default":
            if value is not None:  # a null default is no default
                out[key] = copy.deepcopy(value)
        elif key in _KEY_ORDER:
            out[key] = copy.deepcopy(value)
        else:
            raise SchemaConversionError(f"{_where(path)}: unsupported JSON schema keyword {key!r}")
    return out


def _convert_union(
    node: Schema, branches: list[Schema], defs: dict[str, Schema], path: tuple[str, ...]
) -> Schema:
    """``anyOf``/``oneOf``: optional (``[X, null]``), number-or-string, or tagged objects."""
    nullable = any(b == {"type": "null"} for b in branches)
    rest = [_convert(b, defs, path) for b in branches if b != {"type": "null"}]
    types = {b.get("type") for b in rest}
    if len(rest) == 1:
        merged = {**rest[0], **_convert_keys(node, defs, path)}
    elif len(rest) == 2 and "string" in types and types & set(_NUMERIC):
        merged = _int_or_string(node, rest, defs, path)
    elif types == {"object"}:
        merged = _tagged_union(node, rest, defs, path)
    else:
        raise SchemaConversionError(
            f"{_where(path)}: unsupported union of {sorted(map(str, types))}"
        )
    if nullable:
        merged["nullable"] = True
    return merged


def _int_or_string(
    node: Schema, rest: list[Schema], defs: dict[str, Schema], path: tuple[str, ...]
) -> Schema:
    """A number or a string (durations, quantities): Kubernetes' int-or-string.

    Kubernetes takes integers only as numbers: fractions need the string form.
    Numeric bounds apply to the numbers, the pattern to the strings.
    """
    numeric = next(b for b in rest if b["type"] in _NUMERIC)
    string = next(b for b in rest if b["type"] == "string")
    out: Schema = {"x-kubernetes-int-or-string": True}
    out.update({k: v for k, v in numeric.items() if k != "type"})
    out.update({k: v for k, v in string.items() if k != "type"})
    out.update(_convert_keys(node, defs, path))
    default = out.get("default")
    if isinstance(default, float):
        out["default"] = int(default) if default.is_integer() else f"{default:g}s"
    return out


def _tagged_union(
    node: Schema, variants: list[Schema], defs: dict[str, Schema], path: tuple[str, ...]
) -> Schema:
    """Objects told apart by a ``type`` property: one object, the union of the properties.

    ``type`` becomes a required enum; a property that only some variants have loses
    its default (it would land in the other variants) and gets a CEL rule.
    """
    tag = "type"
    values: list[Any] = []
    described: list[str] = []
    for variant in variants:
        tag_property = variant.get("properties", {}).get(tag, {})
        enum = tag_property.get("enum", [])
        if len(enum) != 1:
            raise SchemaConversionError(f"{_where(path)}: union variants need a {tag!r} constant")
        values.append(enum[0])
        if not described and "description" in tag_property:
            described.append(tag_property["description"])
        if "description" in variant:
            described.append(f"- `{enum[0]}`: {variant['description']}")
    properties: dict[str, Schema] = {}
    owners: dict[str, list[Any]] = {}
    for value, variant in zip(values, variants, strict=True):
        for name, sub in variant.get("properties", {}).items():
            if name == tag:
                continue
            if name in properties and properties[name] != sub:
                raise SchemaConversionError(f"{_where(path)}.{name}: differs between variants")
            properties[name] = sub
            owners.setdefault(name, []).append(value)
    rules: list[Schema] = []
    for name, only in owners.items():
        if len(only) == len(values):
            continue
        sub = properties[name] = {k: v for k, v in properties[name].items() if k != "default"}
        shown = " or ".join(str(v) for v in only)
        sub["description"] = f"{sub.get('description', '')} Only with {tag} {shown}.".strip()
        allowed = ", ".join(f"'{v}'" for v in only)
        rules.append({
            "rule": f"!has(self.{name}) || self.{tag} in [{allowed}]",
            "message": f"{name} is only valid with {tag} {shown}",
        })  # fmt: skip
    tag_schema: Schema = {"type": "string", "enum": values}
    if described:
        tag_schema["description"] = "\n".join(described)
    out: Schema = {
        "type": "object",
        "properties": {
            tag: _ordered(tag_schema),
            **{k: _ordered(v) for k, v in properties.items()},
        },
        "required": [tag],
    }
    if rules:
        out["x-kubernetes-validations"] = rules
    out.update(_convert_keys(node, defs, path))
    return out


def _description(text: str) -> str:
    """A docstring as a description: RST literals as Markdown, wrapped lines joined."""
    text = text.replace("``", "`")
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        lines: list[str] = []
        for line in paragraph.splitlines():
            line = line.strip()
            if lines and not line.startswith("- "):
                lines[-1] = f"{lines[-1]} {line}"
            else:
                lines.append(line)
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def _ordered(node: Schema) -> Schema:
    unknown = set(node) - set(_KEY_ORDER)
    if unknown:
        raise SchemaConversionError(f"unsupported schema keywords {sorted(unknown)}")
    return {key: node[key] for key in _KEY_ORDER if key in node}


def _ordered_tree(node: Schema) -> Schema:
    """``node`` and every schema below it with keys in the rendered order."""
    out = _ordered(node)
    if "properties" in out:
        out["properties"] = {k: _ordered_tree(v) for k, v in out["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _ordered_tree(out[key])
    return out


def _add_rules(schema: Schema, rules: dict[tuple[str, ...], list[Schema]]) -> None:
    for path, extra in rules.items():
        node = schema
        for name in path:
            node = node["properties"][name]
        node.setdefault("x-kubernetes-validations", []).extend(copy.deepcopy(extra))


# ------------------------------------------------------------------ the CRD


def attribute_docstrings(source: str) -> dict[str, dict[str, str]]:
    """Per class of ``source`` (a module's text), its attributes' docstrings: the string
    right after an annotated attribute, cleaned as ``inspect.cleandoc`` does (the rule of
    pydantic's ``use_attribute_docstrings``)."""
    found: dict[str, dict[str, str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        docs = found.setdefault(node.name, {})
        for before, after in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(before, ast.AnnAssign)
                and isinstance(before.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[before.target.id] = inspect.cleandoc(after.value.value)
    return found


def spec_json_schema() -> Schema:
    """``StreamJobSpec``'s JSON schema, every field described by its attribute docstring.

    The docstrings are read from ``keyshift.api.spec``'s source here, when a schema is
    made, rather than by pydantic's ``use_attribute_docstrings`` when the models are
    defined: that parses each model's source again at import, a fifth of the imports of
    every worker process and ``keyshift`` command."""
    schema = StreamJobSpec.model_json_schema(by_alias=True)
    docs = attribute_docstrings(inspect.getsource(spec_models))
    defs: dict[str, Schema] = schema.get("$defs", {})
    for model in vars(spec_models).values():
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        node = schema if model is StreamJobSpec else defs.get(model.__name__)
        if node is None:
            continue  # not part of the spec
        for name, field in model.model_fields.items():
            prop = node.get("properties", {}).get(field.alias or name)
            # the class that declares the field: its docstring, as pydantic would take it
            owner = next(c for c in model.__mro__ if name in vars(c).get("__annotations__", {}))
            doc = docs.get(owner.__name__, {}).get(name)
            if prop is not None and doc is not None and field.description is None:
                prop["description"] = doc
    return schema


def spec_schema() -> Schema:
    """The structural schema of ``spec``, with the CEL rules."""
    schema = structural_schema(spec_json_schema())
    _add_rules(schema, _SPEC_RULES)
    return schema


def _free(description: str) -> Schema:
    return {
        "description": description,
        "nullable": True,
        "x-kubernetes-preserve-unknown-fields": True,
    }


def _typed(kind: str, description: str) -> Schema:
    return {"description": description, "type": kind, "nullable": True}


def status_schema() -> Schema:
    """``status``: written by the operator; the documented fields typed, others kept."""
    condition_fields = {
        "type": {"description": "Ready, Rescaling, Degraded or InvalidSpec.", "type": "string"},
        "status": {"description": "True, False or Unknown.", "type": "string"},
        "reason": {"description": "Why, in one CamelCase word.", "type": "string"},
        "message": {"description": "Why, for humans.", "type": "string"},
        "lastTransitionTime": {
            "description": "When the status last changed.",
            "type": "string",
            "format": "date-time",
        },
    }
    return {
        "description": "The job as observed by the operator.",
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "phase": _typed(
                "string",
                (
                    "Pending, Running, Rescaling, Degraded, Finished (a bounded input all "
                    "processed and committed) or Failed."
                ),
            ),
            "parallelism": _typed("integer", "Workers of the current assignment."),
            "desiredParallelism": _typed(
                "integer",
                "The parallelism the operator moves to: the autoscaler's choice, or "
                "spec.parallelism (see desiredParallelismSource).",
            ),
            "desiredParallelismSource": _typed(
                "string", "Who chose desiredParallelism: manual (spec.parallelism) or autoscaler."
            ),
            "generation": _typed("integer", "Generation of the current assignment."),
            "lag": _typed("integer", "Records not yet processed, over all key groups."),
            "lastRescalePauseSeconds": _typed(
                "number", "Longest pause of a key group during the last rescale, in seconds."
            ),
            "selector": _typed("string", "Label selector of the worker pods (scale subresource)."),
            "observedGeneration": _typed("integer", "The metadata.generation last acted on."),
            "conditions": {
                "description": "Ready, Rescaling, Degraded and InvalidSpec.",
                "type": "array",
                "nullable": True,
                "items": {
                    "type": "object",
                    "properties": condition_fields,
                    "required": ["type", "status"],
                },
            },
            "workers": _free("Each worker: ordinal, name, readiness, key ranges."),
            "failedKeyGroups": _free(
                "Key groups their workers stopped (a user function's error, a poison record, "
                "or the store's): key group, worker, reason, since, offset."
            ),
            "rescale": _free("The rescale in progress, if any."),
            "rescales": _free("The last rescales: from, to, reason, duration, pause, outcome."),
            "autoscaler": _free("The autoscaler's last decision and its inputs."),
            "controller": _free("The rescale executor's persistent record."),
        },
    }


def streamjob_crd() -> dict[str, Any]:
    """The StreamJob CustomResourceDefinition (``apiextensions.k8s.io/v1``)."""
    root: Schema = {
        "description": "A stateful stream job whose keyed state lives in a remote store, so "
        "that it rescales by handing over key ranges.",
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string", "description": API_VERSION},
            "kind": {"type": "string", "description": "StreamJob"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "required": ["spec"],
        "x-kubernetes-validations": [_JOB_NAME],
    }
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Parallelism", "type": "integer", "jsonPath": ".status.parallelism"},
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        },
        {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredParallelism"},
        {"name": "Lag", "type": "integer", "jsonPath": ".status.lag"},
        {"name": "Last pause", "type": "number", "jsonPath": ".status.lastRescalePauseSeconds"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": NAME},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": ["sj"],
                "categories": ["keyshift"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _ordered_tree(root)},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.parallelism",
                            "statusReplicasPath": ".status.parallelism",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block style; multi-line strings as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def render_yaml(crd: dict[str, Any]) -> str:
    """The CRD as the YAML file committed in ``crds/``, with a header saying how it is made."""
    header = (
        f"# Generated by `{WRITE_COMMAND}` from keyshift.api.spec.StreamJobSpec:\n"
        "# do not edit by hand. `keyshift crd --check` fails when this file is stale.\n"
    )
    body = yaml.dump(crd, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)
    return header + body
