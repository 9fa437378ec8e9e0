"""The operator: the Kubernetes API client, the objects it owns, the StatefulSet pool,
the StreamJob's status, the job runner, the kopf handlers and the CRD."""
