"""The ``keyshift store`` commands, run as a user runs them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from keyshift.store import open_store
from keyshift.store.server import LocalServer
from tests.support import WorkerProcess, counter_manifest, deploy, wait_for, write_manifest


def keyshift(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keyshift.controller.cli", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_selfcheck_passes_on_an_embedded_store() -> None:
    result = keyshift("store", "selfcheck")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout
    assert "FAILED" not in result.stdout


async def test_list_export_delete_import(
    standalone_server: LocalServer, job: str, tmp_path: Path
) -> None:
    store = open_store(standalone_server.url)
    await store.init_job(job, 2)
    c = await store.claim(job, 1, "w3")
    await store.commit(
        job, 1, epoch=c.epoch, token=c.token, seq=0, puts={"n": {b"a": b"1"}}, position=7
    )
    url = ["--url", standalone_server.url]

    listed = keyshift("store", "list", job, "--json", *url)
    assert listed.returncode == 0, listed.stderr
    groups = json.loads(listed.stdout)["key_groups"]
    assert [(g["key_group"], g["owner"], g["position"], g["entries"]) for g in groups] == [
        (0, "", 0, 0),
        (1, "w3", 7, 1),
    ]

    savepoint = tmp_path / "job.savepoint"
    assert keyshift("store", "export", job, str(savepoint), *url).returncode == 0
    refused = keyshift("store", "delete", job, *url)
    assert refused.returncode == 2 and "--yes" in refused.stdout
    assert await store.job_info(job) is not None
    assert keyshift("store", "delete", job, "--yes", *url).returncode == 0
    assert await store.job_info(job) is None
    assert keyshift("store", "import", job, str(savepoint), *url).returncode == 0
    assert await store.get_many(job, 1, "n", [b"a"]) == {b"a": b"1"}
    assert (await store.key_group_info(job, 1)).position == 7
    await store.close()


def test_a_url_with_a_password_is_refused() -> None:
    result = keyshift("store", "list", "x", "--url", "redis://:hunter2@127.0.0.1:6379")
    assert result.returncode != 0
    assert "must not carry credentials" in result.stderr


async def test_delete_refuses_a_running_job_until_it_is_stopped(
    standalone_server: LocalServer, job: str, tmp_path: Path, spawn: Callable[..., WorkerProcess]
) -> None:
    """A running worker would start the job again from offset 0 on the deleted state."""
    url = standalone_server.url
    source = {"seed": 1, "keys": 100, "limit": 1000}
    manifest = write_manifest(
        tmp_path, counter_manifest(job, key_groups=2, parallelism=1, store_url=url, source=source)
    )
    store = open_store(url)
    try:
        _, (worker,) = await deploy(store, job, 2, 1, manifest, url, spawn)

        async def alive() -> bool:
            return f"{job}-worker-0" in await store.alive_workers(job)

        await wait_for(alive, 30, "the worker's first heartbeat")
        refused = await asyncio.to_thread(keyshift, "store", "delete", job, "--yes", "--url", url)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "is running" in refused.stdout and f"{job}-worker-0" in refused.stdout
        assert await store.job_info(job) is not None
        worker.stop()  # SIGTERM: a clean stop forgets its heartbeat
        deleted = await asyncio.to_thread(keyshift, "store", "delete", job, "--yes", "--url", url)
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        assert await store.job_info(job) is None
    finally:
        await store.close()
