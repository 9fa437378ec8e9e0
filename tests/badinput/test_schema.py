"""Invalid StreamJobs the CRD's structural schema refuses at ``kubectl apply`` time.

The emulator's schema validation (``tests/k8s/schema.py``) stands in for the API server.
``kubectl apply`` against a real API server asks for strict field validation (unknown
fields are an error, not silently dropped); the emulator serves no OpenAPI document, so
kubectl needs ``--validate=false`` there, and the create goes through ``kubectl create
--raw`` with ``fieldValidation=Strict``, which is the request a real ``kubectl apply``
sends.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.badinput.cases import CASES, OPERATOR_REPORTED, SCHEMA_REJECTED, VALID, Case
from tests.k8s.emulator import KubernetesEmulator
from tests.support import REPO

JOBS = "/apis/keyshift.dev/v1alpha1/namespaces/default/streamjobs"


def test_there_are_enough_bad_manifests_and_each_names_its_message() -> None:
    assert len(CASES) >= 20
    assert len({c.name for c in CASES if c.update_of is None}) == len(CASES) - 1  # one update
    for case in CASES:
        assert case.wrong and case.message, case.id


def apply_strict(k8s: KubernetesEmulator, doc: dict[str, object]) -> tuple[int, str]:
    """Create ``doc`` as ``kubectl apply`` would on a real API server: (exit code, stderr)."""
    created = k8s.kubectl(
        "create", "--raw", f"{JOBS}?fieldValidation=Strict", "-f", "-",
        input=json.dumps(doc), check=False,
    )  # fmt: skip
    return created.returncode, created.stderr


def test_the_docs_list_every_manifest_with_its_messages() -> None:
    """docs/reliability.md, "Bad input": a row per manifest, with its messages."""
    docs = (REPO / "docs" / "reliability.md").read_text()
    section = docs.split("## Bad input", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines()
            if line.startswith("| `")}  # fmt: skip
    assert sorted(rows) == sorted(f"`{c.path.name}`" for c in CASES)
    for case in CASES:
        row = rows[f"`{case.path.name}`"]
        for message in (case.message, case.schema):
            if message is not None:
                assert f"`{message}`".replace("|", "\\|") in row, (case.id, message)


@pytest.fixture
def crd(k8s: KubernetesEmulator) -> KubernetesEmulator:
    k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "streamjob.yaml"))
    return k8s


@pytest.mark.parametrize("case", [c for c in SCHEMA_REJECTED if c.update_of is None],
                         ids=lambda c: c.id)  # fmt: skip
def test_rejected_at_apply_time_with_its_message(crd: KubernetesEmulator, case: Case) -> None:
    code, stderr = apply_strict(crd, case.doc)
    assert (code, stderr) == (1, f"{case.schema}\n")
    assert crd.get("streamjobs", case.name) is None


def test_a_changed_key_group_count_is_rejected_and_the_job_keeps_its_own(
    crd: KubernetesEmulator,
) -> None:
    [case] = [c for c in CASES if c.update_of]
    assert case.update_of == VALID.name
    crd.kubectl("apply", "--validate=false", "-f", str(VALID))
    changed = crd.kubectl("apply", "--validate=false", "-f", "-",
                          input=yaml.safe_dump(case.doc), check=False)  # fmt: skip
    assert (changed.returncode, changed.stderr) == (1, f"{case.schema}\n")
    job = crd.get("streamjobs", case.name)
    assert job is not None and job["spec"]["keyGroups"] == 4


@pytest.mark.parametrize("case", OPERATOR_REPORTED, ids=lambda c: c.id)
def test_the_others_pass_the_schema(crd: KubernetesEmulator, case: Case) -> None:
    """What the schema lets through is the operator's to report (see test_operator.py)."""
    code, stderr = apply_strict(crd, case.doc)
    assert (code, stderr) == (0, "")
    assert crd.get("streamjobs", case.name) is not None
