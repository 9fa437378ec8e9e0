"""The StreamJob manifest and the worker's environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from keyshift.runtime.config import StreamJob, load_manifest, settings_from

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
