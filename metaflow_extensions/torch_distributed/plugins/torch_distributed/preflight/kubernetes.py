"""The preflight on Kubernetes: the JobSet API and its version, what the caller may do with
JobSets and pods in the namespace, a Kueue LocalQueue named in the step's labels, and nodes
that advertise the GPUs a pod asks for (preflight.py).

`gather` reads the API through an injected `kubernetes` client module and ApiClient (the
configuration Metaflow uses) and never writes anything but SelfSubjectAccessReviews, which
only ask; `check` is a pure function of what it answered (a `KubernetesFacts`).
"""

from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Type, TypeVar

from ..backends.isolation import POLICY_ACCESS
from ..preflight.common import (Finding, GangNeeds, check_image, check_shared_memory, failed,
                                passed, unknown, warned)

if TYPE_CHECKING:  # the kubernetes package is imported where the preflight uses it
    from kubernetes.client import ApiException

JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
JOBSET_CRD = "jobsets.jobset.x-k8s.io"
# The release whose CRD the emulation validates against, and the install command its docs give.
JOBSET_RELEASE = "v0.12.0"
JOBSET_INSTALL = ("kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/"
                  "releases/download/%s/manifests.yaml" % JOBSET_RELEASE)
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# What `run --with kubernetes` does with a gang of N > 1 nodes (one JobSet) and with a one-node
# gang (one Job), as (verb, API group, resource) in the step's namespace (kubernetes_cli.py,
# kubernetes_jobsets.py, kubernetes_job.py).
GANG_ACCESS = (
    ("create", JOBSET_GROUP, "jobsets"),
    ("get", JOBSET_GROUP, "jobsets"),
    ("delete", JOBSET_GROUP, "jobsets"),
    ("list", "", "pods"),
)
JOB_ACCESS = (
    ("create", "batch", "jobs"),
    ("get", "batch", "jobs"),
    ("list", "", "pods"),
)
GPU_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
# (verb, API group, resource) of an access review
Access = Tuple[str, str, str]
_T = TypeVar("_T")


@dataclass
class KubernetesFacts:
    """What the API answered for one step: `jobset_resources` the resource names served under
    jobset.x-k8s.io/v1alpha2 (None: the group is not served), `jobset_crd` the CRD object,
    `access` {(verb, group, resource): (allowed, reason)}, `kueue_served`, `local_queue`,
    `nodes` (NodeList items); `refused` says which calls were refused and why."""

    jobset_resources: Optional[List[str]] = None
    jobset_crd: Optional[Dict[str, Any]] = None
    access: Dict[Access, Tuple[bool, str]] = field(default_factory=dict)
    kueue_served: Optional[bool] = None
    local_queue: Optional[Dict[str, Any]] = None
    nodes: Optional[List[Dict[str, Any]]] = None
    refused: Dict[str, str] = field(default_factory=dict)


# -- the checks (pure) ---------------------------------------------------------------------

def check(needs: GangNeeds, facts: KubernetesFacts) -> List[Finding]:
    findings = check_jobset(needs, facts)
    findings += check_access(needs, facts)
    findings += check_network_policy(needs, facts)
    findings += check_queue(needs, facts)
    findings += check_gpus(needs, facts)
    findings += check_shared_memory(needs, "kubernetes")
    findings += check_image(needs, "kubernetes")
    return findings


def _namespace(needs: GangNeeds) -> str:
    return needs.options.get("namespace") or "default"


def check_jobset(needs: GangNeeds, facts: KubernetesFacts) -> List[Finding]:
    """A gang of N > 1 nodes is one JobSet: the API must serve jobsets, from a controller new
    enough for what Metaflow's JobSets set (startupPolicy: v0.4; terminalState, which Argo's
    conditions read: v0.6)."""
    if needs.nodes == 1:
        return []
    if "jobset_api" in facts.refused:
        return [unknown(needs.step, "JobSet", "the API group %s could not be read (%s)"
                        % (JOBSET_GROUP, facts.refused["jobset_api"]),
                        "kubectl api-resources --api-group=%s" % JOBSET_GROUP)]
    if not facts.jobset_resources or "jobsets" not in facts.jobset_resources:
        return [failed(needs.step, "JobSet", "the cluster does not serve %s/%s JobSets: the "
                       "JobSet controller is not installed, and a gang of %d nodes is one JobSet"
                       % (JOBSET_GROUP, JOBSET_VERSION, needs.nodes), JOBSET_INSTALL)]
    if facts.jobset_crd is None:
        return [passed(needs.step, "JobSet", "the cluster serves %s/%s JobSets (its CRD, and "
                       "so its version, could not be read: %s)" % (
                           JOBSET_GROUP, JOBSET_VERSION, facts.refused.get("jobset_crd", "")))]
    spec, status = _schema_properties(facts.jobset_crd)
    if "startupPolicy" not in spec:
        return [failed(needs.step, "JobSet", "the JobSet CRD has no spec.startupPolicy, so its "
                       "controller is older than v0.4, which Metaflow's JobSets need",
                       JOBSET_INSTALL)]
    if "terminalState" not in status:
        return [passed(needs.step, "JobSet", "JobSet v0.4 or later is installed (no "
                       "status.terminalState: older than v0.6, which `argo-workflows create` "
                       "needs; `run --with kubernetes` does not)")]
    return [passed(needs.step, "JobSet", "JobSet v0.6 or later is installed (%s/%s, "
                   "startupPolicy and terminalState)" % (JOBSET_GROUP, JOBSET_VERSION))]


def _schema_properties(crd: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(spec properties, status properties) of the CRD's v1alpha2 schema."""
    for version in crd.get("spec", {}).get("versions", []):
        if version.get("name") == JOBSET_VERSION:
            props = version.get("schema", {}).get("openAPIV3Schema", {}).get("properties", {})
            return (props.get("spec", {}).get("properties", {}),
                    props.get("status", {}).get("properties", {}))
    return {}, {}


def access_needed(needs: GangNeeds) -> Tuple[Access, ...]:
    return GANG_ACCESS if needs.nodes > 1 else JOB_ACCESS


def _resource_name(group: str, resource: str) -> str:
    return "%s.%s" % (resource, group) if group else resource


def check_access(needs: GangNeeds, facts: KubernetesFacts) -> List[Finding]:
    """What the credentials Metaflow uses may do in the step's namespace."""
    wanted = access_needed(needs)
    namespace = _namespace(needs)
    if "access" in facts.refused:
        return [unknown(needs.step, "RBAC", "SelfSubjectAccessReviews were refused (%s)"
                        % facts.refused["access"],
                        "kubectl auth can-i create %s -n %s" % (
                            _resource_name(JOBSET_GROUP, "jobsets"), namespace))]
    denied = [(verb, group, resource) for verb, group, resource in wanted
              if not facts.access.get((verb, group, resource), (False, ""))[0]]
    if denied:
        verbs = sorted({verb for verb, _, _ in denied})
        resources = sorted({_resource_name(group, resource) for _, group, resource in denied})
        fix = ("kubectl create role metaflow-gang -n %s --verb=%s --resource=%s, then "
               "kubectl create rolebinding metaflow-gang -n %s --role=metaflow-gang "
               "--user=\"$(kubectl auth whoami -o jsonpath='{.status.userInfo.username}')\" "
               "(check with `kubectl auth can-i %s %s -n %s`)"
               % (namespace, ",".join(verbs), ",".join(resources), namespace, denied[0][0],
                  _resource_name(denied[0][1], denied[0][2]), namespace))
        return [failed(needs.step, "RBAC", "in namespace %s you may not %s"
                       % (namespace, ", ".join("%s %s" % (verb, _resource_name(group, resource))
                                               for verb, group, resource in denied)), fix)]
    return [passed(needs.step, "RBAC", "in namespace %s you may %s" % (
        namespace, ", ".join("%s %s" % (verb, _resource_name(group, resource))
                             for verb, group, resource in wanted)))]


def check_network_policy(needs: GangNeeds, facts: KubernetesFacts) -> List[Finding]:
    """A gang of N > 1 nodes gets a NetworkPolicy beside its JobSet (backends/isolation.py):
    without the right to create it, the gang runs unisolated (a warning, not a failure)."""
    if needs.nodes == 1 or "access" in facts.refused:
        return []
    namespace = _namespace(needs)
    verb, group, resource = POLICY_ACCESS
    name = _resource_name(group, resource)
    if facts.access.get(POLICY_ACCESS, (False, ""))[0]:
        return [passed(needs.step, "NetworkPolicy", "in namespace %s you may create %s: each "
                       "gang's JobSet gets one that admits only its own pods" % (namespace, name))]
    return [warned(needs.step, "NetworkPolicy", "in namespace %s you may not create %s: the "
                   "gang would run without one, and any pod of the cluster could reach its "
                   "store and gloo's and NCCL's ports" % (namespace, name),
                   "kubectl create role metaflow-gang-isolation -n %s --verb=%s --resource=%s, "
                   "then kubectl create rolebinding metaflow-gang-isolation -n %s "
                   "--role=metaflow-gang-isolation --user=\"$(kubectl auth whoami -o "
                   "jsonpath='{.status.userInfo.username}')\" (check with `kubectl auth can-i "
                   "%s %s -n %s`)" % (namespace, verb, name, namespace, verb, name, namespace))]


def queue_name(needs: GangNeeds) -> Optional[str]:
    return (needs.options.get("labels") or {}).get(QUEUE_LABEL)


def check_queue(needs: GangNeeds, facts: KubernetesFacts) -> List[Finding]:
    """A Kueue LocalQueue named by the step's label exists in its namespace and is active."""
    name = queue_name(needs)
    if not name:
        return []
    namespace = _namespace(needs)
    if "local_queue" in facts.refused:
        return [unknown(needs.step, "Kueue", "LocalQueue %s could not be read (%s)"
                        % (name, facts.refused["local_queue"]),
                        "kubectl get localqueues.%s %s -n %s" % (KUEUE_GROUP, name, namespace))]
    if not facts.kueue_served:
        return [failed(needs.step, "Kueue", "the step's label %s=%s names a Kueue queue, but "
                       "the cluster does not serve %s/%s: Kueue is not installed"
                       % (QUEUE_LABEL, name, KUEUE_GROUP, KUEUE_VERSION),
                       "install Kueue (https://kueue.sigs.k8s.io/docs/installation/), or drop "
                       "the %s label from @kubernetes(labels=...)" % QUEUE_LABEL)]
    if facts.local_queue is None:
        return [failed(needs.step, "Kueue", "LocalQueue %s does not exist in namespace %s: the "
                       "JobSet would stay suspended" % (name, namespace),
                       "kubectl get localqueues -n %s lists the queues; create %s pointing at "
                       "a ClusterQueue (kubectl apply -f a LocalQueue with spec.clusterQueue), "
                       "or fix the label %s" % (namespace, name, QUEUE_LABEL))]
    active = [c for c in facts.local_queue.get("status", {}).get("conditions", [])
              if c.get("type") == "Active"]
    if active and active[0].get("status") != "True":
        return [failed(needs.step, "Kueue", "LocalQueue %s in namespace %s is not active (%s: "
                       "%s): the JobSet would stay suspended" % (
                           name, namespace, active[0].get("reason"), active[0].get("message")),
                       "kubectl describe localqueue %s -n %s; its ClusterQueue %s must exist "
                       "and be active" % (name, namespace,
                                          facts.local_queue.get("spec", {}).get("clusterQueue")))]
    return [passed(needs.step, "Kueue", "LocalQueue %s exists in namespace %s (ClusterQueue %s)"
                   % (name, namespace, facts.local_queue.get("spec", {}).get("clusterQueue")))]


def gpu_resource(needs: GangNeeds) -> str:
    vendor = (needs.options.get("gpu_vendor") or "nvidia").lower()
    return GPU_RESOURCES.get(vendor, "%s.com/gpu" % vendor)


def _quantity(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def check_gpus(needs: GangNeeds, facts: KubernetesFacts) -> List[Finding]:
    """Some node advertises the GPUs one pod asks for (a device plugin is installed)."""
    if not needs.gpu:
        return []
    resource = gpu_resource(needs)
    if "nodes" in facts.refused:
        return [unknown(needs.step, "GPUs", "nodes could not be listed (%s)"
                        % facts.refused["nodes"],
                        "kubectl get nodes -o custom-columns=NAME:.metadata.name,GPUS:"
                        ".status.allocatable.%s" % resource.replace(".", "\\."))]
    best = max([_quantity((n.get("status", {}).get("allocatable") or {}).get(resource))
                for n in facts.nodes or []] or [0])
    if best < needs.gpu:
        return [failed(needs.step, "GPUs", "each pod asks for %d %s but no node advertises "
                       "that many (the most is %d): the pods would stay Pending"
                       % (needs.gpu, resource, best),
                       "install the GPU device plugin on the GPU nodes (for NVIDIA, the "
                       "NVIDIA GPU Operator or k8s-device-plugin), add GPU nodes (an autoscaler "
                       "that scales GPU nodes from zero shows none until a pod asks), or lower "
                       "@kubernetes(gpu=...)")]
    return [passed(needs.step, "GPUs", "a node advertises %d %s" % (best, resource))]


# -- what the API answers -----------------------------------------------------------------------

def _refusal(error: Exception) -> str:
    return "%s %s" % (getattr(error, "status", ""), getattr(error, "reason", error))


def gather(needs: GangNeeds, client: ModuleType, api: object,
           api_error: Type["ApiException"]) -> KubernetesFacts:
    """The KubernetesFacts of a step. `client` is the `kubernetes.client` module, `api` an
    ApiClient with Metaflow's configuration, `api_error` the client's ApiException: a refused
    call (403, ...) is recorded in `refused`, a 404 is an answer."""
    import json

    facts = KubernetesFacts()
    custom = client.CustomObjectsApi(api)
    namespace = _namespace(needs)

    def ask(key: str, call: Callable[[], _T], not_found: Optional[_T] = None) -> Optional[_T]:
        try:
            return call()
        except api_error as error:
            if error.status == 404:
                return not_found
            facts.refused[key] = _refusal(error)
            return None

    if needs.nodes > 1:
        served = ask("jobset_api", lambda: custom.get_api_resources(JOBSET_GROUP, JOBSET_VERSION))
        facts.jobset_resources = [r.name for r in served.resources] if served else None
        if facts.jobset_resources:
            raw = ask("jobset_crd", lambda: client.ApiextensionsV1Api(
                api).read_custom_resource_definition(JOBSET_CRD, _preload_content=False))
            facts.jobset_crd = json.loads(raw.data) if raw is not None else None
    authorization = client.AuthorizationV1Api(api)
    wanted = access_needed(needs) + ((POLICY_ACCESS,) if needs.nodes > 1 else ())
    for verb, group, resource in wanted:
        review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb=verb, group=group, resource=resource)))
        answer = ask("access", lambda: authorization.create_self_subject_access_review(review))
        if answer is not None:
            facts.access[(verb, group, resource)] = (bool(answer.status.allowed),
                                                     answer.status.reason or "")
    name = queue_name(needs)
    if name:
        facts.kueue_served = ask("local_queue", lambda: custom.get_api_resources(
            KUEUE_GROUP, KUEUE_VERSION)) is not None
        if facts.kueue_served:
            facts.local_queue = ask("local_queue", lambda: custom.get_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "localqueues", name))
    if needs.gpu:
        raw = ask("nodes", lambda: client.CoreV1Api(api).list_node(_preload_content=False))
        facts.nodes = json.loads(raw.data)["items"] if raw is not None else None
    return facts
