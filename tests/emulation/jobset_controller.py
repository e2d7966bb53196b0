"""A small JobSet controller: JobSets (jobset.x-k8s.io/v1alpha2) whose pods are local processes.

What it keeps from the real controller (kubernetes-sigs/jobset) and the kubelet:

* admission: the object is pruned of nulls and validated against the JobSet CRD's published
  OpenAPI schema (schemas/jobset.x-k8s.io_jobsets.yaml), as the API server does;
* one Job per replica of each replicated job, one pod per Job (completions = parallelism = 1,
  the only shape Metaflow creates), named `<jobset>-<replicated job>-<job index>-0-<suffix>`,
  with JobSet's labels and annotations (jobset-name, replicatedjob-name, job-index,
  restart-attempt, ...) and hostname `<jobset>-<replicated job>-<job index>-0` under the
  JobSet's subdomain;
* `startupPolicyOrder: InOrder`: a replicated job's pods are created once every pod of the one
  before it runs;
* `spec.suspend: true` (a queue such as Kueue holds it): no pods until it is admitted;
* the container's environment: `env` values and downward-API `fieldRef`s (pod name,
  namespace, uid, annotations, labels, service account, host and pod IP);
* restartPolicy Never and backoffLimit 0: a pod that exits non-zero fails its Job; any failed
  Job fails the JobSet (default failure policy), whose other pods are then stopped (SIGTERM to
  the container's main process, then SIGKILL to all of it after the grace period); all Jobs
  succeeded completes it (default success policy);
* status as the controller writes it: replicatedJobsStatus, conditions, terminalState.

What differs (documented in docs/kubernetes.md): every pod runs on this host with this host's
own non-loopback address as its IP (hosts.py: node 0 of a remote gang refuses loopback); cluster DNS is the resolver shim in k8s_dns/ (a pod's FQDN resolves once the pod
runs); emptyDir mounts reach Python's open() only (k8s_api.py); container images, resources,
other volumes and secrets are not applied.
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import yaml

from .hosts import host_address
from .node_process import NodeProcess

SCHEMA_FILE = Path(__file__).parent / "schemas" / "jobset.x-k8s.io_jobsets.yaml"
GROUP, VERSION = "jobset.x-k8s.io", "v1alpha2"
CLUSTER_DOMAIN = "svc.cluster.local"
# Labels and annotations JobSet puts on every Job and pod (jobset/pkg/constants).
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class InvalidJobSet(Exception):
    """The API server would refuse this object (422 Unprocessable Entity)."""


@functools.lru_cache(maxsize=1)
def jobset_schema() -> dict:
    crd = yaml.load(SCHEMA_FILE.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == VERSION]
    return version["schema"]["openAPIV3Schema"]


def pruned(tree):
    """The object without null fields: the API server prunes nulls of fields that are not
    `nullable` before validating (no field of the JobSet schema is)."""
    if isinstance(tree, dict):
        return {k: pruned(v) for k, v in tree.items() if v is not None}
    if isinstance(tree, list):
        return [pruned(v) for v in tree]
    return tree


def validate_jobset(obj: dict) -> None:
    """Raises InvalidJobSet with every violation of the CRD's schema."""
    validator = jsonschema.Draft7Validator(jobset_schema())
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        raise InvalidJobSet("; ".join(
            "%s: %s" % ("/".join(str(p) for p in e.absolute_path) or "<root>", e.message)
            for e in errors[:10]))


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Pod:
    name: str
    namespace: str
    hostname: str
    template: dict
    labels: dict
    annotations: dict
    replicated_job: str = ""
    job_index: int = 0
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    phase: str = "Pending"
    created_at: str = field(default_factory=now_iso)
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    process: NodeProcess | None = None
    deleted: bool = False
    address: str | None = None  # the pod's own IP (nodes as hosts), once it is placed

    @property
    def ip(self) -> str:
        """The pod's IP: its own, else this host's (every pod a process of this host)."""
        return self.address or host_address()

    @property
    def fqdn(self) -> str | None:
        """The pod's DNS name under its subdomain's headless service (JobSet creates one)."""
        subdomain = self.template["spec"].get("subdomain")
        if not subdomain:
            return None
        return "%s.%s.%s.%s" % (self.hostname, subdomain, self.namespace, CLUSTER_DOMAIN)

    @property
    def container(self) -> dict:
        return self.template["spec"]["containers"][0]

    def field_value(self, path: str) -> str:
        """A downward-API fieldRef, as the kubelet resolves it."""
        simple = {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.serviceAccountName": self.template["spec"].get("serviceAccountName", "default"),
            "spec.nodeName": "emulated-node",
            "status.hostIP": self.ip,
            "status.podIP": self.ip,
        }
        if path in simple:
            return simple[path]
        for prefix, values in (("metadata.annotations", self.annotations),
                               ("metadata.labels", self.labels)):
            if path.startswith(prefix + "['") and path.endswith("']"):
                return values.get(path[len(prefix) + 2:-2], "")
        raise InvalidJobSet("unsupported fieldRef %r" % path)

    def env(self) -> dict[str, str]:
        env = {}
        for entry in self.container.get("env", []):
            if "value" in entry:
                env[entry["name"]] = entry["value"]
            elif "fieldRef" in (entry.get("valueFrom") or {}):
                env[entry["name"]] = self.field_value(entry["valueFrom"]["fieldRef"]["fieldPath"])
            elif entry.get("valueFrom"):
                raise InvalidJobSet("env %s: only value and fieldRef are emulated" % entry["name"])
            else:
                env[entry["name"]] = ""
        return env

    def to_dict(self) -> dict:
        """The pod as the API returns it (the fields Metaflow and the tests read)."""
        if self.phase == "Pending":
            state = {"waiting": {"reason": "ContainerCreating"}}
        elif self.phase == "Running":
            state = {"running": {"startedAt": self.started_at}}
        elif self.exit_code is None:
            # stopped before its container ever ran (a pod held pending, then its JobSet
            # failed): the container never terminated, and the API's `terminated` requires an
            # exitCode (V1ContainerStateTerminated), so it stays waiting
            state = {"waiting": {"reason": self.reason or "ContainerCreating"}}
        else:
            state = {"terminated": {"exitCode": self.exit_code, "reason": self.reason,
                                    "startedAt": self.started_at,
                                    "finishedAt": self.finished_at}}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid,
                         "labels": self.labels, "annotations": self.annotations,
                         "creationTimestamp": self.created_at},
            "spec": {**self.template["spec"], "hostname": self.hostname},
            "status": {"phase": self.phase, "hostIP": self.ip, "podIP": self.ip,
                       "containerStatuses": [{
                           "name": self.container["name"], "image": self.container["image"],
                           "imageID": "", "ready": self.phase == "Running",
                           "restartCount": 0, "state": state}]},
        }


@dataclass
class JobSet:
    obj: dict
    pods: list[Pod] = field(default_factory=list)
    conditions: list[dict] = field(default_factory=list)
    terminal: str | None = None
    admit_at: float | None = None  # when the emulated queue resumes it

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.obj["metadata"]["namespace"]

    @property
    def suspended(self) -> bool:
        return bool(self.obj["spec"].get("suspend"))

    def replicated_jobs(self) -> list[dict]:
        return self.obj["spec"]["replicatedJobs"]

    def pods_of(self, replicated_job: str) -> list[Pod]:
        return [p for p in self.pods if p.replicated_job == replicated_job]

    def status(self) -> dict:
        statuses = []
        for rjob in self.replicated_jobs():
            pods = self.pods_of(rjob["name"])
            statuses.append({
                "name": rjob["name"],
                "ready": _count(pods, "Running"),
                "active": _count(pods, "Running", "Pending"),
                "succeeded": _count(pods, "Succeeded"),
                "failed": _count(pods, "Failed"),
                "suspended": rjob.get("replicas", 1) if self.suspended else 0,
            })
        status = {"replicatedJobsStatus": statuses, "restarts": 0}
        if self.conditions:
            status["conditions"] = self.conditions
        if self.terminal:
            status["terminalState"] = self.terminal
        return status

    def to_dict(self) -> dict:
        return {**self.obj, "status": self.status()}


@dataclass
class Job:
    """A batch/v1 Job of one pod (what Metaflow's @kubernetes runs for a plain step)."""

    obj: dict
    pods: list[Pod] = field(default_factory=list)
    terminal: str | None = None

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.obj["metadata"]["namespace"]

    def status(self) -> dict:
        status = {"active": _count(self.pods, "Running", "Pending"),
                  "succeeded": _count(self.pods, "Succeeded"),
                  "failed": _count(self.pods, "Failed"),
                  "startTime": self.obj["metadata"]["creationTimestamp"]}
        if self.terminal:
            status["conditions"] = [_condition(self.terminal, "Job" + self.terminal, "")]
        return status

    def to_dict(self) -> dict:
        return {**self.obj, "status": self.status()}


class JobSetController:
    """Keeps JobSets and their pods; `tick` advances them and never blocks.

    Parameters
    ----------
    start_pod : starts a pod's container: (pod, argv, env) -> NodeProcess.
    place_pod : gives a pod its own address before its environment is made (pod) -> str,
        where every pod is a host of its own (netns.py); None: every pod stands on this host.
    hold_pods : (replicated job, job index) pairs whose pods stay Pending forever (a pod
        that cannot be scheduled, an image that never pulls).
    stop_grace_s : SIGTERM to SIGKILL delay when pods are stopped; None: each pod's own
        terminationGracePeriodSeconds, as the kubelet does.
    queue_admission_s : with a number, a stand-in for Kueue: a JobSet labelled with a queue
        (QUEUE_LABEL) is created suspended, as Kueue's webhook makes it, and admitted (resumed)
        that many seconds later. Plain Jobs are not queued.
    """

    def __init__(self, start_pod: Callable, *, hold_pods: Collection[tuple[str, int]] = (),
                 stop_grace_s: float | None = None, queue_admission_s: float | None = None,
                 place_pod: Callable | None = None) -> None:
        self._start_pod = start_pod
        self._place_pod = place_pod
        self._hold = frozenset(hold_pods)
        self._queue_admission_s = queue_admission_s
        self._stop_grace_s = stop_grace_s
        self._lock = threading.RLock()
        self.jobsets: dict[tuple[str, str], JobSet] = {}
        self.created: list[dict] = []  # every accepted JobSet, as submitted (after pruning)
        self.jobs: dict[tuple[str, str], Job] = {}
        self._orphans: list[Pod] = []  # pods of deleted JobSets, until their processes exit

    # -- API operations --------------------------------------------------------------------

    def create(self, namespace: str, body: dict) -> dict:
        obj = pruned(body)
        obj.setdefault("metadata", {})
        if obj["metadata"].get("namespace", namespace) != namespace:
            raise InvalidJobSet("metadata.namespace does not match the request's namespace")
        validate_jobset(obj)
        name = obj["metadata"]["name"]
        with self._lock:
            if (namespace, name) in self.jobsets:
                raise FileExistsError(name)
            self.created.append(obj)
            obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace,
                                       "uid": str(uuid.uuid4()), "resourceVersion": "1",
                                       "creationTimestamp": now_iso()}}
            jobset = JobSet(obj)
            queued = QUEUE_LABEL in obj["metadata"].get("labels", {})
            if queued and self._queue_admission_s is not None:
                obj["spec"]["suspend"] = True
                jobset.admit_at = time.monotonic() + self._queue_admission_s
            self.jobsets[(namespace, name)] = jobset
            return jobset.to_dict()

    def create_job(self, namespace: str, body: dict) -> dict:
        """A batch/v1 Job (not validated: no Job schema is kept here) with its one pod."""
        obj = pruned(body)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name") or meta["generateName"] + secrets.token_hex(3)[:5]
        uid = str(uuid.uuid4())
        obj["metadata"] = {**meta, "name": name, "namespace": namespace, "uid": uid,
                           "creationTimestamp": now_iso()}
        template = obj["spec"]["template"]
        tmeta = template.get("metadata", {})
        pod_name = "%s-%s" % (name, secrets.token_hex(3)[:5])
        pod = Pod(name=pod_name, namespace=namespace, hostname=pod_name, template=template,
                  labels={**tmeta.get("labels", {}), "job-name": name, "controller-uid": uid,
                          "batch.kubernetes.io/job-name": name},
                  annotations=dict(tmeta.get("annotations", {})))
        with self._lock:
            job = Job(obj, [pod])
            self.jobs[(namespace, name)] = job
            return job.to_dict()

    def get_job(self, namespace: str, name: str) -> dict | None:
        with self._lock:
            job = self.jobs.get((namespace, name))
            return None if job is None else job.to_dict()

    def get(self, namespace: str, name: str) -> dict | None:
        with self._lock:
            jobset = self.jobsets.get((namespace, name))
            return None if jobset is None else jobset.to_dict()

    def delete(self, namespace: str, name: str) -> dict | None:
        """Deletes the JobSet and, through owner references, its Jobs and pods."""
        with self._lock:
            jobset = self.jobsets.pop((namespace, name), None)
            if jobset is None:
                return None
            for pod in jobset.pods:
                self._stop(pod, "Deleted")
                pod.deleted = True
            self._orphans.extend(p for p in jobset.pods if p.process is not None)
            return jobset.to_dict()

    def pods(self, namespace: str, selector: dict[str, str]) -> list[dict]:
        with self._lock:
            return [pod.to_dict() for pod in self._all_pods() if pod.namespace == namespace
                    and all(pod.labels.get(k) == v for k, v in selector.items())]

    def _all_pods(self) -> list[Pod]:
        return [p for w in [*self.jobsets.values(), *self.jobs.values()] for p in w.pods]

    def delete_pod(self, namespace: str, name: str) -> dict | None:
        """Deleting a running pod (eviction, preemption) fails its Job: restartPolicy Never."""
        with self._lock:
            for pod in self._all_pods():
                if pod.namespace == namespace and pod.name == name:
                    self._stop(pod, "Evicted")
                    return pod.to_dict()
        return None

    # -- the control loop --------------------------------------------------------------------

    def tick(self) -> None:
        with self._lock:
            now = time.monotonic()
            for jobset in list(self.jobsets.values()):
                self._advance(jobset, now)
            for job in self.jobs.values():
                for pod in job.pods:
                    self._poll(pod, now)
                if job.terminal is None:
                    self._start_pods(job)
                    if any(p.phase == "Failed" for p in job.pods):
                        job.terminal = "Failed"
                    elif all(p.phase == "Succeeded" for p in job.pods):
                        job.terminal = "Complete"
            for pod in self._orphans:
                self._poll(pod, now)
            self._orphans = [p for p in self._orphans if p.process.exit_code() is None]

    def processes(self) -> list[NodeProcess]:
        with self._lock:
            pods = self._all_pods() + self._orphans
            return [p.process for p in pods if p.process is not None]

    def _advance(self, jobset: JobSet, now: float) -> None:
        for pod in jobset.pods:
            self._poll(pod, now)
        if jobset.admit_at is not None and now >= jobset.admit_at:
            jobset.obj["spec"]["suspend"], jobset.admit_at = False, None
        if jobset.terminal is None:
            if not jobset.suspended:
                self._create_pods(jobset)
                self._start_pods(jobset)
            self._conclude(jobset)

    def _create_pods(self, jobset: JobSet) -> None:
        global_index = 0
        for rjob in jobset.replicated_jobs():
            replicas = rjob.get("replicas", 1)
            existing = jobset.pods_of(rjob["name"])
            if not existing:
                for index in range(replicas):
                    jobset.pods.append(self._new_pod(jobset, rjob, index, global_index + index))
            global_index += replicas
            in_order = (jobset.obj["spec"].get("startupPolicy") or {}).get(
                "startupPolicyOrder") == "InOrder"
            if in_order and not all(p.phase == "Running" or p.phase == "Succeeded"
                                    for p in jobset.pods_of(rjob["name"])):
                return  # the next replicated job waits for this one's pods to run

    def _new_pod(self, jobset: JobSet, rjob: dict, index: int, global_index: int) -> Pod:
        template = rjob["template"]["spec"]["template"]
        meta = template.get("metadata", {})
        ours = {JOBSET_NAME: jobset.name, REPLICATED_JOB_NAME: rjob["name"],
                JOB_INDEX: str(index), JOB_GLOBAL_INDEX: str(global_index),
                REPLICATED_JOB_REPLICAS: str(rjob.get("replicas", 1)),
                RESTART_ATTEMPT: "0"}
        hostname = "%s-%s-%d-0" % (jobset.name, rjob["name"], index)
        return Pod(
            name="%s-%s" % (hostname, secrets.token_hex(3)[:5]), namespace=jobset.namespace,
            hostname=hostname, template=template, replicated_job=rjob["name"], job_index=index,
            labels={**meta.get("labels", {}), **ours},
            annotations={**meta.get("annotations", {}), **ours},
        )

    def _start_pods(self, workload: JobSet | Job) -> None:
        for pod in workload.pods:
            if pod.phase != "Pending" or (pod.replicated_job, pod.job_index) in self._hold:
                continue
            container = pod.container
            argv = list(container.get("command", [])) + list(container.get("args", []))
            try:
                if self._place_pod is not None:
                    pod.address = self._place_pod(pod)
                pod.process = self._start_pod(pod, argv, pod.env())
            except OSError as error:  # the kubelet's StartError
                pod.phase, pod.exit_code, pod.reason = "Failed", 128, "StartError: %s" % error
                pod.finished_at = now_iso()
                continue
            pod.phase, pod.started_at = "Running", now_iso()

    def _poll(self, pod: Pod, now: float) -> None:
        if pod.process is None:
            return
        pod.process.enforce(now)
        code = pod.process.exit_code()
        if code is None or pod.phase not in ("Running", "Pending"):
            return
        pod.process.teardown()
        pod.exit_code, pod.finished_at = code, now_iso()
        pod.phase = "Succeeded" if code == 0 and pod.reason is None else "Failed"
        if pod.reason is None:
            pod.reason = "Completed" if code == 0 else "Error"

    def _stop(self, pod: Pod, reason: str) -> None:
        if pod.phase == "Pending" and pod.process is None:
            pod.phase, pod.reason, pod.finished_at = "Failed", reason, now_iso()
            return
        if pod.phase in ("Running", "Pending") and pod.process is not None:
            pod.reason = pod.reason or reason
            # The kubelet signals the container's main process (PID 1) only; the others get
            # SIGKILL when the pod's grace period ends.
            pod.process.request_stop(time.monotonic(), self._grace_of(pod), whole_group=False)

    def _grace_of(self, pod: Pod) -> float:
        """The pod's terminationGracePeriodSeconds (default 30), at least the kubelet's
        minimum of 2 s; with `stop_grace_s` set, that instead (a test's shortcut)."""
        if self._stop_grace_s is not None:
            return self._stop_grace_s
        return max(2.0, float(pod.template["spec"].get("terminationGracePeriodSeconds", 30)))

    def _conclude(self, jobset: JobSet) -> None:
        failed = [p for p in jobset.pods if p.phase == "Failed"]
        expected = sum(r.get("replicas", 1) for r in jobset.replicated_jobs())
        succeeded = [p for p in jobset.pods if p.phase == "Succeeded"]
        if failed:
            first = failed[0]
            jobset.conditions.append(_condition(
                "Failed", "FailedJobs",
                "jobset failed due to one or more job failures (first: job %s-%s-%d)"
                % (jobset.name, first.replicated_job, first.job_index)))
            jobset.terminal = "Failed"
            for pod in jobset.pods:  # the controller deletes the JobSet's other Jobs
                self._stop(pod, "Terminated")
        elif len(succeeded) == expected:
            jobset.conditions.append(_condition("Completed", "AllJobsCompleted",
                                                "jobset completed successfully"))
            jobset.terminal = "Completed"


def _count(pods: list[Pod], *phases: str) -> int:
    return sum(p.phase in phases for p in pods)


def _condition(kind: str, reason: str, message: str) -> dict:
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": now_iso()}
