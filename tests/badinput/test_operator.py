"""The real operator (a subprocess) against the API emulator, with every invalid StreamJob
the schema lets through and one valid job in the same namespace.

Each invalid job is reported in its own status (phase ``Failed``, condition
``InvalidSpec`` with its message, an ``InvalidSpec`` Event) with nothing deployed; the
one whose code cannot be imported is reported by its workers (condition ``Degraded``).
The valid job runs as if they were not there, a change of its key group count is
refused at apply time, and the operator is still running at the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from keyshift.store.server import LocalServer
from tests.badinput.cases import CASES, OPERATOR_REPORTED, Case, valid_doc
from tests.e2e.harness import OperatorProcess
from tests.e2e.kubelet import PodRunner
from tests.k8s.emulator import KubernetesEmulator
from tests.support import REPO

Obj = dict[str, Any]
TIMEOUT = 90.0


@pytest.fixture
def operator(
    k8s: KubernetesEmulator, pod_runner: PodRunner, tmp_path: Path
) -> Iterator[OperatorProcess]:
    k8s.kubectl("apply", "--validate=false", "-f", str(REPO / "crds" / "streamjob.yaml"))
    process = OperatorProcess(k8s.kubeconfig, tmp_path / "operator.log").start()
    try:
        yield process
    finally:
        process.stop()


def apply(k8s: KubernetesEmulator, doc: Obj, check: bool = True) -> Any:
    return k8s.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(doc),
                       check=check)  # fmt: skip


def status_of(k8s: KubernetesEmulator, name: str) -> Obj:
    status: Obj = ((k8s.get("streamjobs", name) or {}).get("status")) or {}
    return status


def condition(status: Obj, kind: str) -> Obj:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def invalid_spec_events(k8s: KubernetesEmulator) -> dict[str, list[str]]:
    events = json.loads(k8s.kubectl("get", "events", "-o", "json").stdout)["items"]
    found: dict[str, list[str]] = {}
    for e in events:
        if e.get("reason") == "InvalidSpec":
            found.setdefault(e["involvedObject"]["name"], []).append(e["message"])
    return found


def running(k8s: KubernetesEmulator, name: str) -> Obj | None:
    s = status_of(k8s, name)
    ok = s.get("phase") == "Running" and s.get("parallelism") == 1 and s.get("rescale") is None
    return s if ok else None


def test_invalid_jobs_are_reported_and_the_valid_one_runs(
    k8s: KubernetesEmulator,
    operator: OperatorProcess,
    standalone_server: LocalServer,
    pod_runner: PodRunner,
) -> None:
    def diagnostics() -> str:
        return f"--- operator\n{operator.output()}\n--- pods\n{pod_runner.logs(tail=20)}"

    def wait(what: str, condition: Any) -> Any:
        try:
            return k8s.wait_for(condition, TIMEOUT, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnostics()}") from None

    store = standalone_server.url
    good = valid_doc()
    good["spec"]["stateStore"]["url"] = store
    apply(k8s, good)
    wait("the valid job running", lambda: running(k8s, "good"))

    for case in OPERATOR_REPORTED:
        apply(k8s, case.with_store(store))
    [changed] = [c for c in CASES if c.update_of]
    refused = apply(k8s, changed.with_store(store), check=False)
    assert (refused.returncode, refused.stderr) == (1, f"{changed.schema}\n")

    invalid = [c for c in OPERATOR_REPORTED if c.reported is None]

    def all_reported() -> bool:
        return all(status_of(k8s, c.name).get("phase") == "Failed" for c in invalid)

    wait("every invalid job reported", all_reported)

    def all_events() -> dict[str, list[str]] | None:
        found = invalid_spec_events(k8s)
        return found if all(c.name in found for c in invalid) else None

    events = wait("an InvalidSpec event for every invalid job", all_events)
    wrong = []
    for case in invalid:
        status = status_of(k8s, case.name)
        got = (condition(status, "InvalidSpec"), condition(status, "Ready"), events[case.name])
        expected = (
            {"type": "InvalidSpec", "status": "True", "reason": "InvalidSpec",
             "message": case.message},
            {"type": "Ready", "status": "False", "reason": "InvalidSpec",
             "message": "the spec is invalid"},
            [case.message],
        )  # fmt: skip
        for cond in got[:2]:
            cond.pop("lastTransitionTime", None)
        if got != expected:
            wrong.append(f"{case.id}: {got} != {expected}")
        if k8s.get("statefulsets", f"{case.name}-worker") is not None:
            wrong.append(f"{case.id}: a StatefulSet was deployed")
    assert not wrong, "\n".join(wrong)

    for case in (c for c in OPERATOR_REPORTED if c.reported == "Degraded"):
        assert_degraded(k8s, case, wait)

    # the valid job: untouched by all of this
    good_status = running(k8s, "good")
    assert good_status is not None, status_of(k8s, "good")
    assert condition(good_status, "InvalidSpec")["status"] == "False"
    assert [w["keyRanges"] for w in good_status["workers"]] == ["0-3"]
    assert [r["reason"] for r in good_status["rescales"]] == ["initial"]  # no failover, no rescale
    assert k8s.get("statefulsets", "good-worker") is not None
    assert (k8s.get("streamjobs", "good") or {})["spec"]["keyGroups"] == 4
    assert operator.popen is not None and operator.popen.poll() is None, diagnostics()
    assert "Traceback" not in operator.output(tail=100_000), diagnostics()


def assert_degraded(k8s: KubernetesEmulator, case: Case, wait: Any) -> None:
    """The spec is valid, so it is deployed; its workers say why they cannot run it."""

    def reported() -> Obj | None:
        degraded = condition(status_of(k8s, case.name), "Degraded")
        return degraded if case.message in degraded.get("message", "") else None

    degraded = wait(f"{case.id} reported by its workers", reported)
    assert degraded["status"] == "True"
    assert condition(status_of(k8s, case.name), "InvalidSpec")["status"] == "False"
