"""benchmarks.compare drives benchmarks.rescale for keyshift's rows: with the arguments
rescale reads (a flag added there and not here broke the comparison once)."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from benchmarks import compare, rescale
from keyshift.api.spec import StreamJob


def test_keyshift_rows_get_a_valid_rescale_manifest(tmp_path: Path) -> None:
    args = argparse.Namespace(repeats=1, rate=2000.0)
    run = compare.keyshift_args(args, 1000, failover=True)
    path = tmp_path / "job.yaml"
    rescale.write_manifest(path, run, 1000, "out.jsonl")
    job = StreamJob.model_validate(yaml.safe_load(path.read_text()))
    assert job.spec.key_groups == compare.KEY_GROUPS
    assert job.spec.job == "benchmarks.jobs:rescale_job"  # compare measures the light job
    assert job.spec.standby_workers == 0
