"""RBAC rules and API requests in one shape: ``(apiGroup, resource[/subresource], verb)``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from tests.k8s.emulator import ApiRequest


class Grant(NamedTuple):
    group: str
    resource: str  # "streamjobs" or "streamjobs/status"
    verb: str

    def __str__(self) -> str:
        return f"{self.verb} {self.resource}.{self.group or 'core'}"


def grants(rules: Iterable[dict[str, Any]]) -> set[Grant]:
    """Every (group, resource, verb) the rules allow; wildcards and names are refused,
    since a least-privilege Role has none."""
    out: set[Grant] = set()
    for rule in rules:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule, rule
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"a wildcard in {field}: {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.update(Grant(group, resource, verb) for verb in rule["verbs"])
    return out


def needed(request: ApiRequest) -> Grant:
    """What RBAC checks for one request."""
    resource = request.resource
    if request.subresource:
        resource = f"{resource}/{request.subresource}"
    return Grant(request.group, resource, request.verb)


def role_allows(role: dict[str, Any]) -> Callable[[ApiRequest], bool]:
    """Whether RBAC lets a request through with this Role (its namespace only) or
    ClusterRole (any namespace, and the cluster scope)."""
    allowed = grants(role["rules"])
    namespace = role["metadata"].get("namespace") if role["kind"] == "Role" else None

    def allows(request: ApiRequest) -> bool:
        in_scope = namespace is None or request.namespace == namespace
        return in_scope and needed(request) in allowed

    return allows
