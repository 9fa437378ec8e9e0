"""The worker: runs the key groups the assignment gives it, and hands them off.

One asyncio task per owned key group (:class:`KeyGroupRunner`), plus:

- a watcher that follows the assignment record in the store;
- a reconcile loop (level-triggered: it compares what runs with what the
  latest assignment says) that asks runners of lost key groups to release,
  starts claimers for gained ones, and acks the generation once it runs it;
- a claimer per gained key group: it claims at once when the assignment forces
  it, when nobody owns the key group, or when the store names this very
  worker (a restart); otherwise the store registers it as the key group's successor
  and it waits for the previous owner's release: the release script claims the key
  group for it (with the claimer's token) and announces that claim on the job's
  (sharded) pub/sub channel, which the worker's listener hands to the claimer; a slow
  poll (``claim_poll_seconds``) covers a lost announcement (the claim, same token, is
  answered with the release's), and a new assignment wakes it too (a claim by force);
- a heartbeat that records the worker alive in the store (readiness; ``keyshift store
  delete`` refuses a job with live workers); when it reconnects, every runner asks
  the store at once whether it still holds its fence (the store may have lost commits).

A store error that no retry cures (corrupt metadata, a refused command) marks the key
group failed (``/healthz``, ``keyshift_key_groups_failed``), is logged once, and the
key group is tried again after a back-off (:mod:`keyshift.runtime.failures`).  A claim
on an assignment older than the key group's last claim or release is refused by the
store; the claimer waits for the newer assignment.

Key groups that stay never pause.  A fenced runner drops its cache; if the
store lost its commit (sequence mismatch, or an epoch behind the writer's) and
the assignment still gives the key group here, it is claimed again by force.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

from keyshift.api.spec import GeneratorSource, InvalidSpec
from keyshift.runtime.aio import wait_event
from keyshift.runtime.api import Job
from keyshift.runtime.cache import StateCache
from keyshift.runtime.collector import PauseRecorder
from keyshift.runtime.config import WorkerSettings
from keyshift.runtime.failures import FailedKeyGroups
from keyshift.runtime.faults import crash_point
from keyshift.runtime.handoff import stale_claims
from keyshift.runtime.keygroup import (
    CorruptStateError,
    Failure,
    KeyGroupRunner,
    PoisonRecordError,
    RunnerOutcome,
    RunnerResult,
    RuntimeDeps,
    StateLayoutError,
    UserFunctionError,
)
from keyshift.runtime.metrics import FailureMark, WorkerMetrics
from keyshift.runtime.sinks import DeadLetters, Outputs, Sink, open_sink
from keyshift.runtime.sources import Source, open_source
from keyshift.runtime.store import WorkerStore
from keyshift.store.protocol import (
    Assignment,
    Claim,
    Fenced,
    Released,
    StaleClaim,
    StillOwned,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
)

log = logging.getLogger("keyshift.runtime")

CLAIM_POLL_SECONDS = 1.0
"""The claimer's safety net: how often it looks at the store when no release notification
came (one may be lost: a dropped connection, a failover).  Notifications do the work."""
CLAIM_RETRY_SECONDS = 0.05
"""How soon a claimer tries again after the store was unreachable."""
RECONCILE_SECONDS = 0.25
HEARTBEAT_SECONDS = 2.0
WARM_CONNECTIONS = 8
"""Store connections opened at start (at most one per key group): a handoff's claims and
first loads run at once and would otherwise each open one, about 0.5 ms of CPU and a
round trip apiece on a worker busy with the rescale."""


class Worker:
    def __init__(
        self,
        settings: WorkerSettings,
        job: Job[Any],
        store: WorkerStore,
        *,
        sink: Sink | None = None,
        metrics: WorkerMetrics | None = None,
        assignment_poll_seconds: float = 0.5,
        claim_poll_seconds: float = CLAIM_POLL_SECONDS,
    ) -> None:
        self.settings = settings
        self.job = job
        self.store = store
        self.name = settings.worker_name
        self.ordinal = settings.ordinal
        self.job_name = settings.job
        self.sink = sink if sink is not None else open_sink(settings.spec.sink, settings.output_dir)
        self.source: Source | None = None
        self.metrics = metrics or WorkerMetrics(self.job_name, self.name)
        self.cache = StateCache(settings.spec.state_store.cache_bytes)
        self.metrics.cache_size(0, self.cache.max_bytes)
        self.assignment_poll_seconds = assignment_poll_seconds
        self.claim_poll_seconds = claim_poll_seconds
        self._handed: dict[int, Claim] = {}
        """Claims a release made for a waiting claimer here, until the claimer takes it."""
        self._claim_wakes: dict[int, tuple[asyncio.Event, list[str]]] = {}
        """Per waiting claimer: its wake-up and why it was woken (``notified``, ...)."""
        self.releases_subscribed = False
        """Whether the job's release notifications reach this worker now."""
        self.release_waits: set[int] = set()
        """Key groups this worker waits to claim: their previous owner holds them still."""
        self.assignment: Assignment | None = None
        self.acked_generation = 0
        self.runners: dict[int, KeyGroupRunner] = {}
        self._tasks: dict[int, asyncio.Task[RunnerResult]] = {}
        self._claimers: dict[int, asyncio.Task[None]] = {}
        self._force_next: set[int] = set()
        self._forced_done: set[tuple[int, int]] = set()
        self._suspects: set[int] = set(range(settings.spec.key_groups))
        self._assignment_seen_at = 0.0
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self.connected = False
        self.heartbeat = time.monotonic()
        """When the worker loop last went round (read by the HTTP thread's ``/healthz``)."""
        self.started = asyncio.Event()
        self._deps: RuntimeDeps | None = None
        self.fenced_key_groups: list[int] = []
        self.store_failures = FailedKeyGroups()
        self._failed_since: dict[tuple[int, int], float] = {}
        """Key groups stopped by a store error that retries do not cure, with back-off."""

    # -- state for health and tests ---------------------------------------------------

    @property
    def failed_key_groups(self) -> list[int]:
        """Key groups stopped by a user function, a poison record or the store."""
        stopped = {kg for kg, r in list(self.runners.items()) if r.failed is not None}
        return sorted(stopped | {kg for kg, _ in self.store_failures.items()})

    def failure_marks(self) -> dict[int, FailureMark]:
        """Every stopped key group with its reason, since when, and the record's offset."""
        marks: dict[int, FailureMark] = {}
        now = time.time()
        for kg, runner in list(self.runners.items()):  # one step under the GIL
            failed = runner.failed
            if failed is None:
                continue
            if isinstance(failed, CorruptStateError | StateLayoutError):
                reason = "store"
            elif isinstance(failed, PoisonRecordError):
                reason = "poison-record"
            else:
                reason = "user-function"
            since = self._failed_since.setdefault((kg, id(failed)), now)
            marks[kg] = FailureMark(reason, since, failed.offset)
        for kg, failure in self.store_failures.items():
            marks.setdefault(kg, FailureMark("store", failure.since, None))
        for key in [k for k in list(self._failed_since) if k[0] not in marks]:
            self._failed_since.pop(key, None)
        return marks

    def sync_failure_metrics(self) -> None:
        """Bring the failure metrics up to date (the loop and the HTTP thread call it)."""
        self.metrics.failures(self.failure_marks())

    @property
    def source_problem(self) -> str | None:
        """Why the source cannot deliver records now, e.g. Kafka unreachable."""
        if self.source is None:
            return "source not open yet"
        return self.source.problem()

    @property
    def ready(self) -> bool:
        """Connected to the store and the source, and running the current generation."""
        current = self.assignment
        return (
            self.connected
            and self.source_problem is None
            and (current is None or self.acked_generation >= current.generation)
        )

    def health(self) -> dict[str, Any]:
        """What ``/healthz`` answers: the stopped key groups with their reason, offset and
        the error's type, never its message (it may quote records, keys or state: the
        worker's log has it, and the endpoint listens on the pod's network)."""
        runners = list(self.runners.items())  # one step under the GIL: the HTTP thread reads
        errors = {kg: _error_type(r.failed) for kg, r in runners if r.failed is not None}
        for kg, failure in self.store_failures.items():
            errors.setdefault(kg, failure.error_type)
        failed = {
            str(kg): {"reason": mark.reason, "offset": mark.offset, "error": errors.get(kg)}
            for kg, mark in sorted(self.failure_marks().items())
        }
        return {
            "status": "degraded" if failed else "ok",
            "worker": self.name,
            "connected": self.connected,
            "source": self.source_problem or "ok",
            "source_notice": None if self.source is None else self.source.notice(),
            "generation": self.acked_generation,
            "assignment_generation": (
                None if self.assignment is None else self.assignment.generation
            ),
            "key_groups": sorted(kg for kg, _ in runners),
            "failed_key_groups": failed,
        }

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    # -- main loop ------------------------------------------------------------------

    async def run(self) -> None:
        spec = self.settings.spec
        await self.store.ping()
        self.connected = True
        await self.store.warm(min(spec.key_groups, WARM_CONNECTIONS))
        await self._check_eviction_policy()
        info = await self.store.init_job(self.job_name, spec.key_groups)
        if info.key_groups != spec.key_groups:
            raise InvalidSpec(
                f"job {self.job_name!r} has {info.key_groups} key groups in the store but "
                f"{spec.key_groups} in its spec; the count is fixed for the life of a job"
            )
        self.source = await self._open_source(info.created_at)
        self._deps = RuntimeDeps(
            job_name=self.job_name,
            job=self.job,
            store=self.store,
            cache=self.cache,
            outputs=self._open_outputs(),
            source=self.source,
            metrics=self.metrics,
            checkpoint_interval=spec.checkpoint_interval,
            batch_size=spec.batch_size,
            error_policy=spec.error_policy,
            on_poison="fail" if isinstance(spec.source, GeneratorSource) else spec.source.on_poison,
            out_of_orderness=spec.time.out_of_orderness,
            idle_timeout=spec.time.idle_timeout,
        )
        helpers = [
            # subscribed before the first claim, and for good: no handoff waits for it
            asyncio.create_task(self._listen_releases(), name="release-watch"),
            asyncio.create_task(self._watch(), name="assignment-watch"),
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
        ]
        gc_pauses = PauseRecorder(self.metrics.gc_pause)
        gc_pauses.install()
        self.started.set()
        log.info("worker %s started (job %s)", self.name, self.job_name)
        try:
            while not self._stop.is_set():
                try:
                    await self._reconcile()
                except StoreUnavailable as exc:
                    log.warning("reconcile: %s", exc)
                await wait_event(self._wake, RECONCILE_SECONDS)
                self._wake.clear()
                self.heartbeat = time.monotonic()
        finally:
            self._stop.set()  # the helpers end at their next step; cancelling hurries them
            for task in helpers:
                task.cancel()
            await self._shutdown()
            await asyncio.wait(helpers, timeout=5.0)
            for task in helpers:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    log.warning("%s ended with %r", task.get_name(), task.exception())
            gc_pauses.remove()

    async def _check_eviction_policy(self) -> None:
        """Refuse a store that may evict keys (it would lose state silently), unless the
        spec allows it; then, and when the store does not say, warn."""
        policy = await self.store.eviction_policy()
        if policy == "noeviction":
            return
        allowed = self.settings.spec.state_store.allow_eviction
        if policy is None:
            log.warning("the store does not say its maxmemory-policy (CONFIG is disabled): "
                        "make sure it is noeviction, or state can be lost silently")  # fmt: skip
        elif allowed:
            log.warning("the store's maxmemory-policy is %s: it may evict keys and lose "
                        "state silently (stateStore.allowEviction is set)", policy)  # fmt: skip
        else:
            raise StoreMisconfigured(
                f"the store's maxmemory-policy is {policy!r}: it may evict keyshift's keys "
                "and lose state silently; set it to 'noeviction' (CONFIG SET "
                "maxmemory-policy noeviction, or in the server's configuration), or set "
                "stateStore.allowEviction: true to run anyway"
            )

    async def _open_source(self, created_at: float) -> Source:
        def opened(source: Source) -> None:
            self.source = source  # its problem() tells /readyz and /healthz while it connects

        return await open_source(
            self.settings.spec, created_at, group_id=f"keyshift-{self.job_name}",
            decode=self.job.decode, on_open=opened,
        )  # fmt: skip

    def _open_outputs(self) -> Outputs:
        spec = self.settings.spec
        dead_letters: DeadLetters | None = None
        if not isinstance(spec.source, GeneratorSource) and spec.source.on_poison == "dead-letter":
            from keyshift.runtime.kafka.sink import KafkaDeadLetters

            dead_letters = KafkaDeadLetters(spec.source)
        output_dir = self.settings.output_dir
        side = {name: open_sink(sink, output_dir) for name, sink in spec.side_outputs.items()}
        return Outputs(self.sink, side, dead_letters, self.metrics.side_output)

    async def _shutdown(self) -> None:
        for task in self._claimers.values():
            task.cancel()
        for runner in self.runners.values():
            runner.request_stop()
        results = await asyncio.gather(*self._tasks.values(), *self._claimers.values(),
                                       return_exceptions=True)  # fmt: skip
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("at shutdown: %s: %s", type(result).__name__, result)
        self.runners.clear()
        self._tasks.clear()
        with contextlib.suppress(StoreError, TimeoutError):  # its record ages out otherwise
            async with asyncio.timeout(HEARTBEAT_SECONDS):
                await self.store.mark_stopped(self.job_name, self.name)
        if self._deps is not None:
            await self._deps.outputs.close()
        else:
            await self.sink.close()
        if self.source is not None:
            await self.source.close()

    async def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                watch = self.store.watch_assignment(
                    self.job_name, poll_interval=self.assignment_poll_seconds
                )
                try:
                    async for assignment in watch:
                        if self._stop.is_set():
                            break
                        self._on_assignment(assignment)
                finally:
                    aclose = getattr(watch, "aclose", None)  # an async generator's cleanup
                    if aclose is not None:
                        await aclose()
            except StoreError as exc:
                log.warning("assignment watch: %s; retrying", exc)
                await wait_event(self._stop, 1.0)

    def _on_assignment(self, assignment: Assignment) -> None:
        current = self.assignment
        if current is None or assignment.generation > current.generation:
            log.info(
                "assignment generation %d: key groups %s",
                assignment.generation,
                assignment.owned_by(self.ordinal),
            )
            self.assignment = assignment
            self._assignment_seen_at = time.monotonic()
            # releases and claims start now: on a busy worker the reconcile loop's turn
            # comes later
            self._request_releases(assignment)
            if self._deps is not None:
                self._start_claimers(assignment)
            self._wake.set()
            for kg in list(self._claim_wakes):  # a claim by force does not wait for a poll
                self._nudge_claimer(kg, "assignment")

    def _request_releases(self, assignment: Assignment) -> None:
        """Ask the runners of key groups that ``assignment`` gives to others to release."""
        for kg, runner in self.runners.items():
            if assignment.owners[kg] != self.ordinal and not runner.releasing:
                log.info("releasing key group %d at generation %d", kg, assignment.generation)
                runner.request_release(assignment.generation)

    def _start_claimers(self, assignment: Assignment) -> None:
        """A claimer for each key group ``assignment`` gives here that has neither a runner
        nor a claimer (and is not backing off after a store failure)."""
        now = time.time()
        for kg in assignment.owned_by(self.ordinal):
            if (
                kg not in self.runners
                and kg not in self._claimers
                and not self.store_failures.waiting(kg, now)
            ):
                self._claimers[kg] = asyncio.create_task(self._claim(kg), name=f"claim-{kg}")

    def _nudge_claimer(self, kg: int, why: str) -> None:
        found = self._claim_wakes.get(kg)
        if found is not None:
            event, reasons = found
            reasons.append(why)
            event.set()

    async def _heartbeat(self) -> None:
        while not self._stop.is_set():
            try:
                async with asyncio.timeout(HEARTBEAT_SECONDS):
                    await self.store.mark_alive(self.job_name, self.name)
                if not self.connected:  # back: the store may have lost commits meanwhile
                    for runner in list(self.runners.values()):
                        runner.request_fence_check()
                self.connected = True
            except (TimeoutError, StoreError, OSError):
                self.connected = False
            # while the store is away, look again soon: ready again within a second
            await wait_event(self._stop, HEARTBEAT_SECONDS if self.connected else 0.5)

    async def _reconcile(self) -> None:
        self._collect_finished()
        assignment = self.assignment
        if assignment is None:
            self.metrics.key_groups_owned.set(len(self.runners))
            return
        mine = set(assignment.owned_by(self.ordinal))
        if self._suspects:
            await self._release_stale(assignment, mine)
        self._request_releases(assignment)
        self._start_claimers(assignment)
        for kg, runner in self.runners.items():
            if runner.confirmed and self.store_failures.clear(kg):
                log.info("key group %d runs again", kg)
        self.sync_failure_metrics()
        self.metrics.key_groups_finished.set(sum(r.finished for r in self.runners.values()))
        self.metrics.key_groups_owned.set(len(self.runners))
        runs_it = all(kg in self.runners and not self.runners[kg].releasing for kg in mine) and all(
            kg in mine for kg in self.runners
        )
        if runs_it and self.acked_generation < assignment.generation:
            await self.store.ack_generation(self.job_name, self.name, assignment.generation)
            self.acked_generation = assignment.generation
            self.metrics.assignment_generation.set(assignment.generation)
            if self._assignment_seen_at:
                self.metrics.handoff_seconds.observe(time.monotonic() - self._assignment_seen_at)
            log.info("running generation %d", assignment.generation)

    def _collect_finished(self) -> None:
        for kg, task in list(self._tasks.items()):
            if not task.done():
                continue
            del self._tasks[kg]
            self.runners.pop(kg, None)
            if task.cancelled():
                continue
            exc = task.exception()
            if exc is not None:
                self._store_failed(kg, exc)
                self._suspects.add(kg)  # it may still be ours in the store
                continue
            result = task.result()
            if result.outcome is RunnerOutcome.FENCED:
                self.fenced_key_groups.append(kg)
                if result.store_lost_commit:
                    self._force_next.add(kg)
                # the store may still name this worker (it lost commits, not the claim):
                # if the key group has moved meanwhile, release it for its new owner
                self._suspects.add(kg)
            log.info("key group %d: %s", kg, result.outcome.value)

    def _store_failed(self, kg: int, exc: BaseException) -> None:
        """Mark ``kg`` failed by an error retries do not cure; log it when it is news."""
        if self.store_failures.record(kg, exc, time.time()):
            log.error("key group %d stopped: %s: %s; retrying with back-off",
                      kg, type(exc).__name__, exc)  # fmt: skip

    async def _release_stale(self, assignment: Assignment, mine: set[int]) -> None:
        """Release key groups the store says this worker holds but it does not run.

        A previous incarnation (before a crash) held them and never released
        them; their new owners wait for the release.  Every key group is a
        suspect at start; one stays a suspect until this worker runs it or has
        checked that the store does not name it as owner.
        """
        owners: dict[int, str] = {}
        for kg in sorted(self._suspects):
            if kg in self.runners:
                self._suspects.discard(kg)  # the runner releases it when it has to
            elif kg not in mine:
                owners[kg] = (await self.store.key_group_info(self.job_name, kg)).owner
                if owners[kg] != self.name:
                    self._suspects.discard(kg)
        for kg in stale_claims(owners, assignment, self.ordinal, self.name):
            self._suspects.discard(kg)
            try:
                claim = await self.store.claim(
                    self.job_name, kg, self.name, generation=assignment.generation
                )
                with contextlib.suppress(Fenced):  # claimed by force meanwhile: not ours anyway
                    await self.store.release(
                        self.job_name,
                        kg,
                        epoch=claim.epoch,
                        token=claim.token,
                        generation=assignment.generation,
                    )
            except StoreUnavailable:
                self._suspects.add(kg)  # look again on the next pass
                raise
            except StoreError as exc:  # a newer assignment, or corrupt: its owner sees it too
                log.warning("key group %d held before a restart not released: %s", kg, exc)
                continue
            log.info("released key group %d held before a restart", kg)

    async def _claim(self, kg: int) -> None:
        assert self._deps is not None
        turns = self._deps.turns
        # short slices for the key groups here until the new runner's first batch (it
        # ends the handoff) or until this claimer gives up
        turns.handoff_started(kg)
        runner: KeyGroupRunner | None = None
        wake = asyncio.Event()
        reasons: list[str] = []
        self._claim_wakes[kg] = (wake, reasons)
        via = "found"  # how it learned it may claim: a first look finds it released
        learned = time.time()
        # one token for this claimer's every claim: a release that hands the key group to
        # it claims with this token, and a claim after a lost announcement is answered so
        token = secrets.token_hex(16)
        waited = False  # registered as the successor once: a release may hand it here
        try:
            while not self._stop.is_set():
                assignment = self.assignment
                if assignment is None or assignment.owners[kg] != self.ordinal:
                    return
                forced = kg in self._force_next or (
                    kg in assignment.forced and (assignment.generation, kg) not in self._forced_done
                )
                delay = self.claim_poll_seconds
                try:
                    handed = self._handed.pop(kg, None)
                    if handed is not None and handed.token == token:
                        # the release claimed it for this claimer and said so: no round trip
                        claim = handed
                        learned = claim.claimed_at or learned
                        via = "handed"
                    else:
                        # one round trip looks and claims: the store refuses (StillOwned)
                        # while another worker holds the key group, unless by force
                        looked = time.time()
                        claim = await self.store.claim(
                            self.job_name, kg, self.name, generation=assignment.generation,
                            if_released=not forced, token=token,
                        )  # fmt: skip
                        if via in ("found", "polled", "subscribed"):
                            # it learns from the store's answer, the claim's own (a wake on
                            # subscribing is only a prompt to look: the release may come
                            # after it): the look and the claim are one request, applied
                            # at claimed_at
                            learned = claim.claimed_at or looked
                    if forced:
                        via = "forced"
                    elif claim.previous_owner == self.name:
                        via = "own"
                    crash_point("claim.after")
                    self._forced_done.add((assignment.generation, kg))
                    self._force_next.discard(kg)
                    self.cache.drop(kg)
                    runner = KeyGroupRunner(self._deps, claim, learned=learned, via=via)
                    self._deps.source.assign(kg, claim.position, runner.data_arrived)
                    self.runners[kg] = runner
                    task = asyncio.create_task(runner.run(), name=f"key-group-{kg}")
                    task.add_done_callback(lambda _t: self._wake.set())
                    self._tasks[kg] = task
                    log.info(
                        "claimed key group %d (epoch %d, position %d, %s)",
                        kg, claim.epoch, claim.position, via,
                    )  # fmt: skip
                    return
                except StillOwned:
                    # not released yet: the release hands it here, and says so
                    self.release_waits.add(kg)
                    waited = True
                except StoreUnavailable as exc:
                    log.warning("claiming key group %d: %s", kg, exc)
                    delay = CLAIM_RETRY_SECONDS
                except StaleClaim as exc:  # the watcher brings the newer assignment
                    log.info("%s; waiting for the newer assignment", exc)
                    delay = self.assignment_poll_seconds
                except StoreError as exc:
                    self._store_failed(kg, exc)
                    return  # reconcile starts a new claimer after the back-off
                woken = await wait_event(wake, delay)
                wake.clear()
                learned = time.time()
                via = reasons[-1] if woken and reasons else "polled"
                reasons.clear()
        finally:
            if runner is None:
                turns.handoff_finished(kg)
                if waited:  # a release may hand it here yet: reconcile looks, and releases
                    self._suspects.add(kg)
            self._handed.pop(kg, None)
            self._claim_wakes.pop(kg, None)
            self.release_waits.discard(kg)
            self._claimers.pop(kg, None)
            self._wake.set()

    def _on_release(self, released: Released) -> None:
        """A release the store announced: wake the key group's claimer here, and give it
        the claim when the release handed the key group to this worker."""
        kg, handed = released.key_group, released.handed_to
        if handed is None:
            self._nudge_claimer(kg, "notified")
        elif handed.owner == self.name:
            if kg in self._claim_wakes:
                self._handed[kg] = handed
                self._nudge_claimer(kg, "handed")
            else:  # its claimer gave up (a newer assignment): reconcile releases it
                self._suspects.add(kg)
                self._wake.set()

    async def _listen_releases(self) -> None:
        """Wake the claimer of each key group whose release the store announces, and every
        claimer when the subscription (again) stands: a release just before it has no
        notification."""
        while not self._stop.is_set():
            watch = self.store.watch_releases(self.job_name)
            try:
                async for released in watch:
                    if released is None:
                        self.releases_subscribed = True
                        for waiting in list(self._claim_wakes):
                            self._nudge_claimer(waiting, "subscribed")
                    else:
                        self._on_release(released)
            except StoreError as exc:  # the claimers' poll covers
                log.info("release notifications: %s; subscribing again", exc)
            finally:
                self.releases_subscribed = False
                aclose = getattr(watch, "aclose", None)  # its subscription ends now, not later
                if aclose is not None:
                    await aclose()
            await wait_event(self._stop, 1.0)


def _error_type(failure: Failure) -> str:
    """The type of what stopped a key group: the user function's exception, or the
    failure's own kind (poison record, corrupt state)."""
    if isinstance(failure, UserFunctionError):
        return type(failure.cause).__name__
    return type(failure).__name__
