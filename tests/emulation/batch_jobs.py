"""Job and node records, and the state machine that moves them through AWS Batch's lifecycle.

`JobBoard.tick` is called over and over by one scheduler thread; it never blocks: it starts
processes, polls them and signals them. Lifecycle (AWS docs, "Job states" and "Job
lifecycle for MNP jobs"):

    SUBMITTED -> PENDING -> RUNNABLE -> STARTING -> RUNNING -> SUCCEEDED | FAILED

A multinode job launches its main node first; child nodes go to STARTING only once the
main node is RUNNING. The job's status, exit code and reason are the main node's; when
the main node exits the job is finished and the child nodes are stopped. A child node
that exits on its own changes nothing else.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import netns
from .batch_spec import NodeLaunch, Placement, injected_environment
from .node_process import NodeProcess

QUEUED = ("SUBMITTED", "PENDING", "RUNNABLE")
LAUNCH_ORDER = QUEUED + ("STARTING",)
FINISHED = ("SUCCEEDED", "FAILED")
# AWS's statusReason for a container whose main process exited by itself.
EXITED_REASON = "Essential container in task exited"
MAIN_NODE_EXITED_REASON = "Main node exited; child node stopped"
TIMEOUT_REASON = "Job attempt duration exceeded timeout"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Queue:
    name: str
    arn: str
    compute_environment: str
    platform: str


@dataclass
class Node:
    launch: NodeLaunch
    status: str = "SUBMITTED"
    status_reason: str | None = None
    started_at: int | None = None
    stopped_at: int | None = None
    exit_code: int | None = None
    container_reason: str | None = None
    task_id: str = field(default_factory=lambda: secrets.token_hex(16))
    process: NodeProcess | None = None
    stop_reason: str | None = None
    entered: float = field(default_factory=time.monotonic)
    address: str | None = None  # its private address, once placed

    @property
    def index(self) -> int:
        return self.launch.index

    def move(self, status: str) -> None:
        self.status = status
        self.entered = time.monotonic()


@dataclass
class Job:
    job_id: str
    arn: str
    name: str
    queue: Queue
    definition: dict
    submission: dict
    nodes: list[Node]
    multinode: bool
    created_at: int = field(default_factory=now_ms)
    status: str = "SUBMITTED"
    status_reason: str | None = None
    started_at: int | None = None
    stopped_at: int | None = None
    terminate_reason: str | None = None
    is_cancelled: bool = False
    is_terminated: bool = False
    entered: float = field(default_factory=time.monotonic)

    @property
    def main(self) -> Node:
        return next(node for node in self.nodes if node.launch.is_main)

    @property
    def children(self) -> list[Node]:
        return [node for node in self.nodes if not node.launch.is_main]

    @property
    def timeout_s(self) -> int | None:
        timeout = self.submission.get("timeout") or self.definition.get("timeout") or {}
        return timeout.get("attemptDurationSeconds")

    def move(self, status: str) -> None:
        self.status = status
        self.entered = time.monotonic()


# Put on every node's PYTHONPATH: the node's hostname resolves to its private address.
HOST_SHIM = Path(__file__).parent / "batch_host"
# What an image whose /etc/hosts maps the hostname to loopback resolves it to (Debian, Ubuntu).
DEBIAN_HOSTNAME_ADDRESS = "127.0.1.1"


def ec2_hostname(address: str) -> str:
    """The hostname EC2 gives an instance in us-east-1 (Batch's nodes run on instances)."""
    return "ip-%s.ec2.internal" % address.replace(".", "-")


@dataclass(frozen=True)
class NodeRunner:
    """How a node's container is started: where it lives and what the host adds to it.
    By default every node is a process of this host, whose own non-loopback address stands
    for each node's private address (tests/emulation/hosts.py); with `hosts` (netns.py,
    TD_EMULATION_HOSTS=1) every node is a host of its own on a bridge, with its own address
    and EC2 hostname, which sees of this host's /tmp only its own folder (not the other
    nodes' folders nor the launcher's: separate instances share no disk). The nodes in
    `loopback_hostname_nodes` find 127.0.1.1 for their hostname instead (their /etc/hosts
    says so, as a Debian or Ubuntu image's does)."""

    root: Path
    base_env: dict[str, str]
    main_node_address: str = "127.0.0.1"
    start: Callable[..., NodeProcess] = NodeProcess.start
    loopback_hostname_nodes: frozenset[int] = frozenset()
    hosts: netns.Network | None = None

    def node_dir(self, job: Job, node: Node) -> Path:
        return self.root / job.job_id / ("node-%d" % node.index)

    def log_path(self, job: Job, node: Node) -> Path:
        return self.node_dir(job, node) / "container.log"

    def launch(self, job: Job, node: Node) -> NodeProcess:
        workdir = self.node_dir(job, node) / "work"
        workdir.mkdir(parents=True)
        host = self.hosts.add_host() if self.hosts is not None else None
        node.address = host.address if host is not None else self.main_node_address
        placement = Placement(
            job_id=job.job_id,
            queue_name=job.queue.name,
            compute_environment=job.queue.compute_environment,
            attempt=1,
            num_nodes=len(job.nodes) if job.multinode else None,
            main_node=job.main.index if job.multinode else None,
            main_node_address=job.main.address,
        )
        # Precedence as in a container: image env < job env < what AWS Batch injects.
        env = {"HOME": str(workdir), **self.base_env, **node.launch.environment}
        env.update(injected_environment(placement, node.launch))
        hostname_address = (DEBIAN_HOSTNAME_ADDRESS if node.index in self.loopback_hostname_nodes
                            else node.address)
        if host is None:
            env["BATCH_EMULATOR_HOST_ADDRESS"] = hostname_address
            env["PYTHONPATH"] = os.pathsep.join(
                [str(HOST_SHIM)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
            return self.start(node.launch.command, workdir, env, self.log_path(job, node))
        hostname = ec2_hostname(host.address)
        env["HOSTNAME"] = hostname
        container = netns.container_spec(host, self.node_dir(job, node), hostname, workdir,
                                         shared=(self.node_dir(job, node),),
                                         hostname_address=hostname_address,
                                         memory_bytes=container_memory(node.launch.container),
                                         weight_cpus=container_vcpus(node.launch.container))
        return self.start(node.launch.command, workdir, env, self.log_path(job, node),
                          host=host, container=container)


class JobBoard:
    """All jobs of one emulator. Not thread-safe: the emulator holds a lock around it."""

    def __init__(
        self,
        runner: NodeRunner,
        hold_nodes: frozenset[int],
        transition_s: float,
        stop_grace_s: float,
    ) -> None:
        self.jobs: dict[str, Job] = {}
        self._runner = runner
        self._hold_nodes = hold_nodes
        self._transition_s = transition_s
        self._stop_grace_s = stop_grace_s

    def add(self, job: Job) -> None:
        self.jobs[job.job_id] = job

    def terminate(self, job: Job, reason: str) -> None:
        """AWS TerminateJob: queued jobs fail at once, started ones once their nodes stop."""
        if job.status not in FINISHED and job.terminate_reason is None:
            job.terminate_reason = reason
            job.is_terminated = True

    def cancel(self, job: Job, reason: str) -> None:
        """AWS CancelJob: only jobs that have not reached STARTING are cancelled."""
        if job.status in QUEUED:
            job.is_cancelled = True
            job.terminate_reason = reason

    def tick(self) -> None:
        for job in self.jobs.values():
            self._advance(job)

    def processes(self) -> list[NodeProcess]:
        return [
            node.process
            for job in self.jobs.values()
            for node in job.nodes
            if node.process is not None
        ]

    def _due(self, entered: float) -> bool:
        return time.monotonic() - entered >= self._transition_s

    def _advance(self, job: Job) -> None:
        if job.status not in FINISHED:
            if job.terminate_reason is not None and job.status in QUEUED:
                self._finish(job, "FAILED", job.terminate_reason)
            elif job.status in QUEUED:
                self._queue_step(job)
            else:
                self._run_step(job)
        for node in job.nodes:
            self._supervise(job, node)

    def _queue_step(self, job: Job) -> None:
        if not self._due(job.entered):
            return
        job.move(LAUNCH_ORDER[LAUNCH_ORDER.index(job.status) + 1])
        for node in job.nodes:
            # The main node is launched first; child nodes wait in RUNNABLE.
            launching = job.status in QUEUED or node.launch.is_main
            node.move(job.status if launching else "RUNNABLE")

    def _run_step(self, job: Job) -> None:
        main = job.main
        if job.terminate_reason is None and self._timed_out(job):
            job.terminate_reason = TIMEOUT_REASON
        if job.terminate_reason is not None:
            self._stop_all(job, job.terminate_reason)
        if main.status == "RUNNING":
            # AWS launches the child nodes once the main node runs.
            for child in job.children:
                if child.status == "RUNNABLE":
                    child.move("STARTING")
        if main.status in FINISHED:
            reason = job.terminate_reason or main.status_reason
            self._finish(job, "FAILED" if job.terminate_reason else main.status, reason)
            return
        job.status = main.status
        job.started_at = main.started_at

    @staticmethod
    def _timed_out(job: Job) -> bool:
        """AWS: attemptDurationSeconds counts from the start of the job (its main node)."""
        if job.timeout_s is None or job.started_at is None:
            return False
        return now_ms() - job.started_at >= job.timeout_s * 1000

    def _supervise(self, job: Job, node: Node) -> None:
        if node.status == "STARTING":
            held = job.multinode and node.index in self._hold_nodes
            if not held and self._due(node.entered):
                self._launch(job, node)
        elif node.status == "RUNNING":
            node.process.enforce(time.monotonic())
            exit_code = node.process.exit_code()
            if exit_code is not None:
                self._exited(node, exit_code)

    @staticmethod
    def _exited(node: Node, exit_code: int) -> None:
        node.process.teardown()
        node.exit_code = exit_code
        node.stopped_at = now_ms()
        if node.stop_reason is not None:
            # Stopped by AWS Batch (TerminateJob, timeout, main node exit): always FAILED.
            node.move("FAILED")
            node.status_reason = node.stop_reason
        else:
            node.move("SUCCEEDED" if exit_code == 0 else "FAILED")
            node.status_reason = EXITED_REASON

    def _launch(self, job: Job, node: Node) -> None:
        try:
            node.process = self._runner.launch(job, node)
        except OSError as error:
            node.move("FAILED")
            node.stopped_at = now_ms()
            node.status_reason = "Task failed to start"
            node.container_reason = "CannotStartContainerError: %s" % error
            return
        node.move("RUNNING")
        node.started_at = now_ms()

    def _stop_all(self, job: Job, reason: str) -> None:
        for node in job.nodes:
            if node.status == "RUNNING":
                if node.stop_reason is None:
                    node.stop_reason = reason
                # like `docker stop`: SIGTERM to the container's main process (PID 1) only
                node.process.request_stop(time.monotonic(), self._stop_grace_s,
                                          whole_group=False)
            elif node.status not in FINISHED:
                # Never launched (or held in STARTING): nothing to stop.
                node.move("FAILED")
                node.status_reason = reason
                node.stopped_at = now_ms()

    def _finish(self, job: Job, status: str, reason: str | None) -> None:
        job.move(status)
        job.status_reason = reason
        job.stopped_at = job.main.stopped_at or now_ms()
        self._stop_all(job, job.terminate_reason or MAIN_NODE_EXITED_REASON)


def container_vcpus(container: dict) -> float | None:
    """The container's vCPUs: its VCPU resource requirement, else the legacy `vcpus` field;
    None when it gives none. On EC2 (where multi-node jobs run) Docker gets them as CPU shares,
    1024 per vCPU, a weight and no cap: the container may use all of its instance's CPUs."""
    vcpus = next((r["value"] for r in container.get("resourceRequirements", [])
                  if r.get("type") == "VCPU"), container.get("vcpus"))
    return float(vcpus) if vcpus is not None else None


def container_memory(container: dict) -> int | None:
    """The container's memory in bytes: its MEMORY resource requirement (MiB), else the
    legacy `memory` field; None when it gives none."""
    memory = next((r["value"] for r in container.get("resourceRequirements", [])
                   if r.get("type") == "MEMORY"), container.get("memory"))
    return int(memory) << 20 if memory is not None else None
