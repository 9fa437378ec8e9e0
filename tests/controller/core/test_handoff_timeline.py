"""The handoff timeline of a rescale's record: pure functions over the store's marks."""

from __future__ import annotations

from keyshift.controller.core.handoffs import (
    STAGES,
    KeyGroupHandoff,
    key_group_handoff,
    publish_time,
    timeline,
)
from keyshift.controller.core.records import ControllerRecord
from keyshift.controller.core.rescale import Rescale
from keyshift.store import KeyGroupInfo

T0 = 1000.0


def info(kg: int, *, released: int, claimed: int, **extra: object) -> KeyGroupInfo:
    return KeyGroupInfo(
        job="j", key_group=kg, epoch=2, owner="j-worker-1", seq=3, position=10,
        watermark=None, claimed_generation=claimed, released_generation=released,
        entries=0, timers=0, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_key_group_timeline_counts_only_this_handoffs_marks() -> None:
    found = key_group_handoff(
        info(
            4, released=2, claimed=2, released_at=T0 + 0.040, claimed_at=T0 + 0.043,
            release_marks={"release_requested": T0 + 0.002, "batch_ended": T0 + 0.020,
                           "flushed": T0 + 0.021, "committed": T0 + 0.039},
            claim_marks={"learned": T0 + 0.041, "loaded": T0 + 0.045, "first_batch": T0 + 0.05},
            claim_via="notified",
        ),
        0, 1, 2, T0,
    )  # fmt: skip
    assert found.via == "notified"
    assert list(found.at_ms) == list(STAGES)
    assert found.at_ms["release_requested"] == 2.0 and found.at_ms["first_batch"] == 50.0
    # forced: the store's release marks are an older handoff's, and are left out
    forced = key_group_handoff(
        info(5, released=1, claimed=3, released_at=T0 - 50, claimed_at=T0 + 0.5,
             release_marks={"release_requested": T0 - 51}, claim_via="forced"),
        0, 1, 2, T0,
    )  # fmt: skip
    assert forced.at_ms == {"claimed": 500.0} and forced.via == "forced"


def test_the_timeline_sums_each_step_over_the_key_groups() -> None:
    a = KeyGroupHandoff(key_group=1, from_worker=0, to_worker=1, via="notified",
                        at_ms={"release_requested": 2, "batch_ended": 12, "released": 20,
                               "claimed": 22, "loaded": 30})  # fmt: skip
    b = KeyGroupHandoff(key_group=0, from_worker=0, to_worker=1, via="polled",
                        at_ms={"release_requested": 4, "batch_ended": 24, "released": 30,
                               "claimed": 90})  # fmt: skip
    t = timeline(T0, [a, b])
    assert [h.key_group for h in t.key_groups] == [0, 1]
    assert t.steps["release_requested"].median_ms == 3.0
    assert t.steps["batch_ended"].max_ms == 20.0
    assert t.steps["claimed"].max_ms == 60.0 and t.steps["claimed"].key_groups == 2
    assert t.steps["loaded"].key_groups == 1
    assert t.pause_ms is not None and t.pause_ms.max_ms == 18.0  # batch end -> loaded
    assert t.via == {"notified": 1, "polled": 1}
    assert not t.complete  # key group 0's new owner has not recorded its first load yet
    b.at_ms["loaded"] = 95
    assert t.complete


def test_the_publish_time_is_the_end_of_the_publishing_phase() -> None:
    steps = [("starting_workers", 1.5), ("publishing", 0.01), ("handing_off", 0.2)]
    assert publish_time(T0, steps) == T0 + 1.51


def test_older_rescales_keep_the_summary_not_the_detail() -> None:
    record = ControllerRecord(job="j")
    for n in range(8):
        r = Rescale(
            id=str(n), job="j", reason="manual", from_parallelism=1, to_parallelism=2,
            from_generation=n, to_generation=n + 1, from_owners=[0], to_owners=[1],
        )  # fmt: skip
        r.handoff = timeline(T0, [KeyGroupHandoff(key_group=0, from_worker=0, to_worker=1)])
        record.finish(r)
    kept = [bool(r.handoff and r.handoff.key_groups) for r in record.history]
    assert kept == [False] * 3 + [True] * 5
