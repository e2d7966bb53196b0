"""A loopback Kubernetes API for the calls Metaflow's `kubernetes step` makes on its JobSet path,
with a JobSet controller (jobset_controller.py) that runs every pod as a local process group.

The official `kubernetes` client reaches it through a kubeconfig (`emulator.env` sets
KUBECONFIG), from the test, the Metaflow run and its `kubernetes step` processes alike.
Served (everything else is answered 404 and recorded in `errors`, so a test notices a call it
does not emulate):

    POST   /apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets          create (validated)
    GET    /apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets/{name}   read, with status
    POST   /apis/batch/v1/namespaces/{ns}/jobs, GET .../jobs/{name}           a plain step's Job
    DELETE /apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets/{name}   delete (pods stop)
    GET    /api/v1/namespaces/{ns}/pods?labelSelector=k=v,...               list pods
    DELETE /api/v1/namespaces/{ns}/pods/{name}                              evict a pod
    GET    /api/v1/namespaces/{ns}/pods/{name}/exec                         refused (400): no
           websocket here, so Metaflow's kill falls back to deleting the JobSet
    discovery, the JobSet CRD, SelfSubjectAccessReviews, Kueue LocalQueues, nodes, and RBAC
    on the calls above: k8s_cluster.py
    NetworkPolicies (validated), deleted with their owner JobSet as the garbage collector
    does: k8s_policies.py

Pods see the network a container would: `http_proxy` points here, so the instance metadata
calls Metaflow's pods make (169.254.169.254) are answered 404 locally, and the cluster DNS
shim (k8s_dns/) resolves pod names under svc.cluster.local to the pod IP (this host's own
non-loopback address, hosts.py) once they run and
stands in for emptyDir mounts (Python's open() under a mount path lands in the pod's directory).

    with KubernetesEmulator(image_env=aws.container_env) as k8s:
        env = {**aws.env, **k8s.env}   # `python flow.py run --with kubernetes` with this env
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Collection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from . import netns
from .jobset_controller import GROUP, VERSION, InvalidJobSet, JobSetController, Pod
from .k8s_cluster import ClusterApi, forbidden
from .k8s_policies import NetworkPolicies
from .batch_jobs import DEBIAN_HOSTNAME_ADDRESS
from .node_process import NodeProcess

DNS_SHIM = Path(__file__).parent / "k8s_dns"
_JOBSETS = "/apis/%s/%s/namespaces/" % (GROUP, VERSION)
_JOBS = "/apis/batch/v1/namespaces/"
_PODS = "/api/v1/namespaces/"


class EmulatorError(Exception):
    """The emulator itself failed, or was asked for something it does not emulate."""


def status_object(code: int, reason: str, message: str) -> dict:
    """A metav1.Status, the body of every API error."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_DELETE = do_PUT = do_PATCH = do_GET

    def log_message(self, format: str, *args) -> None:
        """Quiet: failures surface as API errors or in `KubernetesEmulator.errors`."""

    def _dispatch(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        emulator = self.server.emulator
        if self.path.startswith("http://"):
            # A pod's request through `http_proxy` (instance metadata and the like).
            emulator.sunk_requests.append("%s %s" % (self.command, self.path))
            self._reply(404, {})
            return
        try:
            self._reply(*emulator.answer(self.command, self.path, body))
        # The HTTP boundary: report the emulator's own bugs instead of dropping the connection.
        except Exception:
            emulator.errors.append(traceback.format_exc())
            self._reply(500, status_object(500, "InternalError", "emulator error"))

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    emulator: KubernetesEmulator


# SIGTERM to SIGKILL when the emulator itself stops (every pod's whole process group).
SHUTDOWN_GRACE_S = 2.0


class KubernetesEmulator:
    """A Kubernetes API with a JobSet controller on 127.0.0.1, pods as local process groups.

    Parameters
    ----------
    image_env : what the container image and cluster provide (credentials, endpoints).
    hold_pods : (replicated job, job index) pairs whose pods never start.
    workdir : where pod directories, logs, the kubeconfig and DNS records go.
    stop_grace_s : SIGTERM to SIGKILL delay when pods are stopped; None (the default): each
        pod's terminationGracePeriodSeconds, as the kubelet does. The emulator's own shutdown
        always gives SHUTDOWN_GRACE_S.
    poll_s : how often the controller advances JobSets and polls pod processes.
    queue_admission_s : queue JobSets that carry Kueue's queue label this long (see
        JobSetController).
    cluster : the served API groups, RBAC, Kueue queues and nodes (k8s_cluster.py); by
        default JobSet is installed, everything is allowed, and one node has no GPU.
    loopback_hostname_pods : (replicated job, job index) pairs whose pods' /etc/hosts maps
        their names to 127.0.1.1, as a Debian or Ubuntu image's does where nothing rewrites
        it (pods as hosts only).
    """

    def __init__(self, *, image_env: dict[str, str] | None = None,
                 hold_pods: Collection[tuple[str, int]] = (), workdir: Path | None = None,
                 stop_grace_s: float | None = None, poll_s: float = 0.05,
                 queue_admission_s: float | None = None,
                 cluster: ClusterApi | None = None,
                 loopback_hostname_pods: Collection[tuple[str, int]] = ()) -> None:
        self.cluster = cluster if cluster is not None else ClusterApi()
        self._image_env = dict(image_env or {})
        self._owns_root = workdir is None
        self._root = Path(workdir) if workdir is not None else None
        self._poll_s = poll_s
        self._hosts = netns.network() if netns.enabled() else None
        self._loopback_hostname_pods = frozenset(loopback_hostname_pods)
        if self._loopback_hostname_pods and self._hosts is None:
            raise ValueError("loopback_hostname_pods needs pods as hosts (%s=1)" % netns.ENV)
        self._pod_hosts: dict[str, netns.Host] = {}  # pod name -> its host, until it starts
        self.controller = JobSetController(
            self._start_pod, hold_pods=hold_pods, stop_grace_s=stop_grace_s,
            queue_admission_s=queue_admission_s,
            place_pod=self._place_pod if self._hosts is not None else None)
        self.network_policies = NetworkPolicies(self.cluster.allowed, forbidden)
        self._server: _Server | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self.endpoint_url = ""
        self.errors: list[str] = []
        self.sunk_requests: list[str] = []
        self.requests: list[str] = []  # "METHOD /path" of every API request, in order

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> KubernetesEmulator:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> None:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="k8s-emulator-"))
        self._root.mkdir(parents=True, exist_ok=True)
        self._server = _Server((netns.listen_address(), 0), _Handler)
        self._server.emulator = self
        host, port = self._server.server_address[:2]
        self.endpoint_url = "http://%s:%d" % (host, port)
        self.kubeconfig.write_text(json.dumps({  # JSON is YAML: the client reads it as is
            "apiVersion": "v1", "kind": "Config", "current-context": "emulated",
            "clusters": [{"name": "emulated", "cluster": {"server": self.endpoint_url}}],
            "users": [{"name": "tester", "user": {"token": "emulated"}}],
            "contexts": [{"name": "emulated", "context": {
                "cluster": "emulated", "user": "tester", "namespace": "default"}}],
        }))
        self.dns_records.parent.mkdir(exist_ok=True)
        self.dns_records.write_text("{}")
        self._threads = [
            threading.Thread(target=self._server.serve_forever, args=(0.1,), daemon=True),
            threading.Thread(target=self._schedule, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        """Stops serving, stops every pod process (bounded) and removes the temp dir."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        processes = self.controller.processes()
        started = time.monotonic()
        for process in processes:
            process.request_stop(started, SHUTDOWN_GRACE_S)
        while time.monotonic() - started < SHUTDOWN_GRACE_S and any(
                process.exit_code() is None for process in processes):
            time.sleep(0.02)
        for process in processes:
            process.teardown()
            if process.wait(timeout_s=5) is None:
                self.errors.append("pod process %d survived SIGKILL" % process.pid)
        self._server = None
        if self._owns_root:
            shutil.rmtree(self._root, ignore_errors=True)
        if self.errors:
            raise EmulatorError("kubernetes emulator failed:\n" + "\n".join(self.errors))

    def _schedule(self) -> None:
        while not self._stopping.wait(self._poll_s):
            try:
                self.controller.tick()
                self.network_policies.collect({js.obj["metadata"]["uid"] for js in
                                               list(self.controller.jobsets.values())})
                self._publish_dns()
            # Kept for close() to raise, instead of the thread dying silently.
            except Exception:
                self.errors.append(traceback.format_exc())
                return

    def _publish_dns(self) -> None:
        records = {pod.fqdn: pod.ip for js in list(self.controller.jobsets.values())
                   for pod in js.pods if pod.phase == "Running" and pod.fqdn}
        tmp = self.dns_records.with_suffix(".tmp")
        tmp.write_text(json.dumps(records))
        os.replace(tmp, self.dns_records)

    # -- what tests use --------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        return self._root / "kubeconfig"

    @property
    def dns_records(self) -> Path:
        """The cluster's DNS records, in a folder of their own: with pods as hosts, that folder
        and each pod's own are all a pod sees of the emulator's."""
        return self._root / "dns" / "records.json"

    @property
    def env(self) -> dict[str, str]:
        """For the test's Metaflow run: the Kubernetes client reaches this API."""
        return {"KUBECONFIG": str(self.kubeconfig), "no_proxy": _bypass(), "NO_PROXY": _bypass()}

    @property
    def created(self) -> list[dict]:
        """Every JobSet accepted (pruned of nulls and valid against the CRD), in order."""
        return self.controller.created

    def pod_dir(self, pod_name: str) -> Path:
        """The pod's directory: `log` is its container's output, `work/` its working directory."""
        return self._root / "pods" / pod_name

    def pod_log(self, pod_name: str) -> str:
        return (self.pod_dir(pod_name) / "log").read_text(errors="replace")

    def pods(self, jobset_name: str) -> list[Pod]:
        return [p for js in list(self.controller.jobsets.values()) if js.name == jobset_name
                for p in js.pods]

    # -- the API ---------------------------------------------------------------------------

    def answer(self, method: str, url: str, body: bytes) -> tuple[int, dict]:
        parts = urlsplit(url)
        path, query = parts.path.rstrip("/"), parse_qs(parts.query)
        self.requests.append("%s %s" % (method, path))
        found = self.cluster.answer(method, path, body)
        if found is None:
            found = self.network_policies.answer(method, path, body)
        if found is not None:
            return found
        if path.startswith(_JOBSETS):
            rest = path[len(_JOBSETS):].split("/")
            if not self.cluster.installed[GROUP]:
                return 404, status_object(404, "NotFound",
                                          "the server could not find the requested resource")
            verb = {"POST": "create", "GET": "get", "DELETE": "delete"}.get(method, method)
            if not self.cluster.allowed(verb, GROUP, "jobsets"):
                return forbidden(verb, GROUP, "jobsets", rest[0])
            if len(rest) == 2 and rest[1] == "jobsets" and method == "POST":
                return self._create(rest[0], json.loads(body or b"{}"))
            if len(rest) == 3 and rest[1] == "jobsets" and method in ("GET", "DELETE"):
                found = (self.controller.get if method == "GET" else self.controller.delete)(
                    rest[0], rest[2])
                return (200, found) if found is not None else _not_found("jobsets", rest[2])
        if path.startswith(_JOBS):
            rest = path[len(_JOBS):].split("/")
            if len(rest) == 2 and rest[1] == "jobs" and method == "POST":
                return 201, self.controller.create_job(rest[0], json.loads(body or b"{}"))
            if len(rest) == 3 and rest[1] == "jobs" and method == "GET":
                found = self.controller.get_job(rest[0], rest[2])
                return (200, found) if found is not None else _not_found("jobs", rest[2])
        if path.startswith(_PODS):
            rest = path[len(_PODS):].split("/")
            if len(rest) == 2 and rest[1] == "pods" and method == "GET":
                if not self.cluster.allowed("list", "", "pods"):
                    return forbidden("list", "", "pods", rest[0])
                selector = dict(term.split("=", 1) for term in
                                ",".join(query.get("labelSelector", [])).split(",") if term)
                return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                             "items": self.controller.pods(rest[0], selector)}
            if len(rest) == 3 and rest[1] == "pods" and method == "DELETE":
                found = self.controller.delete_pod(rest[0], rest[2])
                return (200, found) if found is not None else _not_found("pods", rest[2])
            if len(rest) == 4 and rest[3] == "exec":
                return 400, status_object(400, "BadRequest",
                                          "exec needs a websocket upgrade (not emulated)")
        self.errors.append("not emulated: %s %s" % (method, url))
        return 404, status_object(404, "NotFound", "not emulated: %s %s" % (method, path))

    def _create(self, namespace: str, body: dict) -> tuple[int, dict]:
        try:
            return 201, self.controller.create(namespace, body)
        except InvalidJobSet as error:
            return 422, status_object(422, "Invalid", "JobSet is invalid: %s" % error)
        except FileExistsError as error:
            return 409, status_object(409, "AlreadyExists",
                                      'jobsets "%s" already exists' % error)

    # -- pods ------------------------------------------------------------------------------

    def _start_pod(self, pod: Pod, argv: list[str], env: dict[str, str]) -> NodeProcess:
        pod_dir = self.pod_dir(pod.name)
        work = pod_dir / "work"
        work.mkdir(parents=True)
        mounts = self._empty_dirs(pod, pod_dir)
        # The test's interpreter stands in for the image's: its bin dir comes first on PATH.
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        proxy = self.endpoint_url
        full_env = {
            "PATH": path,
            "HOME": str(work),
            "HOSTNAME": pod.hostname,
            **self._image_env,
            "http_proxy": proxy, "HTTP_PROXY": proxy, "https_proxy": proxy, "HTTPS_PROXY": proxy,
            "no_proxy": _bypass(), "NO_PROXY": _bypass(),
            "PYTHONPATH": str(DNS_SHIM),
            "K8S_EMULATOR_DNS_RECORDS": str(self.dns_records),
            "K8S_EMULATOR_MOUNTS": json.dumps(mounts),
            # marks every process of the pod, as its cgroup would (see NodeProcess.teardown)
            "K8S_EMULATOR_POD": str(pod_dir),
            **env,
        }
        host = self._pod_hosts.pop(pod.name, None)
        if host is None:
            return NodeProcess.start(argv, work, full_env, pod_dir / "log",
                                     marker=("K8S_EMULATOR_POD", str(pod_dir)))
        # the kubelet's /etc/hosts: the pod's hostname (and FQDN) at its own IP
        loopback = (pod.replicated_job, pod.job_index) in self._loopback_hostname_pods
        container = netns.container_spec(
            host, pod_dir, pod.hostname, work,
            shared=(pod_dir, self.dns_records.parent),
            names=tuple(n for n in (pod.fqdn, pod.hostname) if n),
            hostname_address=DEBIAN_HOSTNAME_ADDRESS if loopback else None,
            memory_bytes=memory_limit(pod.template),
            cpus=cpu_quantity(pod.template, "limits"),
            weight_cpus=cpu_quantity(pod.template, "requests"))
        return NodeProcess.start(argv, work, full_env, pod_dir / "log",
                                 marker=("K8S_EMULATOR_POD", str(pod_dir)), host=host,
                                 container=container)

    def _place_pod(self, pod: Pod) -> str:
        """A host of its own for the pod (nodes as hosts): its IP, before its env is made."""
        host = self._hosts.add_host()
        self._pod_hosts[pod.name] = host
        return host.address


    @staticmethod
    def _empty_dirs(pod: Pod, pod_dir: Path) -> dict[str, str]:
        """mount path -> a directory of the pod's own, for the container's emptyDir mounts
        (the pod's sitecustomize redirects Python's open() there)."""
        empty = {v["name"] for v in pod.template["spec"].get("volumes", []) if "emptyDir" in v}
        mounts = {}
        for mount in pod.container.get("volumeMounts", []):
            if mount["name"] in empty:
                host_dir = pod_dir / "volumes" / mount["name"]
                host_dir.mkdir(parents=True, exist_ok=True)
                mounts[mount["mountPath"]] = str(host_dir)
        return mounts


def _bypass() -> str:
    """no_proxy: this API (and moto) are reached directly."""
    return ",".join(dict.fromkeys([netns.listen_address(), "127.0.0.1", "localhost"]))


def _not_found(kind: str, name: str) -> tuple[int, dict]:
    return 404, status_object(404, "NotFound", '%s "%s" not found' % (kind, name))


_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


_CPU = re.compile(r"^(\d+(?:\.\d+)?)(m)?$")


def cpu_quantity(template: dict, kind: str) -> float | None:
    """The CPU `kind` ("limits": the CFS quota the kubelet sets; "requests": the cgroup's
    weight) of the pod's (first) container in CPUs ("500m" is 0.5); None without one."""
    containers = template.get("spec", {}).get("containers", [])
    value = (containers[0].get("resources", {}).get(kind, {}).get("cpu")
             if containers else None)
    found = _CPU.match(str(value)) if value is not None else None
    if not found:
        return None
    return float(found.group(1)) / (1000 if found.group(2) else 1)


def memory_limit(template: dict) -> int | None:
    """The memory limit of the pod's (first) container in bytes, as the kubelet sets its
    cgroup; None without one (the container may use the node's memory)."""
    containers = template.get("spec", {}).get("containers", [])
    limit = (containers[0].get("resources", {}).get("limits", {}).get("memory")
             if containers else None)
    found = _QUANTITY.match(str(limit)) if limit is not None else None
    return int(float(found.group(1)) * _UNITS[found.group(2)]) if found else None
