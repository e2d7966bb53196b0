"""Kubernetes: a NetworkPolicy beside each gang's JobSet, so that only the JobSet's own pods
reach its pods (the gang's store on node 0, gloo's and NCCL's connections between nodes).

The policy selects the JobSet's pods by the label the JobSet controller puts on every pod of
a JobSet (`jobset.sigs.k8s.io/jobset-name`) and admits traffic to them, on every port (gloo
and NCCL listen on ports the kernel chooses), only from pods of the same label in the same
namespace. It is owned by the JobSet (ownerReferences, without blockOwnerDeletion, which would
need the right to update the JobSet's finalizers), so Kubernetes' garbage collector removes it
with the JobSet. It is created right after the JobSet, before its pods can have been
scheduled and pulled their image; a cluster whose network plugin does not enforce
NetworkPolicies accepts it and ignores it (docs/security.md).

A caller who may not create NetworkPolicies still gets the gang: the run goes on, with one
warning that names the permission and what stays open.

A gang deployed to Argo Workflows gets the same kind of policy (own_pods_only), selecting its
pods by labels of its own and created by the workflow itself (argo.py).
"""

from typing import Any, Callable, Dict, Optional, Type

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
# The label the JobSet controller sets on every pod of a JobSet: its name.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
NETWORKING_GROUP = "networking.k8s.io"
POLICY_API = "%s/v1" % NETWORKING_GROUP
# (verb, API group, resource) the run needs for the policy (preflight/kubernetes.py asks).
POLICY_ACCESS = ("create", NETWORKING_GROUP, "networkpolicies")
MANAGED_BY = {"app.kubernetes.io/managed-by": "metaflow-torch-distributed"}


def policy_name(jobset_name: str) -> str:
    """The gang's NetworkPolicy: the JobSet's name and a suffix (names are per kind, the
    suffix says what it is in `kubectl get networkpolicies`)."""
    return "%s-gang" % jobset_name


def network_policy(jobset_name: str, namespace: str, jobset_uid: str) -> Dict[str, Any]:
    """The NetworkPolicy that admits traffic to the JobSet's pods only from its own pods."""
    policy = own_pods_only(policy_name(jobset_name), {JOBSET_NAME_LABEL: jobset_name})
    policy["metadata"].update(
        namespace=namespace,
        ownerReferences=[{"apiVersion": JOBSET_API, "kind": "JobSet", "name": jobset_name,
                          "uid": jobset_uid}])
    return policy


def own_pods_only(name: str, labels: Dict[str, str]) -> Dict[str, Any]:
    """A NetworkPolicy `name` that selects the pods carrying all of `labels` and admits
    traffic to them, on every port, only from pods carrying all of them (in its namespace)."""
    pods = {"matchLabels": dict(labels)}
    return {
        "apiVersion": POLICY_API,
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": dict(MANAGED_BY, **labels)},
        "spec": {
            "podSelector": pods,
            "policyTypes": ["Ingress"],
            # no `ports`: every port, since gloo and NCCL listen on ephemeral ones
            "ingress": [{"from": [{"podSelector": pods}]}],
        },
    }


def isolation_warning(step_name: str, namespace: str, jobset_name: str, status: Any,
                      reason: str) -> str:
    """The warning for a JobSet whose NetworkPolicy could not be created."""
    if status == 403:
        why = ("you may not create networkpolicies.%s in namespace %s (%s)"
               % (NETWORKING_GROUP, namespace, reason))
    else:
        why = "the API server refused it (%s %s)" % (status, reason)
    return ("@torch_distributed on step %s: the gang runs without its NetworkPolicy %s: %s. Any "
            "pod of the cluster that reaches JobSet %s's pods can connect to the gang's store "
            "and to gloo's and NCCL's ports. Grant `create` on networkpolicies.%s in namespace "
            "%s to isolate the gang; see docs/kubernetes.md, \"Cluster needs\"."
            % (step_name, policy_name(jobset_name), why, jobset_name, NETWORKING_GROUP,
               namespace))


def isolate(client: Any, api_error: Type[Exception], step_name: str, jobset_name: str,
            namespace: str, warn: Callable[[str], None]) -> Optional[Dict[str, Any]]:
    """Create the NetworkPolicy of the JobSet `jobset_name` (just created). `client` is the
    `kubernetes.client` module, configured as Metaflow's own calls; a refused call is `warn`ed
    (never raised) and None returned, else the policy created."""
    try:
        jobset = client.CustomObjectsApi().get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", jobset_name)
        body = network_policy(jobset_name, namespace, jobset["metadata"]["uid"])
        client.NetworkingV1Api().create_namespaced_network_policy(namespace, body)
    except api_error as error:
        warn(isolation_warning(step_name, namespace, jobset_name, getattr(error, "status", ""),
                               getattr(error, "reason", "") or str(error)))
        return None
    return body
