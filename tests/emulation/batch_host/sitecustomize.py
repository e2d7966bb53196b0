"""The network identity of an emulated AWS Batch node (tests/emulation/batch_jobs.py puts this
directory on the node's PYTHONPATH when its nodes are processes of this host): in the node's
Python, the hostname resolves to BATCH_EMULATOR_HOST_ADDRESS, the node's private address (this
host's own non-loopback address, tests/emulation/hosts.py), as a node's hostname resolves to
its private IP on AWS. A node given 127.0.1.1 stands for an image whose /etc/hosts maps the
hostname to it (Debian's and Ubuntu's default). Only Python's socket module is redirected:
gloo, in C++, still resolves the hostname through this host's resolver."""

import os
import socket

_ADDRESS = os.environ.get("BATCH_EMULATOR_HOST_ADDRESS")


def _mine(host):
    return isinstance(host, str) and host.rstrip(".") in (_NAME, _NAME.split(".")[0])


def _gethostbyname_ex(host, _real=socket.gethostbyname_ex):
    return (host, [], [_ADDRESS]) if _mine(host) else _real(host)


def _gethostbyname(host, _real=socket.gethostbyname):
    return _ADDRESS if _mine(host) else _real(host)


def _getaddrinfo(host, *args, _real=socket.getaddrinfo, **kwargs):
    return _real(_ADDRESS if _mine(host) else host, *args, **kwargs)


if _ADDRESS:
    _NAME = socket.gethostname()
    socket.gethostbyname_ex = _gethostbyname_ex
    socket.gethostbyname = _gethostbyname
    socket.getaddrinfo = _getaddrinfo
