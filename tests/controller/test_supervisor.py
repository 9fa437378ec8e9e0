"""The supervisor's choices, as data: the desired parallelism and the metrics provider."""

from __future__ import annotations

import asyncio

from keyshift.api.spec import AutoscalerSpec
from keyshift.controller.autoscaling.metrics.direct import DirectScrapeProvider
from keyshift.controller.autoscaling.metrics.prometheus import PrometheusMetricsProvider
from keyshift.controller.autoscaling.runner import AutoscalerRunner
from keyshift.controller.core.reconcile import Desired
from keyshift.controller.supervisor import ManualRequest, ParallelismChoice, metrics_provider


class Requests:
    """What the host says the user asked for (``spec.parallelism``, ``desired.json``)."""

    def __init__(self, parallelism: int, asked: object) -> None:
        self.now = ManualRequest(Desired(parallelism, "manual"), asked)

    def __call__(self) -> ManualRequest:
        return self.now


def runner() -> AutoscalerRunner:
    spec = AutoscalerSpec(enabled=True)
    return AutoscalerRunner("job", 8, spec, DirectScrapeProvider())


def test_without_an_autoscaler_the_user_decides() -> None:
    requests = Requests(3, "t1")
    choice = ParallelismChoice(requests, None)
    assert choice() == Desired(3, "manual")
    requests.now = ManualRequest(Desired(5, "manual"), "t2")
    assert choice() == Desired(5, "manual")


def test_the_autoscalers_wish_wins_until_the_user_asks_again() -> None:
    scaler = runner()
    requests = Requests(2, "t1")
    choice = ParallelismChoice(requests, scaler)
    assert choice() == Desired(2, "manual")
    scaler.wish = 6  # a scale-up decision
    assert choice() == Desired(6, "autoscaler")
    assert choice() == Desired(6, "autoscaler")  # the same request: the wish stands
    requests.now = ManualRequest(Desired(2, "manual"), "t2")  # asked again, same number
    assert choice() == Desired(2, "manual")
    assert scaler.wish is None


def test_the_first_request_seen_does_not_drop_a_wish() -> None:
    scaler = runner()
    scaler.wish = 4  # e.g. decided before the host first asked
    choice = ParallelismChoice(Requests(1, 1), scaler)
    assert choice() == Desired(4, "autoscaler")


def test_prometheus_when_the_spec_names_one_else_a_direct_scrape() -> None:
    local = metrics_provider(AutoscalerSpec(enabled=True))
    assert isinstance(local, DirectScrapeProvider)
    spec = AutoscalerSpec.model_validate(
        {"enabled": True, "prometheus": {"url": "http://127.0.0.1:9090"}}
    )
    prom = metrics_provider(spec, namespace="team-a", credentials={"token": "t"})
    assert isinstance(prom, PrometheusMetricsProvider)
    asyncio.run(prom.close())
