"""The StreamJob manifest and the worker's environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from keyshift.api.spec import DuplicateKeyError, StreamJob, StreamJobSpec, load_manifest, parse_yaml
from keyshift.runtime.api import JobLoadError, find_job_module
from keyshift.runtime.config import settings_from

REPO = Path(__file__).resolve().parents[2]


def test_the_example_manifest_loads() -> None:
    m = load_manifest(REPO / "examples" / "counter.yaml")
    assert m.name == "counter"
    assert m.spec.job == "examples.counter:job"
    assert m.spec.checkpoint_interval == 1.0
    assert m.spec.generator.distribution == "zipf"
    assert m.spec.sink.type == "log"


def test_environment_gives_ordinal_store_url_and_password_file(tmp_path: Path) -> None:
    m = load_manifest(REPO / "examples" / "counter.yaml")
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    env = {
        "KEYSHIFT_WORKER_ORDINAL": "3",
        "KEYSHIFT_STORE_URL": "redis://10.0.0.1:6379",
        "KEYSHIFT_STORE_PASSWORD_FILE": str(secret),
    }
    s = settings_from(m, environ=env)
    assert (s.ordinal, s.store_url, s.store_password) == (3, "redis://10.0.0.1:6379", "s3cret")
    assert s.worker_name == "counter-worker-3"
    assert "s3cret" not in repr(s)
    # a StatefulSet pod name gives the ordinal too; arguments win over the environment
    assert settings_from(m, environ={"HOSTNAME": "counter-worker-7"}).ordinal == 7
    assert settings_from(m, ordinal=1, environ=env).ordinal == 1
    with pytest.raises(ValueError, match="ordinal"):
        settings_from(m, environ={})


def test_the_store_ca_file_is_used_when_the_secret_has_one(tmp_path: Path) -> None:
    """The operator names ``ca.crt`` of the store's Secret for every worker; a Secret
    without it (no TLS, or a certificate the system's CAs verify) leaves no file."""
    m = load_manifest(REPO / "examples" / "counter.yaml")
    ca = tmp_path / "ca.crt"
    env = {"KEYSHIFT_WORKER_ORDINAL": "0", "KEYSHIFT_STORE_CA_FILE": str(ca)}
    assert settings_from(m, environ=env).store_ca_file is None
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert settings_from(m, environ=env).store_ca_file == str(ca)
    assert settings_from(m, environ={"KEYSHIFT_WORKER_ORDINAL": "0"}).store_ca_file is None


def test_invalid_manifests_are_refused_with_the_field_named() -> None:
    base = {"metadata": {"name": "ok"}, "spec": {"job": "m:j"}}
    assert StreamJob.model_validate(base).spec.key_groups == 128
    with pytest.raises(ValidationError, match="keyGroups"):
        StreamJob.model_validate({**base, "spec": {"job": "m:j", "keyGroups": 0}})
    with pytest.raises(ValueError, match="invalid job name"):
        StreamJob.model_validate({**base, "metadata": {"name": "Bad_Name"}})
    with pytest.raises(ValidationError, match=r"checkpointInterval|bad duration"):
        StreamJob.model_validate({**base, "spec": {"job": "m:j", "checkpointInterval": "soon"}})
    with pytest.raises(ValidationError, match="needs recordsPerSecond"):
        StreamJob.model_validate(
            {**base, "spec": {"job": "m:j", "source": {"rate": {"shape": "step"}}}}
        )
    spec = StreamJob.model_validate(
        {**base, "spec": {"job": "m:j", "checkpointInterval": "250ms"}}
    ).spec
    assert spec.checkpoint_interval == 0.25


FULL_WIDTH_ONE = "\uff11"
SECRET_KEY_REF = {"secretKeyRef": {"name": "store", "key": "password"}}


def spec_with(**fields: object) -> dict[str, object]:
    return {"job": "examples.counter:job", "keyGroups": 4, **fields}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"keyGroups": "4"}, "keyGroups\n  Input should be a valid integer"),
        ({"parallelism": True}, "parallelism\n  Input should be a valid integer"),
        ({"sink": {"type": "log", "fsync": "yes"}}, "Input should be a valid boolean"),
        ({"failoverAfter": FULL_WIDTH_ONE + "s"}, f"bad duration '{FULL_WIDTH_ONE}s'"),
        ({"checkpointInterval": "99999999999h"}, "less than or equal to 3600"),
        ({"time": {"outOfOrderness": "1" + "0" * 400 + "s"}}, "bad duration of 402 characters"),
        ({"batchSize": 10**30}, "less than or equal to 1000000"),
        ({"source": {"rate": {"recordsPerSecond": float("inf")}}}, "finite number"),
        ({"source": {"rate": {"recordsPerSecond": float("nan")}}}, "finite number"),
    ],
)
def test_the_model_is_as_strict_as_the_crd(fields: dict[str, object], message: str) -> None:
    """What the CRD's schema refuses the model refuses too, so ``keyshift run`` coerces
    nothing the API server would not take, and no number is unbounded or infinite."""
    with pytest.raises(ValidationError, match=message):
        StreamJobSpec.model_validate(spec_with(**fields))


def test_rate_points_from_yaml_lists_are_taken() -> None:
    spec = StreamJobSpec.model_validate(
        spec_with(source={"rate": {"shape": "points", "points": [[0, 10], [5, 20.5]]}})
    )
    assert spec.generator.rate.points == [(0.0, 10.0), (5.0, 20.5)]


@pytest.mark.parametrize(
    "env",
    [
        {"name": "KEYSHIFT_STORE_PASSWORD", "value": "pw"},
        {"name": "KEYSHIFT_KAFKA_SASL_PASSWORD", "value": "pw"},
        {"name": "API_TOKEN", "value": "t"},
        {"name": "KEYSHIFT_STORE_URL", "value": "redis://:pw@valkey:6379"},
        {"name": "SOMETHING", "value": "redis://valkey:6379?password=pw"},
    ],
)
def test_secrets_in_clear_in_env_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="holds a secret in clear") as info:
        StreamJobSpec.model_validate(spec_with(env=[env]))
    assert "pw" not in str(info.value).replace("password", "")


@pytest.mark.parametrize(
    "env",
    [
        {"name": "KEYSHIFT_STORE_PASSWORD", "valueFrom": SECRET_KEY_REF},
        {"name": "KEYSHIFT_STORE_URL", "value": "redis://valkey:6379"},
        {"name": "KEYSHIFT_STORE_PASSWORD_FILE", "value": "/var/run/secrets/pw"},
        {"name": "LOG_LEVEL", "value": "debug"},
    ],
)  # fmt: skip
def test_env_without_secrets_in_clear_is_fine(env: dict[str, object]) -> None:
    StreamJobSpec.model_validate(spec_with(env=[env]))


@pytest.mark.parametrize("path", ["../x.jsonl", "a/../../x.jsonl", "/etc/x.jsonl", "..\\x"])
def test_a_log_sink_path_stays_in_the_output_directory(path: str) -> None:
    with pytest.raises(ValidationError, match="must stay inside the job's output directory"):
        StreamJobSpec.model_validate(spec_with(sink={"type": "log", "path": path}))
    spec = StreamJobSpec.model_validate(spec_with(sink={"type": "log", "path": "out/a.jsonl"}))
    assert spec.sink.type == "log"


def test_a_key_given_twice_is_refused_with_its_line() -> None:
    with pytest.raises(
        DuplicateKeyError, match=r"key 'keyGroups' is given twice \(again on line 3\)"
    ):
        parse_yaml("spec:\n  keyGroups: 2\n  keyGroups: 64\n")
    assert parse_yaml("a: {b: 1}\nc: [1, 2]\n") == {"a": {"b": 1}, "c": [1, 2]}


def test_finding_the_job_module_runs_none_of_its_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    package = tmp_path / "pkg_with_init"
    package.mkdir()
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (package / "jobs.py").write_text(f"open({str(marker)!r}, 'w').close()\njob = None\n")
    find_job_module("pkg_with_init.jobs:job", [str(tmp_path)])
    assert not marker.exists()
    with pytest.raises(JobLoadError, match=r"No module named 'pkg_with_init\.nope'"):
        find_job_module("pkg_with_init.nope:job", [str(tmp_path)])
    with pytest.raises(JobLoadError, match="No module named 'nowhere_at_all'"):
        find_job_module("nowhere_at_all:job", [str(tmp_path)])
