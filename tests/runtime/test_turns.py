"""Turns on the event loop: control work waits about one batch however many key groups
are busy, nobody starves, and a paused (just claimed) key group does not wait."""

from __future__ import annotations

import asyncio
import math

from keyshift.runtime.turns import HANDOFF_PRIORITY_SECONDS, Turns

BATCH = 0.015
"""Seconds each simulated batch reports (the budget is 0.02: two batches per iteration)."""


async def run_busy(
    turns: Turns, key_groups: int, log: list[int], stop: asyncio.Event, *, remote: bool = False
) -> None:
    """Key groups that always have records: a batch whenever they may. ``remote``: each
    batch first loads its state from the store, its records processed when the reply
    comes (an iteration later)."""

    async def runner(kg: int) -> None:
        while not stop.is_set():
            if turns.may_work(kg):
                if remote:
                    await asyncio.sleep(0)  # the load's round trip
                log.append(kg)
                turns.worked(kg, BATCH)
            await asyncio.sleep(0)

    await asyncio.gather(*(runner(kg) for kg in range(key_groups)))


async def batches_before_control(turns: Turns, key_groups: int, *, remote: bool = False) -> int:
    """How many batches run between a control callback's scheduling (as a socket's
    reply is, after the loop's poll) and its run, with every key group busy."""
    log: list[int] = []
    stop = asyncio.Event()
    busy = asyncio.create_task(run_busy(turns, key_groups, log, stop, remote=remote))
    for _ in range(50):  # let the turns settle into their steady order
        await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    ran: asyncio.Future[int] = loop.create_future()
    at_schedule = len(log)
    loop.call_soon(lambda: ran.set_result(len(log)))
    at_run = await ran
    stop.set()
    await busy
    return at_run - at_schedule


async def test_control_work_waits_about_one_batch_however_many_key_groups() -> None:
    with_turns = await batches_before_control(Turns(), 16)
    assert with_turns <= 2
    # without a budget it waits for every key group's batch (what Turns is for)
    assert await batches_before_control(Turns(budget=math.inf), 16) >= 15


async def test_batches_that_wait_for_the_store_count_where_they_start() -> None:
    """With a remote store a batch's records are processed an iteration after it starts
    (its state's load): charged only then, every key group's batch would start in one
    iteration and be processed in the next, all of them before the control work."""
    assert await batches_before_control(Turns(), 16, remote=True) <= 3
    assert await batches_before_control(Turns(), 16) <= 2  # a local store: as before
    turns = Turns()
    turns.handoff_started(3)
    assert await batches_before_control(turns, 16, remote=True) <= 2


async def test_every_busy_key_group_gets_its_turn_in_order() -> None:
    turns = Turns()
    log: list[int] = []
    stop = asyncio.Event()
    busy = asyncio.create_task(run_busy(turns, 6, log, stop))
    for _ in range(200):
        await asyncio.sleep(0)
    stop.set()
    await busy
    steady = log[12:]
    counts = [steady.count(kg) for kg in range(6)]
    assert min(counts) > 0 and max(counts) - min(counts) <= 2, counts
    # no key group works twice while another waits: within any 6 batches, all 6 appear
    windows = [set(steady[i : i + 6]) for i in range(0, len(steady) - 6, 6)]
    assert all(len(w) == 6 for w in windows), windows
    assert turns.given_up > 0


async def test_a_paused_key_group_does_not_wait_its_turn() -> None:
    turns = Turns()
    assert turns.may_work(0)
    turns.worked(0, 1.0)  # this iteration's budget is spent
    turns._tick_pending = True  # and no new one yet
    assert not turns.may_work(1)
    assert turns.may_work(2, urgent=True)  # just claimed: its handoff goes first
    turns.leave(1)  # idle now: it holds nobody up
    assert not turns._waiting


async def test_a_handoff_shortens_the_slices_until_it_ends() -> None:
    """While a key group is released or claimed here, every iteration runs one short batch,
    so each step of the handoff (a store reply) waits one batch, not two."""
    turns = Turns()
    assert turns.batch_seconds(0.02) == 0.02
    assert await batches_before_control(turns, 16) <= 2
    turns.handoff_started(3)
    assert turns.batch_seconds(0.02) == 0.005
    assert await batches_before_control(turns, 16) <= 1
    turns.handoff_started(3)  # the same handoff asked again: still one
    turns.handoff_finished(3)
    assert not turns.handoff_under_way()
    assert turns.batch_seconds(0.02) == 0.02


def test_a_handoff_that_lasts_stops_counting() -> None:
    """An old owner slow to release does not keep this worker on short slices."""
    now = [1000.0]
    turns = Turns(clock=lambda: now[0])
    turns.handoff_started(7)
    now[0] += HANDOFF_PRIORITY_SECONDS - 0.1
    assert turns.handoff_under_way()
    now[0] += 0.2
    assert not turns.handoff_under_way()
    assert turns.batch_seconds(0.02) == 0.02
