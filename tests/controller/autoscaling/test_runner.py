"""Scaling execution: what the controller rescales to, and which decisions make events."""

from __future__ import annotations

from keyshift.api.spec import AutoscalerSpec
from keyshift.controller.autoscaling.decision import Decision, ScalingHistory
from keyshift.controller.autoscaling.metrics.direct import DirectScrapeProvider
from keyshift.controller.autoscaling.runner import (
    AutoscalerRunner,
    choose_desired,
    direction,
    worth_an_event,
)
from keyshift.controller.core.reconcile import Desired


def decision(action: str, reason: str, current: int = 2, desired: int = 2) -> Decision:
    return Decision(at=0.0, current=current, desired=desired, action=action,  # type: ignore[arg-type]
                    reason=reason, message="")  # type: ignore[arg-type]  # fmt: skip


def test_the_autoscalers_wish_wins_until_the_user_sets_a_parallelism() -> None:
    manual = Desired(3, "manual")
    assert choose_desired(manual, None) == manual
    assert choose_desired(manual, 5) == Desired(5, "autoscaler")


def test_events_for_actions_and_changes_of_reason_only() -> None:
    quiet = decision("none", "within_band")
    assert worth_an_event(quiet, None)
    assert not worth_an_event(quiet, quiet)
    assert worth_an_event(decision("none", "cooldown"), quiet)
    up = decision("scale_up", "high_utilization", 2, 4)
    assert worth_an_event(up, up)
    assert direction(up) == "up" and direction(decision("scale_down", "low_utilization")) == "down"
    assert direction(quiet) == "none" and direction(decision("blocked", "x")) == "blocked"


def test_a_job_at_zero_stays_asleep_across_a_restart_unless_its_spec_forbids_zero() -> None:
    asleep = ScalingHistory(parallelism=0)
    zero = AutoscalerSpec(enabled=True, min_parallelism=0)
    provider = DirectScrapeProvider(window_seconds=60)
    assert AutoscalerRunner("j", 8, zero, provider, asleep).wish == 0
    assert AutoscalerRunner("j", 8, zero, provider, ScalingHistory(parallelism=2)).wish is None
    one = AutoscalerSpec(enabled=True, min_parallelism=1)
    assert AutoscalerRunner("j", 8, one, provider, asleep).wish is None  # the manual one wakes it
    advice = zero.model_copy(update={"mode": "recommend"})
    assert AutoscalerRunner("j", 8, advice, provider, asleep).wish is None
