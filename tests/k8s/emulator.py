"""A Kubernetes API emulator for tests: kmock's HTTP server and Kubernetes scaffold plus a store.

What comes from kmock 0.8 (PyPI ``kmock``, by kopf's author):

* ``kmock.Server``: the aiohttp server on ``127.0.0.1`` and a free port;
* ``kmock.KubernetesScaffold`` (a ``kmock.RawHandler``): ``kmock.Request``,
  ``KubernetesError`` rendered as Kubernetes ``Status`` bodies, the discovery
  endpoints ``/api`` and ``/version`` (``/``, ``/apis``, ``/apis/<g>`` overridden
  to list the registered resources).  kmock's request DSL (``kmock['get /x'] << ...``)
  is bypassed: ``__call__`` is overridden because kmock's path parser fails on
  ``/api/v1/namespaces`` and because matching every request against the DSL
  and recording it is what makes stock kmock slower with every request.

What is replaced, and why: kmock's ``KubernetesEmulator`` object store (its
``_handle`` and ``_serve_*`` methods).  Its objects have no ``uid`` or
``resourceVersion``, listing and watching scan every object and keep a full
history of every version, a watch sends a snapshot and then only what arrives on
a bus (events in between are lost, ``resourceVersion`` cannot be resumed), and
every request is filtered through the DSL.  Those gaps are in the core of the
store, so patching around them would have been larger than the small store below,
which is one dict per resource plus one bounded event log per resource.  Every
request costs O(objects of that resource) for lists and O(1) otherwise, whatever
the number of requests served before.

Supported (see tests/k8s/test_emulator.py):

* discovery: ``/api``, ``/api/v1``, ``/apis``, ``/apis/<g>``, ``/apis/<g>/<v>``,
  built-in resources (``BUILTINS``) and every CRD once it is POSTed (plural,
  singular, kind, short names, categories, scope, ``status``/``scale`` subresources);
* GET, LIST (``labelSelector`` with =, ==, !=, in, notin, exists, !exists;
  ``fieldSelector`` on any dotted path, =, ==, !=), WATCH (``resourceVersion``
  resumes from the event log, 410 Gone when it was trimmed; ``timeoutSeconds``;
  ``allowWatchBookmarks`` accepted and ignored), POST (``generateName``, ``uid``,
  ``resourceVersion``, ``creationTimestamp``, ``generation``), PUT (409 on a stale
  ``resourceVersion``), PATCH (merge, strategic-merge -- a merge patch where lists
  of objects with a ``name`` are merged by name -- and JSON patch with ``test``),
  DELETE and DELETE-collection;
* finalizers (``deletionTimestamp`` set, object kept until they are removed);
  ``ownerReferences`` garbage collection in the background (by owner ``uid``, any
  namespace; ``propagationPolicy: Orphan`` strips the references instead;
  ``Foreground`` is treated as ``Background``);
* ``status`` subresource isolation and ``metadata.generation`` bumped on changes
  outside ``metadata``/``status``; ``scale`` subresource (autoscaling/v1 Scale)
  for StatefulSets, Deployments and CRs (``specReplicasPath``, ``statusReplicasPath``,
  ``labelSelectorPath``);
* custom resources validated, pruned and defaulted against the CRD's OpenAPI v3
  schema (``tests/k8s/schema.py``): 422 ``Invalid`` naming the fields, or 400 for
  unknown fields with ``fieldValidation=Strict`` (what ``kubectl apply`` sends);
* namespaces: ``default`` and ``kube-system`` exist; creating into a missing
  namespace is a 404; deleting a namespace deletes what is in it.

Not supported: server-side apply (``application/apply-patch+yaml`` is a 415),
``Table`` output (clients fall back to plain lists), OpenAPI documents
(``/openapi/v2``, ``/openapi/v3`` are 404, so use ``kubectl --validate=false`` or
rely on the server-side field validation above), conversion between CRD versions
(one stored object, ``apiVersion`` rewritten), CEL rules other than
``self == oldSelf``, built-in controllers (no pods from StatefulSets, no
endpoints), authentication/authorization (everything is allowed), watch DELETED
events for objects that stop matching a selector, and the shared storage of
``events.k8s.io/v1`` and core ``v1`` Events (they are two separate resources).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import datetime
import json
import secrets
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch  # a kmock dependency
import kmock
from typing_extensions import override

from tests.k8s.schema import Cause, apply_schema

Obj = dict[str, Any]
GroupResource = tuple[str, str]  # (group, plural): the storage key of a resource
ObjKey = tuple[str, str]  # (namespace or "", name)

# How many watch events are kept per resource for watches resuming from a resourceVersion.
EVENT_LOG_SIZE = 5000


# ----------------------------------------------------------------------------- errors


class ApiError(kmock.KubernetesError):
    """An error rendered as a Kubernetes ``Status`` body (see ``_render_error``)."""


def _status_body(exc: kmock.KubernetesError) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": exc.message or "",
        "reason": exc.reason or "",
        "details": exc.details or {},
        "code": exc.status,
    }


def _not_found(res: ResourceDef, name: str) -> ApiError:
    return ApiError(
        status=404,
        reason="NotFound",
        message=f'{res.group_resource_name} "{name}" not found',
        details={"name": name, "group": res.group, "kind": res.plural},
    )


def _conflict(res: ResourceDef, name: str) -> ApiError:
    return ApiError(
        status=409,
        reason="Conflict",
        message=(
            f'Operation cannot be fulfilled on {res.group_resource_name} "{name}": the object'
            " has been modified; please apply your changes to the latest version and try again"
        ),
        details={"name": name, "group": res.group, "kind": res.plural},
    )


def _invalid(res: ResourceDef, name: str, causes: list[Cause]) -> ApiError:
    listed = "; ".join(c.message for c in causes) if len(causes) == 1 else None
    text = listed or "[" + ", ".join(c.message for c in causes) + "]"
    return ApiError(
        status=422,
        reason="Invalid",
        message=f'{res.kind}.{res.group or "core"} "{name}" is invalid: {text}'.replace(
            ".core ", " "
        ),
        details={
            "name": name,
            "group": res.group,
            "kind": res.kind,
            "causes": [c.as_dict() for c in causes],
        },
    )


def _forbidden(request: ApiRequest) -> ApiError:
    resource = request.resource + (f"/{request.subresource}" if request.subresource else "")
    where = (
        f' in the namespace "{request.namespace}"' if request.namespace else " at the cluster scope"
    )
    return ApiError(
        status=403,
        reason="Forbidden",
        message=(
            f"{resource}{'.' + request.group if request.group else ''} is forbidden: User "
            f'"{request.user}" cannot {request.verb} resource "{resource}" in API group '
            f'"{request.group}"{where}'
        ),
        details={"name": request.name or "", "group": request.group, "kind": request.resource},
    )


def _bad_request(message: str) -> ApiError:
    return ApiError(status=400, reason="BadRequest", message=message)


# ----------------------------------------------------------------------------- resources


@dataclass(frozen=True)
class ScaleSpec:
    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    label_selector: str | None = None  # a path to a selector string (CRD convention)
    selector_object: str | None = None  # a path to a LabelSelector object (apps/v1)


@dataclass
class ResourceDef:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    singular: str = ""
    status: bool = False  # has the status subresource (status isolated, generation tracked)
    scale: ScaleSpec | None = None
    schema: dict[str, Any] | None = None  # the openAPIV3Schema of a CR version
    custom: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def gr(self) -> GroupResource:
        return (self.group, self.plural)

    @property
    def group_resource_name(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def discovery(self) -> list[Obj]:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        main: Obj = {
            "name": self.plural,
            "singularName": self.singular or self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": verbs,
        }
        if self.short_names:
            main["shortNames"] = self.short_names
        if self.categories:
            main["categories"] = self.categories
        result = [main]
        sub_verbs = ["get", "patch", "update"]
        if self.status:
            result.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": sub_verbs,
                }
            )
        if self.scale:
            result.append(
                {
                    "name": f"{self.plural}/scale",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": sub_verbs,
                }
            )
        return result


def _builtins() -> list[ResourceDef]:
    apps_scale = ScaleSpec(selector_object=".spec.selector")
    return [
        ResourceDef("", "v1", "namespaces", "Namespace", False, ["ns"], status=True),
        ResourceDef("", "v1", "pods", "Pod", True, ["po"], ["all"], status=True),
        ResourceDef("", "v1", "services", "Service", True, ["svc"], ["all"], status=True),
        ResourceDef("", "v1", "configmaps", "ConfigMap", True, ["cm"]),
        ResourceDef("", "v1", "secrets", "Secret"),
        ResourceDef("", "v1", "serviceaccounts", "ServiceAccount", True, ["sa"]),
        ResourceDef("", "v1", "events", "Event", True, ["ev"]),
        ResourceDef("events.k8s.io", "v1", "events", "Event", True, ["ev"]),
        ResourceDef(
            "apps",
            "v1",
            "statefulsets",
            "StatefulSet",
            True,
            ["sts"],
            ["all"],
            status=True,
            scale=apps_scale,
        ),
        ResourceDef(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            True,
            ["deploy"],
            ["all"],
            status=True,
            scale=apps_scale,
        ),
        ResourceDef(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            True,
            ["pdb"],
            status=True,
        ),
        ResourceDef("coordination.k8s.io", "v1", "leases", "Lease"),
        ResourceDef(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            False,
            ["crd", "crds"],
            status=True,
        ),
    ]


# ----------------------------------------------------------------------------- helpers


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _get_path(obj: Any, path: str) -> Any:
    """Read a ``.spec.replicas``-style (or ``spec.replicas``) path; None if absent."""
    for part in path.strip(".").split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _set_path(obj: Obj, path: str, value: Any) -> None:
    parts = path.strip(".").split(".")
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value


def _merge(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 merge patch; with ``strategic``, lists of named objects merge by ``name``."""
    if not isinstance(patch, dict):
        if strategic and isinstance(patch, list) and isinstance(target, list):
            return _merge_named_lists(target, patch)
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    order: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if strategic and key.startswith("$setElementOrder/"):
            order[key.split("/", 1)[1]] = value
        elif strategic and key.startswith("$"):
            continue  # $patch, $retainKeys, $deleteFromPrimitiveList: not supported
        elif value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value, strategic)
    for key, names in order.items():
        items = result.get(key)
        if isinstance(items, list) and all(isinstance(i, dict) and "name" in i for i in items):
            wanted = [n.get("name") for n in names if isinstance(n, dict)]
            by_name = {i["name"]: i for i in items}
            result[key] = [by_name[n] for n in wanted if n in by_name]
    return result


def _merge_named_lists(target: list[Any], patch: list[Any]) -> list[Any]:
    named = all(isinstance(i, dict) and "name" in i for i in target + patch)
    if not named or not patch:
        return copy.deepcopy(patch)
    result = [dict(i) for i in target]
    index = {i["name"]: n for n, i in enumerate(result)}
    for item in patch:
        if item.get("$patch") == "delete":
            result = [i for i in result if i["name"] != item["name"]]
            index = {i["name"]: n for n, i in enumerate(result)}
        elif item["name"] in index:
            result[index[item["name"]]] = _merge(result[index[item["name"]]], item, True)
        else:
            index[item["name"]] = len(result)
            result.append(_merge({}, item, True))
    return result


def _parse_label_selector(text: str) -> Callable[[dict[str, str]], bool]:
    """``a=b,c!=d,e in (x,y),f notin (z),g,!h`` as a predicate over labels."""
    terms: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    checks: list[Callable[[dict[str, str]], bool]] = []
    for raw in terms:
        term = raw.strip()
        if term:
            checks.append(_label_term(term))
    return lambda labels: all(check(labels) for check in checks)


def _label_term(term: str) -> Callable[[dict[str, str]], bool]:
    for word, negate in ((" notin ", True), (" in ", False)):
        if word in term:
            key, _, values = term.partition(word)
            allowed = {v.strip() for v in values.strip().strip("()").split(",")}
            return lambda labels: (labels.get(key.strip()) in allowed) != negate
    if "!=" in term:
        key, _, value = term.partition("!=")
        return lambda labels: labels.get(key.strip()) != value.strip()
    if "=" in term:
        key, _, value = term.replace("==", "=").partition("=")
        return lambda labels: labels.get(key.strip()) == value.strip()
    if term.startswith("!"):
        return lambda labels: term[1:].strip() not in labels
    return lambda labels: term in labels


def _parse_field_selector(text: str) -> Callable[[Obj], bool]:
    checks: list[Callable[[Obj], bool]] = []
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            continue
        negate = "!=" in term
        key, _, value = term.replace("!=", "=").replace("==", "=").partition("=")

        def check(obj: Obj, k: str = key.strip(), v: str = value.strip(), n: bool = negate) -> bool:
            found = _get_path(obj, k)
            text = "" if found is None else str(found).lower() if isinstance(found, bool) else found
            return (str(text) == v) != n

        checks.append(check)
    return lambda obj: all(check(obj) for check in checks)


def _selector_string(selector: Any) -> str:
    """A LabelSelector object as the string form used in ``Scale.status.selector``."""
    if not isinstance(selector, dict):
        return ""
    terms = [f"{k}={v}" for k, v in sorted(selector.get("matchLabels", {}).items())]
    for expr in selector.get("matchExpressions", []):
        op, key, values = expr.get("operator"), expr.get("key"), expr.get("values", [])
        if op in ("In", "NotIn"):
            terms.append(f"{key} {op.lower()} ({','.join(values)})")
        elif op == "Exists":
            terms.append(key)
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
    return ",".join(terms)


@dataclass
class _Request:
    """A parsed API path.

    ``/api[s]/<group>/<version>[/namespaces/<ns>]/<plural>[/<name>[/<sub>]]``.
    """

    group: str
    version: str
    plural: str | None = None
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


@dataclass(frozen=True)
class ApiRequest:
    """One resource request as RBAC sees it: who, which verb, on what.

    ``user`` is the bearer token of the request (each kubeconfig of
    :meth:`KubernetesEmulator.kubeconfig_for` has its own); ``verb`` is the RBAC verb
    (``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``,
    ``deletecollection``); ``namespace`` is None for cluster-scoped or all-namespace
    requests.
    """

    user: str
    verb: str
    group: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None


def _rbac_verb(method: str, name: str | None, params: dict[str, str]) -> str:
    if method == "GET":
        if params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if name is not None else "list"
    if method == "DELETE":
        return "delete" if name is not None else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def _parse_path(path: str) -> _Request | None:
    parts = [p for p in path.strip("/").split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        req, rest = _Request("", parts[1]), parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        req, rest = _Request(parts[1], parts[2]), parts[3:]
    else:
        return None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        req.namespace, rest = rest[1], rest[2:]
    if rest:
        req.plural = rest[0]
        req.name = rest[1] if len(rest) > 1 else None
        req.subresource = "/".join(rest[2:]) or None
    return req


# ----------------------------------------------------------------------------- the store


@dataclass
class _Log:
    """The recent events of one resource, for watches (bounded; the index is absolute)."""

    events: list[tuple[int, str, Obj]] = field(default_factory=list)
    offset: int = 0  # absolute index of events[0]
    trimmed_rv: int = 0  # the resourceVersion of the last event dropped

    def append(self, rv: int, kind: str, obj: Obj) -> None:
        self.events.append((rv, kind, obj))
        if len(self.events) > 2 * EVENT_LOG_SIZE:
            self.trimmed_rv = self.events[EVENT_LOG_SIZE - 1][0]
            del self.events[:EVENT_LOG_SIZE]
            self.offset += EVENT_LOG_SIZE

    @property
    def end(self) -> int:
        return self.offset + len(self.events)

    def position_after(self, rv: int) -> int | None:
        """The absolute index of the first event after ``rv``, or None if already trimmed."""
        if rv < self.trimmed_rv:
            return None
        return self.offset + bisect.bisect_right(self.events, rv, key=lambda e: e[0])


@attrs.define(kw_only=True)
class EmulatorHandler(kmock.KubernetesScaffold):
    """The request handler: kmock's scaffold with a resourceVersion-aware object store."""

    registry: dict[tuple[str, str, str], ResourceDef] = attrs.field(factory=dict, init=False)
    objects: dict[GroupResource, dict[ObjKey, Obj]] = attrs.field(factory=dict, init=False)
    logs: dict[GroupResource, _Log] = attrs.field(factory=dict, init=False)
    uids: dict[str, tuple[GroupResource, ObjKey]] = attrs.field(factory=dict, init=False)
    dependents: dict[str, set[tuple[GroupResource, ObjKey]]] = attrs.field(factory=dict, init=False)
    rv: int = attrs.field(default=1, init=False)
    lock: threading.RLock = attrs.field(factory=threading.RLock, init=False)
    _changed: asyncio.Event | None = attrs.field(default=None, init=False)
    closing: bool = attrs.field(default=False, init=False)
    """Set when the server stops: open watches end (aiohttp waits for them otherwise)."""
    request_log: list[ApiRequest] = attrs.field(factory=list, init=False)
    authorize: Callable[[ApiRequest], bool] | None = attrs.field(default=None, init=False)
    """None: everything is allowed; else a request it refuses is a 403 Forbidden (RBAC)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for res in _builtins():
            self.register(res)
        for ns in ("default", "kube-system", "kube-public"):
            self.create_obj(self.lookup("", "v1", "namespaces"), None, {"metadata": {"name": ns}})

    # ---- registry

    def register(self, res: ResourceDef) -> None:
        self.registry[res.group, res.version, res.plural] = res
        self.objects.setdefault(res.gr, {})
        self.logs.setdefault(res.gr, _Log())

    def lookup(self, group: str, version: str, plural: str) -> ResourceDef:
        res = self.registry.get((group, version, plural))
        if res is None:
            raise ApiError(
                status=404,
                reason="NotFound",
                message="the server could not find the requested resource",
                details={"group": group, "kind": plural},
            )
        return res

    def find(self, what: str) -> ResourceDef:
        """A resource by plural, singular, kind or short name, optionally ``.group``-qualified."""
        name, _, group = what.partition(".")
        for res in self.registry.values():
            names = {res.plural, res.singular, res.kind.lower(), *res.short_names}
            if name.lower() in names and (not group or res.group == group):
                return res
        raise KeyError(what)

    # ---- events

    def _emit(self, res: ResourceDef, kind: str, obj: Obj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self.logs[res.gr].append(rv, kind, copy.deepcopy(obj))
        self._wake_watches()

    def _wake_watches(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def close_watches(self) -> None:
        """End every open watch (call in the server's loop, before it stops)."""
        self.closing = True
        self._wake_watches()

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _index(self, res: ResourceDef, key: ObjKey, obj: Obj | None, old: Obj | None) -> None:
        for prev in [old] if old else []:
            self.uids.pop(prev["metadata"]["uid"], None)
            for ref in prev["metadata"].get("ownerReferences", []):
                self.dependents.get(ref.get("uid", ""), set()).discard((res.gr, key))
        if obj is not None:
            self.uids[obj["metadata"]["uid"]] = (res.gr, key)
            for ref in obj["metadata"].get("ownerReferences", []):
                self.dependents.setdefault(ref.get("uid", ""), set()).add((res.gr, key))

    def _storage(self, gr: GroupResource) -> ResourceDef:
        for res in self.registry.values():
            if res.gr == gr:
                return res
        raise KeyError(gr)

    # ---- the operations (synchronous, atomic under the lock)

    def _key(self, res: ResourceDef, namespace: str | None, name: str) -> ObjKey:
        return ((namespace or "default") if res.namespaced else "", name)

    def read_obj(self, res: ResourceDef, namespace: str | None, name: str) -> Obj:
        with self.lock:
            obj = self.objects[res.gr].get(self._key(res, namespace, name))
            if obj is None:
                raise _not_found(res, name)
            return self._out(res, obj)

    def _out(self, res: ResourceDef, obj: Obj) -> Obj:
        out = copy.deepcopy(obj)
        out["apiVersion"], out["kind"] = res.api_version, res.kind
        return out

    def list_objs(
        self, res: ResourceDef, namespace: str | None, labels: str = "", fields: str = ""
    ) -> tuple[list[Obj], str]:
        match = self._matcher(labels, fields)
        with self.lock:
            items = [
                self._out(res, obj)
                for (ns, _), obj in self.objects[res.gr].items()
                if (namespace is None or ns == namespace) and match(obj)
            ]
            return items, str(self.rv)

    @staticmethod
    def _matcher(labels: str, fields: str) -> Callable[[Obj], bool]:
        by_labels = _parse_label_selector(labels) if labels else None
        by_fields = _parse_field_selector(fields) if fields else None
        return lambda obj: (
            (by_labels is None or by_labels(obj.get("metadata", {}).get("labels") or {}))
            and (by_fields is None or by_fields(obj))
        )

    def create_obj(
        self, res: ResourceDef, namespace: str | None, body: Obj, strict: bool = False
    ) -> Obj:
        with self.lock:
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            if not isinstance(meta, dict):
                raise _bad_request("metadata must be an object")
            if res.namespaced:
                if namespace and meta.get("namespace") not in (None, "", namespace):
                    raise _bad_request(
                        "the namespace of the provided object does not match the namespace"
                        " sent on the request"
                    )
                namespace = namespace or meta.get("namespace") or "default"
                if ("", namespace) not in self.objects["", "namespaces"]:
                    raise _not_found(self.lookup("", "v1", "namespaces"), namespace)
                meta["namespace"] = namespace
            else:
                meta.pop("namespace", None)
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
            name = meta.get("name")
            if not name:
                cause = Cause(
                    "FieldValueRequired",
                    "metadata.name",
                    "metadata.name: Required value: name or generateName is required",
                )
                raise _invalid(res, "", [cause])
            key = self._key(res, namespace, name)
            if key in self.objects[res.gr]:
                raise ApiError(
                    status=409,
                    reason="AlreadyExists",
                    message=f'{res.group_resource_name} "{name}" already exists',
                    details={"name": name, "group": res.group, "kind": res.plural},
                )
            for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(k, None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
            if res.status or res.custom:
                meta["generation"] = 1
            if res.status and res.plural != "customresourcedefinitions":
                obj.pop("status", None)
            self._admit(res, obj, None, strict)
            meta["resourceVersion"] = self._next_rv()
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            self.objects[res.gr][key] = obj
            self._index(res, key, obj, None)
            self._emit(res, "ADDED", obj)
            if res.plural == "customresourcedefinitions":
                self._register_crd(obj)
            return self._out(res, obj)

    def _admit(self, res: ResourceDef, obj: Obj, old: Obj | None, strict: bool) -> None:
        """Per-resource admission: schemas for CRs, defaults for some built-ins."""
        name = obj["metadata"].get("name", "")
        if res.schema is not None:
            result = apply_schema(obj, res.schema, old)
            if result.pruned and strict:
                fields = ", ".join(f'unknown field "{p}"' for p in result.pruned)
                raise _bad_request(f"strict decoding error: {fields}")
            if result.causes:
                raise _invalid(res, name, result.causes)
        if res.plural == "namespaces":
            obj.setdefault("status", {})["phase"] = "Active"
        if res.plural == "customresourcedefinitions":
            self._admit_crd(res, obj)

    def _admit_crd(self, res: ResourceDef, crd: Obj) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        group, plural = spec.get("group", ""), names.get("plural", "")
        causes = []
        if crd["metadata"].get("name") != f"{plural}.{group}":
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    "metadata.name",
                    f'metadata.name: Invalid value: "{crd["metadata"].get("name")}": must be'
                    ' spec.names.plural+"."+spec.group',
                )
            )
        for path in ("spec.group", "spec.names.kind", "spec.names.plural", "spec.versions"):
            if not _get_path(crd, path):
                causes.append(Cause("FieldValueRequired", path, f"{path}: Required value"))
        if causes:
            raise _invalid(res, crd["metadata"].get("name", ""), causes)
        crd["status"] = {
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")],
            "conditions": [
                {"type": t, "status": "True", "reason": r, "lastTransitionTime": _now()}
                for t, r in (
                    ("NamesAccepted", "NoConflicts"),
                    ("Established", "InitialNamesAccepted"),
                )
            ],
        }

    def _register_crd(self, crd: Obj) -> None:
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            subresources = version.get("subresources") or {}
            scale = subresources.get("scale")
            self.register(
                ResourceDef(
                    group=spec["group"],
                    version=version["name"],
                    plural=names["plural"],
                    kind=names["kind"],
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    short_names=names.get("shortNames", []),
                    categories=names.get("categories", []),
                    singular=names.get("singular", names["kind"].lower()),
                    status="status" in subresources,
                    scale=None
                    if scale is None
                    else ScaleSpec(
                        spec_replicas=scale["specReplicasPath"],
                        status_replicas=scale["statusReplicasPath"],
                        label_selector=scale.get("labelSelectorPath"),
                    ),
                    schema=(version.get("schema") or {}).get("openAPIV3Schema")
                    or {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    custom=True,
                )
            )

    def _unregister_crd(self, crd: Obj) -> None:
        spec = crd["spec"]
        gr = (spec["group"], spec["names"]["plural"])
        try:
            res = self._storage(gr)
        except KeyError:
            return
        for key, obj in list(self.objects.get(gr, {}).items()):
            self._remove(res, key, obj)
        for k in [k for k, r in self.registry.items() if r.gr == gr]:
            del self.registry[k]

    def update_obj(
        self,
        res: ResourceDef,
        namespace: str | None,
        name: str,
        change: Callable[[Obj], Obj],
        subresource: str | None = None,
        strict: bool = False,
    ) -> Obj:
        """Replace an object by ``change(current)`` with the API server's rules for updates."""
        with self.lock:
            key = self._key(res, namespace, name)
            old = self.objects[res.gr].get(key)
            if old is None:
                raise _not_found(res, name)
            new = change(copy.deepcopy(old))
            if not isinstance(new, dict):
                raise _bad_request("the object must be a JSON object")
            meta = new.get("metadata")
            if not isinstance(meta, dict):
                meta = new["metadata"] = {}
            wanted_rv = meta.get("resourceVersion")
            if wanted_rv not in (None, "") and wanted_rv != old["metadata"]["resourceVersion"]:
                raise _conflict(res, name)
            if subresource == "status":  # only the status changes
                status = new.get("status")
                new = copy.deepcopy(old)
                if status is None:
                    new.pop("status", None)
                else:
                    new["status"] = status
            elif res.status and res.plural != "customresourcedefinitions":
                new.pop("status", None)  # the status does not change via the main resource
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
            meta = new["metadata"]
            for k in ("name", "namespace", "uid", "creationTimestamp", "generation"):
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
            for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(k, None)
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            new["apiVersion"], new["kind"] = res.api_version, res.kind
            self._admit(res, new, old, strict and subresource is None)
            if new == old:
                return self._out(res, old)  # a no-op: no new resourceVersion, no event
            if "generation" in meta:
                strip = ("metadata", "status", "apiVersion", "kind")
                if {k: v for k, v in new.items() if k not in strip} != {
                    k: v for k, v in old.items() if k not in strip
                }:
                    meta["generation"] = old["metadata"]["generation"] + 1
            meta["resourceVersion"] = self._next_rv()
            self.objects[res.gr][key] = new
            self._index(res, key, new, old)
            self._emit(res, "MODIFIED", new)
            if res.plural == "customresourcedefinitions":
                self._register_crd(new)
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                self._remove(res, key, new)
            return self._out(res, new)

    def delete_obj(
        self,
        res: ResourceDef,
        namespace: str | None,
        name: str,
        options: Obj | None = None,
    ) -> Obj:
        options = options or {}
        with self.lock:
            key = self._key(res, namespace, name)
            obj = self.objects[res.gr].get(key)
            if obj is None:
                raise _not_found(res, name)
            precondition = (options.get("preconditions") or {}).get("resourceVersion")
            if precondition and precondition != obj["metadata"]["resourceVersion"]:
                raise _conflict(res, name)
            if options.get("propagationPolicy") == "Orphan":
                self._orphan(obj["metadata"]["uid"])
            if obj["metadata"].get("finalizers"):
                if not obj["metadata"].get("deletionTimestamp"):
                    new = copy.deepcopy(obj)
                    new["metadata"].update(
                        deletionTimestamp=_now(),
                        deletionGracePeriodSeconds=0,
                        resourceVersion=self._next_rv(),
                    )
                    self.objects[res.gr][key] = new
                    self._emit(res, "MODIFIED", new)
                    obj = new
                return self._out(res, obj)
            return self._out(res, self._remove(res, key, obj))

    def _remove(self, res: ResourceDef, key: ObjKey, obj: Obj) -> Obj:
        """Really remove an object (no finalizers left), then collect its dependents."""
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        del self.objects[res.gr][key]
        self._index(res, key, None, obj)
        self._emit(res, "DELETED", gone)
        if res.plural == "customresourcedefinitions":
            self._unregister_crd(gone)
        if res.plural == "namespaces":
            for gr, objs in self.objects.items():
                for okey in [k for k in objs if k[0] == key[1]]:
                    self.delete_obj(self._storage(gr), okey[0], okey[1])
        uid = obj["metadata"]["uid"]
        if uid in self.dependents:
            try:
                asyncio.get_running_loop().call_soon(self._collect, uid)
            except RuntimeError:  # not in the server's loop (a direct call): collect now
                self._collect(uid)
        return gone

    def _collect(self, owner_uid: str) -> None:
        """The garbage collector: delete the dependents that have no owner left."""
        with self.lock:
            for gr, key in sorted(self.dependents.pop(owner_uid, set())):
                obj = self.objects.get(gr, {}).get(key)
                if obj is None:
                    continue
                owners = [r.get("uid") for r in obj["metadata"].get("ownerReferences", [])]
                if not any(uid in self.uids for uid in owners if uid != owner_uid):
                    with contextlib.suppress(ApiError):
                        self.delete_obj(self._storage(gr), key[0], key[1])

    def _orphan(self, owner_uid: str) -> None:
        for gr, key in sorted(self.dependents.pop(owner_uid, set())):
            obj = self.objects.get(gr, {}).get(key)
            if obj is not None:
                refs = obj["metadata"].get("ownerReferences", [])

                def strip(o: Obj, refs: list[Obj] = refs) -> Obj:
                    o["metadata"]["ownerReferences"] = [r for r in refs if r["uid"] != owner_uid]
                    return o

                self.update_obj(self._storage(gr), key[0] or None, key[1], strip)

    # ---- scale subresource

    def scale_of(self, res: ResourceDef, obj: Obj) -> Obj:
        assert res.scale is not None
        meta = obj["metadata"]
        if res.scale.label_selector:
            selector = _get_path(obj, res.scale.label_selector) or ""
        else:
            selector = _selector_string(_get_path(obj, res.scale.selector_object or ""))
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": _get_path(obj, res.scale.spec_replicas) or 0},
            "status": {
                "replicas": _get_path(obj, res.scale.status_replicas) or 0,
                "selector": selector,
            },
        }

    # ---- HTTP

    @override
    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock's Request._parse fails on some valid paths (``/api/v1/namespaces``), so the
        # request is built here: the same fields, without kmock's path guessing.
        try:
            body = await raw_request.read()
            request = kmock.Request(
                method=raw_request.method,
                url=raw_request.url,
                params=dict(raw_request.query),
                headers=dict(raw_request.headers),
                body=body,
                raw_request=raw_request,
            )
            return await self._handle(request)
        except kmock.KubernetesError as e:
            return await self._render_error(e)
        except Exception as e:
            return await self._render_error(e)

    @override
    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, kmock.KubernetesError):
            return aiohttp.web.json_response(_status_body(exc), status=exc.status)
        return await super()._render_error(exc)

    @override
    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if self._changed is None:
            self._changed = asyncio.Event()
        parsed = _parse_path(request.url.path)
        if parsed is None:
            if request.url.path in ("/healthz", "/livez", "/readyz"):
                return aiohttp.web.Response(text="ok")
            if request.url.path.startswith("/openapi/"):
                raise ApiError(status=404, reason="NotFound", message="404 page not found")
            path = request.url.path.rstrip("/") or "/"
            payload: kmock.Payload
            if path == "/":
                payload = await self._serve_root(request)
            elif path == "/api":
                payload = await self._serve_api(request)
            elif path == "/apis":
                payload = await self._serve_apis(request)
            elif path == "/version":
                payload = await self._serve_server_version(request)
            elif path.startswith("/apis/"):
                payload = await self._serve_group(request)
            else:
                raise ApiError(status=404, reason="NotFound", message="404 page not found")
            return aiohttp.web.json_response(payload)
        if parsed.plural is None:
            return aiohttp.web.json_response(self._discover(parsed))
        record = self._log_request(request, parsed)
        if self.authorize is not None and not self.authorize(record):
            raise _forbidden(record)
        res = self.lookup(parsed.group, parsed.version, parsed.plural)
        return await self._serve(request, parsed, res)

    def _log_request(self, request: kmock.Request, parsed: _Request) -> ApiRequest:
        assert parsed.plural is not None
        auth = request.headers.get("Authorization", "")
        method = request.method.value.upper()
        record = ApiRequest(
            user=auth.removeprefix("Bearer ").strip(),
            verb=_rbac_verb(method, parsed.name, dict(request.params)),
            group=parsed.group,
            resource=parsed.plural,
            subresource=parsed.subresource,
            namespace=parsed.namespace,
            name=parsed.name,
        )
        self.request_log.append(record)
        return record

    async def _serve(
        self, request: kmock.Request, parsed: _Request, res: ResourceDef
    ) -> aiohttp.web.StreamResponse:
        method, params, ns, name = request.method.value.upper(), request.params, None, parsed.name
        if res.namespaced:
            ns = parsed.namespace
        sub = parsed.subresource
        strict = params.get("fieldValidation") == "Strict"
        if sub not in (None, "status", "scale") or (sub == "scale" and res.scale is None):
            raise _not_found(res, f"{name}/{sub}")
        if method == "GET" and params.get("watch") in ("true", "1"):
            fields = params.get("fieldSelector", "")
            if name:
                fields = ",".join(filter(None, [fields, f"metadata.name={name}"]))
            return await self._watch(request, res, ns, params.get("labelSelector", ""), fields)
        body: Any = None
        if request.body:
            try:
                body = json.loads(request.body)
            except ValueError:
                raise _bad_request("the request body is not valid JSON") from None
        result: Obj
        if method == "GET" and name is None:
            items, rv = self.list_objs(
                res, ns, params.get("labelSelector", ""), params.get("fieldSelector", "")
            )
            result = {
                "apiVersion": res.api_version,
                "kind": f"{res.kind}List",
                "metadata": {"resourceVersion": rv},
                "items": items,
            }
        elif method == "GET" and name is not None:
            result = self.read_obj(res, ns, name)
            result = self.scale_of(res, result) if sub == "scale" else result
        elif method == "POST" and name is None:
            result = self.create_obj(res, ns, body or {}, strict)
            return aiohttp.web.json_response(result, status=201)
        elif method in ("PUT", "PATCH") and name is not None:
            change = self._changer(request, res, sub, method, body)
            result = self.update_obj(
                res, ns, name, change, "status" if sub == "status" else None, strict
            )
            result = self.scale_of(res, result) if sub == "scale" else result
        elif method == "DELETE" and name is not None:
            result = self.delete_obj(res, ns, name, body)
        elif method == "DELETE":
            items, _ = self.list_objs(
                res, ns, params.get("labelSelector", ""), params.get("fieldSelector", "")
            )
            for item in items:
                with contextlib.suppress(ApiError):
                    self.delete_obj(
                        res, item["metadata"].get("namespace"), item["metadata"]["name"]
                    )
            result = {"apiVersion": res.api_version, "kind": f"{res.kind}List", "items": items}
        else:
            raise ApiError(status=405, reason="MethodNotAllowed", message=f"{method} not allowed")
        return aiohttp.web.json_response(result)

    def _changer(
        self, request: kmock.Request, res: ResourceDef, sub: str | None, method: str, body: Any
    ) -> Callable[[Obj], Obj]:
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()

        def patch(current: Any) -> Any:
            if method == "PUT":
                return copy.deepcopy(body)
            if ctype == "application/json-patch+json":
                try:
                    return jsonpatch.apply_patch(current, body)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                    raise ApiError(status=422, reason="Invalid", message=str(e)) from None
            if ctype == "application/merge-patch+json":
                return _merge(current, body)
            if ctype == "application/strategic-merge-patch+json":
                return _merge(current, body, strategic=True)
            raise ApiError(
                status=415, reason="UnsupportedMediaType", message=f"unsupported patch {ctype}"
            )

        if sub != "scale":
            return patch

        def scale(current: Obj) -> Obj:
            new_scale = patch(self.scale_of(res, current))
            assert res.scale is not None
            wanted = (new_scale.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise _conflict(res, current["metadata"]["name"])
            _set_path(
                current, res.scale.spec_replicas, (new_scale.get("spec") or {}).get("replicas")
            )
            return current

        return scale

    def _discover(self, parsed: _Request) -> Obj:
        found = [
            r
            for r in self.registry.values()
            if r.group == parsed.group and r.version == parsed.version
        ]
        if not found:
            raise ApiError(status=404, reason="NotFound", message="404 page not found")
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": found[0].api_version,
            "resources": [entry for r in found for entry in r.discovery()],
        }

    def _groups(self) -> list[Obj]:
        versions: dict[str, list[str]] = {}
        for res in self.registry.values():
            if res.group and res.version not in versions.setdefault(res.group, []):
                versions[res.group].append(res.version)
        return [
            {
                "name": group,
                "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in vs],
                "preferredVersion": {"groupVersion": f"{group}/{vs[0]}", "version": vs[0]},
            }
            for group, vs in versions.items()
        ]

    @override
    async def _serve_apis(self, request: kmock.Request) -> kmock.Payload:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": self._groups()}

    @override
    async def _serve_group(self, request: kmock.Request) -> kmock.Payload:
        name = request.url.path.strip("/").split("/")[1]
        for group in self._groups():
            if group["name"] == name:
                return {"kind": "APIGroup", "apiVersion": "v1", **group}
        raise ApiError(status=404, reason="NotFound", message="404 page not found")

    @override
    async def _serve_root(self, request: kmock.Request) -> kmock.Payload:
        paths = ["/api", "/api/v1", "/apis", "/healthz", "/version"]
        for group in self._groups():
            paths += [f"/apis/{group['name']}"]
            paths += [f"/apis/{v['groupVersion']}" for v in group["versions"]]
        return {"paths": sorted(paths)}

    async def _watch(
        self, request: kmock.Request, res: ResourceDef, ns: str | None, labels: str, fields: str
    ) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        params = request.params
        match = self._matcher(labels, fields)
        timeout = float(params.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(raw)
        log = self.logs[res.gr]
        since = params.get("resourceVersion") or "0"
        with self.lock:
            if since == "0":  # a synthetic ADDED for every current object, then the news
                position: int | None = log.end
                lines = [
                    {"type": "ADDED", "object": self._out(res, obj)}
                    for (ons, _), obj in self.objects[res.gr].items()
                    if (ns is None or ons == ns) and match(obj)
                ]
            else:
                position = log.position_after(int(since))
                lines = []
        for line in lines:
            await response.write(json.dumps(line).encode() + b"\n")
        try:
            while True:
                changed = self._changed
                assert changed is not None
                if position is None or position < log.offset:  # fell out of the log
                    gone = ApiError(
                        status=410,
                        reason="Expired",
                        message=f"too old resource version: {since}",
                    )
                    line = {"type": "ERROR", "object": _status_body(gone)}
                    await response.write(json.dumps(line).encode() + b"\n")
                    break
                while position < log.end:
                    _, kind, obj = log.events[position - log.offset]
                    position += 1
                    if (ns is None or obj["metadata"].get("namespace") == ns) and match(obj):
                        event = {"type": kind, "object": self._out(res, obj)}
                        await response.write(json.dumps(event).encode() + b"\n")
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.closing:
                    break
                if raw.transport is None or raw.transport.is_closing():
                    return response  # the client went away: nothing to write to
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), timeout=min(remaining, 1.0))
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response


# ----------------------------------------------------------------------------- the runner


class KubernetesEmulator:
    """The emulator served over HTTP from a thread of its own, usable from sync and async tests.

    ``url`` is ``http://127.0.0.1:<port>``; ``kubeconfig`` a file with a cluster, a
    user and a current context named ``emulator`` (for kubectl, kopf and clients).
    The helpers (``get``, ``list``, ``create``, ``patch``, ``delete``, ``wait_for``,
    ``kubectl``) read and write the store directly; writes notify watchers.
    Resources are named as in kubectl: ``"pods"``, ``"sts"``, ``"streamjobs.keyshift.dev"``.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.handler = EmulatorHandler()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.url = ""
        self.kubeconfig = workdir / "kubeconfig"

    def start(self) -> KubernetesEmulator:
        self._thread = threading.Thread(target=self._run, name="k8s-emulator", daemon=True)
        self._thread.start()
        if not self._started.wait(30) or self._error is not None:
            raise RuntimeError(f"the emulator did not start: {self._error!r}")
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": "emulator"}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "emulator", "namespace": "default"},
                }
            ],
            "current-context": "emulator",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))  # JSON is YAML
        return self

    def kubeconfig_for(self, user: str) -> Path:
        """A kubeconfig whose requests carry ``user`` as their token, so that
        ``handler.request_log`` tells this client's requests from the others'."""
        config = json.loads(self.kubeconfig.read_text())
        config["users"][0]["user"]["token"] = user
        path = self.workdir / f"kubeconfig-{user}"
        path.write_text(json.dumps(config, indent=2))
        return path

    def requests_of(self, user: str) -> list[ApiRequest]:
        """The resource requests made with ``user``'s kubeconfig so far, oldest first."""
        with self.handler.lock:
            return [r for r in self.handler.request_log if r.user == user]

    def _run(self) -> None:
        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with self.handler, kmock.Server(self.handler) as server:
                self.url = f"http://127.0.0.1:{server.port}"
                self._started.set()
                await self._stop.wait()
                self.handler.close_watches()

        try:
            asyncio.run(serve())
        except BaseException as e:  # reported by start()
            self._error = e
            self._started.set()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    def __enter__(self) -> KubernetesEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- direct access (thread-safe: writes run in the server's loop to wake watchers)

    def _call(self, fn: Callable[[], Any]) -> Any:
        assert self._loop is not None

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(30)

    def resource(self, what: str) -> ResourceDef:
        return self.handler.find(what)

    def get(self, what: str, name: str, namespace: str | None = "default") -> Obj | None:
        try:
            return self.handler.read_obj(self.resource(what), namespace, name)
        except ApiError:
            return None

    def list(self, what: str, namespace: str | None = None, labels: str = "") -> list[Obj]:
        return self.handler.list_objs(self.resource(what), namespace, labels)[0]

    def create(self, what: str, body: Obj, namespace: str | None = None) -> Obj:
        res = self.resource(what)
        obj: Obj = self._call(lambda: self.handler.create_obj(res, namespace, body))
        return obj

    def patch(self, what: str, name: str, patch: Obj, namespace: str | None = "default") -> Obj:
        """A merge patch of the object; a ``status`` in it goes to the status subresource."""
        res = self.resource(what)
        main = {k: v for k, v in patch.items() if k != "status"}
        result: Obj = self._call(
            lambda: self.handler.update_obj(res, namespace, name, lambda o: _merge(o, main))
        )
        if "status" in patch:
            status = {"status": patch["status"]}
            result = self._call(
                lambda: self.handler.update_obj(
                    res, namespace, name, lambda o: _merge(o, status), "status"
                )
            )
        return result

    def delete(self, what: str, name: str, namespace: str | None = "default") -> Obj:
        res = self.resource(what)
        result: Obj = self._call(lambda: self.handler.delete_obj(res, namespace, name))
        return result

    def wait_for(
        self, condition: Callable[[], Any], timeout: float = 20.0, message: str = ""
    ) -> Any:
        """Poll ``condition()`` until truthy; its value is returned, or AssertionError."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting: {message or condition}")
            time.sleep(0.05)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the emulator; raises with its output if ``check`` fails."""
        cmd = ["kubectl", f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def events(self, what: str) -> Iterator[tuple[str, Obj]]:
        """The recent watch events of a resource (type, object), oldest first."""
        log = self.handler.logs[self.resource(what).gr]
        with self.handler.lock:
            items = [(kind, copy.deepcopy(obj)) for _, kind, obj in log.events]
        yield from items
