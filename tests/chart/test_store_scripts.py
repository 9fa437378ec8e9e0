"""The managed store's start and probe scripts (store-config.yaml), run for real.

The rendered ConfigMap's ``start.sh``, ``cli.sh`` and ``valkey.conf`` run against a
local server binary with the container's paths moved into a temporary directory
(``valkey-server``/``valkey-cli`` are Debian's redis-server/redis-cli). Checked as a
user would: the password (one with a space, quotes, a backslash and a dollar sign)
opens the store and is in no process's argv; with TLS the chart's own certificate
serves, and its CA (in the store's Secret) verifies it for the store's DNS names.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from keyshift.store import open_store
from keyshift.store.server import ServerStartError, free_port, stop_process, wait_until
from tests.chart.render import NAMESPACE, one, render

Obj = dict[str, Any]

PASSWORD = "a p\"ass\\word'$HOME`x`"
"""What a shell or valkey.conf would mangle if it were not quoted right."""


def _binary(*names: str) -> str:
    explicit = os.environ.get("KEYSHIFT_STORE_SERVER") if "redis-server" in names else None
    for found in (explicit, *(shutil.which(n) for n in names)):
        if found:
            return found
    pytest.skip(f"none of {names} is installed")


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    port: int
    root: Path
    tls: Obj | None
    """The rendered store Secrets (``tls``: the certificate's, ``store``: the password's)."""

    def client(self, password: str | None = PASSWORD) -> redis.Redis:
        extra: Obj = {}
        if self.tls is not None:
            extra = {"ssl": True, "ssl_ca_certs": str(self.root / "run-valkey-tls" / "ca.crt")}
        # no retries: a refused password is an answer, not an outage
        return redis.Redis(
            host="127.0.0.1", port=self.port, password=password, socket_timeout=5,
            retry=Retry(NoBackoff(), 0), **extra,
        )  # fmt: skip


def _store_files(values: Obj) -> tuple[Obj, list[Obj]]:
    objects = render(values)
    return one(objects, "ConfigMap", "keyshift-valkey")["data"], objects


def _local(text: str, root: Path) -> str:
    """The container's paths, moved under ``root`` (in one pass: ``root`` is in /tmp)."""
    return re.sub(
        r"/run/secrets/valkey/|/run/valkey/tls/|/etc/valkey/|/tmp/|(?<= )/data\b",
        lambda m: f"{root}/{m[0].strip('/').replace('/', '-')}" + ("/" if m[0][-1] == "/" else ""),
        text,
    )


def _start(tmp_path: Path, values: Obj, password: str = PASSWORD) -> Started:
    files, objects = _store_files(values)
    root = tmp_path
    for d in ("run-secrets-valkey", "run-valkey-tls", "etc-valkey", "tmp", "data", "bin"):
        (root / d).mkdir()
    (root / "run-secrets-valkey" / "password").write_text(password)
    tls = None
    if values["stateStore"]["managed"].get("tls", {}).get("enabled"):
        secret = one(objects, "Secret", "keyshift-valkey-tls")
        for key, value in secret["data"].items():
            (root / "run-valkey-tls" / key).write_bytes(base64.b64decode(value))
        tls = {"tls": secret, "store": one(objects, "Secret", "keyshift-store")}
    port = free_port()
    # the container listens on 6379 of its own address; here: a free port of 127.0.0.1
    conf = _local(files["valkey.conf"], root).replace(" 6379\n", f" {port}\n")
    conf += f"bind 127.0.0.1\nlogfile {root}/server.log\n"
    if "cluster-enabled yes" in conf:
        conf += f"cluster-port {free_port()}\n"
    (root / "etc-valkey" / "valkey.conf").write_text(conf)
    for script in ("start.sh", "cli.sh"):
        (root / "etc-valkey" / script).write_text(_local(files[script], root))
    # valkey-server: the real server, its arguments kept first (it rewrites its argv
    # in /proc to a process title)
    wrapper = root / "bin" / "valkey-server"
    wrapper.write_text(
        f'printf "%s\\0" "$@" > {root}/argv\nexec {_binary("redis-server", "valkey-server")} "$@"\n'
    )
    wrapper.chmod(0o755)
    (root / "bin" / "valkey-cli").symlink_to(_binary("redis-cli", "valkey-cli"))
    env = {"PATH": f"{root}/bin:/usr/bin:/bin", "POD_NAME": "keyshift-valkey-0"}
    process = subprocess.Popen(
        ["sh", str(root / "etc-valkey" / "start.sh")],
        env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    return Started(process, port, root, tls)


@pytest.fixture
def started() -> Iterator[list[Started]]:
    servers: list[Started] = []
    yield servers
    for s in servers:
        stop_process(s.process)


def _running(tmp_path: Path, values: Obj, started: list[Started]) -> Started:
    server = _start(tmp_path, values)
    started.append(server)

    def answers() -> bool:
        if server.process.poll() is not None:
            out = server.process.stdout.read().decode() if server.process.stdout else ""
            log = server.root / "server.log"
            out += log.read_text() if log.exists() else ""
            if "TLS" in out and "support" in out:
                pytest.skip(f"the server binary has no TLS: {out[-300:]}")
            raise ServerStartError(f"start.sh exited {server.process.returncode}: {out}")
        with server.client() as c:
            return bool(c.ping())

    wait_until(answers, 20, "the store started by start.sh")
    return server


MODES: dict[str, Obj] = {
    "standalone": {"stateStore": {"managed": {}}},
    "standalone TLS": {"stateStore": {"managed": {"tls": {"enabled": True}}}},
    "cluster TLS": {"stateStore": {"managed": {"mode": "cluster", "tls": {"enabled": True}}}},
}


@pytest.mark.parametrize("values", MODES.values(), ids=MODES.keys())
def test_start_sh_sets_the_password_without_showing_it(
    values: Obj, tmp_path: Path, started: list[Started]
) -> None:
    server = _running(tmp_path, values, started)
    argv = (server.root / "argv").read_bytes().split(b"\0")
    assert argv[:3] == [str(server.root / "etc-valkey" / "valkey.conf").encode(), b"--include",
                        str(server.root / "tmp" / "auth.conf").encode()]  # fmt: skip
    assert not any(PASSWORD.encode() in arg for arg in argv)
    # the shell exec'd the server: its pid is the server's
    assert PASSWORD.encode() not in Path(f"/proc/{server.process.pid}/cmdline").read_bytes()
    assert PASSWORD.encode() not in Path(f"/proc/{server.process.pid}/environ").read_bytes()
    auth = server.root / "tmp" / "auth.conf"
    assert auth.stat().st_mode & 0o777 == 0o600

    with server.client() as c:
        assert c.echo("hello") == b"hello"
        assert c.config_get("protected-mode") == {"protected-mode": "yes"}
        assert c.config_get("masterauth")["masterauth"] == PASSWORD
    with server.client(password=None) as c, pytest.raises(redis.AuthenticationError):
        c.echo("hello")
    with server.client(password=PASSWORD[:-1]) as c, pytest.raises(redis.AuthenticationError):
        c.ping()

    # the probes' and the cluster-init Job's valkey-cli: authenticated, TLS verified
    probe = subprocess.run(
        ["sh", str(server.root / "etc-valkey" / "cli.sh"), "-h", "127.0.0.1",
         "-p", str(server.port), "ping"],
        env={"PATH": f"{server.root}/bin:/usr/bin:/bin"}, capture_output=True, timeout=10,
    )  # fmt: skip
    assert probe.stdout.strip() == b"PONG", probe


def test_start_sh_in_cluster_mode_announces_the_pods_dns_name(
    tmp_path: Path, started: list[Started]
) -> None:
    server = _running(tmp_path, MODES["cluster TLS"], started)
    with server.client() as c:
        hostname = c.config_get("cluster-announce-hostname")["cluster-announce-hostname"]
        assert hostname == f"keyshift-valkey-0.keyshift-valkey-headless.{NAMESPACE}.svc"
        assert c.config_get("tls-cluster") == {"tls-cluster": "yes"}
        assert c.config_get("tls-replication") == {"tls-replication": "yes"}
        assert c.config_get("port") == {"port": "0"}  # nothing without TLS


async def test_the_chart_made_certificate_serves_and_the_store_secret_verifies_it(
    tmp_path: Path, started: list[Started]
) -> None:
    server = _running(tmp_path, MODES["cluster TLS"], started)
    assert server.tls is not None
    ca = base64.b64decode(server.tls["store"]["data"]["ca.crt"]).decode()
    assert ca == base64.b64decode(server.tls["tls"]["data"]["ca.crt"]).decode()
    # the operator's way: the Secret's ca.crt as text; the server by address
    store = open_store(f"rediss://127.0.0.1:{server.port}", password=PASSWORD, ca_data=ca)
    try:
        await store.ping()
    finally:
        await store.close()

    # the names StreamJobs and the cluster client use: the certificate must be theirs
    context = ssl.create_default_context(cadata=ca)
    valid = [
        f"keyshift-valkey.{NAMESPACE}.svc",
        f"keyshift-valkey.{NAMESPACE}.svc.cluster.local",
        f"keyshift-valkey-3.keyshift-valkey-headless.{NAMESPACE}.svc",
        f"keyshift-valkey-0.keyshift-valkey-headless.{NAMESPACE}.svc.cluster.local",
    ]
    for name in valid:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            context.wrap_socket(sock, server_hostname=name).close()
    for name in ("keyshift-valkey.other.svc", "evil.example"):
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock,
            pytest.raises(ssl.SSLCertVerificationError, match="mismatch"),
        ):
            context.wrap_socket(sock, server_hostname=name)


@pytest.mark.parametrize(
    ("password", "error"),
    [("two\nlines", "must be one line"), ("\n", "empty password")],
)
def test_start_sh_refuses_a_password_valkey_conf_cannot_hold(
    password: str, error: str, tmp_path: Path
) -> None:
    server = _start(tmp_path, MODES["standalone"], password=password)
    out, _ = server.process.communicate(timeout=10)
    assert server.process.returncode == 1
    assert error in out.decode()
    assert not (server.root / "tmp" / "auth.conf").exists()


def test_a_trailing_newline_of_the_secret_is_not_part_of_the_password(
    tmp_path: Path, started: list[Started]
) -> None:
    """As ``kubectl create secret --from-file`` of an echoed file makes it; the workers
    strip it too."""
    server = _start(tmp_path, MODES["standalone"], password=PASSWORD + "\n")
    started.append(server)
    wait_until(lambda: server.client().ping(), 20, "the store")
