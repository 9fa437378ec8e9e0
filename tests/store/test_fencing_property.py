"""Property: interleaved claims, commits and releases from several simulated
workers never let two writers commit under one epoch, and the stored state is
exactly the sum of the accepted commits."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyshift.store import Claim, Fenced, open_store

WORKERS = 4
OPS = st.sampled_from(["claim", "commit", "commit", "commit", "release"])
# rounds of operations, at most one per worker; the operations of a round run concurrently
ROUNDS = st.lists(
    st.dictionaries(st.integers(0, WORKERS - 1), OPS, min_size=1),
    min_size=1,
    max_size=25,
)


@dataclass
class SimulatedWorker:
    name: str
    claim: Claim | None = None
    seq: int = 0
    position: int = 0
    counter: int = 0
    """The worker's view of the state value it increments on every commit."""


async def _run(url: str, rounds: list[dict[int, str]]) -> None:
    store = open_store(url, retry_seconds=5)
    job = f"p-{secrets.token_hex(4)}"
    workers = [SimulatedWorker(f"w{i}") for i in range(WORKERS)]
    accepted: list[tuple[int, str]] = []  # (epoch, writer) of each accepted commit
    committed_counter = 0
    committed_position = 0

    async def step(w: SimulatedWorker, op: str, generation: int) -> None:
        """``op`` on the assignment of ``generation`` (each round is a newer one)."""
        nonlocal committed_counter, committed_position
        if op == "claim":
            w.claim = await store.claim(job, 0, w.name, generation=generation)
            w.seq, w.position = w.claim.seq, w.claim.position
            got = await store.get_many(job, 0, "s", [b"counter"])
            w.counter = int(got.get(b"counter", b"0"))
        elif op == "commit" and w.claim is not None:
            value, position = w.counter + 1, w.position + 1
            try:
                result = await store.commit(
                    job, 0, epoch=w.claim.epoch, token=w.claim.token, seq=w.seq,
                    puts={"s": {b"counter": str(value).encode()}}, position=position,
                )  # fmt: skip
            except Fenced:
                w.claim = None  # a fenced worker drops its view, as the runtime does
                return
            accepted.append((w.claim.epoch, w.name))
            w.seq, w.counter, w.position = result.seq, value, position
            committed_counter, committed_position = value, position
        elif op == "release" and w.claim is not None:
            with contextlib.suppress(Fenced):
                await store.release(
                    job, 0, epoch=w.claim.epoch, token=w.claim.token, generation=generation
                )
            w.claim = None

    try:
        for generation, ops in enumerate(rounds, start=1):
            await asyncio.gather(*(step(workers[i], op, generation) for i, op in ops.items()))
        writers_by_epoch: dict[int, set[str]] = {}
        for epoch, writer in accepted:
            writers_by_epoch.setdefault(epoch, set()).add(writer)
        assert all(len(ws) == 1 for ws in writers_by_epoch.values()), writers_by_epoch
        # every accepted commit built on the previous accepted one: no lost update
        assert committed_counter == len(accepted)
        info = await store.key_group_info(job, 0)
        stored = await store.get_many(job, 0, "s", [b"counter"])
        assert int(stored.get(b"counter", b"0")) == committed_counter
        assert (info.seq, info.position) == (len(accepted), committed_position)
    finally:
        await store.delete_job(job)
        await store.close()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(rounds=ROUNDS)
def test_no_two_writers_commit_under_one_epoch(
    store_url: str, rounds: list[dict[int, str]]
) -> None:
    asyncio.run(_run(store_url, rounds))
