"""Slurm: every step of `python flow.py run --with torch_slurm` is one Slurm job; a gang of N
nodes is one job of N nodes, one Slurm task per node.

Metaflow's runtime runs on the login node; for each attempt @torch_slurm (slurm_decorator.py)
puts the submitter (slurm_submit.py) in front of the task's own command. The submitter writes
the job's two scripts (the batch script and the node script, both pure functions of a
SlurmJob, below), submits with `sbatch`, watches the job with `scontrol show job` and forwards
node 0's output to Metaflow, which keeps it as the task's log. In the job, `srun` starts the
node script once per node: node 0 runs the task's own command with the gang's plan in its
environment, nodes 1..N-1 the node agent (a hidden spin-step of the same task), as on AWS
Batch (batch.py). The agents ship their ranks' output to node 0; their own output goes to a
file per node in the job's folder.

Code and data reach the nodes the HPC way: the job's folder, the flow's folder and Metaflow's
local datastore (or S3) are on a filesystem every node shares, and every node runs the same
interpreter path. The login node may be another machine than the one the flow runs on
(METAFLOW_TORCH_SLURM_SSH): Slurm's commands then run there over ssh (on_login_node), and the
job's environment comes from a file of the job's folder (exported_env), not from the ssh
session's. Node 0's address is the first name of the job's node list, resolved on the
node (never SLURM_LAUNCH_NODE_IPADDR, the host srun ran on); a loopback answer is refused.
"""

import json
import os
import re
import shlex
import socket
import subprocess
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from ..core import naming
from ..core.errors import TorchDistributedEnvironmentError
from ..core.gangspec import SLURM_BACKEND, AgentOrder, NodeZero, TaskIdentity
from . import address, trampoline
from .base import AgentPlace, Backend, GangStep

# Where the login node is, when it is not this machine: ssh's destination and options, as
# written after `ssh` ("login1", or "-F ~/.ssh/hpc -J bastion me@login1").
SSH_ENV = "METAFLOW_TORCH_SLURM_SSH"
# What a job submitted over ssh gets of the submitting machine's environment (the ssh session's
# own is the login node's): Metaflow's settings, AWS's (an S3 datastore), the user's name, and
# the step's @environment variables (SlurmJob.exported).
EXPORTED_PREFIXES = ("METAFLOW_", "AWS_")
EXPORTED_NAMES = ("USERNAME",)
# In the job's environment on node 0 only: the gang's plan (trampoline.plan_env).
MAIN_NODE_ENV = "METAFLOW_TORCH_DISTRIBUTED_SLURM_MAIN"
# A node's index in the job, which the node script is given as its argument (srun's
# --multi-prog `%t`, one task per node): Slurm's own SLURM_NODEID is missing inside a
# container of srun's --container (Slurm 22.05 gives a container the step's environment, not
# the task's).
NODE_ID = "METAFLOW_TORCH_DISTRIBUTED_SLURM_NODE"
NUM_NODES = "SLURM_JOB_NUM_NODES"
NODE_LIST = "SLURM_JOB_NODELIST"
# What the batch script asks Slurm once, on the job's first node and outside any container
# (an image need not have Slurm's commands), for every node: the job's host names in node
# order (`scontrol show hostnames`), the cluster's KillWait in seconds, and the mount
# namespace the batch script runs in (node 0 started in that same one ran outside the
# container it asked for).
HOSTS_ENV = "METAFLOW_TORCH_DISTRIBUTED_SLURM_HOSTS"
KILL_WAIT_ENV = "METAFLOW_TORCH_DISTRIBUTED_SLURM_KILL_WAIT"
HOST_MOUNTS_ENV = "METAFLOW_TORCH_DISTRIBUTED_SLURM_HOST_MOUNTS"
# A node's index, as the node script's shell expands it.
NODE_WORD = "${%s}" % NODE_ID


# -- the job, as data -------------------------------------------------------------------------

@dataclass(frozen=True)
class SlurmOptions:
    """@torch_slurm's attributes that become sbatch options (metaflow-slurm's names where
    they overlap)."""

    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: Optional[str] = None  # Slurm's forms: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
    constraint: Optional[str] = None
    gres: Optional[str] = None
    gpu: int = 0  # per node
    cpu: int = 0  # per node (the node's one Slurm task)

    def sbatch_words(self) -> List[str]:
        words = ["--%s=%s" % (name, value) for name, value in (
            ("partition", self.partition), ("account", self.account), ("qos", self.qos),
            ("time", self.time), ("constraint", self.constraint), ("gres", self.gres))
            if value]
        if self.gpu:
            words.append("--gpus-per-node=%d" % self.gpu)
        if self.cpu:
            words.append("--cpus-per-task=%d" % self.cpu)
        return words


def gang_options(options: SlurmOptions, nproc_per_node: int) -> SlurmOptions:
    """A gang's job options: a CPU gang that names no CPUs asks for one per process of a node
    (Slurm's default, one CPU per task, would have the node's processes share one CPU where
    the cluster binds tasks to their CPUs). A GPU gang keeps the cluster's CPUs per GPU."""
    if options.cpu or options.gpu or options.gres or nproc_per_node <= 1:
        return options
    return replace(options, cpu=nproc_per_node)


@dataclass(frozen=True)
class SlurmJob:
    """One attempt of one step as a Slurm job: everything but node 0's command, which the
    submitter is given as its own argv (the task's command as Metaflow built it)."""

    step_name: str
    name: str
    nodes: int
    work_dir: str  # the job's folder, on the filesystem every node shares
    cwd: str  # the flow's folder, where every node runs its command
    options: SlurmOptions
    task_env: Dict[str, str] = field(default_factory=dict)  # node 0's only
    agent_argv: List[str] = field(default_factory=list)
    # the indices of agent_argv's words the node's shell expands (spinstep.Shell words)
    agent_shell_words: List[int] = field(default_factory=list)
    agent_env: Dict[str, str] = field(default_factory=dict)
    # shell lines every node runs first (`module load ...`, `source .../activate`), or ""
    setup: str = ""
    # the interpreter every node runs the task and the agent with ("": the login node's)
    python: str = ""
    # the step's @environment variables' names: a job submitted over ssh gets them from
    # `env_file`, with the rest of exported_env
    exported: List[str] = field(default_factory=list)
    # a file of `export NAME=value` lines every node reads first, or "" (sbatch --export=ALL
    # gives the job the submitting shell's environment)
    env_file: str = ""
    # the OCI bundle (a folder with config.json and its rootfs) every node's task runs in,
    # through srun's --container, or "": on the nodes themselves
    container: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "SlurmJob":
        fields = json.loads(text)
        fields["options"] = SlurmOptions(**fields["options"])
        return cls(**fields)

    @property
    def stdout(self) -> str:
        return "%s/job.out" % self.work_dir

    @property
    def stderr(self) -> str:
        return "%s/job.err" % self.work_dir

    def node_log(self, node: int) -> str:
        return "%s/node-%d.log" % (self.work_dir, node)

    @property
    def programs(self) -> str:
        """srun's --multi-prog file: every task (one per node) runs the node script."""
        return "%s/nodes.conf" % self.work_dir


def sbatch_argv(job: SlurmJob, batch_script: str) -> List[str]:
    """`sbatch` of `job`: one task per node, no requeue (retries belong to @retry: Slurm's own
    requeue comes about 2 minutes later), output appended (a requeue by an administrator
    would otherwise truncate the first run's)."""
    return ["sbatch", "--parsable", "--job-name=%s" % job.name, "--nodes=%d" % job.nodes,
            "--ntasks-per-node=1", "--no-requeue", "--open-mode=append",
            "--output=%s" % job.stdout, "--error=%s" % job.stderr, "--chdir=%s" % job.cwd,
            "--export=ALL", *job.options.sbatch_words(), batch_script]


def batch_script(job: SlurmJob, programs: str) -> str:
    """The batch script: it asks Slurm, once and outside any container, what every node needs
    (the job's hosts, KillWait), then one task per node runs the node script, in the
    container when the step names one; the first task to fail ends the others (fail-fast of
    the nodes; the gang's own fail-fast usually comes first)."""
    lines = ["#!/bin/bash",
             'export %s="$(scontrol show hostnames "$%s" | tr "\\n" " ")"' % (
                 HOSTS_ENV, NODE_LIST)]
    if job.nodes > 1:
        lines += ['export %s="$(scontrol show config | sed -nE '
                  '\'s/^KillWait *= *([0-9]+).*/\\1/p\')"' % KILL_WAIT_ENV]
    srun = ["srun", "--kill-on-bad-exit=1", "--nodes=%d" % job.nodes, "--ntasks=%d" % job.nodes,
            "--ntasks-per-node=1"]
    if job.container:
        lines += ['export %s="$(readlink /proc/self/ns/mnt)"' % HOST_MOUNTS_ENV]
        srun.append("--container=%s" % job.container)
    return "\n".join(lines + ["exec %s --multi-prog %s" % (
        " ".join(shlex.quote(w) for w in srun), shlex.quote(programs)), ""])


def programs_file(node_script: str) -> str:
    """srun's --multi-prog file: every task runs the node script with its task id, which is
    its node's index (one task per node). The file quotes words with single quotes and knows
    no escape: the job's folder must have none (slurm_decorator refuses one)."""
    if "'" in node_script or "\n" in node_script:
        raise ValueError("a quote or a line break in %r" % node_script)
    return "* /bin/bash '%s' %%t\n" % node_script


def node_script(job: SlurmJob, task_argv: Sequence[str]) -> str:
    """The node script: node 0 runs the task's own command with the plan; every other node
    the node agent, its output in a file of its own (its ranks' output reaches node 0).

    Node 0 decides how the gang ends, as on AWS Batch, where the job's status is the main
    node's: an agent's exit status ends the script with 0, or `srun --kill-on-bad-exit`
    would kill node 0 while it reports the gang's root cause (an agent exits non-zero as soon
    as node 0 aborts the gang). Node 0's own failure still ends every node."""
    def interpreted(argv: Sequence[str]) -> List[str]:
        return [job.python, *argv[1:]] if job.python and argv else list(argv)

    agent_argv = interpreted(job.agent_argv)
    agent = " ".join(w if i in job.agent_shell_words else shlex.quote(w)
                     for i, w in enumerate(agent_argv))
    lines = ["#!/bin/bash", "export %s=\"$1\"" % NODE_ID]
    if job.container:
        lines += _outside_container(job)
    lines += ["cd %s || exit 1" % shlex.quote(job.cwd)]
    if job.env_file:
        lines += [". %s || exit 1" % shlex.quote(job.env_file)]
    if job.setup:
        # in this shell, so that what it loads or activates holds for the task and the agent
        lines += ["{", job.setup, "}", "status=$?", 'if [ "$status" != 0 ]; then',
                  '    echo "@torch_slurm on step *%s*: the setup command failed with exit '
                  'status $status on node $%s ($(hostname)): %s" >&2'
                  % (job.step_name, NODE_ID, _echoable(job.setup)),
                  "    exit 1", "fi"]
    lines += ['if [ "$%s" = 0 ]; then' % NODE_ID]
    lines += ["    export %s=%s" % (k, shlex.quote(v)) for k, v in sorted(job.task_env.items())]
    lines += ["    exec %s" % " ".join(shlex.quote(w) for w in interpreted(task_argv)), "fi"]
    lines += ["unset %s" % k for k in sorted(job.task_env)]
    lines += ["export %s=%s" % (k, shlex.quote(v)) for k, v in sorted(job.agent_env.items())]
    # This shell outlives Slurm's SIGTERM (a scancel, a preemption) until the agent, which
    # has the gang's grace, is done: in srun's --container the shell is the container's first
    # process, and Slurm removes (SIGKILL) a container whose first process ended. (The agent
    # gets the signal from Slurm itself; a trapped signal is reset to its default in it.)
    lines += ['exec >> %s/node-"$%s".log 2>&1' % (shlex.quote(job.work_dir), NODE_ID),
              "trap : TERM",
              agent, 'echo "[node $%s] the node agent exited with status $?"' % NODE_ID,
              "exit 0", ""]
    return "\n".join(lines)


def _outside_container(job: SlurmJob) -> List[str]:
    """Lines that end node 0 when it runs in the batch script's own mount namespace: a
    cluster that has no OCI runtime configured (oci.conf) ignores srun's --container and runs
    the task on the node itself, with a warning in the slurmd's log only."""
    return ['if [ "$%s" = 0 ] && [ "$(readlink /proc/self/ns/mnt)" = "$%s" ]; then'
            % (NODE_ID, HOST_MOUNTS_ENV),
            '    echo "@torch_slurm on step *%s*: Slurm ran node 0 ($(hostname)) outside the '
            'container %s: this cluster runs srun --container only where an OCI runtime is '
            'configured (oci.conf beside slurm.conf); ask its administrators for one, or '
            'remove container= and METAFLOW_TORCH_SLURM_CONTAINER." >&2'
            % (job.step_name, _echoable(job.container)),
            "    exit 1", "fi"]


def _echoable(text: str) -> str:
    """`text` on one line, safe inside the double quotes of an echo."""
    flat = " ".join(text.split())
    return "".join("\\" + c if c in '"$`\\' else c for c in flat)


def chosen_partition(wanted: Optional[str], partitions: str) -> Optional[Dict[str, str]]:
    """The fields of partition `wanted` (None: the cluster's default one) in `scontrol show
    partition -o`'s output, or None when there is no such partition."""
    for line in partitions.splitlines():
        fields = parse_job(line)
        if fields and (fields.get("PartitionName") == wanted if wanted
                       else fields.get("Default") == "YES"):
            return fields
    return None


def partition_refusal(step_name: str, nodes: int, wanted: Optional[str],
                      partitions: str) -> Optional[str]:
    """Why a job of `nodes` nodes in partition `wanted` (None: the default one) could never
    start, from `scontrol show partition -o` (`partitions`), or None. Slurm itself accepts
    such a job and leaves it PENDING (Reason=PartitionConfig) for ever."""
    fields = chosen_partition(wanted, partitions)
    if fields is None:
        return None  # sbatch names an unknown partition itself
    limits = [int(fields[k]) for k in ("TotalNodes", "MaxNodes") if fields.get(k, "").isdigit()]
    if not limits or nodes <= min(limits):
        return None
    return ("@torch_slurm on step *%s*: the gang needs %d nodes, but partition %s has %s "
            "nodes (TotalNodes=%s MaxNodes=%s, Nodes=%s): the job could never start. Use "
            "fewer nodes (@torch_distributed(nodes=...)) or a larger partition "
            "(@torch_slurm(partition=...); `sinfo` lists them)."
            % (step_name, nodes, fields.get("PartitionName"), min(limits),
               fields.get("TotalNodes"), fields.get("MaxNodes"), fields.get("Nodes")))


# -- the job's state, as `scontrol show job -o` says it -------------------------------------

_FIELD = re.compile(r"(\w+)=(\S*)")
# Slurm's states of a job that has not ended. COMPLETING is one of them: a failed or
# cancelled job passes through it too, for seconds.
ACTIVE = frozenset(("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                    "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING",
                    "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"))
SUCCESS = "COMPLETED"
# Every other end, what it means, and what to do.
ENDINGS = {
    "FAILED": "failed: node 0's task exited non-zero (its output above has the gang's root "
              "cause)",
    "CANCELLED": "was cancelled (scancel, by a user or an administrator, or the cluster's "
                 "policy); every rank was sent SIGTERM, then SIGKILL after the cluster's "
                 "KillWait",
    "NODE_FAIL": "lost a node: Slurm stopped hearing from it (its slurmd, its network or the "
                 "machine failed); retry the step with @retry, or ask the cluster's "
                 "administrators about the node",
    "TIMEOUT": "ran past its time limit; raise @torch_slurm(time=...) or the partition's "
               "default",
    "PREEMPTED": "was preempted by a job of higher priority; retry it with @retry",
    "OUT_OF_MEMORY": "ran out of memory on a node; ask for more memory or use fewer or "
                     "smaller ranks per node",
    "BOOT_FAIL": "could not start: a node failed to boot",
    "DEADLINE": "reached its deadline (sbatch --deadline) before it ended",
}


def parse_job(text: str) -> Dict[str, str]:
    """The fields of one job in `scontrol show job -o`'s one-line form."""
    return dict(_FIELD.findall(text))


def job_state(fields: Mapping[str, str]) -> str:
    """The job's state word (JobState=CANCELLED by 0 is CANCELLED)."""
    return fields.get("JobState", "UNKNOWN").split()[0]


def ending(step_name: str, job_id: str, fields: Mapping[str, str]) -> Optional[str]:
    """None while the job runs (COMPLETING included), "" when it COMPLETED, else the message
    of its end: Slurm's state, reason, exit code and nodes."""
    state = job_state(fields)
    if state in ACTIVE:
        return None
    if state == SUCCESS:
        return ""
    what = ENDINGS.get(state, "ended in Slurm state %s, which @torch_slurm does not know"
                       % state)
    return ("@torch_slurm on step *%s*: Slurm job %s %s (JobState=%s Reason=%s ExitCode=%s "
            "NodeList=%s)." % (step_name, job_id, what, state, fields.get("Reason", "?"),
                               fields.get("ExitCode", "?"), fields.get("NodeList", "?")))


def down_nodes(hosts: Sequence[str], nodes_text: str) -> List[str]:
    """Which of the job's hosts (in node order: node 0 first) Slurm holds down, from `scontrol
    show node -o` of them: "node 1 (n2, State=DOWN+NOT_RESPONDING, Reason=Not responding)"."""
    states = {}
    for line in nodes_text.splitlines():
        fields = parse_job(line)
        name = fields.get("NodeName")
        if name:
            why = re.search(r"\bReason=(.*?)(?: \w+=|$)", line)
            states[name] = (fields.get("State", "?"), why.group(1).strip() if why else "")
    found = []
    for node, host in enumerate(hosts):
        state, reason = states.get(host, ("", ""))
        if any(word in state for word in ("DOWN", "FAIL", "NOT_RESPONDING")) or \
                state.endswith("*"):
            found.append("node %d (%s, State=%s%s)" % (node, host, state,
                                                      ", Reason=%s" % reason if reason else ""))
    return found


# -- on the nodes: node 0's place and the agents' ---------------------------------------------

def hostnames(node_list: str, run: Callable[[List[str]], str]) -> List[str]:
    """The host names of a node list (`n[1-2]`) in order, as `scontrol show hostnames`
    expands it."""
    return run(["scontrol", "show", "hostnames", node_list]).split()


def first_host(step_name: str, node_list: str,
               run: Callable[[List[str]], str]) -> str:
    """The first host name of the job's node list, on the node."""
    names = hostnames(node_list, run)
    if not names:
        raise TorchDistributedEnvironmentError(
            step_name, "`scontrol show hostnames %s` named no host on this Slurm node: "
            "node 0's address is unknown." % node_list)
    return names[0]


def run_slurm(argv: List[str]) -> str:
    """The output of one of Slurm's commands here; raises (OSError, CalledProcessError,
    TimeoutExpired) when it cannot be run, fails or hangs for 30 s."""
    return subprocess.run(argv, check=True, capture_output=True, text=True,
                          timeout=30).stdout


def ssh_words(environ: Mapping[str, str]) -> List[str]:
    """ssh's destination and options for the login node (SSH_ENV), or [] when Slurm's commands
    run on this machine."""
    return shlex.split(environ.get(SSH_ENV, ""))


def on_login_node(argv: Sequence[str], environ: Mapping[str, str],
                  control: Optional[str] = None) -> List[str]:
    """`argv` as run on the login node: itself, or through ssh (never asking for a password:
    BatchMode), over the connection whose ControlPath is `control` when one is open."""
    words = ssh_words(environ)
    if not words:
        return list(argv)
    shared = ["-o", "ControlPath=%s" % control, "-o", "ControlMaster=no"] if control else []
    return ["ssh", "-o", "BatchMode=yes", *shared, *words, "--", shlex.join(argv)]


def run_login(argv: List[str]) -> str:
    """run_slurm on the login node (on_login_node)."""
    return run_slurm(on_login_node(argv, os.environ))


def exported_env(environ: Mapping[str, str], names: Sequence[str]) -> str:
    """The lines of a job's env_file: what a job submitted over ssh gets of `environ`."""
    chosen = sorted(k for k in environ if k.startswith(EXPORTED_PREFIXES)
                    or k in EXPORTED_NAMES or k in names)
    return "".join("export %s=%s\n" % (k, shlex.quote(environ[k])) for k in chosen
                   if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k))


def node_zero_address(step_name: str, nodes: int, environ: Mapping[str, str],
                      run: Callable[[List[str]], str] = run_slurm,
                      resolve: Callable[[str], str] = socket.gethostbyname) -> str:
    """Node 0's address: the first host of the job's node list, resolved on this node
    (never SLURM_LAUNCH_NODE_IPADDR, the host srun ran on); loopback is refused. The batch
    script lists the job's hosts (HOSTS_ENV); without that list, `scontrol` here does."""
    node_list = environ.get(NODE_LIST)
    if not node_list:
        raise TorchDistributedEnvironmentError(
            step_name, "%s is not set: this process does not run in a Slurm job." % NODE_LIST)
    listed = environ.get(HOSTS_ENV, "").split()
    name = listed[0] if listed else first_host(step_name, node_list, run)
    try:
        found = resolve(name)
    except OSError as ex:
        raise TorchDistributedEnvironmentError(
            step_name, "node 0's host name %r (the first of the job's nodes %s) does not "
            "resolve on this node (%s): make the cluster's nodes resolve each other's names "
            "(DNS or /etc/hosts)." % (name, node_list, ex)) from ex
    return address.check_resolved(step_name, nodes, name, found)


# Seconds the gang keeps, within the cluster's KillWait, to stop what is left after the
# preemption's grace and record the attempt before Slurm's SIGKILL.
KILL_WAIT_MARGIN_S = 3.0
_KILL_WAIT = re.compile(r"^KillWait\s*=\s*(\d+)", re.MULTILINE)


def kill_wait(environ: Mapping[str, str],
              run: Callable[[List[str]], str] = run_slurm) -> Optional[float]:
    """The cluster's KillWait in seconds, as the batch script read it (KILL_WAIT_ENV), else
    from `scontrol show config` here: how long Slurm waits after the SIGTERM of a scancel, a
    preemption or a time limit before its SIGKILL. None when it cannot be read."""
    said = environ.get(KILL_WAIT_ENV, "").strip()
    if said.isdigit():
        return float(said)
    try:
        found = _KILL_WAIT.search(run(["scontrol", "show", "config"]))
    except (OSError, subprocess.SubprocessError):
        return None
    return float(found.group(1)) if found else None


def grace_limit(kill_wait_s: Optional[float]) -> Optional[float]:
    """The longest preemption grace a gang can have under KillWait `kill_wait_s`."""
    if kill_wait_s is None:
        return None
    return max(1.0, kill_wait_s - KILL_WAIT_MARGIN_S)


def planned_nodes(environ: Mapping[str, str], step_name: str) -> Optional[int]:
    """The nodes of the gang when this process is node 0 of `step_name`'s Slurm job, else
    None; a job of another size than planned is refused."""
    return trampoline.checked_plan(environ, MAIN_NODE_ENV, step_name, NUM_NODES,
                                   "Slurm job", decorator="@torch_slurm")


class SlurmBackend(Backend):
    """Slurm: a gang of N > 1 nodes is one job of N nodes (slurm_submit.py submits it)."""

    name = SLURM_BACKEND

    def node_zero(self, step: GangStep, environ: Mapping[str, str],
                  identity: TaskIdentity) -> Optional[NodeZero]:
        nodes = planned_nodes(environ, step.step_name)
        if nodes is None:
            return None
        waits = kill_wait(environ)
        return NodeZero(node_zero_address(step.step_name, nodes, environ),
                        trampoline.attempt_port(step.step_name, identity),
                        naming.new_secret(), self.name, grace_limit_s=grace_limit(waits),
                        grace_limit_why="Slurm sends SIGKILL to every process of the job "
                        "KillWait=%g s after the SIGTERM of a scancel or a preemption" % (
                            waits or 0))

    def agent_place(self, order: AgentOrder, environ: Mapping[str, str]) -> AgentPlace:
        step_name = order.blueprint.step_name
        try:
            node = int(environ[NODE_ID])
        except (KeyError, ValueError):
            raise TorchDistributedEnvironmentError(
                step_name, "this node agent runs outside a Slurm job (%s=%r)."
                % (NODE_ID, environ.get(NODE_ID)))
        return AgentPlace(node, node_zero_address(step_name, order.blueprint.nodes, environ))


BACKEND = SlurmBackend()
