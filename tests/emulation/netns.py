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
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from . import dns

ENV = "TD_EMULATION_HOSTS"
SUBNETS = ipaddress.ip_network("10.77.0.0/16")
SHIM = Path(__file__).with_name("node_host.py")
REPOSITORY = Path(__file__).resolve().parents[2]
_LOCK = Path("/run/lock/td-emulation-hosts.lock")
# cgroup v1's memory and cpu hierarchies, where a host's cgroups are made (cgroup v2: the root)
_MEMORY_V1 = Path("/sys/fs/cgroup/memory")
_CPU_V1 = Path("/sys/fs/cgroup/cpu")
_CGROUP_V2 = Path("/sys/fs/cgroup")
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
    for root in (_MEMORY_V1, _CPU_V1, _CGROUP_V2):
        for group in root.glob("td*n*") if root.is_dir() else ():
            found = _NAME.match(group.name)
            if found and not _alive(int(found.group(1))):
                remove_cgroup(group)


def memory_cgroup(name: str, limit_bytes: int | None) -> tuple[Path | None, str]:
    """A memory cgroup called `name` for a host's container, limited to `limit_bytes` (its
    container's memory; None: no limit, as a pod without one), with no swap beyond it: (its
    folder, "") or, where the kernel does not let one be made, (None, why)."""
    try:
        if (_MEMORY_V1 / "memory.limit_in_bytes").exists():
            group = _MEMORY_V1 / name
            group.mkdir(exist_ok=True)
            if limit_bytes is not None:
                (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
                if (group / "memory.memsw.limit_in_bytes").exists():
                    (group / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
            return group, ""
        if "memory" in (_CGROUP_V2 / "cgroup.subtree_control").read_text().split():
            group = _CGROUP_V2 / name
            group.mkdir(exist_ok=True)
            if limit_bytes is not None:
                (group / "memory.max").write_text(str(limit_bytes))
                if (group / "memory.swap.max").exists():
                    (group / "memory.swap.max").write_text("0")
            return group, ""
        return None, "no memory controller in %s or %s" % (_MEMORY_V1, _CGROUP_V2)
    except OSError as error:
        return None, "cannot make a memory cgroup: %s" % error


def cpu_cgroup(name: str, cpus: float | None, weight_cpus: float | None
               ) -> tuple[Path | None, str]:
    """A cpu cgroup called `name` for a host's container, as a container runtime makes one:
    a hard quota of `cpus` CPUs (the CFS quota a pod's CPU limit sets; None: none) and a
    relative weight of `weight_cpus` CPUs (what a pod's CPU request or an AWS Batch job's
    vCPUs set: 1024 shares per CPU; None: the default): (its folder, "") or (None, why)."""
    shares = max(2, int(weight_cpus * 1024)) if weight_cpus else None
    try:
        if (_CPU_V1 / "cpu.cfs_quota_us").exists():
            group = _CPU_V1 / name
            group.mkdir(exist_ok=True)
            if cpus is not None:
                period = int((group / "cpu.cfs_period_us").read_text())
                (group / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpus * period))))
            if shares is not None:
                (group / "cpu.shares").write_text(str(shares))
            return group, ""
        if "cpu" in (_CGROUP_V2 / "cgroup.subtree_control").read_text().split():
            group = _CGROUP_V2 / name
            group.mkdir(exist_ok=True)
            if cpus is not None:
                (group / "cpu.max").write_text("%d 100000" % max(1000, int(cpus * 100000)))
            if shares is not None:  # the kernel's own conversion of shares to a weight
                (group / "cpu.weight").write_text(str(1 + (shares - 2) * 9999 // 262142))
            return group, ""
        return None, "no cpu controller in %s or %s" % (_CPU_V1, _CGROUP_V2)
    except OSError as error:
        return None, "cannot make a cpu cgroup: %s" % error


@functools.lru_cache(maxsize=1)
def cgroups_unavailable() -> str | None:
    """Why hosts get no memory cgroup of their own here, or None when they do (a probe)."""
    group, why_not = memory_cgroup("td%dn0" % os.getpid(), 64 << 20)
    if group is not None:
        remove_cgroup(group)
    return why_not or None


def remove_cgroup(group: Path) -> None:
    """Removes a host's cgroup once the last of its processes is gone (bounded)."""
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            for pid in (group / "cgroup.procs").read_text().split() \
                    if (group / "cgroup.procs").exists() else ():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            threading.Event().wait(0.1)


def _mac(link: str, netns: str | None = None) -> str:
    """The MAC address of `link` (in namespace `netns`, else this one)."""
    found = _ip_json(*(["-n", netns] if netns else []), "link", "show", "dev", link)
    if not found:
        raise HostsUnavailable("no link %s%s" % (link, " in %s" % netns if netns else ""))
    return found[0]["address"]


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
    bridge: str = ""
    # the hostname its container got (container_spec): what the bridge's DNS answers for it
    name: str = ""
    # its container's cgroups (container_spec: memory, cpu), removed with the host
    cgroups: list[Path] = field(default_factory=list)
    removed: bool = False

    def cut(self) -> None:
        """The host's link goes down at the bridge (a failed switch port): nothing in or out."""
        _ip("link", "set", self.veth, "down")

    def mend(self) -> None:
        _ip("link", "set", self.veth, "up")

    def deafen(self) -> None:
        """One way only: the host still sends, nothing reaches it (a switch port whose receive
        side failed). The bridge stops learning and flooding to its port and forgets its
        address, so no frame (ARP included) is forwarded to it; the host first learns for good
        the MAC addresses of the bridge and of the other hosts, whose ARP answers it could no
        longer hear, so that what it sends still goes out."""
        for address, mac in [(self.gateway, _mac(self.bridge))] + [
                (p.address, _mac("eth0", p.netns)) for p in list(network().hosts.values())
                if p is not self and not p.removed]:
            _ip("-n", self.netns, "neigh", "replace", address, "lladdr", mac, "dev", "eth0",
                "nud", "permanent")
        subprocess.run(["bridge", "link", "set", "dev", self.veth, "learning", "off", "flood",
                        "off", "mcast_flood", "off", "bcast_flood", "off"],
                       capture_output=True, text=True, timeout=30, check=True)
        for entry in json.loads(subprocess.run(
                ["bridge", "-j", "fdb", "show", "dev", self.veth], capture_output=True,
                text=True, timeout=30, check=True).stdout or "[]"):
            if "permanent" not in entry.get("state", "") and entry.get("master"):
                subprocess.run(["bridge", "fdb", "del", entry["mac"], "dev", self.veth,
                                "master"], capture_output=True, timeout=30)

    def remove(self) -> None:
        """Kills what still runs in the namespace and deletes it (its veth goes with it)."""
        if not self.removed:
            self.removed = True
            _kill_inside(self.netns)
            _ip("netns", "delete", self.netns)
            for group in self.cgroups:
                remove_cgroup(group)

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
    dns: "dns.Server | None" = None
    _count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def address(self) -> str:
        return str(self.subnet.network_address + 1)

    def add_host(self) -> Host:
        """A new namespace on the bridge, with the subnet's next free address after the last
        one given (round the subnet): an address is not given again soon after its host was
        removed. A removed host's namespace lingers, its veth on the bridge and its address up,
        until the last of its processes (killed, not yet reaped) is gone and the kernel has torn
        it down: a new host at its address would share it with the old one for that while."""
        with self._lock:
            taken = {h.address for h in self.hosts.values() if not h.removed}
            free = [str(a) for a in self.subnet.hosts() if str(a) != self.address
                    and str(a) not in taken]
            if not free:
                raise HostsUnavailable("no address left on %s" % self.subnet)
            last = next(reversed(self.hosts.values()), None)  # the hosts in the order given
            after = [a for a in free if last is None
                     or ipaddress.ip_address(a) > ipaddress.ip_address(last.address)]
            address = (after or free)[0]
            self._count += 1
            host = Host(netns="td%dn%d" % (os.getpid(), self._count),
                        veth="td%dv%d" % (os.getpid(), self._count),
                        address=address, gateway=self.address, bridge=self.bridge)
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

    def lookup(self, name: str) -> str | None:
        """The address of the host called `name` (its full hostname or its first label)."""
        return next((h.address for h in list(self.hosts.values()) if not h.removed and h.name
                     and name in (h.name.lower(), h.name.split(".")[0].lower())), None)

    def reverse(self, address: str) -> str | None:
        """The hostname of the host at `address`."""
        return next((h.name for h in list(self.hosts.values()) if not h.removed and h.name
                     and h.address == address), None)

    def close(self) -> None:
        if self.dns is not None:
            self.dns.close()
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
    # the nodes' resolver (their /etc/resolv.conf): answers at once, as a cloud's DNS does
    net.dns = dns.Server(net.address, net.lookup, net.reverse)
    atexit.register(net.close)
    return net


@functools.lru_cache(maxsize=None)
def _say_once(message: str) -> None:
    warnings.warn(message)


def listen_address() -> str:
    """Where moto and the emulated APIs listen: the bridge's address in this mode, else
    127.0.0.1."""
    return network().address if enabled() else "127.0.0.1"


def container_spec(host: Host, folder: Path, hostname: str, cwd: Path,
                   shared: tuple[Path, ...] = (), names: tuple[str, ...] = (),
                   hostname_address: str | None = None,
                   memory_bytes: int | None = None, cpus: float | None = None,
                   weight_cpus: float | None = None) -> dict:
    """What node_host.py makes of the container: its hostname, an /etc/hosts that maps
    `names` (the hostname and its first label by default) to `hostname_address` (the host's
    own address by default; 127.0.1.1 stands for a Debian or Ubuntu image), and a private
    /tmp in `folder` through which the `shared` folders under /tmp stay visible (the node's
    own folders of the emulator's: see docs/testing.md), and cgroups of its own where the kernel
    allows them (else the spec's `cgroup_unavailable` says why and the container runs in this
    one's): memory limited to `memory_bytes` (None: no limit), CPU to a quota of `cpus`
    (None: none) with the weight of `weight_cpus` (cpu_cgroup)."""
    names = names or tuple(dict.fromkeys([hostname, hostname.split(".")[0]]))
    host.name = hostname
    etc_hosts = folder / "etc-hosts"
    etc_hosts.write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                         "%s\t%s\n" % (hostname_address or host.address, " ".join(names)))
    # The bridge's DNS server (dns.py) answers every query at once, as a cloud's resolver
    # does: this machine's own nameserver is out of a node's reach (gloo's and the TCPStore's
    # reverse lookups would wait out the resolver's timeouts).
    resolv_conf = folder / "resolv.conf"
    resolv_conf.write_text("nameserver %s\noptions timeout:1 attempts:1\n" % host.gateway)
    tmp = folder / "tmp"
    tmp.mkdir(exist_ok=True)
    # What stands in for the image stays visible wherever it lies, /tmp included (a checkout or
    # a CI runner's workspace under /tmp): this repository (the package's source, the
    # emulators' shims) and the interpreter's environment.
    image = (REPOSITORY, Path(sys.prefix), Path(sys.executable).resolve().parent)
    under_tmp = sorted({p.resolve() for p in (*shared, *image)
                        if p.resolve().is_relative_to("/tmp")})
    # a folder inside another shared one is visible through it already
    outermost = [p for p in under_tmp if not any(p != q and p.is_relative_to(q)
                                                   for q in under_tmp)]
    memory, why_not = memory_cgroup(host.netns, memory_bytes)
    if why_not:
        _say_once("nodes as hosts run without a memory cgroup of their own: %s" % why_not)
    cpu, why_not_cpu = cpu_cgroup(host.netns, cpus, weight_cpus)
    if why_not_cpu:
        _say_once("nodes as hosts run without a cpu cgroup of their own: %s" % why_not_cpu)
    # on cgroup v2 both are the one folder
    host.cgroups = list(dict.fromkeys(g for g in (memory, cpu) if g is not None))
    return {"hostname": hostname, "etc_hosts": str(etc_hosts),
            "resolv_conf": str(resolv_conf), "tmp": str(tmp),
            "shared": [str(p) for p in outermost], "cwd": str(cwd),
            "cgroups": [str(g) for g in host.cgroups],
            "cgroup_unavailable": "; ".join(w for w in (why_not, why_not_cpu) if w)}
