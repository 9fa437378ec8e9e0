"""The autoscaler: the decision (pure), its runner on a schedule, and the load metrics
it decides from (``metrics``: one base, the direct scrape and Prometheus providers)."""
