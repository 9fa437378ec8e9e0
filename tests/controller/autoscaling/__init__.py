"""The autoscaler (``keyshift.controller.autoscaling``)."""
