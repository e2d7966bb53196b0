"""Cluster DNS for the emulated pods (tests/emulation/k8s_api.py puts this directory on their
PYTHONPATH): a name under the cluster domain resolves to the address the emulator published for
it in the records file, and fails like an unknown name (EAI_NONAME) until then, as a pod's
record appears only once the pod runs. Every other name goes to the host's resolver, and so
does a name in the pod's /etc/hosts (glibc reads "files" before "dns": with pods as hosts, the
kubelet's /etc/hosts maps the pod's own names).

It also stands in for the pod's emptyDir volume mounts (K8S_EMULATOR_MOUNTS: mount path ->
the pod's own directory on this host): a file Python opens under a mount path is opened in
the pod's directory instead (e.g. /mnt/out, where Metaflow's Argo tasks write their outputs).
Only Python's open() is redirected; a shell in the pod still sees the host's paths."""

import json
import os
import socket

_RECORDS = os.environ.get("K8S_EMULATOR_DNS_RECORDS")
_DOMAIN = ".svc.cluster.local"


def _in_etc_hosts(host):
    try:
        with open("/etc/hosts", encoding="utf-8") as f:
            return any(host in line.split("#")[0].split()[1:] for line in f)
    except OSError:
        return False


def _lookup(host):
    if not (_RECORDS and isinstance(host, str) and host.rstrip(".").endswith(_DOMAIN)):
        return None
    if _in_etc_hosts(host.rstrip(".")):
        return None
    try:
        with open(_RECORDS, encoding="utf-8") as f:
            records = json.load(f)
    except (OSError, ValueError):
        records = {}
    address = records.get(host.rstrip("."))
    if address is None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return address


def _wrap(resolve):
    def resolved(host, *args, **kwargs):
        address = _lookup(host)
        return resolve(host if address is None else address, *args, **kwargs)
    return resolved


socket.getaddrinfo = _wrap(socket.getaddrinfo)
socket.gethostbyname = _wrap(socket.gethostbyname)
socket.gethostbyname_ex = _wrap(socket.gethostbyname_ex)


_MOUNTS = json.loads(os.environ.get("K8S_EMULATOR_MOUNTS") or "{}")


def _mounted(path):
    if not isinstance(path, str):
        return path
    for mount, host_dir in _MOUNTS.items():
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            return os.path.join(host_dir, os.path.relpath(path, mount))
    return path


if _MOUNTS:
    import builtins

    _open = builtins.open

    def _open_mounted(file, *args, **kwargs):
        return _open(_mounted(file), *args, **kwargs)

    builtins.open = _open_mounted
