"""The Kubernetes "restricted" Pod Security Standard, checked field by field.

:func:`violations` lists what in a pod spec breaks the restricted profile (as the
``PodSecurity`` admission controller enforces it, policy version 1.30), plus a
read-only root filesystem, which this project asks of every container too. A
container's own ``securityContext`` overrides the pod's, as in Kubernetes.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

ALLOWED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip
ALLOWED_CAPABILITIES = {"NET_BIND_SERVICE"}


def _effective(pod: Obj, container: Obj, field: str) -> Any:
    own = (container.get("securityContext") or {}).get(field)
    return own if own is not None else (pod.get("securityContext") or {}).get(field)


def violations(pod: Obj) -> list[str]:
    """What in ``pod`` (a PodSpec) the restricted profile forbids; empty if nothing."""
    found: list[str] = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"{field} is on")
    for volume in pod.get("volumes") or []:
        kind = next(k for k in volume if k != "name")
        if kind not in ALLOWED_VOLUMES:
            found.append(f"volume {volume['name']} is a {kind}")
    containers = [*(pod.get("initContainers") or []), *pod["containers"]]
    for c in containers:
        name = c["name"]
        context = c.get("securityContext") or {}
        if _effective(pod, c, "runAsNonRoot") is not True:
            found.append(f"{name}: runAsNonRoot is not true")
        if _effective(pod, c, "runAsUser") == 0:
            found.append(f"{name}: runs as user 0")
        seccomp = (_effective(pod, c, "seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccomp profile {seccomp or 'unset'}")
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name}: capabilities not dropped (drop: [ALL])")
        added = set(capabilities.get("add") or []) - ALLOWED_CAPABILITIES
        if added:
            found.append(f"{name}: adds capabilities {sorted(added)}")
        if context.get("readOnlyRootFilesystem") is not True:
            found.append(f"{name}: root filesystem is writable")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            found.append(f"{name}: uses a host port")
    return found
