"""``keyshift run`` refuses every invalid manifest before it starts anything: exit code 2
and the message the operator writes in the ``InvalidSpec`` condition (see cases.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.badinput.cases import CASES, VALID, Case, valid_doc
from tests.support import REPO

_SCRIPT = Path(sys.executable).with_name("keyshift")
KEYSHIFT = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "keyshift.controller.cli"]
"""The ``keyshift`` command (its console script, where it is installed)."""
TIMEOUT = 60.0  # a refusal takes a couple of seconds: the imports

LOCAL = [c for c in CASES if c.update_of is None and not c.kubernetes_only]
"""What ``keyshift run`` refuses: all but updates and what only a cluster needs."""


def keyshift(*args: str, run_dir: Path) -> list[str]:
    """The ``keyshift`` command a user runs, from the repository root (where the examples'
    entry points import from)."""
    return [*KEYSHIFT, "--dir", str(run_dir), *args]


def run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)  # fmt: skip


@pytest.fixture(scope="module")
def refusals(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    """``keyshift run`` on every manifest but the update (a few at a time: each is a process
    that only imports and checks); by case id, with the run directory it was given."""
    base = tmp_path_factory.mktemp("runs")

    def one(case: Case) -> tuple[str, tuple[Path, subprocess.CompletedProcess[str]]]:
        run_dir = base / case.id
        return case.id, (run_dir, run(keyshift("run", str(case.path), run_dir=run_dir)))

    with ThreadPoolExecutor(4) as pool:
        return dict(pool.map(one, LOCAL))


@pytest.mark.parametrize("case", LOCAL, ids=lambda c: c.id)
def test_refused_before_anything_starts(
    refusals: dict[str, tuple[Path, subprocess.CompletedProcess[str]]], case: Case
) -> None:
    run_dir, done = refusals[case.id]
    assert done.stderr == f"keyshift: error: {case.path} is not a valid StreamJob: {case.message}\n"
    assert done.returncode == 2
    assert done.stdout == ""
    assert not run_dir.exists()  # no store, no workers, no files


def test_a_changed_key_group_count_is_refused_before_the_store_starts(tmp_path: Path) -> None:
    """The valid job runs here and stops; then its manifest with another key group count
    is refused with the CRD's immutability message (the local run's ``oldSelf`` is its
    last status).

    The manifests are copied out of ``tests/``: the workers import from the manifest's
    folder and its parent, and ``tests/operator`` would shadow the standard library's
    ``operator`` there."""
    [case] = [c for c in CASES if c.update_of]
    valid, changed = tmp_path / VALID.name, tmp_path / case.path.name
    shutil.copy(VALID, valid)
    shutil.copy(case.path, changed)
    run_dir = tmp_path / "runs"
    status = run_dir / "good" / "status.json"
    proc = subprocess.Popen(
        keyshift("run", str(valid), run_dir=run_dir), cwd=REPO, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT
        while not _running(status):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the valid job did not start"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C: the workers commit, the store stops
        assert proc.wait(TIMEOUT) == 0, proc.communicate()[0]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    done = run(keyshift("run", str(changed), run_dir=run_dir))
    assert done.stderr == f"keyshift: error: {changed} is not a valid StreamJob: {case.message}\n"
    assert done.returncode == 2
    assert not (run_dir / "good" / "supervisor.json").exists()
    assert json.loads(status.read_text())["key_groups"] == 4


def _running(status: Path) -> bool:
    try:
        doc = json.loads(status.read_text())
    except (OSError, ValueError):
        return False
    return bool(doc.get("workers")) and all(w.get("ready") for w in doc["workers"])


def test_checking_a_manifest_runs_none_of_the_jobs_code(tmp_path: Path) -> None:
    """The job's module is found, not imported, while the manifest is checked: here its
    top-level code would leave a file, and the manifest asks for more worker processes
    than a local run starts (the check after the module's)."""
    marker = tmp_path / "imported"
    (tmp_path / "sideeffect.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\njob = None\n"
    )
    doc = valid_doc()
    doc["spec"].update(job="sideeffect:job", keyGroups=65536, parallelism=4096)
    manifest = tmp_path / "many.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    done = run(keyshift("run", str(manifest), run_dir=tmp_path / "runs"))
    assert done.stderr == (
        f"keyshift: error: {manifest} is not a valid StreamJob: spec.parallelism is 4096: "
        "keyshift run starts at most 64 worker processes on this machine (--max-workers "
        "raises the limit)\n"
    )
    assert done.returncode == 2
    assert not marker.exists()
    assert not (tmp_path / "runs").exists()


def test_an_infinite_rate_is_refused(tmp_path: Path) -> None:
    """``.inf`` is YAML's infinity; JSON (and so ``kubectl apply``) has none."""
    doc = valid_doc()
    doc["spec"]["source"]["rate"]["recordsPerSecond"] = float("inf")
    manifest = tmp_path / "inf.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    assert ".inf" in manifest.read_text()
    done = run(keyshift("run", str(manifest), run_dir=tmp_path / "runs"))
    assert done.stderr == (
        f"keyshift: error: {manifest} is not a valid StreamJob: "
        "spec.source.rate.recordsPerSecond: Input should be a finite number\n"
    )
    assert done.returncode == 2
