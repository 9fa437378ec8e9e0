"""What a user sees when a command cannot do its job: one clear line and a non-zero
exit, never a traceback (issue 20, section 3). Every command runs as a user runs it."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from keyshift.controller.local.view import log_line
from keyshift.store.server import free_port

REPO = Path(__file__).resolve().parents[3]
COUNTER = REPO / "examples" / "counter.yaml"
NO_CLUSTER = {"KUBECONFIG": "/nonexistent/kubeconfig", "KUBERNETES_SERVICE_HOST": ""}


def run(*args: str, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 90) -> subprocess.CompletedProcess[str]:  # fmt: skip
    import os

    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def keyshift(*args: str, cwd: Path, env: dict[str, str] | None = None,
             timeout: float = 90) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return run("-m", "keyshift.controller.cli", *args, cwd=cwd, env=env, timeout=timeout)


def one_clear_line(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "Traceback" not in out, out
    for text in expected:
        assert text in out, out


@pytest.fixture
def http_port() -> Iterator[int]:
    """An HTTP server: the wrong kind of server for a store URL."""

    class Hello(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = HTTPServer(("127.0.0.1", free_port()), Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_run_against_a_server_that_is_not_a_store(tmp_path: Path, http_port: int) -> None:
    result = keyshift("run", str(COUNTER), "--store-url", f"redis://127.0.0.1:{http_port}",
                      cwd=tmp_path)  # fmt: skip
    one_clear_line(result, "does not speak the Redis protocol")


def test_explain_and_operator_without_a_cluster(tmp_path: Path) -> None:
    for args in (("explain", "counter", "-n", "default"), ("operator", "-n", "default")):
        result = keyshift(*args, cwd=tmp_path, env=NO_CLUSTER)
        one_clear_line(result, "no Kubernetes credentials", "KUBECONFIG")


def test_explain_of_a_job_that_never_ran(tmp_path: Path) -> None:
    result = keyshift("explain", "nosuchjob", cwd=tmp_path)
    one_clear_line(result, "no job 'nosuchjob' has run")


def test_a_worker_without_a_store_says_so(tmp_path: Path) -> None:
    closed = free_port()
    result = run(
        "-m", "keyshift.runtime", "--manifest", str(COUNTER), "--ordinal", "0",
        "--store-url", f"redis://127.0.0.1:{closed}",
        cwd=REPO, env={"KEYSHIFT_STORE_RETRY_SECONDS": "1"},
    )  # fmt: skip
    one_clear_line(result, "state store unreachable")
    assert len(result.stderr.strip().splitlines()) <= 4, result.stderr  # no 81-line dump


def test_a_worker_whose_http_port_is_taken_names_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(
            "-m", "keyshift.runtime", "--manifest", str(COUNTER), "--ordinal", "0",
            "--store-url", "redis://127.0.0.1:1", "--http-port", str(port), cwd=REPO,
        )  # fmt: skip
    one_clear_line(result, f"127.0.0.1:{port}", "in use")


def test_version_and_help(tmp_path: Path) -> None:
    version = keyshift("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("keyshift 0."), version
    scale = keyshift("scale", "--help", cwd=tmp_path)
    assert "the number of workers to run" in scale.stdout
    assert "seconds to wait" in scale.stdout


def test_plain_log_lines_carry_a_timestamp() -> None:
    doc = {
        "job": "j", "at": 1_700_000_000.0, "parallelism": 1, "desired_parallelism": 1,
        "generation": 1, "workers": [], "rates": {"input": 1.0, "processed": 1.0},
        "lag": 0, "cache_hit_ratio": None, "rescale_in_progress": None,
    }  # fmt: skip
    line = log_line(doc)
    assert line.split(" job=")[0].count(":") == 2 and line.startswith("2023-11-1"), line
