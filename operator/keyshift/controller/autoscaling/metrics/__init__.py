"""Load metrics for the autoscaler: ``base`` (the LoadSample and the provider interface),
``direct`` (scrapes the workers, local mode), ``prometheus`` (queries Prometheus)."""
