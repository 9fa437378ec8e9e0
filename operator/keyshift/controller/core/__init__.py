"""The controller's core, the same for both hosts: the assignment of key ranges, the
rescale plan and its executor, the reconcile plan, the control loop, its records, the
worker pool interface, handoff timelines and the status document."""
