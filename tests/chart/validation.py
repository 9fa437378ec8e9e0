"""Validating rendered manifests as an API server would, without one.

- built-in kinds: ``kubernetes-validate`` in strict mode (unknown fields are errors)
  against a Kubernetes version's OpenAPI schemas;
- kopf's peering objects: the chart's own CRDs (``crds/``), through the schema code of
  the API emulator (``tests/k8s/schema.py``): pruned fields count as unknown;
- Prometheus Operator objects: the fields of its CRDs the chart uses
  (``tests/chart/monitoring_schema.py``), closed to any other field.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # a kubernetes-validate dependency
import kubernetes_validate  # type: ignore[import-untyped]
import yaml
from kubernetes_validate.utils import (  # type: ignore[import-untyped]
    SchemaNotFoundError,
    ValidationError,
    latest_version,
)

from tests.chart.monitoring_schema import SCHEMAS as MONITORING
from tests.chart.render import chart_crds
from tests.k8s.schema import apply_schema

Obj = dict[str, Any]

OLDEST = "1.30"
VERSIONS = (OLDEST, latest_version())
"""The oldest Kubernetes the chart supports and the newest schema kubernetes-validate has."""


@cache
def _crd_schemas() -> dict[tuple[str, str], Obj]:
    """The openAPIV3Schema of every CRD version in the chart, by (apiVersion, kind)."""
    schemas: dict[tuple[str, str], Obj] = {}
    for path in chart_crds().values():
        for crd in yaml.safe_load_all(path.read_text()):
            spec = crd["spec"]
            for version in spec["versions"]:
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


def problems(obj: Obj, version: str) -> list[str]:
    """What is wrong with ``obj`` for Kubernetes ``version`` (empty: valid)."""
    where = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
    custom = _crd_schemas().get((obj["apiVersion"], obj["kind"]))
    if custom is not None:
        result = apply_schema(copy.deepcopy(obj), custom, None)
        return [f"{where}: unknown field {p}" for p in result.pruned] + [
            f"{where}: {c.message}" for c in result.causes
        ]
    if obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] in MONITORING:
        validator = jsonschema.Draft202012Validator(MONITORING[obj["kind"]])
        return [
            f"{where}: {'.'.join(map(str, e.path))}: {e.message}"
            for e in validator.iter_errors(obj)
        ]
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        return [f"{where} (Kubernetes {e.version}): {path}: {e.message}"]
    except SchemaNotFoundError as e:
        return [f"{where}: {e.message}"]
    return []
