"""The generator: records are a pure function of (seed, key group, offset)."""

from __future__ import annotations

from collections import Counter

import pytest

from keyshift.api.spec import GeneratorSource, RateSpec
from keyshift.runtime.sources.generator import Generator, cumulative, rate_at


def test_records_are_deterministic_and_resumable_anywhere() -> None:
    spec = GeneratorSource(seed=1, keys=1000, distribution="zipf")
    a = Generator(spec, 8, created_at=0.0)
    b = Generator(spec, 8, created_at=12345.0)  # another worker, another clock
    whole = a.read(3, 0, 1000)
    assert whole == a.read(3, 0, 400) + b.read(3, 400, 1000)
    assert whole != a.read(4, 0, 1000)
    assert whole != Generator(spec.model_copy(update={"seed": 2}), 8, 0.0).read(3, 0, 1000)
    # keys of key group kg are the keys i with i % key_groups == kg
    assert all(int(e.key.removeprefix("key-")) % 8 == 3 for e in whole)
    assert all(1 <= e.value <= spec.max_value for e in whole)


def test_zipf_keys_are_skewed_and_uniform_keys_are_not() -> None:
    zipf = Generator(GeneratorSource(keys=100_000, distribution="zipf"), 1, 0.0)
    uniform = Generator(GeneratorSource(keys=100_000, distribution="uniform"), 1, 0.0)
    z = Counter(e.key for e in zipf.read(0, 0, 20_000))
    u = Counter(e.key for e in uniform.read(0, 0, 20_000))
    assert z.most_common(1)[0][1] > 1000  # rank 1 takes several percent
    assert u.most_common(1)[0][1] < 10
    assert z.most_common(1)[0][0] == "key-0"


@pytest.mark.parametrize(
    ("rate", "t", "records"),
    [
        (RateSpec(records_per_second=100), 10, 1000),
        (RateSpec(shape="step", records_per_second=100, at=5, to=300), 10, 2000),
        (RateSpec(shape="spike", records_per_second=100, at=2, duration=1, to=1100), 10, 2000),
        (RateSpec(shape="sine", records_per_second=100, amplitude=50, period=10), 10, 1000),
        (RateSpec(shape="points", points=[(0, 0), (10, 200)]), 10, 1000),
        (RateSpec(shape="points", points=[(0, 0), (10, 200)]), 20, 3000),
    ],
)
def test_rate_profiles_integrate_to_the_record_count(
    rate: RateSpec, t: float, records: int
) -> None:
    assert cumulative(rate, t) == pytest.approx(records)
    assert cumulative(rate, 0) == 0


def test_availability_follows_the_rate_from_the_job_start_and_stops_at_the_limit() -> None:
    spec = GeneratorSource(rate=RateSpec(records_per_second=400), limit=300)
    gen = Generator(spec, 4, created_at=1000.0)
    assert gen.available(0, 1000.0) == 0
    assert gen.available(2, 1001.0) == 100  # 400/s over 4 key groups
    assert gen.available(2, 1010.0) == 300  # capped by the limit
    assert gen.exhausted(2, 300)
    assert rate_at(spec.rate, 1.0) == 400
    assert 1001.0 < gen.when_available(0, 150, 1001.0) <= 1002.0
    unlimited = Generator(GeneratorSource(limit=50), 4, created_at=1000.0)
    assert unlimited.available(0, 1000.5) == 50


def test_reads_in_small_pieces_give_the_records_of_one_read() -> None:
    """A runner at a low rate reads one or two records at a time; the generator goes on
    from where the key group's last read stopped, and a read elsewhere in between (a
    replay, another key group) changes nothing."""
    spec = GeneratorSource(seed=3, keys=5000, distribution="zipf")
    whole = Generator(spec, 4, 0.0).read(1, 0, 700)
    gen = Generator(spec, 4, 0.0)
    pieces = []
    for start in range(0, 700, 3):
        pieces += gen.read(1, start, min(700, start + 3))
        if start % 90 == 0:
            gen.read(1, 10, 12)  # elsewhere in this key group's stream
            gen.read(2, start, start + 5)
    assert pieces == whole


@pytest.mark.parametrize(
    "rate",
    [RateSpec(records_per_second=400), RateSpec(shape="sine", records_per_second=400,
                                                amplitude=100, period=7)],
)  # fmt: skip
def test_every_key_group_waits_for_the_instant_its_next_record_exists(rate: RateSpec) -> None:
    """The hint is the instant the record comes to exist (not a record's interval from
    whenever the key group asked): the same for every key group at the same position, so
    that a worker's idle key groups wake together."""
    gen = Generator(GeneratorSource(rate=rate), 4, created_at=1000.0)
    now = 1003.21
    position = gen.available(0, now)  # caught up: the next record does not exist yet
    hints = [gen.when_available(kg, position, now + kg * 0.0001) for kg in range(4)]
    assert max(hints) - min(hints) < 1e-5  # the same instant, to ten microseconds
    at = max(hints)
    assert now < at <= now + 1.0
    assert gen.available(0, at) == position + 1  # it exists then
    assert gen.available(0, at - 0.001) == position  # and not a millisecond before
    assert gen.when_available(0, position - 1, now) == now  # already there: at once
