"""The part of the Prometheus Operator's ``monitoring.coreos.com/v1`` API the chart uses.

No Python package ships those CRDs' schemas without side effects (one that does
registers a pytest plugin), so the fields the chart writes are transcribed here from
the PodMonitor and ServiceMonitor CRDs, each object closed (``additionalProperties:
false``): a misspelt or misplaced field fails. A field the chart starts to use must be
added here from the CRD, not from the chart.
"""

from __future__ import annotations

from typing import Any

# Prometheus' duration, as the CRDs' pattern for ``interval`` has it.
DURATION = (
    "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)

_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchLabels": _STRINGS, "matchExpressions": {"type": "array"}},
}
_NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "any": {"type": "boolean"},
        "matchNames": {"type": "array", "items": {"type": "string"}},
    },
}
# RelabelConfig (monitoring.coreos.com/v1)
_RELABEL_CONFIG = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
        },
        "separator": {"type": "string"},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "modulus": {"type": "integer", "format": "int64"},
        "replacement": {"type": "string"},
        "action": {
            "type": "string",
            "default": "replace",
            "enum": [
                "replace",
                "Replace",
                "keep",
                "Keep",
                "drop",
                "Drop",
                "hashmod",
                "HashMod",
                "labelmap",
                "LabelMap",
                "labeldrop",
                "LabelDrop",
                "labelkeep",
                "LabelKeep",
                "lowercase",
                "Lowercase",
                "uppercase",
                "Uppercase",
                "keepequal",
                "KeepEqual",
                "dropequal",
                "DropEqual",
            ],
        },
    },
}
_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string"},
        "interval": {"type": "string", "pattern": DURATION},
        "honorLabels": {"type": "boolean"},
        "scrapeTimeout": {"type": "string", "pattern": DURATION},
        "relabelings": {"type": "array", "items": _RELABEL_CONFIG},
        "metricRelabelings": {"type": "array", "items": _RELABEL_CONFIG},
    },
}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": _STRINGS,
        "annotations": _STRINGS,
    },
    "additionalProperties": False,
}


def _monitor(kind: str, endpoints: str) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector"],
                "properties": {
                    "selector": _LABEL_SELECTOR,
                    "namespaceSelector": _NAMESPACE_SELECTOR,
                    "jobLabel": {"type": "string"},
                    endpoints: {"type": "array", "items": _ENDPOINT},
                },
            },
        },
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "PodMonitor": _monitor("PodMonitor", "podMetricsEndpoints"),
    "ServiceMonitor": _monitor("ServiceMonitor", "endpoints"),
}
