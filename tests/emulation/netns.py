"""Nodes as hosts (TD_EMULATION_HOSTS=1): every emulated node or pod its own host on a bridge.

Each host gets a network namespace with a veth to a bridge whose host end, in this host's own
namespace, carries `Network.address`: moto and the emulated APIs listen there, and nodes
reach them through it (their default route). The node's container then runs through
`node_host.py` in a UTS, mount and PID namespace of its own: its hostname, an /etc/hosts
mapping it to the host's address, a private /tmp, and the container's command as PID 1.
The approach is `.ci/slurm`'s (a veth per host, `nsenter --net`, cutting a link by setting the
veth's bridge end down), with the bridge in this host's namespace so that the launcher, moto
and the APIs need no namespace of their own.

Every process that starts emulators owns one bridge and one /24 of 10.77.0.0/16 (pytest-xdist
runs several at once); its names carry its pid, so what a killed run left behind is removed by
the next one (`_sweep`). Everything needs root and iproute2: where that is missing,
`unavailable()` says why and `network()` raises `HostsUnavailable` with it.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

ENV = "TD_EMULATION_HOSTS"
SUBNETS = ipaddress.ip_network("10.77.0.0/16")
SHIM = Path(__file__).with_name("node_host.py")
_LOCK = Path("/run/lock/td-emulation-hosts.lock")
# td<pid>br: a bridge; td<pid>n<k>: a host's namespace; td<pid>v<k>: its veth's bridge end
_NAME = re.compile(r"^td(\d+)(br|n\d+|v\d+)$")


class HostsUnavailable(RuntimeError):
    """TD_EMULATION_HOSTS=1 is set but this machine cannot give nodes hosts of their own."""


def enabled() -> bool:
    """Whether the emulators run every node as a host of its own (TD_EMULATION_HOSTS=1)."""
    return os.environ.get(ENV, "") == "1"


def unavailable() -> str | None:
    """Why nodes cannot be hosts here, or None when they can."""
    if not sys.platform.startswith("linux"):
        return "nodes as hosts need Linux namespaces (this is %s)" % sys.platform
    if os.geteuid() != 0:
        return "nodes as hosts need root (network, PID and mount namespaces, a bridge)"
    missing = [tool for tool in ("ip", "nsenter") if shutil.which(tool) is None]
    if missing:
        return "nodes as hosts need %s (iproute2, util-linux)" % " and ".join(missing)
    return None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise HostsUnavailable("`ip %s` failed: %s" % (" ".join(args), result.stderr.strip()))


def _ip_json(*args: str) -> list[dict]:
    result = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=30)
    return json.loads(result.stdout or "[]") if result.returncode == 0 else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _sweep() -> None:
    """Removes the bridges and namespaces of processes that are gone (a killed test run)."""
    for entry in _ip_json("netns", "list"):
        found = _NAME.match(entry["name"])
        if found and not _alive(int(found.group(1))):
            _kill_inside(entry["name"])
            subprocess.run(["ip", "netns", "delete", entry["name"]], capture_output=True)
    for link in _ip_json("link", "show"):
        found = _NAME.match(link["ifname"])
        if found and not _alive(int(found.group(1))):
            subprocess.run(["ip", "link", "delete", link["ifname"]], capture_output=True)


def _kill_inside(netns: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True,
                          text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class Host:
    """One emulated machine's network: a namespace with an address on the bridge."""

    netns: str
    veth: str
    address: str
    gateway: str
    removed: bool = False

    def cut(self) -> None:
        """The host's link goes down at the bridge (a failed switch port): nothing in or out."""
        _ip("link", "set", self.veth, "down")

    def mend(self) -> None:
        _ip("link", "set", self.veth, "up")

    def remove(self) -> None:
        """Kills what still runs in the namespace and deletes it (its veth goes with it)."""
        if not self.removed:
            self.removed = True
            _kill_inside(self.netns)
            _ip("netns", "delete", self.netns)

    def argv(self, command: list[str], spec: dict, report_fd: int) -> list[str]:
        """The command line that runs `command` as PID 1 of this host (node_host.py)."""
        return ["nsenter", "--net=/run/netns/%s" % self.netns, sys.executable, "-I", "-S",
                str(SHIM), json.dumps(spec), str(report_fd), "--", *command]


@dataclass
class Network:
    """This process's bridge; `address` is where moto and the emulated APIs listen."""

    bridge: str
    subnet: ipaddress.IPv4Network
    hosts: dict[str, Host] = field(default_factory=dict)
    _count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def address(self) -> str:
        return str(self.subnet.network_address + 1)

    def add_host(self) -> Host:
        """A new namespace on the bridge, with the next free address of the subnet."""
        with self._lock:
            taken = {h.address for h in self.hosts.values() if not h.removed}
            free = [str(a) for a in self.subnet.hosts() if str(a) != self.address
                    and str(a) not in taken]
            if not free:
                raise HostsUnavailable("no address left on %s" % self.subnet)
            self._count += 1
            host = Host(netns="td%dn%d" % (os.getpid(), self._count),
                        veth="td%dv%d" % (os.getpid(), self._count),
                        address=free[0], gateway=self.address)
            self.hosts[host.netns] = host
        _ip("netns", "add", host.netns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0",
            "netns", host.netns)
        _ip("link", "set", host.veth, "master", self.bridge, "up")
        _ip("-n", host.netns, "addr", "add", "%s/%d" % (host.address, self.subnet.prefixlen),
            "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("-n", host.netns, "route", "add", "default", "via", self.address)
        return host

    def close(self) -> None:
        for host in list(self.hosts.values()):
            if not host.removed:
                subprocess.run(["ip", "netns", "delete", host.netns], capture_output=True)
                host.removed = True
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)


@functools.lru_cache(maxsize=1)
def network() -> Network:
    """This process's bridge, made on first use and removed when the process exits."""
    reason = unavailable()
    if reason is not None:
        raise HostsUnavailable("%s=1: %s" % (ENV, reason))
    _LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _sweep()
        used = {ipaddress.ip_interface("%s/%d" % (a["local"], a["prefixlen"])).network
                for link in _ip_json("-4", "addr", "show") for a in link.get("addr_info", [])}
        subnet = next((s for s in SUBNETS.subnets(new_prefix=24) if not any(
            s.overlaps(u) for u in used)), None)
        if subnet is None:
            raise HostsUnavailable("every /24 of %s is taken on this host" % SUBNETS)
        net = Network(bridge="td%dbr" % os.getpid(), subnet=subnet)
        _ip("link", "add", net.bridge, "type", "bridge")
        _ip("addr", "add", "%s/%d" % (net.address, subnet.prefixlen), "dev", net.bridge)
        _ip("link", "set", net.bridge, "up")
    atexit.register(net.close)
    return net


def listen_address() -> str:
    """Where moto and the emulated APIs listen: the bridge's address in this mode, else
    127.0.0.1."""
    return network().address if enabled() else "127.0.0.1"


def container_spec(host: Host, folder: Path, hostname: str, cwd: Path,
                   shared: tuple[Path, ...] = (), names: tuple[str, ...] = (),
                   hostname_address: str | None = None) -> dict:
    """What node_host.py makes of the container: its hostname, an /etc/hosts that maps
    `names` (the hostname and its first label by default) to `hostname_address` (the host's
    own address by default; 127.0.1.1 stands for a Debian or Ubuntu image), and a private
    /tmp in `folder` through which the `shared` folders under /tmp stay visible (the test's
    folder and the emulator's: see docs/testing.md)."""
    names = names or tuple(dict.fromkeys([hostname, hostname.split(".")[0]]))
    etc_hosts = folder / "etc-hosts"
    etc_hosts.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                         "%s\t%s\n" % (hostname_address or host.address, " ".join(names)))
    # No DNS server runs on the bridge: a query is refused at once (ICMP port unreachable)
    # instead of waiting out the resolver's timeouts for this machine's nameserver, which a
    # node cannot reach (gloo's and the TCPStore's reverse lookups would eat a short timeout).
    resolv_conf = folder / "resolv.conf"
    resolv_conf.write_text("nameserver %s\noptions timeout:1 attempts:1\n" % host.gateway)
    tmp = folder / "tmp"
    tmp.mkdir(exist_ok=True)
    under_tmp = sorted({p.resolve() for p in shared if p.resolve().is_relative_to("/tmp")})
    # a folder inside another shared one is visible through it already
    outermost = [p for p in under_tmp if not any(p != q and p.is_relative_to(q)
                                                   for q in under_tmp)]
    return {"hostname": hostname, "etc_hosts": str(etc_hosts),
            "resolv_conf": str(resolv_conf), "tmp": str(tmp),
            "shared": [str(p) for p in outermost], "cwd": str(cwd)}
