"""The NetworkPolicy beside a gang's JobSet (backends/isolation.py): its construction against a
golden value and the published Kubernetes API (the kubernetes client's models), and a refusal
that warns instead of failing the run. The emulated cluster creates and collects it end to
end (tests/emulation/test_k8s_gang.py)."""

from types import SimpleNamespace

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends import isolation
from tests.emulation.k8s_policies import InvalidObject, validate_object

UID = "0b6f3a54-8f3e-4a4c-9d55-0a2f6a1d3c11"


def test_the_policy_admits_the_jobsets_own_pods_only_golden():
    got = isolation.network_policy("js-3f2a1b", "team-a", UID)
    pods = {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "js-3f2a1b"}}
    assert got == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "js-3f2a1b-gang",
            "namespace": "team-a",
            "labels": {"app.kubernetes.io/managed-by": "metaflow-torch-distributed",
                       "jobset.sigs.k8s.io/jobset-name": "js-3f2a1b"},
            "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                 "name": "js-3f2a1b", "uid": UID}],
        },
        "spec": {"podSelector": pods, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": pods}]}]},
    }
    validate_object(got, "V1NetworkPolicy")


def test_the_validator_refuses_what_the_api_server_would():
    policy = isolation.network_policy("js-1", "default", UID)
    policy["spec"]["ingress"][0]["from"][0]["podSelektor"] = {}
    with pytest.raises(InvalidObject, match="unknown fields"):
        validate_object(policy, "V1NetworkPolicy")
    policy = isolation.network_policy("js-1", "default", UID)
    del policy["metadata"]["ownerReferences"][0]["uid"]
    with pytest.raises(InvalidObject, match="uid"):
        validate_object(policy, "V1NetworkPolicy")


class ApiError(Exception):
    def __init__(self, status, reason):
        super().__init__("(%s) Reason: %s" % (status, reason))
        self.status, self.reason = status, reason


def _client(created, refuse=None):
    def create(namespace, body):
        if refuse:
            raise ApiError(*refuse)
        created.append((namespace, body))

    return SimpleNamespace(
        CustomObjectsApi=lambda: SimpleNamespace(
            get_namespaced_custom_object=lambda *a: {"metadata": {"uid": UID}}),
        NetworkingV1Api=lambda: SimpleNamespace(create_namespaced_network_policy=create))


def test_the_policy_is_created_owned_by_the_jobset():
    created, warned = [], []
    body = isolation.isolate(_client(created), ApiError, "train", "js-1", "ns", warned.append)
    assert created == [("ns", body)] and not warned
    assert body["metadata"]["ownerReferences"][0]["uid"] == UID


def test_a_forbidden_policy_warns_naming_the_permission_and_the_run_goes_on():
    created, warned = [], []
    assert isolation.isolate(_client(created, (403, "Forbidden")), ApiError, "train", "js-1",
                             "ns", warned.append) is None
    [warning] = warned
    assert warning.startswith("@torch_distributed on step train: the gang runs without its "
                              "NetworkPolicy js-1-gang: you may not create "
                              "networkpolicies.networking.k8s.io in namespace ns")
    assert "Grant `create` on networkpolicies.networking.k8s.io in namespace ns" in warning
    assert "can connect to the gang's store" in warning
