"""The chart rendered by the real Helm engine (PyPI ``helm-python-sdk``), as objects.

``render(values)`` is what ``helm template`` would print for a release ``keyshift``
in namespace ``streams``: every manifest, parsed, in template order. CRDs (the chart's
``crds/``) are not templates; ``chart_crds()`` reads them.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from tests.support import REPO

Obj = dict[str, Any]

CHART = REPO / "charts" / "keyshift"
RELEASE = "keyshift"
NAMESPACE = "streams"


@contextmanager
def loaded() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as chart:
        yield chart


def render(values: Obj | None = None, *, namespace: str = NAMESPACE) -> list[Obj]:
    """Every object the chart renders with ``values`` over its defaults."""
    with loaded() as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True)
    objects: list[Obj] = []
    for path in sorted(manifests):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(manifests[path]) if doc)
    return objects


def notes(values: Obj | None = None) -> str:
    """The NOTES.txt ``helm install`` prints."""
    with loaded() as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def notes_streamjob(values: Obj) -> Obj:
    """The StreamJob NOTES.txt tells the user to apply."""
    text = notes(values)
    block = text.split("<<'YAML'\n", 1)[1].split("\n  YAML\n", 1)[0]
    job: Obj = yaml.safe_load(textwrap.dedent(block))
    return job


def find(objects: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def chart_crds() -> dict[str, Path]:
    """The chart's CRD files by name."""
    return {p.name: p for p in sorted((CHART / "crds").glob("*.yaml"))}
