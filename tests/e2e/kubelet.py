"""A pod runner for end-to-end tests: the StatefulSet controller and a kubelet, in one object.

The Kubernetes emulator (``tests.k8s``) stores objects but runs nothing.  ``PodRunner``
watches it over HTTP and plays the two missing parts for StatefulSets, so the operator's
``<job>-worker`` StatefulSets get real worker processes on this machine::

    runner = PodRunner(k8s.url, tmp_path / "kubelet").start()   # or the ``pod_runner`` fixture
    k8s.kubectl("apply", "-f", "sts.yaml", "--validate=false")
    runner.wait_ready(["web-0", "web-1"], timeout=10)
    runner.kill("web-1", hold=5)          # SIGKILL; the pod stays NotReady for 5 s
    ...
    runner.stop()                         # every process it started is killed

**StatefulSet controller** (``podManagementPolicy: Parallel`` whatever the spec says):
for each ordinal ``i < spec.replicas`` a Pod ``<sts>-<i>`` is created from
``spec.template`` (its labels plus ``statefulset.kubernetes.io/pod-name``,
``apps.kubernetes.io/pod-index`` and ``controller-revision-hash``; its annotations; its
spec plus ``hostname``, ``subdomain`` = ``spec.serviceName`` and ``nodeName``), owned by
the StatefulSet (``controller: true``); Pods with an ordinal ``>= replicas`` are deleted;
a deleted Pod whose ordinal is still wanted is created again once the old one is gone
(and after ``hold(pod, seconds)`` expires, if a test set one).  The StatefulSet's status
(``observedGeneration``, ``replicas``, ``readyReplicas``, ``availableReplicas``,
``currentReplicas``, ``updatedReplicas``, ``currentRevision``, ``updateRevision``) is kept
up to date through the status subresource.  A changed pod template is only used for Pods
created afterwards (like ``updateStrategy: OnDelete``): ``updatedReplicas`` counts the
Pods made from the current template.  ``minReadySeconds`` is ignored (available = ready).

**Graceful deletion.** The emulator removes an object without finalizers at once, which
would let a new ``<sts>-<i>`` start while the old process is still terminating.  So every
Pod this runner creates carries the finalizer ``test.keyshift.dev/kubelet``: a delete
(kubectl, the operator, scale-down, garbage collection of the StatefulSet) only sets
``deletionTimestamp``; the kubelet then SIGTERMs the process, waits up to
``terminationGracePeriodSeconds`` (default 30, capped at ``MAX_GRACE`` = 20 s), SIGKILLs
it, and removes the finalizer, which lets the emulator remove the Pod, as a real
kubelet does.  A Pod removed outright (DELETED event) has its process stopped the same way.

**Kubelet**, for every Pod with a StatefulSet as its controller (in the watched
namespace, or all namespaces):

* one local process from the *first* container: ``command`` + ``args`` (``args`` alone
  are the command line when there is no ``command``, since there is no image entrypoint);
  a leading ``python``/``python3``/``pythonX.Y`` (any directory) becomes ``sys.executable``,
  so the test's venv runs it; ``$(VAR)`` references are expanded as Kubernetes does; the
  working directory is the repository root (``workingDir`` is ignored); started with
  ``start_new_session=True`` and only ever signalled by its own process group; other
  containers, init containers, ``securityContext`` and ``resources`` are ignored;
* environment: ``os.environ`` + ``envFrom`` + ``env`` (``value``, ``valueFrom.fieldRef``
  for ``metadata.name|namespace|uid``, ``metadata.labels['..']``,
  ``metadata.annotations['..']``, ``status.podIP``, ``status.hostIP``, ``spec.nodeName``,
  ``spec.serviceAccountName``; ``valueFrom.secretKeyRef`` and ``configMapKeyRef`` read
  from the emulator, Secret data base64-decoded; ``optional`` honoured) + ``HOSTNAME=<pod>``
  + ``PYTHONUNBUFFERED=1`` (unless the container sets it; so logs survive a SIGKILL); a
  missing ConfigMap/Secret keeps the container waiting (``CreateContainerConfigError``)
  and is retried every second, a command that cannot be executed (``RunContainerError``)
  after a back-off;
* volumes: ``configMap`` and ``secret`` (``items`` or every key; ``data``, ``binaryData``
  and ``stringData``) are written once, when the Pod starts, to
  ``<dir>/pods/<ns>.<pod>.<uid8>/<volume>/``; ``emptyDir`` and every other kind is an empty
  directory there.  There is no mount namespace, so **paths are rewritten**: every
  occurrence of a ``volumeMounts[].mountPath`` as a path prefix (the whole path, or
  followed by ``/``) in ``command``, ``args`` and the container's env values is replaced by
  the local directory (plus ``subPath``), e.g. ``--manifest /etc/keyshift/job.yaml`` ->
  ``--manifest <dir>/pods/default.x-0.1a2b3c4d/manifest/job.yaml``;
* ports: every Pod is on 127.0.0.1, so each Pod gets a free local port of its own
  (recorded in the annotation ``test.keyshift.dev/http-port``, ``http_port_of(pod)``);
  ``KEYSHIFT_HTTP_HOST=127.0.0.1`` and ``KEYSHIFT_HTTP_PORT=<port>`` override the
  container's values (the keyshift worker reads them), ``--http-host``/``--http-port``
  arguments are rewritten to them too, and the readiness probe is sent to that port
  whatever port it names;
* readiness: the ``readinessProbe`` ``httpGet`` path on ``127.0.0.1:<port>`` (2xx/3xx is a
  success) or ``tcpSocket`` connect, every ``min(periodSeconds, PROBE_PERIOD_CAP)``
  seconds (0.5 s, to keep tests fast), ``initialDelaySeconds`` ignored,
  ``failureThreshold``/``successThreshold`` honoured; no probe (or an ``exec`` probe, not
  supported): ready while the process runs.  Liveness and startup probes are ignored;
* status: ``phase`` Pending then Running, ``podIP``/``hostIP`` 127.0.0.1, ``startTime``,
  conditions ``PodScheduled``, ``Initialized``, ``ContainersReady``, ``Ready`` (a
  ``lastTransitionTime`` changes only on a transition), ``containerStatuses`` with
  ``ready``, ``started``, ``restartCount``, ``state`` (waiting/running/terminated with
  ``exitCode``, 128+signal for a signal, and the ``message`` the process left in the file
  named by ``KEYSHIFT_TERMINATION_LOG``, the stand-in for ``terminationMessagePath``) and
  ``lastState``;
* ``restartPolicy: Always`` whatever the spec says: an exited process is restarted after
  a back-off (1 s, doubling, capped at ``BACKOFF_CAP``; reset after 10 s of running); the
  Pod is NotReady meanwhile, its container ``terminated``;
* output: stdout and stderr of every run of a Pod go to ``log_of(pod)`` (one file per Pod
  name, appended across restarts and re-creations); ``logs()`` gathers them all for
  failure messages.

Test controls: ``kill(pod, hold=s)``, ``hold(pod, s)`` (no re-creation for ``s``
seconds after a delete), ``pid_of(pod)``, ``http_port_of(pod)``, ``wait_ready(pods)``,
``stop()``.  Everything runs on one asyncio loop in a background thread; the public
methods are called from the test's thread.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx

from keyshift.store.server import free_port

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
FINALIZER = "test.keyshift.dev/kubelet"
PORT_ANNOTATION = "test.keyshift.dev/http-port"
NODE_NAME = "kubelet-emulator"
LOCAL_IP = "127.0.0.1"
PROBE_PERIOD_CAP = 0.5  # seconds between readiness probes at most
MAX_GRACE = 20.0  # terminationGracePeriodSeconds is capped at this
BACKOFF_START, BACKOFF_CAP, BACKOFF_RESET = 1.0, 8.0, 10.0  # restart back-off, seconds
TICK = 0.05  # how often a pod's process is polled
RESYNC = 0.5  # every StatefulSet is reconciled at least this often
PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace") or "default", meta["name"]


def _controller_of(pod: Obj) -> Obj | None:
    """The pod's controlling StatefulSet reference, if it has one."""
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "StatefulSet":
            return dict(ref)
    return None


def _ordinal(pod_name: str, sts_name: str) -> int | None:
    prefix, _, tail = pod_name.rpartition("-")
    return int(tail) if prefix == sts_name and tail.isdigit() else None


def _is_ready(pod: Obj) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


# ----------------------------------------------------------------------------- pure helpers


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: known names are replaced, ``$$`` is a literal ``$``."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return variables[name] if name in variables else m.group(0)

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, text)


def path_rewriter(mounts: Mapping[str, str]) -> Callable[[str], str]:
    """A function replacing each ``mountPath`` used as a path prefix by its local directory.

    A mount path matches where it starts a path (at the start of the string or after a
    character that cannot be part of a path, like ``=``, ``:``, space) and ends one (at the
    end or before ``/`` or such a character).  Longer mount paths win, one pass, so a local
    directory is never rewritten again.
    """
    if not mounts:
        return lambda text: text
    paths = sorted((p.rstrip("/") or "/" for p in mounts), key=len, reverse=True)
    local = {p.rstrip("/") or "/": d for p, d in mounts.items()}
    pattern = re.compile(
        r"(?<![\w.~/-])(" + "|".join(re.escape(p) for p in paths) + r")(?=/|$|[^\w.~-])"
    )
    return lambda text: pattern.sub(lambda m: local[m.group(1)], text)


def _override_args(args: list[str], options: Mapping[str, str]) -> list[str]:
    """``--opt X`` and ``--opt=X`` get the value ``options[--opt]``."""
    out: list[str] = []
    it = iter(args)
    for arg in it:
        name, eq, _ = arg.partition("=")
        if name in options and eq:
            out.append(f"{name}={options[name]}")
        elif arg in options:
            out.append(arg)
            if next(it, None) is not None:
                out.append(options[arg])
        else:
            out.append(arg)
    return out


def _field_ref(pod: Obj, path: str) -> str:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.*)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", NODE_NAME),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": LOCAL_IP,
        "status.hostIP": LOCAL_IP,
        "status.podIPs": LOCAL_IP,
        "status.hostIPs": LOCAL_IP,
    }
    if path not in simple:
        raise ConfigError(f"unsupported fieldRef {path!r}")
    return str(simple[path])


def _decoded(obj: Obj, secret: bool) -> dict[str, bytes]:
    """The key -> bytes data of a ConfigMap or Secret."""
    out: dict[str, bytes] = {}
    if secret:
        out.update({k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()})
        out.update({k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()})
    else:
        out.update({k: str(v).encode() for k, v in (obj.get("data") or {}).items()})
        out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return out


async def _exit_of(proc: subprocess.Popen[bytes], seconds: float) -> None:
    """Wait up to ``seconds`` for the process to exit (polled: it is not our child
    watcher's, and a thread blocked in ``wait`` would hold up ``stop()``)."""
    for _ in range(max(1, int(seconds / TICK))):
        if proc.poll() is not None:
            return
        await asyncio.sleep(TICK)


class ConfigError(Exception):
    """The container cannot start yet: a missing ConfigMap, Secret or key."""


# ----------------------------------------------------------------------------- one pod


class _Pod:
    """The kubelet's side of one Pod (one uid): its process, probes and status."""

    def __init__(self, runner: PodRunner, pod: Obj) -> None:
        self.runner = runner
        self.pod = pod
        self.key = _key(pod)
        self.uid: str = pod["metadata"]["uid"]
        self.dir = runner.dir / "pods" / f"{self.key[0]}.{self.key[1]}.{self.uid[:8]}"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # monotonic, of the current process
        self.starts = 0
        self.restart_at = 0.0  # monotonic: no (re)start before
        self.backoff = BACKOFF_START
        self.kill_hold: float | None = None  # set by kill(): the next restart waits so long
        self.ready = False
        self.probe_ok = 0
        self.probe_failed = 0
        self.next_probe = 0.0
        self.ever_started = False
        self.volumes_done = False
        self.state: Obj = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: Obj = {}
        self.last_exit: Obj | None = None
        self.start_time = _now()
        self.transitions: dict[str, tuple[str, str]] = {}
        self.published: Obj | None = None
        self.terminating = asyncio.Event()
        self.wake = asyncio.Event()
        self.done = asyncio.Event()  # the process is gone for good
        self.task: asyncio.Task[None] | None = None

    @property
    def container(self) -> Obj:
        containers = (self.pod.get("spec") or {}).get("containers") or [{}]
        first: Obj = containers[0]
        return first

    @property
    def pid(self) -> int | None:
        proc = self.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    # ---- the life of the pod

    async def run(self) -> None:
        try:
            await self.runner._patch(
                self.key, {"metadata": {"annotations": {PORT_ANNOTATION: str(self.port)}}}
            )
            while not self.terminating.is_set():
                await self._step()
                await self._publish()
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), TICK)
            await self._terminate()
        finally:
            self._signal(signal.SIGKILL)  # only does something when cancelled (stop())
            self.done.set()

    async def _step(self) -> None:
        now = time.monotonic()
        proc = self.proc
        if proc is None:
            if now >= self.restart_at:
                try:
                    await self._start()
                except ConfigError as e:
                    reason = (
                        "CreateContainerConfigError" if self.volumes_done else "ContainerCreating"
                    )
                    self.state = {"waiting": {"reason": reason, "message": str(e)}}
                    self.restart_at = now + 1.0
                except OSError as e:  # the command cannot be executed: back off and retry
                    with self.runner.log_of(self.key[1], self.key[0]).open("a") as log:
                        log.write(f"=== {_now()} cannot start: {e}\n")
                    self.state = {"waiting": {"reason": "RunContainerError", "message": str(e)}}
                    self.restart_at = now + self.backoff
                    self.backoff = min(self.backoff * 2, BACKOFF_CAP)
            return
        code = proc.poll()
        if code is not None:
            self._exited(code)
        elif now >= self.next_probe:
            await self._probe()

    async def _start(self) -> None:
        container = self.container
        if not self.volumes_done:
            await self._write_volumes()
            self.volumes_done = True
        mounts = {
            m["mountPath"]: str(self.dir / m["name"] / m.get("subPath", ""))
            for m in container.get("volumeMounts") or []
        }
        rewrite = path_rewriter({k: v.rstrip("/") for k, v in mounts.items()})
        env = await self._container_env(container, rewrite)
        argv = [*(container.get("command") or []), *(container.get("args") or [])]
        if not argv:
            raise ConfigError("the container has neither command nor args")
        argv = [rewrite(expand(a, env)) for a in argv]
        argv = _override_args(argv, {"--http-host": LOCAL_IP, "--http-port": str(self.port)})
        if PYTHON.match(Path(argv[0]).name):
            argv[0] = sys.executable
        process_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        self.termination_log = self.dir / "termination-log"
        self.termination_log.unlink(missing_ok=True)
        process_env.update(
            HOSTNAME=self.key[1], KEYSHIFT_HTTP_HOST=LOCAL_IP, KEYSHIFT_HTTP_PORT=str(self.port),
            KEYSHIFT_TERMINATION_LOG=str(self.termination_log),
        )  # fmt: skip
        self.proc = self._spawn(argv, process_env)
        self.started_at = time.monotonic()
        self.starts += 1
        if self.last_exit is not None:
            self.last_state = {"terminated": self.last_exit}
        self.ever_started = True
        self.state = {"running": {"startedAt": _now()}}
        self.probe_ok = self.probe_failed = 0
        self.next_probe = 0.0
        self.ready = self._probe_spec() is None

    def _spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start the process in a session of its own, its output appended to the pod's log."""
        log = self.runner.log_of(self.key[1], self.key[0])
        with log.open("ab") as out:
            out.write(f"=== {_now()} start {self.uid[:8]} #{self.starts}: {argv}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.runner._procs.append(proc)
        return proc

    def _exited(self, code: int) -> None:
        now = time.monotonic()
        exit_code = 128 - code if code < 0 else code
        terminated: Obj = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": (self.state.get("running") or {}).get("startedAt", _now()),
            "finishedAt": _now(),
        }
        if code < 0:
            terminated["signal"] = -code
        with contextlib.suppress(OSError):
            message = self.termination_log.read_text(errors="replace").strip()
            if message:
                terminated["message"] = message[:4096]
        self.state = {"terminated": terminated}
        self.last_exit = terminated
        self.proc = None
        self.ready = False
        if now - self.started_at >= BACKOFF_RESET:
            self.backoff = BACKOFF_START
        if self.kill_hold is not None:
            self.restart_at, self.kill_hold = now + self.kill_hold, None
        else:
            self.restart_at = now + self.backoff
            self.backoff = min(self.backoff * 2, BACKOFF_CAP)

    def _signal(self, sig: signal.Signals) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:  # not reaped: its group id is ours
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)

    def kill(self, hold: float) -> int | None:
        pid = self.pid
        self.kill_hold = hold
        if pid is None:  # not running: the next start waits too
            self.restart_at = max(self.restart_at, time.monotonic() + hold)
            self.kill_hold = None
        self._signal(signal.SIGKILL)
        self.wake.set()
        return pid

    async def _terminate(self) -> None:
        grace = (self.pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        grace = min(float(30 if grace is None else grace), MAX_GRACE)
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self._signal(signal.SIGTERM)
            await _exit_of(proc, grace)
            self._signal(signal.SIGKILL)
            await _exit_of(proc, 30.0)
        if proc is not None:
            code = proc.poll()
            assert code is not None
            self._exited(code)
        self.done.set()
        await self._publish()
        await self.runner._remove_finalizer(self.key, self.uid)

    # ---- readiness

    def _probe_spec(self) -> Obj | None:
        probe: Obj | None = self.container.get("readinessProbe")
        if probe and ("httpGet" in probe or "tcpSocket" in probe):
            return probe
        return None

    async def _probe(self) -> None:
        probe = self._probe_spec()
        if probe is None:
            self.ready = True
            return
        period = min(float(probe.get("periodSeconds") or 10), PROBE_PERIOD_CAP)
        timeout = min(float(probe.get("timeoutSeconds") or 1), 1.0)
        self.next_probe = time.monotonic() + period
        try:
            if "httpGet" in probe:
                path = probe["httpGet"].get("path") or "/"
                url = f"http://{LOCAL_IP}:{self.port}/{path.lstrip('/')}"
                response = await self.runner._probes.get(url, timeout=timeout)
                ok = 200 <= response.status_code < 400
            else:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(LOCAL_IP, self.port), timeout
                )
                writer.close()
                ok = True
        except (httpx.HTTPError, OSError, TimeoutError):
            ok = False
        if ok:
            self.probe_ok, self.probe_failed = self.probe_ok + 1, 0
            if self.probe_ok >= int(probe.get("successThreshold") or 1):
                self.ready = True
        else:
            self.probe_ok, self.probe_failed = 0, self.probe_failed + 1
            if self.probe_failed >= int(probe.get("failureThreshold") or 3):
                self.ready = False

    # ---- volumes and environment

    async def _write_volumes(self) -> None:
        for volume in (self.pod.get("spec") or {}).get("volumes") or []:
            target = self.dir / volume["name"]
            target.mkdir(parents=True, exist_ok=True)
            # a projected volume: each of its sources written into the one directory
            sources = (volume.get("projected") or {}).get("sources") or [volume]
            for source in sources:
                await self._write_source(source, target)

    async def _write_source(self, volume: Obj, target: Path) -> None:
        """One configMap or secret (a volume's, or a projected volume's source) into ``target``."""
        if "configMap" not in volume and "secret" not in volume:
            return
        secret = "secret" in volume
        source = volume["secret" if secret else "configMap"]
        # a secret volume names it secretName, a projected volume's source name
        name = source.get("secretName" if secret else "name") or source.get("name", "")
        obj = await self.runner._read("secrets" if secret else "configmaps", self.key[0], name)
        if obj is None:
            if source.get("optional"):
                return
            kind = "secret" if secret else "configmap"
            raise ConfigError(f'{kind} "{name}" not found')
        data = _decoded(obj, secret)
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            if item["key"] not in data:
                if source.get("optional"):
                    continue
                raise ConfigError(f'key "{item["key"]}" not in {name}')
            path = target / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data[item["key"]])

    async def _lookup(self, what: str, ref: Obj) -> str | None:
        obj = await self.runner._read(what, self.key[0], ref.get("name", ""))
        data = _decoded(obj, what == "secrets") if obj is not None else {}
        if ref["key"] in data:
            return data[ref["key"]].decode()
        if ref.get("optional"):
            return None
        raise ConfigError(f'{what} "{ref.get("name")}" or its key "{ref["key"]}" not found')

    async def _container_env(self, container: Obj, rewrite: Callable[[str], str]) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            secret = "secretRef" in source
            ref = source.get("secretRef" if secret else "configMapRef") or {}
            obj = await self.runner._read(
                "secrets" if secret else "configmaps", self.key[0], ref.get("name", "")
            )
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f"envFrom: {ref.get('name')} not found")
            prefix = source.get("prefix", "")
            env.update({prefix + k: v.decode() for k, v in _decoded(obj, secret).items()})
        for var in container.get("env") or []:
            name, source = var["name"], var.get("valueFrom")
            value: str | None
            if source is None:
                value = expand(str(var.get("value", "")), env)
            elif "fieldRef" in source:
                value = _field_ref(self.pod, source["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in source:
                value = await self._lookup("secrets", source["secretKeyRef"])
            elif "configMapKeyRef" in source:
                value = await self._lookup("configmaps", source["configMapKeyRef"])
            else:
                raise ConfigError(f"env {name}: unsupported valueFrom {sorted(source)}")
            if value is not None:
                env[name] = rewrite(value)
        return env

    # ---- status

    def _condition(self, kind: str, true: bool) -> Obj:
        status = "True" if true else "False"
        previous = self.transitions.get(kind)
        if previous is None or previous[0] != status:
            self.transitions[kind] = previous = (status, _now())
        return {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": previous[1],
        }

    def status(self) -> Obj:
        container = self.container
        status: Obj = {
            "phase": "Running" if self.ever_started else "Pending",
            "conditions": [
                self._condition("PodScheduled", True),
                self._condition("Initialized", True),
                self._condition("ContainersReady", self.ready),
                self._condition("Ready", self.ready),
            ],
            "hostIP": LOCAL_IP,
            "hostIPs": [{"ip": LOCAL_IP}],
            "podIP": LOCAL_IP,
            "podIPs": [{"ip": LOCAL_IP}],
            "startTime": self.start_time,
            "qosClass": "BestEffort",
            "containerStatuses": [
                {
                    "name": container.get("name", ""),
                    "image": container.get("image", ""),
                    "imageID": "",
                    "containerID": f"process://{self.pid}" if self.pid else "",
                    "ready": self.ready,
                    "started": self.pid is not None,
                    "restartCount": max(self.starts - 1, 0),
                    "state": self.state,
                    "lastState": self.last_state,
                }
            ],
        }
        return status

    async def _publish(self) -> None:
        status = self.status()
        if status != self.published:
            await self.runner._put_status("pods", self.key, status, self.uid)
            self.published = status


# ----------------------------------------------------------------------------- the runner


class PodRunner:
    """The StatefulSet controller and the kubelet for the emulator at ``url`` (see module doc).

    ``namespace``: watch one namespace, or all (None).  ``workdir`` holds the pods'
    volumes and logs.  Call ``start()`` (or use ``with``), and ``stop()`` at the end.
    """

    def __init__(self, url: str, workdir: Path, namespace: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.dir = Path(workdir)
        self.namespace = namespace
        self._sts: dict[Key, Obj] = {}
        self._pods: dict[Key, Obj] = {}
        self._agents: dict[str, _Pod] = {}  # by pod uid
        self._finished: set[str] = set()  # uids of pods whose process is gone for good
        self._background: set[asyncio.Task[None]] = set()
        self._procs: list[subprocess.Popen[bytes]] = []
        self._holds: dict[Key, float] = {}  # no re-creation before (monotonic)
        self._dirty: set[Key] = set()
        self._errors: list[str] = []  # what went wrong in the loop, for ``logs()``
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._synced = threading.Event()
        self._error: BaseException | None = None
        self._stopping: asyncio.Event | None = None
        self._wake: asyncio.Event | None = None
        self._api = httpx.Client(base_url=self.url, timeout=30, trust_env=False)
        self._client: httpx.AsyncClient
        self._probes: httpx.AsyncClient

    # ---- lifecycle

    def start(self) -> PodRunner:
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.dir / "pods").mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="pod-runner", daemon=True)
        self._thread.start()
        if not self._synced.wait(30) or self._error is not None:
            self.stop()
            raise RuntimeError(f"the pod runner did not start: {self._error!r}")
        return self

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop watching and kill every process this runner started (idempotent)."""
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(30)
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        self._api.close()

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stopping = asyncio.Event()
            self._wake = asyncio.Event()
            async with (
                httpx.AsyncClient(base_url=self.url, timeout=30, trust_env=False) as client,
                httpx.AsyncClient(trust_env=False) as probes,
            ):
                self._client, self._probes = client, probes
                sts_synced, pods_synced = asyncio.Event(), asyncio.Event()
                stopping = self._stopping

                async def synced() -> None:
                    await sts_synced.wait()
                    await pods_synced.wait()
                    self._synced.set()
                    await stopping.wait()

                tasks = [
                    asyncio.create_task(self._watch("/apis/apps/v1", "statefulsets", sts_synced)),
                    asyncio.create_task(self._watch("/api/v1", "pods", pods_synced)),
                    asyncio.create_task(self._reconcile_loop()),
                    asyncio.create_task(synced()),
                ]
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in tasks:
                    if task.done() and task.exception() is not None:
                        self._error = task.exception()
                agents = [a.task for a in self._agents.values() if a.task is not None]
                for task in [*tasks, *agents]:
                    task.cancel()
                await asyncio.gather(*tasks, *agents, return_exceptions=True)

        try:
            asyncio.run(main())
        except BaseException as e:
            self._error = e
        finally:
            self._synced.set()

    def _call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(30)

    # ---- test controls (called from the test's thread)

    def _agent(self, pod_name: str, namespace: str | None) -> _Pod | None:
        """The kubelet's record of the newest pod of that name (call in the loop)."""
        key = (namespace or self.namespace or "default", pod_name)
        agents = [a for a in self._agents.values() if a.key == key and not a.done.is_set()]
        agents.sort(key=lambda a: a.terminating.is_set())
        return agents[0] if agents else None

    def _ask(self, pod_name: str, namespace: str | None, what: Callable[[_Pod], T]) -> T | None:
        async def ask() -> T | None:
            agent = self._agent(pod_name, namespace)
            return what(agent) if agent is not None else None

        if self._thread is None or not self._thread.is_alive():
            return None
        return self._call(ask)

    def pid_of(self, pod_name: str, namespace: str | None = None) -> int | None:
        """The PID of the pod's running process (None if it has none now)."""
        return self._ask(pod_name, namespace, lambda a: a.pid)

    def http_port_of(self, pod_name: str, namespace: str | None = None) -> int | None:
        """The local port the pod's process serves on (its ``KEYSHIFT_HTTP_PORT``)."""
        return self._ask(pod_name, namespace, lambda a: a.port)

    def kill(self, pod_name: str, hold: float = 0.0, namespace: str | None = None) -> int | None:
        """SIGKILL the pod's process; it is restarted ``hold`` seconds later (no back-off).

        Meanwhile the pod is NotReady, phase Running, its container ``terminated``
        (exit code 137).  Returns the killed PID (None if nothing ran).
        """

        async def kill() -> int | None:
            agent = self._agent(pod_name, namespace)
            if agent is None:
                raise KeyError(f"no pod {pod_name} runs here")
            return agent.kill(hold)

        return self._call(kill)

    def hold(self, pod_name: str, seconds: float, namespace: str | None = None) -> None:
        """Do not re-create this pod (once deleted) for ``seconds`` from now."""
        key = (namespace or self.namespace or "default", pod_name)

        async def hold() -> None:
            self._holds[key] = time.monotonic() + seconds

        self._call(hold)

    def get_pod(self, pod_name: str, namespace: str | None = None) -> Obj | None:
        """The pod as the API server has it now (None if there is none)."""
        ns = namespace or self.namespace or "default"
        response = self._api.get(f"/api/v1/namespaces/{ns}/pods/{pod_name}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        pod: Obj = response.json()
        return pod

    def is_ready(self, pod_name: str, namespace: str | None = None) -> bool:
        pod = self.get_pod(pod_name, namespace)
        return pod is not None and not pod["metadata"].get("deletionTimestamp") and _is_ready(pod)

    def wait_ready(
        self, pod_names: Iterable[str], timeout: float = 20.0, namespace: str | None = None
    ) -> None:
        """Wait until every named pod is Ready in the API; TimeoutError with the logs if not."""
        names = list(pod_names)
        deadline = time.monotonic() + timeout
        while True:
            missing = [n for n in names if not self.is_ready(n, namespace)]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods not ready after {timeout}s: {missing}\n{self.logs()}")
            time.sleep(0.05)

    def log_of(self, pod_name: str, namespace: str | None = None) -> Path:
        """The file with the stdout and stderr of every run of this pod."""
        return self.dir / "logs" / f"{namespace or self.namespace or 'default'}.{pod_name}.log"

    def logs(self, tail: int = 100) -> str:
        """The last ``tail`` lines of every pod's log, for failure messages."""
        parts = []
        for path in sorted((self.dir / "logs").glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"----- {path.name}\n" + "\n".join(lines))
        errors = self._errors[-tail:] + ([repr(self._error)] if self._error else [])
        if errors:
            parts.append("----- pod runner errors\n" + "\n".join(errors))
        return "\n".join(parts) or "(no pod logs)"

    # ---- API access (in the loop)

    def _path(self, what: str, ns: str, name: str = "") -> str:
        base = "/apis/apps/v1" if what == "statefulsets" else "/api/v1"
        return f"{base}/namespaces/{ns}/{what}" + (f"/{name}" if name else "")

    async def _read(self, what: str, ns: str, name: str) -> Obj | None:
        response = await self._client.get(self._path(what, ns, name))
        if response.status_code == 404:
            return None
        response.raise_for_status()
        obj: Obj = response.json()
        return obj

    async def _patch(self, key: Key, patch: Obj, what: str = "pods") -> bool:
        response = await self._client.patch(
            self._path(what, *key),
            content=json.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if response.status_code == 404:
            return False
        response.raise_for_status()
        return True

    async def _put_status(self, what: str, key: Key, status: Obj, uid: str) -> None:
        """Replace the whole status of the object ``uid`` (a JSON patch: no stale key survives)."""
        patch: list[Obj] = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/status", "value": status},
        ]
        await self._json_patch(self._path(what, *key) + "/status", patch)

    async def _json_patch(self, path: str, patch: list[Obj]) -> None:
        """Apply a JSON patch; an object that is gone (404) or replaced (422) is skipped."""
        response = await self._client.patch(
            path,
            content=json.dumps(patch),
            headers={"Content-Type": "application/json-patch+json"},
        )
        if response.status_code not in (404, 422):
            response.raise_for_status()

    async def _remove_finalizer(self, key: Key, uid: str) -> None:
        pod = await self._read("pods", *key)
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        finalizers = [f for f in pod["metadata"].get("finalizers") or [] if f != FINALIZER]
        patch: list[Obj] = [
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "replace", "path": "/metadata/finalizers", "value": finalizers},
        ]
        await self._json_patch(self._path("pods", *key), patch)

    # ---- watching

    async def _watch(self, prefix: str, plural: str, synced: asyncio.Event) -> None:
        """List, then watch from the list's resourceVersion; re-list only on 410 Gone."""
        path = (
            f"{prefix}/namespaces/{self.namespace}/{plural}"
            if self.namespace
            else f"{prefix}/{plural}"
        )
        cache = self._sts if plural == "statefulsets" else self._pods
        handle = self._on_sts if plural == "statefulsets" else self._on_pod
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    response = await self._client.get(path)
                    response.raise_for_status()
                    listed = response.json()
                    items = {_key(o): o for o in listed["items"]}
                    for key, old in list(cache.items()):
                        if key not in items:
                            handle("DELETED", old)
                    for obj in items.values():
                        handle("MODIFIED", obj)
                    rv = listed["metadata"]["resourceVersion"]
                    synced.set()
                params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "30"}
                timeout = httpx.Timeout(40, connect=5)
                async with self._client.stream("GET", path, params=params, timeout=timeout) as r:
                    r.raise_for_status()
                    async for line in r.aiter_lines():
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            if obj.get("code") == 410:
                                rv = None
                                break
                            raise RuntimeError(f"watch {path}: {obj}")
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            handle(event["type"], obj)
            except (httpx.TransportError, httpx.HTTPStatusError) as e:
                if isinstance(e, httpx.HTTPStatusError) and e.response.status_code == 410:
                    rv = None
                await asyncio.sleep(0.2)

    def _touch(self, key: Key) -> None:
        self._dirty.add(key)
        if self._wake is not None:
            self._wake.set()

    def _on_sts(self, kind: str, sts: Obj) -> None:
        key = _key(sts)
        if kind == "DELETED":
            self._sts.pop(key, None)
        else:
            self._sts[key] = sts
            self._touch(key)

    def _on_pod(self, kind: str, pod: Obj) -> None:
        key = _key(pod)
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            if self._pods.get(key, {}).get("metadata", {}).get("uid") == uid:
                del self._pods[key]
        else:
            self._pods[key] = pod
        owner = _controller_of(pod)
        if owner is None:
            return
        self._touch((key[0], owner["name"]))
        agent = self._agents.get(uid)
        gone = kind == "DELETED" or bool(pod["metadata"].get("deletionTimestamp"))
        finalizers = pod["metadata"].get("finalizers") or []
        if agent is None and not gone and uid not in self._finished:
            agent = self._agents[uid] = _Pod(self, pod)
            agent.task = asyncio.create_task(self._supervise(agent))
        elif agent is None and kind == "MODIFIED" and gone and FINALIZER in finalizers:
            # Terminating, and not running here (any more): release it.
            task = asyncio.create_task(self._remove_finalizer(key, uid))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        if agent is not None:
            if kind != "DELETED":
                agent.pod = pod
            if gone:
                agent.terminating.set()
                agent.wake.set()

    async def _supervise(self, agent: _Pod) -> None:
        try:
            await agent.run()
        except Exception as e:  # keep the runner going, but say why
            self._errors.append(f"pod {agent.key}: {e!r}")
        finally:
            self._agents.pop(agent.uid, None)
            self._finished.add(agent.uid)
            self._touch(agent.key)

    # ---- the StatefulSet controller

    async def _reconcile_loop(self) -> None:
        assert self._wake is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), RESYNC)
            self._wake.clear()
            dirty, self._dirty = self._dirty | set(self._sts), set()
            for key in sorted(dirty):
                if key in self._sts:
                    try:
                        await self._reconcile(self._sts[key])
                    except Exception as e:  # try again at the next round, but say why
                        self._errors.append(f"statefulset {key}: {e!r}")
                        self._dirty.add(key)

    async def _reconcile(self, sts: Obj) -> None:
        ns, name = _key(sts)
        meta, spec = sts["metadata"], sts.get("spec") or {}
        if meta.get("deletionTimestamp"):
            return
        replicas = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        revision = (
            f"{name}-"
            + hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        )
        pods: dict[int, Obj] = {}
        for (pns, pname), pod in list(self._pods.items()):
            owner = _controller_of(pod)
            ordinal = _ordinal(pname, name)
            if pns == ns and owner and owner.get("uid") == meta["uid"] and ordinal is not None:
                pods[ordinal] = pod
        now = time.monotonic()
        running = {a.key for a in self._agents.values()}  # incl. processes still terminating
        for i in range(replicas):
            pod_key = (ns, f"{name}-{i}")
            absent = i not in pods and pod_key not in self._pods and pod_key not in running
            if absent and self._holds.get(pod_key, 0.0) <= now:
                await self._create_pod(sts, i, revision)
        for i, pod in pods.items():
            if i >= replicas and not pod["metadata"].get("deletionTimestamp"):
                await self._client.delete(self._path("pods", ns, pod["metadata"]["name"]))
        status = dict(sts.get("status") or {})
        labels = [
            (p["metadata"].get("labels") or {}).get("controller-revision-hash")
            for p in pods.values()
        ]
        current = status.get("currentRevision") or revision
        if all(label == revision for label in labels) and len(pods) >= replicas:
            current = revision
        ready = sum(1 for p in pods.values() if _is_ready(p))
        wanted = {
            **status,
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(pods),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": sum(1 for label in labels if label == current),
            "updatedReplicas": sum(1 for label in labels if label == revision),
            "currentRevision": current,
            "updateRevision": revision,
            "collisionCount": status.get("collisionCount", 0),
        }
        if wanted != sts.get("status"):
            await self._put_status("statefulsets", (ns, name), wanted, meta["uid"])

    async def _create_pod(self, sts: Obj, ordinal: int, revision: str) -> None:
        ns, name = _key(sts)
        spec = sts.get("spec") or {}
        template = spec.get("template") or {}
        tmeta = template.get("metadata") or {}
        pod_name = f"{name}-{ordinal}"
        pod_spec = {**(template.get("spec") or {}), "hostname": pod_name, "nodeName": NODE_NAME}
        if spec.get("serviceName"):
            pod_spec["subdomain"] = spec["serviceName"]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "labels": {
                    **(tmeta.get("labels") or {}),
                    "statefulset.kubernetes.io/pod-name": pod_name,
                    "apps.kubernetes.io/pod-index": str(ordinal),
                    "controller-revision-hash": revision,
                },
                "annotations": dict(tmeta.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "StatefulSet",
                        "name": name,
                        "uid": sts["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
                "finalizers": [FINALIZER],
            },
            "spec": pod_spec,
        }
        response = await self._client.post(self._path("pods", ns), json=body)
        if response.status_code != 409:  # already exists: the watch had not told us yet
            response.raise_for_status()
