"""The windowed examples end to end against a real Valkey, through a SIGKILL and a handoff:
their final results and late records equal the expectation computed from the generator.

The job is created with ``created_at`` minutes in the past, so the generator's event time
(its schedule) spans several one-minute windows or 30 s session gaps, most of the input
is a backlog processed at once, and the last ``TAIL`` seconds arrive live.

Reading at-least-once outputs: after a crash a worker replays from its last commit and
writes the outputs of the replayed records and timers again, identical (processing is
deterministic).  Every firing of a window holds at least as many records as the one
before (a late record updates it and fires it again), so the final result of a window is
the one with the most records, whatever the order of the files and the duplicates.  For
sessions, a session that fired and later merged into a larger one was superseded: the
final sessions are the emitted windows that no other emitted window of the user contains
(two final sessions never contain one another: the later one starts after the earlier).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest
import yaml

from examples import revenue_per_minute, sessions
from keyshift.api.spec import GeneratorSource, StreamJob
from keyshift.controller.core.assignment import plan_assignment
from keyshift.runtime.expected import (
    WindowResults,
    revenue_per_minute_results,
    sessions_results,
)
from keyshift.runtime.faults import ENV
from keyshift.runtime.timers import END_OF_TIME
from keyshift.store import Assignment, RedisStateStore, open_store
from keyshift.store.server import LocalServer
from tests.runtime.test_windows import final_sessions
from tests.support import REPO, WorkerProcess, wait_for, write_manifest

K = 4
TAIL = 15.0
"""Seconds of input still to come when the job starts: the handoff happens in them."""
OOO_MS = 2_000


def final_revenue(emitted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per product and minute the result with the most orders."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for v in emitted:
        k = (v["product"], v["window_start"])
        if k not in best or v["orders"] > best[k]["orders"]:
            best[k] = v
    return [v for _, v in sorted(best.items())]


@dataclass(frozen=True)
class Example:
    module: ModuleType
    manifest: str
    source: dict[str, Any]
    """Overrides of the example's source: a few minutes of event time for ``K`` key groups."""
    final: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
    expected: Callable[[GeneratorSource, int, float], WindowResults]
    """(source, key group, created_at) -> what the example must produce."""

    def __str__(self) -> str:
        return self.manifest


def _revenue(source: GeneratorSource, kg: int, created_at: float) -> WindowResults:
    assert source.limit is not None
    return revenue_per_minute_results(
        source, K, kg, source.limit, created_at=created_at, out_of_orderness_ms=OOO_MS,
        window_ms=revenue_per_minute.WINDOW_MS,
        lateness_ms=revenue_per_minute.ALLOWED_LATENESS_MS,
    )  # fmt: skip


def _sessions(source: GeneratorSource, kg: int, created_at: float) -> WindowResults:
    assert source.limit is not None
    return sessions_results(
        source, K, kg, source.limit, created_at=created_at, out_of_orderness_ms=OOO_MS,
        gap_ms=sessions.GAP_MS, lateness_ms=sessions.ALLOWED_LATENESS_MS,
    )  # fmt: skip


EXAMPLES = [
    Example(
        revenue_per_minute,
        "examples/revenue_per_minute.yaml",
        # 5 minutes of event time, 12 products, 16 orders per second
        {"keys": 12, "limit": 1200, "rate": {"recordsPerSecond": 16}},
        final_revenue,
        _revenue,
    ),
    Example(
        sessions,
        "examples/sessions.yaml",
        # 10 minutes of event time, 200 users with an action every 40 s on average
        {"keys": 200, "limit": 750, "rate": {"recordsPerSecond": 5}},
        final_sessions,
        _sessions,
    ),
]


def _manifest(example: Example, name: str, url: str, out: Path) -> dict[str, Any]:
    """The example's manifest, scaled to the test; outputs to ``out``-prefixed files (in
    the workers' output directory: ``out``'s folder)."""
    raw: dict[str, Any] = yaml.safe_load((REPO / example.manifest).read_text())
    spec = raw["spec"]
    raw["metadata"]["name"] = name
    spec.update(keyGroups=K, parallelism=1, checkpointInterval="100ms", batchSize=50)
    spec["source"].update(example.source)
    spec["time"]["outOfOrderness"] = f"{OOO_MS}ms"
    spec["sink"] = {"type": "log", "path": f"{out.name}.jsonl"}
    spec["sideOutputs"] = {"late": {"type": "log", "path": f"{out.name}-late.jsonl"}}
    spec["stateStore"] = {"url": url}
    return raw


def _read(paths: list[Path]) -> list[tuple[int, int, Any]]:
    """``(key group, offset, value)`` of every line of the files that exist."""
    return [(o["key_group"], o["offset"], o["value"]) for o in _lines(paths)]


def _lines(paths: list[Path]) -> list[dict[str, Any]]:
    decoder = msgspec.json.Decoder()
    return [
        decoder.decode(line)
        for path in paths
        if path.exists()
        for line in path.read_bytes().splitlines()
    ]


Identity = tuple[Any, ...]


def log_identity(line: dict[str, Any]) -> Identity:
    """The origin of a log sink line, as a consumer deduplicating would take it."""
    timer = line.get("timer")
    return (
        line["key_group"],
        line["offset"],
        line["index"],
        None if timer is None else msgspec.json.encode(timer),
    )


def assert_deduplicable(outputs: list[tuple[Identity, int, Any]]) -> None:
    """``(identity, key group, value)`` of every output written, duplicates included: a
    consumer that keeps one output per identity keeps every real output once.  Two
    outputs with one identity are the same output (equal values); an output written twice
    (a replay) was written with one identity both times.  The window results of one key
    group all differ (a later firing holds more records), so equal values are one
    output written again."""
    by_identity: dict[Identity, Any] = {}
    for identity, _, value in outputs:
        first = by_identity.setdefault(identity, value)
        assert first == value, f"two outputs share the identity {identity}: {first}, {value}"
    identities: dict[tuple[int, bytes], set[Identity]] = {}
    for identity, kg, value in outputs:
        identities.setdefault((kg, msgspec.json.encode(value)), set()).add(identity)
    repeated = {value: ids for value, ids in identities.items() if len(ids) > 1}
    assert not repeated, f"one output written with several identities: {repeated}"
    assert len(by_identity) < len(outputs), "no output written twice: no replay to check"


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
async def test_example_is_exact_through_a_sigkill_and_a_handoff(
    example: Example,
    standalone_server: LocalServer,
    tmp_path: Path,
    spawn: Callable[..., WorkerProcess],
) -> None:
    """Worker 0 runs all key groups and SIGKILLs itself right before its second commit
    after windows fired (their outputs flushed, its open windows' state not committed:
    replayed after the restart);
    then, with input still arriving and windows open, half the key groups move to worker
    1.  Each key group's final window results and late records are exactly expected, and
    the outputs' identities tell the replayed duplicates from the real outputs."""
    url = standalone_server.url
    name = f"t-{time.time_ns() % 10**8:08d}"
    raw = [_manifest(example, name, url, tmp_path / f"out-{i}") for i in range(2)]
    paths = []
    for i, m in enumerate(raw):  # one manifest per worker, for its own output files
        (tmp_path / f"m{i}").mkdir()
        paths.append(write_manifest(tmp_path / f"m{i}", m))
    source = StreamJob.model_validate(raw[0]).spec.generator
    assert isinstance(source, GeneratorSource) and source.limit is not None
    limit = source.limit
    rate = source.rate.records_per_second
    assert rate is not None
    span = limit * K / rate
    store: RedisStateStore = open_store(url, retry_seconds=10)
    try:
        info = await store.init_job(name, K, created_at=time.time() - span + TAIL)
        await store.publish_assignment(
            name, Assignment(1, 1, plan_assignment(K, 1)), expected_generation=0
        )
        w0 = spawn(paths[0], 0, url, http=False, env={ENV: "commit.before.fired@2"})
        spawn(paths[1], 1, url, http=False)
        backlog = limit - int(TAIL * rate / K)

        async def infos() -> list[Any]:
            return [await store.key_group_info(name, kg) for kg in range(K)]

        async def restarted_and_caught_up() -> bool:
            if w0.died_by_itself():
                w0.env[ENV] = ""
                w0.start()
            return w0.self_kills == 1 and all(i.position >= backlog for i in await infos())

        await wait_for(restarted_and_caught_up, 30, "the crash, the restart and the backlog")
        moving = [kg for kg, owner in enumerate(plan_assignment(K, 2)) if owner == 1]
        before = await infos()
        await store.publish_assignment(
            name, Assignment(2, 2, plan_assignment(K, 2)), expected_generation=1
        )
        assert all(before[kg].position < limit for kg in moving), "the handoff came too late"
        assert all(before[kg].timers > 0 for kg in moving), "no open window to hand off"

        async def done() -> bool:
            if w0.died_by_itself():
                raise AssertionError("worker 0 crashed twice")
            return all(
                i.position == limit and i.timers == 0 and i.watermark == END_OF_TIME
                for i in await infos()
            )

        await wait_for(done, 60, "every record and every window", interval=0.05)
        after = await infos()
        assert [after[kg].owner for kg in moving] == [f"{name}-worker-1"] * len(moving)
        assert w0.self_kills == 1
    finally:
        await store.delete_job(name)
        await store.close()

    lines = _lines([tmp_path / f"out-{i}.jsonl" for i in range(2)])
    assert_deduplicable([(log_identity(o), o["key_group"], o["value"]) for o in lines])
    outputs = _read([tmp_path / f"out-{i}.jsonl" for i in range(2)])
    late = _read([tmp_path / f"out-{i}-late.jsonl" for i in range(2)])
    total_late = total_results = 0
    for kg in range(K):
        expected = example.expected(source, kg, info.created_at)
        got = example.final([v for g, _, v in outputs if g == kg])
        assert got == expected.results, f"key group {kg}"
        late_offsets = sorted({offset for g, offset, _ in late if g == kg})
        assert late_offsets == expected.late, f"key group {kg}"
        total_late += len(expected.late)
        total_results += len(expected.results)
    assert total_late and len(outputs) > total_results, (
        "no late record or no late firing: the input proves less than the test says"
    )
