"""The controller's core (``keyshift.controller.core``)."""
