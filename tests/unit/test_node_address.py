"""Node 0 of a remote gang never listens on a loopback address (issue 40, point 3): the address
it finds is where the other nodes, on other machines, connect; loopback is refused at once,
naming the address, where it came from and the fix."""

import socket

import pytest

import metaflow  # noqa: F401  (loads the extension)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends import (
    address, batch, kubernetes, registry, trampoline)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import \
    TorchDistributedEnvironmentError
from tests import records

BATCH_NODE_0 = dict(trampoline.plan_env(batch.MAIN_NODE_ENV, "train", 2),
                    **{batch.NUM_NODES: "2"})
K8S_NODE_0 = dict(trampoline.plan_env(kubernetes.MAIN_NODE_ENV, "train", 2),
                  **{kubernetes.NUM_NODES: "2",
                     kubernetes.MASTER_ADDR: "js-a-control-0-0.js-a.default.svc.cluster.local"})


@pytest.fixture
def debian_hosts(tmp_path):
    """An image's /etc/hosts as Debian and Ubuntu write it."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\tlocalhost\n127.0.1.1\tip-10-0-0-7.ec2.internal ip-10-0-0-7\n")
    return str(hosts)


@pytest.mark.parametrize("value, loopback", [
    ("127.0.0.1", True), ("127.0.1.1", True), ("127.255.3.4", True), ("::1", True),
    ("10.0.0.7", False), ("192.0.2.2", False), ("fd00::2", False), ("fe80::1%eth0", False),
    ("not-an-address", False)])
def test_what_counts_as_loopback(value, loopback):
    assert address.is_loopback(value) is loopback


def test_a_hostname_that_resolves_to_127_0_1_1_is_refused_naming_address_source_and_fix(
        debian_hosts):
    with pytest.raises(TorchDistributedEnvironmentError) as raised:
        address.batch_main_address("train", 2, {}, lambda: "ip-10-0-0-7",
                                   lambda name: (name, [], ["127.0.1.1"]), debian_hosts)
    message = str(raised.value)
    assert "on step *train*" in message
    assert "node 0 of this 2-node gang found only the loopback address 127.0.1.1" in message
    assert "its hostname 'ip-10-0-0-7' resolves to 127.0.1.1" in message
    assert ("%s maps 'ip-10-0-0-7' to it (line '127.0.1.1\\tip-10-0-0-7.ec2.internal "
            "ip-10-0-0-7')" % debian_hosts) in message
    assert "before any rank started" in message
    assert "remove that line" in message and "troubleshooting.md" in message


def test_metaflows_own_main_ip_is_loopback_too_when_the_hostname_is(debian_hosts):
    env = {"MF_PARALLEL_MAIN_IP": "127.0.1.1"}  # what Metaflow's @batch set from the hostname
    with pytest.raises(TorchDistributedEnvironmentError,
                       match="MF_PARALLEL_MAIN_IP is 127.0.1.1 .* its hostname 'ip-10-0-0-7' "
                             "resolves to 127.0.1.1"):
        address.batch_main_address("train", 2, env, lambda: "ip-10-0-0-7",
                                   lambda name: (name, [], ["127.0.1.1"]), debian_hosts)


def test_the_first_address_that_is_not_loopback_is_node_0s(debian_hosts):
    lookup = lambda name: (name, [], ["127.0.1.1", "10.0.0.7"])  # noqa: E731
    assert address.batch_main_address("train", 2, {"MF_PARALLEL_MAIN_IP": "127.0.1.1"},
                                      lambda: "h", lookup, debian_hosts) == "10.0.0.7"
    assert address.batch_main_address("train", 2, {"MF_PARALLEL_MAIN_IP": "10.0.0.9"},
                                      lambda: "h", lookup, debian_hosts) == "10.0.0.9"


def test_a_hostname_the_resolver_maps_to_loopback_says_so(tmp_path):
    with pytest.raises(TorchDistributedEnvironmentError,
                       match="'h' resolves to it through the resolver \\(DNS\\)"):
        address.batch_main_address("train", 2, {}, lambda: "h",
                                   lambda name: (name, [], ["127.0.0.1"]),
                                   str(tmp_path / "no-hosts"))


def test_a_hostname_that_does_not_resolve_is_named():
    def lookup(name):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(TorchDistributedEnvironmentError,
                       match="its hostname 'h' does not resolve \\(.*Name or service not known"):
        address.batch_main_address("train", 2, {}, lambda: "h", lookup)


def test_batch_node_0_refuses_loopback_before_any_rank_starts(monkeypatch):
    """The seam the task goes through (registry.node_zero, called before the gang starts),
    with the machine's resolution replaced: 127.0.1.1 was node 0's address before."""
    monkeypatch.setattr(socket, "gethostname", lambda: "ip-10-0-0-7")
    monkeypatch.setattr(socket, "gethostbyname_ex", lambda name: (name, [], ["127.0.1.1"]))
    with pytest.raises(TorchDistributedEnvironmentError,
                       match="found only the loopback address 127.0.1.1"):
        registry.node_zero(records.gang_step(nodes=2), BATCH_NODE_0, records.IDENTITY)
    monkeypatch.setattr(socket, "gethostbyname_ex", lambda name: (name, [], ["10.0.0.7"]))
    placed = registry.node_zero(records.gang_step(nodes=2), BATCH_NODE_0, records.IDENTITY)
    assert (placed.backend, placed.master_addr) == ("batch", "10.0.0.7")


def test_kubernetes_node_0_refuses_its_own_name_resolving_to_loopback():
    backend = kubernetes.KubernetesBackend(resolve=lambda name: "127.0.1.1")
    with pytest.raises(TorchDistributedEnvironmentError,
                       match="found only the loopback address 127.0.1.1 for itself: its own "
                             "name js-a-control-0-0.js-a.default.svc.cluster.local resolves "
                             "to it on node 0"):
        backend.node_zero(records.gang_step(nodes=2), K8S_NODE_0, records.IDENTITY)
    backend = kubernetes.KubernetesBackend(resolve=lambda name: "10.1.2.3")
    assert backend.node_zero(records.gang_step(nodes=2), K8S_NODE_0,
                             records.IDENTITY).master_addr == "10.1.2.3"
