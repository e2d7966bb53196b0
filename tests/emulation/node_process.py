"""One node's container, emulated as a local process group or, with a `Host` (netns.py,
TD_EMULATION_HOSTS=1), as PID 1 of a host of its own.

The container's command (or, on a host, its runtime shim node_host.py) runs as the leader of
a new session, so the node's whole process tree can be signalled at once. Nothing here
blocks except `start` on a host (until the container runs) and `wait`, both bounded.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import psutil

from .netns import Host

# How long a host's container may take to start (node_host.py: namespaces, mounts, exec).
HOST_START_TIMEOUT_S = 60


def docker_exit_code(returncode: int) -> int:
    """Docker reports a container killed by signal N as exit code 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class NodeProcess:
    def __init__(self, popen: subprocess.Popen, log_file,
                 marker: tuple[str, str] | None = None, host: Host | None = None,
                 init_pid: int | None = None) -> None:
        self._popen = popen
        self._host = host
        self._init_pid = init_pid
        self._log_file = log_file
        self._marker = marker
        self._kill_at: float | None = None
        self._killed = False
        self._torn_down = False
        self._doomed: list[psutil.Process] = []

    @classmethod
    def start(cls, argv: list[str], cwd: Path, env: dict[str, str], log_path: Path,
              marker: tuple[str, str] | None = None, host: Host | None = None,
              container: dict | None = None) -> NodeProcess:
        """Raises OSError when the command cannot be executed (AWS: CannotStartContainerError).
        With `marker`, a variable (name, value) in `env`, teardown also kills every process
        that carries it, as a container's cgroup takes all of its processes with it (those in
        process groups of their own included). With `host`, the command runs as PID 1 of that
        host, made as `container` says (netns.container_spec); the host is removed once the
        container is gone (`wait`)."""
        log_file = open(log_path, "ab")
        report = os.pipe() if host is not None else None
        try:
            popen = subprocess.Popen(
                # On a host the runtime carries none of the container's environment
                host.argv(argv, {**container, "env": env}, report[1]) if host is not None
                else argv,
                cwd=cwd,
                env=env if host is None else {"PATH": os.environ.get("PATH", os.defpath)},
                stdin=subprocess.DEVNULL,
                # Like the awslogs driver, stdout and stderr end up in one stream.
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(report[1],) if report is not None else (),
            )
        except OSError:
            log_file.close()
            if host is not None:
                os.close(report[0])
                host.remove()
            raise
        finally:
            if report is not None:
                os.close(report[1])
        if report is None:
            return cls(popen, log_file, marker)
        try:
            init_pid = _started_container(popen, report[0])
        except OSError:
            log_file.close()
            host.remove()
            raise
        return cls(popen, log_file, marker, host, init_pid)

    @property
    def pid(self) -> int:
        """The container's main process as this machine sees it (on a host: its PID 1)."""
        return self._init_pid if self._init_pid is not None else self._popen.pid

    @property
    def host(self) -> Host | None:
        return self._host

    @property
    def stop_requested(self) -> bool:
        return self._kill_at is not None

    def exit_code(self) -> int | None:
        """The container's exit code once its main process has exited, else None."""
        returncode = self._popen.poll()
        return None if returncode is None else docker_exit_code(returncode)

    def request_stop(self, now: float, grace_s: float, whole_group: bool = True) -> None:
        """SIGTERM now, SIGKILL once `grace_s` has passed (see `enforce`). `whole_group=False`
        is how `docker stop` (ECS, for AWS Batch) and the kubelet stop a container: SIGTERM to
        its main process only, which as PID 1 ignores it unless it installed a handler; every
        process of the container gets the SIGKILL. `whole_group=True` signals every process of
        the node (the emulator's own shutdown)."""
        if self._kill_at is None:
            self._kill_at = now + grace_s
            if whole_group:
                self._signal(signal.SIGTERM)
            elif not self._torn_down and _catches(self.pid, signal.SIGTERM):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGTERM)

    def enforce(self, now: float) -> None:
        if self._kill_at is not None and now >= self._kill_at and not self._killed:
            self._killed = True
            self._signal(signal.SIGKILL)

    def teardown(self) -> None:
        """The container is gone: nothing in its process group survives its main process."""
        if self._torn_down:
            return
        self._signal(signal.SIGKILL)
        if self._marker is not None:
            from .probes import processes_with

            for process in processes_with(*self._marker):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
                    self._doomed.append(process)
        self._torn_down = True
        self._log_file.close()

    def wait(self, timeout_s: float) -> int | None:
        """The exit code once the main process has exited and, after `teardown`, every process
        it killed is gone too (a container is removed once its cgroup is empty: a SIGKILLed
        process in uninterruptible sleep, as under load, lives on until its I/O ends); None
        if that takes longer than `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (
                self.exit_code() is None or any(_alive(p) for p in self._doomed)):
            time.sleep(0.02)
        if any(_alive(p) for p in self._doomed):
            return None
        code = self.exit_code()
        if code is not None and self._torn_down and self._host is not None:
            self._host.remove()
        return code

    def _signal(self, signum: int) -> None:
        if self._torn_down:
            return
        if self._init_pid is not None:
            # Every process of the host, whatever its session (its PID namespace is the
            # container's cgroup here); a SIGKILL of PID 1 alone would take them all.
            for process in _in_pid_namespace(self._init_pid):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.send_signal(signum)
        # ProcessLookupError: the whole group has already exited.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._popen.pid, signum)


def _started_container(popen: subprocess.Popen, report: int) -> int:
    """PID 1 of the host's container, once it runs (node_host.py's report); OSError when it
    could not start."""
    lines = []
    with os.fdopen(report, "rb") as reader:
        # The shim writes two short lines at most, then the fd closes at the container's exec.
        deadline = time.monotonic() + HOST_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if select.select([reader], [], [], 0.1)[0]:
                chunk = reader.read1(4096)
                if not chunk:
                    break
                lines.append(chunk)
        else:
            popen.kill()
            raise OSError("the host's container did not start within %d s"
                          % HOST_START_TIMEOUT_S)
    report_text = b"".join(lines).decode(errors="replace")
    error = [line[6:] for line in report_text.splitlines() if line.startswith("error ")]
    pids = [int(line[4:]) for line in report_text.splitlines() if line.startswith("pid ")]
    if error or not pids:
        popen.wait(timeout=10)
        raise OSError(error[0] if error else "the host's runtime exited with %s before "
                      "starting the container" % popen.returncode)
    return pids[0]


def _in_pid_namespace(init_pid: int) -> list[psutil.Process]:
    """Every process in the PID namespace whose init is `init_pid` (its host pid)."""
    try:
        namespace = os.readlink("/proc/%d/ns/pid" % init_pid)
    except OSError:
        return []
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(OSError):
            if os.readlink("/proc/%d/ns/pid" % process.pid) == namespace:
                found.append(process)
    return found


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (SigCgt in /proc/<pid>/status): PID 1
    of a container gets only the signals it handles."""
    try:
        with open("/proc/%d/status" % pid, encoding="ascii") as f:
            caught = next(line for line in f if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caught.split()[1], 16) & (1 << (signum - 1)))
