"""The root of keyshift's errors: every error keyshift raises on purpose is a
:class:`KeyshiftError`, so a caller can tell them from bugs (``except KeyshiftError``),
and third-party errors are translated where keyshift meets the third party.

```
KeyshiftError
├── InvalidSpec (ValueError)            a StreamJob spec that cannot run (keyshift.api.spec)
├── DuplicateKeyError (yaml.YAMLError)  a manifest that gives a key twice (keyshift.api.spec)
├── InvalidWorkerSettings (ValueError)  a worker started without what it needs (runtime.config)
├── StoreError                          a store operation failed (keyshift.store.protocol: its
│                                       own tree; unavailable ones are retried with back-off)
├── InvalidStoreURL (ValueError)        a URL open_store cannot use (store.client)
├── LayoutError (ValueError)            state in a layout a command cannot convert (store.migrate)
├── ServerStartError (RuntimeError)     an embedded Valkey that did not start (store.server)
├── JobLoadError                        the job's module or attribute (runtime.api)
├── StateTooLarge                       a map too large to iterate in the cache (runtime.api)
├── UserFunctionError, PoisonRecordError, CorruptStateError, StateLayoutError
│                                       why a key group stopped (runtime.keygroup)
├── SinkUnavailable, OutputsLost        outputs not delivered (runtime.sinks)
├── SavepointError (ValueError)         a savepoint that cannot be written or read (store.savepoint)
├── PlanError (ValueError)              a parallelism the key groups cannot have (controller.core)
├── MetricsFormatError (ValueError)     a worker's /metrics that does not parse (autoscaling)
├── KubeError                           the Kubernetes API (controller.kubernetes.api: its own tree)
├── InvalidStatus (ValueError)          a StreamJob status.controller that is not a record
├── SchemaConversionError (ValueError)  a spec model the CRD schema cannot express (kubernetes.crd)
└── InvalidManifest (ValueError), JobAlreadyRunning (RuntimeError)
                                        what keyshift run refuses (controller.local.run)
```

The built-in bases in brackets stay for callers that catch those.
"""

from __future__ import annotations


class KeyshiftError(Exception):
    """An error keyshift raises on purpose, with a message meant for its user."""
