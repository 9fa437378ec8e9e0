"""A TLS store (``rediss://``, ``rediss+cluster://``) whose certificate its own CA signed,
as the chart's managed Valkey with ``tls.enabled`` has: the client verifies the server
against the CA it is given (``ca_file`` for the workers, ``ca_data`` for the operator),
and refuses a server that CA did not sign.

Real servers on loopback with TLS only (``--port 0 --tls-port``), clients not asked for
certificates (``--tls-auth-clients no``: they authenticate with the password), and a
CA and server certificate made here with the ``openssl`` command. The server binary
must be built with TLS (Debian's redis-server is; the PyPI Valkey is not): the first of
``$KEYSHIFT_STORE_SERVER``, ``redis-server``, ``valkey-server`` that starts with TLS.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterUnreachableError
from redis.retry import Retry

from keyshift.store import RedisStateStore, StoreUnavailable, open_store
from keyshift.store.server import (
    LocalCluster,
    LocalServer,
    ServerStartError,
    find_server_binary,
    wait_until,
)

PASSWORD = "tls-store-password"


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path
    other_ca: Path
    """A CA that signed nothing here: a client trusting only it must refuse the server."""


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", key, "-out", cert, cwd=directory)  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    d = tmp_path_factory.mktemp("pki")
    ca, ca_key = _ca(d, "store-ca")
    other_ca, _ = _ca(d, "other-ca")
    key, csr, cert = d / "server.key", d / "server.csr", d / "server.crt"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=valkey",
             "-keyout", key, "-out", csr, cwd=d)  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
             "-days", "2", "-extfile", "san.ext", "-out", cert, cwd=d)  # fmt: skip
    return Pki(ca=ca, cert=cert, key=key, other_ca=other_ca)


@dataclass
class TLSServer(LocalServer):
    """A LocalServer that listens with TLS only, on ``port``."""

    pki: Pki | None = None

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        assert self.pki is not None
        cmd = super().command()
        cmd[cmd.index("--port") + 1] = "0"
        cmd += [
            "--tls-port", str(self.port),
            "--tls-cert-file", str(self.pki.cert),
            "--tls-key-file", str(self.pki.key),
            "--tls-ca-cert-file", str(self.pki.ca),
            "--tls-auth-clients", "no",
        ]  # fmt: skip
        if self.cluster:
            cmd += ["--tls-cluster", "yes", "--tls-replication", "yes"]
        return cmd

    def client(self) -> redis.Redis:
        assert self.pki is not None
        return redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5,
            ssl=True, ssl_ca_certs=str(self.pki.ca),
        )  # fmt: skip


def _tls_binaries() -> list[str]:
    found = [
        os.environ.get("KEYSHIFT_STORE_SERVER"),
        shutil.which("redis-server"),
        shutil.which("valkey-server"),
        find_server_binary(),
    ]
    return list(dict.fromkeys(b for b in found if b))


@pytest.fixture(scope="module")
def tls_binary(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The first server binary that starts with TLS."""
    for binary in _tls_binaries():
        probe = TLSServer(tmp_path_factory.mktemp("probe"), binary=binary, pki=pki)
        try:
            probe.start()
        except ServerStartError as exc:
            if "TLS" in str(exc):
                continue  # built without TLS
            raise
        probe.stop()
        return binary
    pytest.skip(f"no server binary with TLS among {_tls_binaries()}")


@pytest.fixture(scope="module")
def tls_server(
    tls_binary: str, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TLSServer]:
    server = TLSServer(
        tmp_path_factory.mktemp("tls"), binary=tls_binary, pki=pki, password=PASSWORD
    )
    server.start()
    yield server
    server.stop()


@dataclass
class TLSCluster(LocalCluster):
    binary: str = ""
    pki: Pki | None = None
    nodes: list[LocalServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return "rediss+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:1])

    def start(self, timeout: float = 30.0) -> TLSCluster:
        self.nodes = [
            TLSServer(self.directory / f"node{i}", cluster=True, password=self.password,
                      binary=self.binary, pki=self.pki).start()
            for i in range(self.masters)
        ]  # fmt: skip
        try:
            self._form(timeout)
        except Exception:
            self.stop()
            raise
        return self


@pytest.fixture(scope="module")
def tls_cluster(
    tls_binary: str, pki: Pki, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TLSCluster]:
    cluster = TLSCluster(
        tmp_path_factory.mktemp("tls-cluster"), masters=3, password=PASSWORD,
        binary=tls_binary, pki=pki,
    ).start()  # fmt: skip
    yield cluster
    cluster.stop()


async def _counts(store: RedisStateStore, job: str, key_groups: int) -> list[bytes | None]:
    """Claim and commit a counter in each key group, read it back: real store calls."""
    await store.ping()
    out: list[bytes | None] = []
    for kg in range(key_groups):
        claim = await store.claim(job, kg, "worker-0")
        await store.commit(
            job, kg, epoch=claim.epoch, token=claim.token, seq=claim.seq,
            puts={"count": {b"n": b"1"}}, position=10,
        )  # fmt: skip
        out.append((await store.get_many(job, kg, "count", [b"n"])).get(b"n"))
    return out


@pytest.fixture(params=["ca_file", "ca_data"])
def trusting(request: pytest.FixtureRequest, pki: Pki) -> dict[str, Any]:
    """The CA as the worker gives it (a file) and as the operator does (the Secret's text)."""
    if request.param == "ca_file":
        return {"ca_file": str(pki.ca)}
    return {"ca_data": pki.ca.read_text()}


async def test_a_standalone_tls_store_works_with_its_ca(
    tls_server: TLSServer, trusting: dict[str, Any], job: str
) -> None:
    store = open_store(tls_server.url, password=PASSWORD, retry_seconds=5, **trusting)
    try:
        assert await _counts(store, job, 2) == [b"1", b"1"]
    finally:
        await store.close()


async def test_a_tls_cluster_works_with_its_ca_on_every_node(
    tls_cluster: TLSCluster, trusting: dict[str, Any], job: str
) -> None:
    """The seed is one node: the others, found through it, are reached with the CA too."""
    store = open_store(tls_cluster.url, password=PASSWORD, retry_seconds=5, **trusting)
    try:
        # 16 key groups spread over the 3 masters' slots
        assert await _counts(store, job, 16) == [b"1"] * 16
    finally:
        await store.close()
    with tls_cluster.nodes[0].client() as c:
        assert c.execute_command("CLUSTER", "INFO").decode().count("cluster_state:ok") == 1


# a cluster none of whose seeds can be reached at the first call: redis-py's
# RedisClusterUnreachableError, not a ConnectionError, so the store does not retry it
REFUSED = {"standalone": StoreUnavailable, "cluster": RedisClusterUnreachableError}


@pytest.mark.parametrize("kind", ["standalone", "cluster"])
async def test_a_server_the_given_ca_did_not_sign_is_refused(
    kind: str, tls_server: TLSServer, tls_cluster: TLSCluster, pki: Pki
) -> None:
    address = tls_server.url if kind == "standalone" else tls_cluster.url
    trusts: list[dict[str, Any]] = [{"ca_file": str(pki.other_ca)}, {}]
    for trust in trusts:  # another CA; the system's CAs
        store = open_store(address, password=PASSWORD, retry_seconds=0.3, **trust)
        try:
            with pytest.raises(REFUSED[kind], match="certificate verify failed"):
                await store.ping()
        finally:
            await store.close()


async def test_the_ca_is_not_sent_to_a_plain_store(pki: Pki) -> None:
    """redis:// has no TLS: a CA given anyway (the worker gets one whenever the Secret
    has it) changes nothing."""
    store = open_store("redis://127.0.0.1:1", ca_file=str(pki.ca), ca_data="x")
    try:
        kwargs = store._client.connection_pool.connection_kwargs
        assert not any(k.startswith("ssl") for k in kwargs)
    finally:
        await store.close()


def test_the_tls_server_refuses_plain_connections(tls_server: TLSServer) -> None:
    """The store listens with TLS only: nothing answers without it."""
    plain = redis.Redis(
        host="127.0.0.1", port=tls_server.port, password=PASSWORD, socket_timeout=2,
        retry=Retry(NoBackoff(), 0),
    )  # fmt: skip
    with plain, pytest.raises(redis.exceptions.ConnectionError):
        plain.ping()
    wait_until(lambda: tls_server.client().ping(), 5, "the TLS server")


async def test_the_store_commands_take_the_ca(tls_server: TLSServer, pki: Pki, job: str) -> None:
    """``keyshift store`` against the TLS store, as an operator of the cluster runs it
    (``kubectl port-forward``, the CA from the store's Secret)."""
    store = open_store(tls_server.url, password=PASSWORD, ca_file=str(pki.ca))
    try:
        await store.init_job(job, 2)
    finally:
        await store.close()
    url = ["--url", tls_server.url]
    env = {**os.environ, "KEYSHIFT_STORE_PASSWORD": PASSWORD}
    env.pop("KEYSHIFT_STORE_CA_FILE", None)

    def keyshift(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "keyshift.controller.cli", "store", *args],
            capture_output=True, text=True, timeout=60, env={**env, **extra},
        )  # fmt: skip

    listed = keyshift("list", job, "--json", *url, "--ca-file", str(pki.ca))
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["key_groups"]) == 2
    from_env = keyshift("list", job, "--json", *url, KEYSHIFT_STORE_CA_FILE=str(pki.ca))
    assert from_env.returncode == 0, from_env.stderr
    refused = keyshift("list", job, *url, "--ca-file", str(pki.other_ca))
    assert refused.returncode != 0
    assert "certificate verify failed" in refused.stdout + refused.stderr
