"""The invalid StreamJobs of ``manifests/``, with what each is expected to produce.

Each manifest starts with comment lines that say what is wrong and what a user sees:

- ``# wrong:`` what is wrong with it;
- ``# schema:`` what ``kubectl apply`` prints when the CRD's structural schema rejects it
  (absent: the schema lets it through, as the Kubernetes API emulator evaluates it);
- ``# message:`` the model's message: the ``InvalidSpec`` condition (and Event) the
  operator writes for a spec the schema let through, and what ``keyshift run`` prints
  after ``<manifest> is not a valid StreamJob:`` for every manifest;
- ``# reported: Degraded`` when the spec is valid and the workers report the problem
  (in the ``Degraded`` condition) because only they have the job's code;
- ``# update-of:`` the manifest it changes (applied first) when it is an update;
- ``# only: kubernetes`` when ``keyshift run`` accepts it (it lacks what only a
  cluster needs, such as the store's URL: a local run starts its own store);
- ``# only: local`` when kubectl's own parser refuses the file (a key given twice): the
  API server never sees it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
MANIFESTS = HERE / "manifests"
VALID = HERE / "valid.yaml"
PLACEHOLDER_STORE_URL = "redis://127.0.0.1:6379"
"""The store URL the manifests carry; the operator tests put the test's store there."""


@dataclass(frozen=True)
class Case:
    path: Path
    wrong: str
    message: str
    schema: str | None
    reported: str | None
    update_of: str | None
    doc: dict[str, Any]
    kubernetes_only: bool = False
    local_only: bool = False

    @property
    def id(self) -> str:
        return self.path.stem

    @property
    def name(self) -> str:
        name: str = self.doc["metadata"]["name"]
        return name

    def with_store(self, url: str) -> dict[str, Any]:
        """The manifest with the placeholder store URL replaced by ``url``."""
        doc = copy.deepcopy(self.doc)
        store = doc["spec"].get("stateStore") or {}
        if store.get("url") == PLACEHOLDER_STORE_URL:
            store["url"] = url
        return doc


def _headers(text: str) -> dict[str, str]:
    headers = {}
    for line in text.splitlines():
        if not line.startswith("# "):
            break
        key, sep, value = line[2:].partition(": ")
        if sep:
            headers[key] = value
    return headers


def load_case(path: Path) -> Case:
    text = path.read_text()
    h = _headers(text)
    return Case(
        path=path,
        wrong=h["wrong"],
        message=h["message"],
        schema=h.get("schema"),
        reported=h.get("reported", "").split(" ")[0] or None,
        update_of=h.get("update-of"),
        doc=yaml.safe_load(text),
        kubernetes_only=h.get("only") == "kubernetes",
        local_only=h.get("only") == "local",
    )


CASES: list[Case] = [load_case(p) for p in sorted(MANIFESTS.glob("*.yaml"))]

SCHEMA_REJECTED = [c for c in CASES if c.schema is not None and not c.local_only]
"""Refused by ``kubectl apply``: the CRD's schema (or its ``self == oldSelf`` rule)."""
OPERATOR_REPORTED = [c for c in CASES if c.schema is None and not c.local_only]
"""Let through by the schema: the operator reports them in the job's status."""


def valid_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(VALID.read_text())
    return doc
