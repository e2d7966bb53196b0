"""The container runtime of an emulated host: runs a command as PID 1 of a host of its own.

    nsenter --net=/run/netns/NS python -I -S node_host.py SPEC REPORT_FD -- COMMAND...

(tests/emulation/netns.py builds that line.) In the host's network namespace, this process
unshares a UTS, mount and PID namespace and forks the container: PID 1, which sets the
hostname, binds the host's /etc/hosts and /etc/resolv.conf, puts a private folder over /tmp
(the `shared` folders under /tmp stay visible at their own paths), mounts the namespace's
/proc, and execs COMMAND with the environment in SPEC; with `cgroups` in SPEC (memory, cpu),
this process first joins them, so the container and everything it starts are in them.
It writes "pid N" (PID 1 as this machine sees it) to REPORT_FD, or "error ..." when the
container could not start; the fd closes when COMMAND is running.

This process stays as the container's parent, like a container runtime's shim: it ignores
SIGTERM and SIGINT (PID 1 gets what is sent to it) and exits as PID 1 did, killed by the
same signal when it was, so the emulator reads the exit code a container runtime reports.
As PID 1, COMMAND gets only the signals it handles, and when it exits the kernel kills every
other process of the host. `util-linux`'s `unshare --fork` would do the namespaces, but it
exits 1 for a child killed by a signal, which hides the 137 of a SIGKILL.
"""

import ctypes
import json
import os
import resource
import signal
import socket
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWPID = 0x20000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_PDEATHSIG = 1
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, "%s: %s" % (what, os.strerror(errno)))


def _mount(source, target, fstype, flags):
    _check(_libc.mount(source and source.encode(), target.encode(),
                       fstype and fstype.encode(), flags, None),
           "mount %s on %s" % (source, target))


def become_host(spec):
    """In PID 1, before the exec: the host's name, /etc/hosts, /tmp and /proc."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing of this host's mounts leaks out
    socket.sethostname(spec["hostname"])
    _mount(spec["etc_hosts"], "/etc/hosts", None, MS_BIND)
    _mount(spec["resolv_conf"], "/etc/resolv.conf", None, MS_BIND)
    for path in spec["shared"]:
        inside = os.path.join(spec["tmp"], os.path.relpath(path, "/tmp"))
        os.makedirs(inside, exist_ok=True)
        _mount(path, inside, None, MS_BIND | MS_REC)
    _mount(spec["tmp"], "/tmp", None, MS_BIND | MS_REC)
    _mount("proc", "/proc", "proc", 0)
    os.chdir(spec["cwd"])


def main():
    spec, report = json.loads(sys.argv[1]), int(sys.argv[2])
    command = sys.argv[sys.argv.index("--") + 1:]
    os.set_inheritable(report, False)  # closes at the exec: the container is running
    for group in spec.get("cgroups", ()):  # the container's cgroups: its processes inherit them
        with open(os.path.join(group, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    _check(_libc.unshare(CLONE_NEWUTS | CLONE_NEWNS | CLONE_NEWPID), "unshare")
    for signum in _STOPS:
        signal.signal(signum, signal.SIG_IGN)
    pid = os.fork()
    if pid == 0:
        try:
            for signum in _STOPS:
                signal.signal(signum, signal.SIG_DFL)
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the host dies with its runtime
            become_host(spec)
            os.execvpe(command[0], command, spec["env"])
        except OSError as error:
            os.write(report, b"error %s\n" % str(error).encode())
            os._exit(127)
    os.write(report, b"pid %d\n" % pid)
    os.close(report)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
