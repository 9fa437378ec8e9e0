"""The deterministic generator source.

Record ``(kg, offset)`` is a pure function of ``(seed, kg, offset)`` (drawn from
a stream seeded by the seed, the key group and the offset's block of
:data:`BLOCK` records: no hidden state), so any worker can resume any key group at
any offset, and the exact state after offsets ``[0, n)`` is computable
(:mod:`keyshift.runtime.expected`).

How many records exist at a moment follows the rate profile, measured from the
job's ``created_at`` (kept in the store, so every worker agrees):
``available(kg, now) = floor(cumulative(now - created_at) / key_groups)``,
capped by ``limit``.  Lag is ``available - position``.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

from keyshift.api.spec import GeneratorSource, RateSpec
from keyshift.runtime.sources import Event as Event  # where jobs import it from
from keyshift.runtime.sources import SourceBatch

MASK64 = (1 << 64) - 1
UNBOUNDED = 1 << 62
BLOCK = 256
"""Records per block: each block of a key group draws from its own seeded stream."""
AVAILABLE_SLACK = 1e-4
"""Seconds added to the instant a record comes to exist, so that the clock read after
waking for it is past the instant whatever the float rounding."""


def mix64(x: int) -> int:
    """splitmix64's finaliser: a bijective 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def cumulative(rate: RateSpec, t: float) -> float:
    """Records produced (over all key groups) in job time ``[0, t]``; ``inf``: unlimited."""
    if t <= 0:
        return 0.0
    r = rate.records_per_second
    if rate.shape == "points":
        return _points_integral(rate.points, t)
    if r is None:
        return math.inf
    if rate.shape == "constant":
        return r * t
    if rate.shape == "step":
        return r * min(t, rate.at) + rate.to * max(0.0, t - rate.at)
    if rate.shape == "sine":
        w = 2 * math.pi / rate.period
        return r * t + rate.amplitude / w * (1 - math.cos(w * t))
    # spike
    overlap = max(0.0, min(t, rate.at + rate.duration) - rate.at)
    return r * t + (rate.to - r) * overlap


def _time_of(rate: RateSpec, need: int, lo: float, hi: float, *, steps: int) -> float:
    """The job time in ``(lo, hi]`` at which ``need`` records have been produced, found by
    halving ``steps`` times (``cumulative(rate, hi) >= need`` is the caller's to know)."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if cumulative(rate, mid) >= need:
            hi = mid
        else:
            lo = mid
    return hi


def _points_integral(points: list[tuple[float, float]], t: float) -> float:
    total = 0.0
    first_t, first_r = points[0]
    total += first_r * min(t, first_t)
    for (t0, r0), (t1, r1) in itertools.pairwise(points):
        if t <= t0:
            return total
        end = min(t, t1)
        r_end = r0 + (r1 - r0) * (end - t0) / (t1 - t0) if t1 > t0 else r1
        total += (r0 + r_end) / 2 * (end - t0)
    last_t, last_r = points[-1]
    if t > last_t:
        total += last_r * (t - last_t)
    return total


def rate_at(rate: RateSpec, t: float) -> float | None:
    """The instantaneous total rate at job time ``t`` (``None``: unlimited)."""
    r = rate.records_per_second
    if rate.shape == "points":
        pts = rate.points
        if t <= pts[0][0]:
            return pts[0][1]
        for (t0, r0), (t1, r1) in itertools.pairwise(pts):
            if t0 <= t < t1:
                return r0 + (r1 - r0) * (t - t0) / (t1 - t0)
        return pts[-1][1]
    if r is None:
        return None
    if rate.shape == "step":
        return r if t < rate.at else rate.to
    if rate.shape == "sine":
        return r + rate.amplitude * math.sin(2 * math.pi * t / rate.period)
    if rate.shape == "spike":
        return rate.to if rate.at <= t < rate.at + rate.duration else r
    return r


class Generator:
    """The generator of one job: records by ``(kg, offset)``, availability by time."""

    def __init__(self, spec: GeneratorSource, key_groups: int, created_at: float) -> None:
        self.spec = spec
        self.key_groups = key_groups
        self.created_at = created_at
        self._seed = mix64(spec.seed & MASK64)
        self._zipf = spec.distribution == "zipf"
        s = spec.zipf_exponent
        self._one_minus_s = 1.0 - s
        self._cursors: dict[int, tuple[int, random.Random]] = {}
        """Per key group, the offset its last read stopped at and the block's stream there."""

    def keys_in(self, kg: int) -> int:
        """How many distinct keys key group ``kg`` draws from (at least one)."""
        return max(1, (self.spec.keys - kg + self.key_groups - 1) // self.key_groups)

    def available(self, kg: int, now: float) -> int:
        """Offsets ``[0, available)`` of key group ``kg`` exist at unix time ``now``."""
        total = cumulative(self.spec.rate, now - self.created_at)
        limit = UNBOUNDED if self.spec.limit is None else self.spec.limit
        if math.isinf(total):
            return limit
        return min(limit, int(total // self.key_groups))

    def end_offset(self, kg: int, now: float) -> int:
        return self.available(kg, now)

    def exhausted(self, kg: int, position: int) -> bool:
        return self.spec.limit is not None and position >= self.spec.limit

    def assign(self, kg: int, position: int, on_data: Callable[[], None] | None = None) -> None:
        return None  # any worker computes any record, when its time comes: nothing to set up

    def unassign(self, kg: int) -> None:
        return None

    def problem(self) -> str | None:
        return None

    def notice(self) -> str | None:
        return None

    async def close(self) -> None:
        return None

    def read_batch(self, kg: int, start: int, stop: int) -> SourceBatch:
        return SourceBatch(self.read(kg, start, stop), None, None, max(start, stop))

    def when_available(self, kg: int, offset: int, now: float) -> float:
        """The unix time at which offset ``offset`` of ``kg`` comes to exist, at most a
        second from ``now`` (a hint for waiting).

        Every key group's next offset comes to exist at the same instant (the job's
        records are dealt round the key groups), so the idle key groups of a worker all
        wake in one turn of its event loop, not one after the other."""
        t = now - self.created_at
        rate = self.spec.rate
        if rate_at(rate, t) is None or offset < self.available(kg, now):
            return now
        if self.spec.limit is not None and offset >= self.spec.limit:
            return now + 1.0  # never
        need = (offset + 1) * self.key_groups
        if rate.shape == "constant" and rate.records_per_second:
            at = need / rate.records_per_second
        elif cumulative(rate, t + 1.0) < need:
            return now + 1.0
        else:  # the instant within the next second, to a microsecond
            at = _time_of(rate, need, t, t + 1.0, steps=20)
        return min(now + 1.0, max(now, self.created_at + at + AVAILABLE_SLACK))

    def scheduled(self, kg: int, offset: int) -> float:
        """The job time (seconds) at which offset ``offset`` of ``kg`` comes to exist."""
        need = (offset + 1) * self.key_groups
        rate = self.spec.rate
        if math.isinf(cumulative(rate, 1.0)):
            return 0.0
        if rate.shape == "constant" and rate.records_per_second:
            return need / rate.records_per_second
        hi = 1.0
        while cumulative(rate, hi) < need:
            hi *= 2
            if hi > 1e12:
                return hi  # the rate stops: never
        return _time_of(rate, need, 0.0, hi, steps=60)

    def event_time(self, kg: int, offset: int) -> int:
        """The event time (unix ms) of record ``(kg, offset)``: when it is scheduled, minus
        a deterministic jitter of up to ``disorder``."""
        base = round((self.created_at + self.scheduled(kg, offset)) * 1000)
        disorder = round(self.spec.disorder * 1000)
        if disorder <= 0:
            return base
        h = mix64(self._seed ^ mix64((kg << 40) ^ offset ^ 0x5851F42D4C957F2D))
        return base - h % (disorder + 1)

    def record(self, kg: int, offset: int) -> Event:
        return self.read(kg, offset, offset + 1)[0]

    def read(self, kg: int, start: int, stop: int) -> list[Event]:
        """Records ``[start, stop)`` of key group ``kg``.

        Records come in blocks of :data:`BLOCK` offsets; each block draws from its own
        Mersenne Twister, seeded by ``(seed, kg, block)``, two ``random()`` draws per
        record (the key, then the value). Python guarantees that ``random()`` of a
        given integer seed stays the same across versions, so records do too.  A read
        that starts where the key group's last one stopped goes on with its stream
        instead of seeding the block's again and drawing up to the start (at low rates
        the runners read a few records at a time).
        """
        n = self.keys_in(kg)
        k = self.key_groups
        max_value = self.spec.max_value
        out: list[Event] = []
        append = out.append
        zipf = self._zipf
        oms = self._one_minus_s
        flat = abs(oms) < 1e-9
        if zipf and not flat:
            span = n**oms - 1.0
            inv = 1.0 / oms
        log_n = math.log(n)
        seed = (self._seed << 128) | (kg << 64)
        offset = start
        while offset < stop:
            block, skip = divmod(offset, BLOCK)
            end = min(stop, offset - skip + BLOCK)
            cursor = self._cursors.pop(kg, None)
            if cursor is not None and cursor[0] == offset:
                rng = cursor[1]  # where the last read of this key group stopped
            else:
                rng = random.Random(seed | block)
                for _ in range(2 * skip):
                    rng.random()
            draw = rng.random
            for _ in range(offset, end):
                u = draw()
                if not zipf:
                    j = int(u * n)
                else:
                    j = int(math.exp(u * log_n) if flat else (span * u + 1.0) ** inv) - 1
                    if j >= n:
                        j = n - 1
                append(Event(key=f"key-{kg + k * j}", value=1 + int(draw() * max_value)))
            if end % BLOCK:
                self._cursors[kg] = (end, rng)
            offset = end
        return out
