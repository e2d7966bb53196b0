"""One node's container, emulated as a local process group.

The container's command runs as the leader of a new session, so the node's whole process
tree can be signalled at once. Nothing here blocks except `wait`, which is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil


def docker_exit_code(returncode: int) -> int:
    """Docker reports a container killed by signal N as exit code 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class NodeProcess:
    def __init__(self, popen: subprocess.Popen, log_file,
                 marker: tuple[str, str] | None = None) -> None:
        self._popen = popen
        self._log_file = log_file
        self._marker = marker
        self._kill_at: float | None = None
        self._killed = False
        self._torn_down = False
        self._doomed: list[psutil.Process] = []

    @classmethod
    def start(cls, argv: list[str], cwd: Path, env: dict[str, str], log_path: Path,
              marker: tuple[str, str] | None = None) -> NodeProcess:
        """Raises OSError when the command cannot be executed (AWS: CannotStartContainerError).
        With `marker`, a variable (name, value) in `env`, teardown also kills every process
        that carries it, as a container's cgroup takes all of its processes with it (those in
        process groups of their own included)."""
        log_file = open(log_path, "ab")
        try:
            popen = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                # Like the awslogs driver, stdout and stderr end up in one stream.
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError:
            log_file.close()
            raise
        return cls(popen, log_file, marker)

    @property
    def pid(self) -> int:
        return self._popen.pid

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
            elif not self._torn_down and _catches(self._popen.pid, signal.SIGTERM):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._popen.pid, signal.SIGTERM)

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
        return self.exit_code()

    def _signal(self, signum: int) -> None:
        if self._torn_down:
            return
        # ProcessLookupError: the whole group has already exited.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._popen.pid, signum)


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
