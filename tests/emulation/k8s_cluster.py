"""What the loopback Kubernetes API (k8s_api.py) knows of its cluster beyond JobSets and pods:
which API groups are served (the JobSet CRD, Kueue), who may do what (RBAC, answered to
SelfSubjectAccessReviews and enforced on the JobSet and pod calls), Kueue LocalQueues, nodes.
It answers as the API server does:

    GET  /apis/{group}/{version}                          discovery (APIResourceList), 404 if
                                                          the group's CRD is not installed
    GET  /apis/apiextensions.k8s.io/v1/customresourcedefinitions/jobsets.jobset.x-k8s.io
                                                          the JobSet CRD (schemas/, v0.12.0)
    POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews
                                                          validated against the kubernetes
                                                          client's models (generated from the
                                                          published OpenAPI)
    GET  /apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/localqueues/{name}
    GET  /api/v1/nodes

A call the caller may not make is answered 403 Forbidden with the API server's message.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Collection
from dataclasses import dataclass

import yaml

from .jobset_controller import GROUP as JOBSET_GROUP, SCHEMA_FILE, VERSION as JOBSET_VERSION

USER = "tester"  # the kubeconfig's user (k8s_api.py)
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
NODES = "/api/v1/nodes"
# The resources each group serves, as discovery lists them (the CRDs' names, verbs).
SERVED = {
    (JOBSET_GROUP, JOBSET_VERSION): [("jobsets", "JobSet"), ("jobsets/status", "JobSet")],
    (KUEUE_GROUP, KUEUE_VERSION): [("localqueues", "LocalQueue"),
                                   ("localqueues/status", "LocalQueue"),
                                   ("clusterqueues", "ClusterQueue"),
                                   ("resourceflavors", "ResourceFlavor"),
                                   ("workloads", "Workload")],
}
VERBS = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
DEFAULT_NODE = {"name": "node-1", "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}}


class InvalidReview(Exception):
    """The API server would refuse the review (400/422)."""


@dataclass(frozen=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str
    active: bool = True


@functools.lru_cache(maxsize=1)
def jobset_crd() -> dict:
    return yaml.load(SCHEMA_FILE.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def forbidden(verb: str, group: str, resource: str, namespace: str | None) -> tuple[int, dict]:
    where = ' in the namespace "%s"' % namespace if namespace else " at the cluster scope"
    name = "%s.%s" % (resource, group) if group else resource
    return 403, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "reason": "Forbidden", "code": 403,
                 "details": {"group": group, "kind": resource},
                 "message": '%s is forbidden: User "%s" cannot %s resource "%s" in API group '
                            '"%s"%s' % (name, USER, verb, resource, group, where)}


def _known_keys(model) -> set[str]:
    return set(model.attribute_map.values())


def validate_review(body: dict) -> dict:
    """The SelfSubjectAccessReview's resourceAttributes, or InvalidReview. Unknown fields are
    refused (the client's models list every field of the published API)."""
    from kubernetes import client

    if body.get("apiVersion", "authorization.k8s.io/v1") != "authorization.k8s.io/v1" or \
            body.get("kind", "SelfSubjectAccessReview") != "SelfSubjectAccessReview":
        raise InvalidReview("not a SelfSubjectAccessReview: %r" % body)
    unknown = set(body) - _known_keys(client.V1SelfSubjectAccessReview)
    if unknown:
        raise InvalidReview("unknown fields %s" % sorted(unknown))
    spec = body.get("spec") or {}
    unknown = set(spec) - _known_keys(client.V1SelfSubjectAccessReviewSpec)
    attributes = spec.get("resourceAttributes")
    if unknown or not attributes:
        raise InvalidReview("spec needs resourceAttributes (unknown fields %s)" % sorted(unknown))
    unknown = set(attributes) - _known_keys(client.V1ResourceAttributes)
    if unknown:
        raise InvalidReview("unknown fields of resourceAttributes %s" % sorted(unknown))
    return attributes


class ClusterApi:
    """The cluster's served groups, RBAC, Kueue queues and nodes (see the module's doc).

    Parameters
    ----------
    jobset_installed : whether the JobSet CRD (and controller) is installed.
    kueue_installed : whether Kueue's CRDs are.
    local_queues : Kueue LocalQueues.
    denied : (verb, API group, resource) the user may not do (in any namespace); everything
        else is allowed.
    nodes : {"name", "allocatable"} of each node.
    """

    def __init__(self, *, jobset_installed: bool = True, kueue_installed: bool = False,
                 local_queues: Collection[LocalQueue] = (),
                 denied: Collection[tuple[str, str, str]] = (),
                 nodes: Collection[dict] = (DEFAULT_NODE,)) -> None:
        self.installed = {JOBSET_GROUP: jobset_installed, KUEUE_GROUP: kueue_installed}
        self.local_queues = {(q.namespace, q.name): q for q in local_queues}
        self.denied = set(denied)
        self.nodes = [copy.deepcopy(n) for n in nodes]
        self.reviews: list[dict] = []

    def allowed(self, verb: str, group: str, resource: str) -> bool:
        return (verb, group, resource) not in self.denied

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict] | None:
        """The answer to a call of this module's, or None for the other routes."""
        parts = path.strip("/").split("/")
        if method == "GET" and len(parts) == 3 and parts[0] == "apis" and \
                (parts[1], parts[2]) in SERVED:
            return self._discovery(parts[1], parts[2])
        if method == "GET" and path.startswith(CRDS):
            return self._crd(path[len(CRDS):])
        if method == "POST" and path == REVIEWS:
            return self._review(json.loads(body or b"{}"))
        if method == "GET" and path == NODES:
            if not self.allowed("list", "", "nodes"):
                return forbidden("list", "", "nodes", None)
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {},
                         "items": [self._node(n) for n in self.nodes]}
        prefix = "/apis/%s/%s/namespaces/" % (KUEUE_GROUP, KUEUE_VERSION)
        if path.startswith(prefix):
            rest = path[len(prefix):].split("/")
            if not self.installed[KUEUE_GROUP]:
                return _not_found("the server could not find the requested resource")
            if method == "GET" and len(rest) == 3 and rest[1] == "localqueues":
                return self._local_queue(rest[0], rest[2])
        return None

    def _discovery(self, group: str, version: str) -> tuple[int, dict]:
        if not self.installed.get(group):
            return _not_found("the server could not find the requested resource")
        return 200, {"kind": "APIResourceList", "apiVersion": "v1",
                     "groupVersion": "%s/%s" % (group, version),
                     "resources": [{"name": name, "singularName": "" if "/" in name
                                    else kind.lower(), "namespaced": kind != "ClusterQueue"
                                    and kind != "ResourceFlavor", "kind": kind,
                                    "verbs": ["get", "patch", "update"] if "/" in name
                                    else VERBS}
                                   for name, kind in SERVED[(group, version)]]}

    def _crd(self, name: str) -> tuple[int, dict]:
        if not self.allowed("get", "apiextensions.k8s.io", "customresourcedefinitions"):
            return forbidden("get", "apiextensions.k8s.io", "customresourcedefinitions", None)
        if name != "jobsets.%s" % JOBSET_GROUP or not self.installed[JOBSET_GROUP]:
            return _not_found('customresourcedefinitions.apiextensions.k8s.io "%s" not found'
                              % name)
        return 200, jobset_crd()

    def _review(self, body: dict) -> tuple[int, dict]:
        if not self.allowed("create", "authorization.k8s.io", "selfsubjectaccessreviews"):
            return forbidden("create", "authorization.k8s.io", "selfsubjectaccessreviews", None)
        try:
            attributes = validate_review(body)
        except InvalidReview as error:
            return 422, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                         "status": "Failure", "reason": "Invalid", "code": 422,
                         "message": str(error)}
        self.reviews.append(attributes)
        allowed = self.allowed(attributes.get("verb", ""), attributes.get("group", ""),
                               attributes.get("resource", ""))
        status = {"allowed": allowed}
        if allowed:
            status["reason"] = 'RBAC: allowed by RoleBinding "emulated" of Role "emulated"'
        return 201, {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                     "metadata": {}, "spec": body.get("spec"), "status": status}

    def _local_queue(self, namespace: str, name: str) -> tuple[int, dict]:
        if not self.allowed("get", KUEUE_GROUP, "localqueues"):
            return forbidden("get", KUEUE_GROUP, "localqueues", namespace)
        queue = self.local_queues.get((namespace, name))
        if queue is None:
            return _not_found('localqueues.%s "%s" not found' % (KUEUE_GROUP, name))
        condition = ({"type": "Active", "status": "True", "reason": "Ready",
                      "message": "Can submit new workloads to localQueue"} if queue.active else
                     {"type": "Active", "status": "False", "reason": "ClusterQueueDoesNotExist",
                      "message": "Can't submit new workloads to clusterQueue"})
        condition["lastTransitionTime"] = "2026-01-01T00:00:00Z"
        return 200, {"apiVersion": "%s/%s" % (KUEUE_GROUP, KUEUE_VERSION), "kind": "LocalQueue",
                     "metadata": {"name": name, "namespace": namespace},
                     "spec": {"clusterQueue": queue.cluster_queue, "stopPolicy": "None"},
                     "status": {"conditions": [condition], "pendingWorkloads": 0,
                                "admittedWorkloads": 0, "reservingWorkloads": 0}}

    @staticmethod
    def _node(node: dict) -> dict:
        return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": node["name"]},
                "status": {"allocatable": dict(node["allocatable"]),
                           "capacity": dict(node["allocatable"])}}


def _not_found(message: str) -> tuple[int, dict]:
    return 404, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "reason": "NotFound", "code": 404, "message": message}
