"""Where the e2e tests run: the emulator here, or a real cluster when asked.

The tests talk to the cluster only through :class:`Cluster`: ``kubectl``, reading
objects as JSON, killing a worker and restarting the operator. Two backends:

- **emulator** (default): the kmock-based API server of ``tests/k8s``, the pod
  runner of ``tests/e2e/kubelet.py`` (StatefulSet controller + kubelet running
  real worker processes), a real Valkey on loopback, and the operator as a
  subprocess (``python -m keyshift.controller.cli operator``).
- **real cluster**: with ``KUBECONFIG`` set and ``KEYSHIFT_E2E_IMAGE`` naming a
  worker image, plus ``KEYSHIFT_E2E_STORE_URL`` (a store the pods reach, e.g.
  ``redis://valkey.keyshift:6379``) and ``KEYSHIFT_E2E_LOCAL_STORE_URL`` (the same
  store as this machine reaches it, e.g. through ``kubectl port-forward``). The
  operator must already run there (``helm install``); it is restarted by deleting
  its pod (label ``app.kubernetes.io/name=keyshift-operator``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support import REPO

if TYPE_CHECKING:
    from tests.e2e.kubelet import PodRunner
    from tests.k8s.emulator import KubernetesEmulator
    from tests.prometheus_server import PrometheusServer

Obj = dict[str, Any]


def real_cluster_settings() -> dict[str, str] | None:
    """The real-cluster settings, or None when the tests run on the emulator."""
    names = ("KUBECONFIG", "KEYSHIFT_E2E_IMAGE", "KEYSHIFT_E2E_STORE_URL",
             "KEYSHIFT_E2E_LOCAL_STORE_URL")  # fmt: skip
    if not os.environ.get("KEYSHIFT_E2E_IMAGE"):
        return None
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        raise RuntimeError(f"a real-cluster e2e run needs {', '.join(missing)} set too")
    return {n: os.environ[n] for n in names}


class OperatorProcess:
    """``keyshift operator`` as a subprocess against the emulator; stopped by its PID."""

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        namespace: str = "default",
        options: tuple[str, ...] = ("--standalone",),
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log = log
        self.namespace = namespace
        self.options = options
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self, **extra_env: str) -> OperatorProcess:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **extra_env}
        cmd = [sys.executable, "-m", "keyshift.controller.cli", "operator",
               "--namespace", self.namespace, *self.options]  # fmt: skip
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        return self

    def wait_exit(self, timeout: float) -> int:
        assert self.popen is not None
        return self.popen.wait(timeout)

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies under the operator."""
        if self.popen is not None and self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        os.kill(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def output(self, tail: int = 80) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(lines[-tail:])


class Cluster:
    """What a test does to the cluster; see the module docstring for the two backends."""

    def __init__(
        self,
        kubectl: Callable[..., subprocess.CompletedProcess[str]],
        *,
        store_url: str,
        local_store_url: str,
        image: str,
        delete_worker_pod: Callable[[str, float], None],
        crash_operator_during: Callable[[Callable[[], None]], None],
        diagnostics: Callable[[], str],
        operator_metrics: Callable[[], str] | None = None,
        namespace: str = "default",
    ) -> None:
        self._kubectl = kubectl
        self.store_url = store_url
        self.local_store_url = local_store_url
        self.image = image
        self.delete_worker_pod = delete_worker_pod
        """``delete_worker_pod(pod, hold)``: delete a worker's pod; on the emulator its
        re-creation is held back ``hold`` seconds (a node that is slow to come back), on a
        real cluster the StatefulSet re-creates it at once."""
        self.crash_operator_during = crash_operator_during
        """``crash_operator_during(start_rescale)``: the operator dies in the middle of the
        rescale that ``start_rescale`` asks for, and a new one is started."""
        self.diagnostics = diagnostics
        self.operator_metrics = operator_metrics
        """The operator's /metrics text, where the test can reach it (None: it cannot)."""
        self.namespace = namespace

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        return self._kubectl(*args, input=input, check=check).stdout

    def run_kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl whose failure is the caller's to check."""
        return self._kubectl(*args, input=input, check=False)

    def get(self, kind: str, name: str) -> Obj | None:
        proc = self._kubectl("get", kind, name, "-n", self.namespace, "-o", "json", check=False)
        if proc.returncode != 0:
            return None
        obj: Obj = json.loads(proc.stdout)
        return obj

    def list(self, kind: str, selector: str = "") -> list[Obj]:
        args = ["get", kind, "-n", self.namespace, "-o", "json"]
        if selector:
            args += ["-l", selector]
        items: list[Obj] = json.loads(self.kubectl(*args))["items"]
        return items

    def wait(self, what: str, condition: Callable[[], Any], timeout: float) -> Any:
        """Poll ``condition`` until truthy (its value is returned) or fail with diagnostics."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}\n{self.diagnostics()}"
                )
            time.sleep(0.2)


@contextlib.contextmanager
def pods_scraped(
    k8s: KubernetesEmulator, pods: PodRunner, prometheus: PrometheusServer
) -> Iterator[None]:
    """Keep Prometheus' targets equal to the worker pods' local metrics ports, as a
    ServiceMonitor would (the pod runner's pods listen on local ports)."""
    stop = threading.Event()

    def follow() -> None:
        last: list[str] = []
        while not stop.wait(0.3):
            ports = [pods.http_port_of(p["metadata"]["name"])
                     for p in k8s.list("pods", "default")]  # fmt: skip
            targets = sorted(f"127.0.0.1:{port}" for port in ports if port)
            if targets != last:
                prometheus.set_targets(targets)
                last = targets

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        prometheus.set_targets([])
