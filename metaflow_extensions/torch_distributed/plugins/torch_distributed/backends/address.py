"""Node 0's address on a remote backend: where the other nodes, on other machines, connect.

Node 0 listens on that one address (gang/leader.py `_bind`), never on every interface. A
loopback address (127.0.0.0/8, ::1) is reachable from node 0's own machine only, so a gang
whose node 0 finds nothing else could never form: node 0 stops before any rank starts and
says which address it found, where it came from and the fix. The usual cause is the image's
/etc/hosts: Debian and Ubuntu map the machine's hostname to 127.0.1.1, and AWS Batch finds
the main node's address from its hostname (as Metaflow's @batch does).
"""

import ipaddress
import socket
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from ..core.errors import TorchDistributedEnvironmentError

HOSTS_FILE = "/etc/hosts"
TROUBLESHOOTING = 'docs/troubleshooting.md, "Node 0 found only a loopback address"'


def is_loopback(address: str) -> bool:
    """Whether `address` (an IP address) reaches its own machine only."""
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def hosts_line(name: str, path: str = HOSTS_FILE) -> Optional[str]:
    """The first line of the hosts file `path` that maps `name`, as written, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                words = line.split("#", 1)[0].split()
                if len(words) > 1 and name in words[1:]:
                    return line.strip()
    except OSError:
        return None
    return None


def _source(name: str, address: str, hosts_file: str) -> str:
    line = hosts_line(name, hosts_file)
    if line is None or line.split()[0] != address:
        return "%r resolves to it through the resolver (DNS), not %s" % (name, hosts_file)
    return "%s maps %r to it (line %r)" % (hosts_file, name, line)


def loopback_error(step_name: str, nodes: int, address: str, what: str,
                   source: str) -> TorchDistributedEnvironmentError:
    """The error of a node 0 whose only address is the loopback `address`."""
    return TorchDistributedEnvironmentError(
        step_name, "node 0 of this %d-node gang found only the loopback address %s for itself: "
        "%s, and %s. The other nodes run on other machines and cannot reach node 0 there, so "
        "node 0 stopped before any rank started. Fix: make the node's name resolve to its "
        "private address, not to a 127.x address: the container's /etc/hosts must not map "
        "it to loopback (Debian and Ubuntu images add a '127.0.1.1 <hostname>' line); remove "
        "that line in the image's entrypoint, or serve the name from DNS. See %s."
        % (nodes, address, what, source, TROUBLESHOOTING))


def batch_main_address(step_name: str, nodes: int, environ: Mapping[str, str],
                       hostname: Optional[Callable[[], str]] = None,
                       lookup: Optional[Callable[[str], Tuple[str, List[str], List[str]]]]
                       = None,
                       hosts_file: str = HOSTS_FILE) -> str:
    """The main node's private address on AWS Batch, which AWS does not tell the main node:
    MF_PARALLEL_MAIN_IP (set by Metaflow's @batch from the hostname) or the hostname's
    addresses, the first that is not loopback. Raises when every one is."""
    given = environ.get("MF_PARALLEL_MAIN_IP")
    if given and not is_loopback(given):
        return given
    name = (hostname or socket.gethostname)()
    try:
        addresses: Sequence[str] = (lookup or socket.gethostbyname_ex)(name)[-1]
    except OSError as ex:
        raise TorchDistributedEnvironmentError(
            step_name, "node 0 of this %d-node gang cannot find its own address: its hostname "
            "%r does not resolve (%s). The other nodes are told node 0's private address; node "
            "0 must find the same one from its hostname, as Metaflow's @batch does. Fix: make "
            "the image resolve its hostname to the node's private address (/etc/hosts or DNS). "
            "See %s." % (nodes, name, ex, TROUBLESHOOTING)) from ex
    found = [a for a in ([given] if given else []) + list(addresses) if a]
    usable = [a for a in found if not is_loopback(a)]
    if usable:
        return usable[0]
    what = "its hostname %r resolves to %s" % (name, ", ".join(addresses) or "no address")
    if given:
        what = "MF_PARALLEL_MAIN_IP is %s (Metaflow's @batch sets it from the hostname) and %s" \
            % (given, what)
    loopback = found[0] if found else "127.0.0.1"
    raise loopback_error(step_name, nodes, loopback, what, _source(name, loopback, hosts_file))


def check_resolved(step_name: str, nodes: int, name: str, address: str,
                   hosts_file: str = HOSTS_FILE) -> str:
    """`address`, which node 0's own DNS name `name` resolved to on node 0 (Kubernetes: the
    control pod's name, which the other pods resolve too); raises when it is loopback."""
    if is_loopback(address):
        raise loopback_error(step_name, nodes, address,
                             "its own name %s resolves to it on node 0" % name,
                             _source(name, address, hosts_file))
    return address
