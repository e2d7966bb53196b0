"""The process Metaflow's runtime starts for a step under @torch_slurm, on the login node:

    python -m <this module> JOB.json -- <the task's own command>

It writes the job's scripts next to JOB.json, submits the job with `sbatch`, forwards node 0's
output to its own stdout and stderr (Metaflow's runtime keeps them as the task's log), polls
`scontrol show job` until the job has ended (`sbatch --wait` notices an end tens of seconds
late), and exits 0 only when the job COMPLETED. SIGINT or SIGTERM cancels the job; so does
its guard, a process of its own session, when this process dies without saying the job is
over (Metaflow's runtime ends its workers with SIGKILL).

    python -m <this module> --guard JOB_ID
"""

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from types import FrameType
from typing import BinaryIO, Dict, List, Mapping, Optional, Sequence

from .slurm import SlurmJob, batch_script, down_nodes, ending, exported_env, hostnames, \
    job_state, node_script, on_login_node, parse_job, partition_refusal, programs_file, \
    run_slurm, sbatch_argv, ssh_words

POLL_S = 0.5
# How long a cancelled job may stay in the queue (COMPLETING) before this process gives up
# waiting for it: the cluster's KillWait (30 s by default) and then some.
CANCEL_WAIT_S = 60.0
GUARD_DONE = b"done\n"
# The longest one of Slurm's commands may take here or over ssh before it counts as failed.
COMMAND_TIMEOUT_S = 60.0
# How long `scontrol show job` may keep failing (the controller restarting, a network blip)
# before the watch gives up and cancels the job.
SCONTROL_PATIENCE_S = 60.0


class Login:
    """Where the job's Slurm commands run: on this machine, or on the login node over ssh
    (METAFLOW_TORCH_SLURM_SSH), through one connection kept open while the job is watched
    (`open`; its socket in a folder of mkdtemp's, which only this user can enter)."""

    def __init__(self, step_name: str, environ: Mapping[str, str]) -> None:
        self.step_name = step_name
        self.environ = environ
        self.words = ssh_words(environ)
        self.control: Optional[str] = None
        self._folder: Optional[str] = None

    def open(self) -> None:
        if not self.words:
            return
        self._folder = tempfile.mkdtemp(prefix="torch-slurm-ssh-")
        control = os.path.join(self._folder, "master")
        # ssh -f stays in the background holding its stderr: a file, never a pipe to wait on
        said = os.path.join(self._folder, "ssh.err")
        with open(said, "w") as err:
            try:
                code = subprocess.run(
                    ["ssh", "-o", "BatchMode=yes", "-o", "ControlMaster=yes", "-o",
                     "ControlPath=%s" % control, "-o", "ControlPersist=yes", "-f", "-N",
                     *self.words], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=err, timeout=COMMAND_TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                code = None
        if code != 0:
            with open(said) as err:
                why = err.read().strip() or ("exit status %d" % code if code is not None
                                             else "no answer in %g s" % COMMAND_TIMEOUT_S)
            self.close()
            raise SystemExit(
                "@torch_slurm on step *%s*: the login node could not be reached over ssh "
                "(`ssh %s`: %s). %s must name a host this machine reaches with ssh without a "
                "password (a key of ssh-agent or of ~/.ssh/config): `ssh %s true` must work."
                % (self.step_name, " ".join(self.words), why, "METAFLOW_TORCH_SLURM_SSH",
                   " ".join(self.words)))
        self.control = control

    def run(self, argv: List[str], timeout: float = COMMAND_TIMEOUT_S
            ) -> "subprocess.CompletedProcess[str]":
        """`argv`'s outcome on the login node; one that hangs (a network that went away under
        ssh) ends as exit status 124, "no answer in N s"."""
        command = on_login_node(argv, self.environ, self.control)
        try:
            return subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(command, 124, "", "no answer in %g s" % timeout)

    def close(self) -> None:
        if self.control is not None:
            subprocess.run(["ssh", "-o", "ControlPath=%s" % self.control, "-O", "exit",
                            *self.words], stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=30)
            self.control = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def with_env_file(job: SlurmJob, environ: Mapping[str, str]) -> SlurmJob:
    """`job`, reading what it needs of `environ` from a file of its folder (readable by this
    user only) when it is submitted over ssh: sbatch --export=ALL would give it the ssh
    session's environment, the login node's."""
    if not ssh_words(environ):
        return job
    path = os.path.join(job.work_dir, "env.sh")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as f:
        f.write(exported_env(environ, job.exported))
    return dataclasses.replace(job, env_file=path)


class ScontrolFailed(Exception):
    """`scontrol show job` failed for another reason than an unknown job."""


class Tail:
    """A file a job appends to, forwarded to `out` as it grows."""

    def __init__(self, path: str, out: BinaryIO) -> None:
        self.path, self.out, self.offset = path, out, 0

    def pump(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        if data:
            self.offset += len(data)
            self.out.write(data)
            self.out.flush()


def submit(job: SlurmJob, task_argv: Sequence[str], login: Login) -> str:
    """Write the job's scripts and submit it; its id."""
    node = os.path.join(job.work_dir, "node.sh")
    batch = os.path.join(job.work_dir, "job.sh")
    with open(node, "w") as f:
        f.write(node_script(job, task_argv))
    with open(job.programs, "w") as f:
        f.write(programs_file(node))
    with open(batch, "w") as f:
        f.write(batch_script(job, job.programs))
    argv = sbatch_argv(job, batch)
    if job.nodes > 1:
        shown = login.run(["scontrol", "show", "partition", "-o"])
        refusal = partition_refusal(job.step_name, job.nodes, job.options.partition,
                                    shown.stdout)
        if refusal:
            raise SystemExit(refusal)
    done = login.run(argv)
    if done.returncode != 0:
        raise SystemExit("@torch_slurm on step *%s*: sbatch refused the job of %d node(s): %s"
                         "\nThe command was: %s\nCheck the step's @torch_slurm options "
                         "(partition, account, qos, time, constraint, gpu, gres) against "
                         "`sinfo` and the cluster's limits." % (
                             job.step_name, job.nodes, done.stderr.strip(), " ".join(argv)))
    return done.stdout.strip().split(";")[0]


def show_job(job_id: str, login: Login) -> Optional[Dict[str, str]]:
    """The job's fields, or None when Slurm no longer knows it (after MinJobAge)."""
    done = login.run(["scontrol", "show", "job", "-o", job_id])
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return None
        raise ScontrolFailed("scontrol show job %s failed: %s" % (job_id, done.stderr.strip()))
    return parse_job(done.stdout)


def in_queue(job_id: str, login: Login) -> bool:
    done = login.run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    return done.returncode == 0 and bool(done.stdout.strip())


def start_guard(job_id: str) -> subprocess.Popen:
    """A process of its own session that cancels the job unless told it is over."""
    return subprocess.Popen([sys.executable, "-m", __spec__.name, "--guard", job_id],
                            stdin=subprocess.PIPE, start_new_session=True)


def guard(job_id: str) -> int:
    said = sys.stdin.buffer.read()
    if said != GUARD_DONE:
        Login("", os.environ).run(["scancel", job_id])
    return 0


class SlurmWatchInterrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, frame: Optional[FrameType]) -> None:
    raise SlurmWatchInterrupted(signum)


def cancel(job: SlurmJob, job_id: str, why: str, tails: List[Tail], login: Login) -> None:
    """scancel the job and wait until it has left the queue, forwarding what it still says."""
    print("@torch_slurm on step *%s*: %s: cancelling Slurm job %s (scancel)."
          % (job.step_name, why, job_id), file=sys.stderr, flush=True)
    login.run(["scancel", job_id])
    deadline = time.monotonic() + CANCEL_WAIT_S
    while in_queue(job_id, login) and time.monotonic() < deadline:
        for tail in tails:
            tail.pump()
        time.sleep(POLL_S)
    for tail in tails:
        tail.pump()


def watch(job: SlurmJob, job_id: str, tails: List[Tail], login: Login) -> int:
    """Forward the job's output until it has ended; 0 when it COMPLETED."""
    state = None
    failing_since: Optional[float] = None
    while True:
        for tail in tails:
            tail.pump()
        try:
            fields = show_job(job_id, login)
        except ScontrolFailed as ex:
            now = time.monotonic()
            if failing_since is None:
                failing_since = now
                print("[slurm] %s; asking again for up to %d s" % (ex, SCONTROL_PATIENCE_S),
                      file=sys.stderr, flush=True)
            if now - failing_since > SCONTROL_PATIENCE_S:
                cancel(job, job_id, "the job's state could not be read for %d s (%s)"
                       % (SCONTROL_PATIENCE_S, ex), tails, login)
                return 1
            time.sleep(POLL_S)
            continue
        failing_since = None
        if fields is None:
            print("@torch_slurm on step *%s*: Slurm job %s is no longer known to the cluster "
                  "(it ended longer ago than the cluster's MinJobAge); its end is unknown."
                  % (job.step_name, job_id), file=sys.stderr, flush=True)
            return 1
        if job_state(fields) != state:
            state = job_state(fields)
            if state == "PENDING" and fields.get("Reason", "None") != "None":
                print("[slurm] job %s pending (Reason=%s)" % (job_id, fields.get("Reason")),
                      flush=True)
            elif state == "RUNNING":
                print("[slurm] job %s running on %s" % (job_id, fields.get("NodeList", "?")),
                      flush=True)
        message = ending(job.step_name, job_id, fields)
        if message is not None:
            for tail in tails:
                tail.pump()
            if message:
                if job_state(fields) == "NODE_FAIL":
                    message += lost_nodes(fields.get("NodeList", ""), login)
                agents = ", ".join(job.node_log(n) for n in range(1, job.nodes))
                print(message + (" The other nodes' own output: %s." % agents if agents
                                 else ""), file=sys.stderr, flush=True)
                return 1
            return 0
        time.sleep(POLL_S)


def lost_nodes(node_list: str, login: Login) -> str:
    """" The lost node: node 1 (n2, State=DOWN*, Reason=...)." for a job that ended in NODE_FAIL
    on `node_list`, or "" when Slurm does not say."""
    def run(argv: List[str]) -> str:
        return run_slurm(on_login_node(argv, login.environ, login.control))

    try:
        hosts = hostnames(node_list, run)
        nodes = run(["scontrol", "show", "node", "-o", node_list])
    except (OSError, subprocess.SubprocessError):
        return ""
    found = down_nodes(hosts, nodes)
    if not found:
        return ""
    return " The lost node%s: %s." % ("s" if len(found) > 1 else "", "; ".join(found))


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["--guard"]:
        return guard(argv[1])
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit("usage: python -m %s JOB.json -- TASK-COMMAND..." % __spec__.name)
    job_file, task_argv = argv[0], list(argv[2:])
    with open(job_file) as f:
        job = SlurmJob.from_json(f.read())
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    tails = [Tail(job.stdout, sys.stdout.buffer), Tail(job.stderr, sys.stderr.buffer)]
    login = Login(job.step_name, os.environ)
    login.open()
    try:
        job_id = submit(with_env_file(job, os.environ), task_argv, login)
        keeper = start_guard(job_id)
        assert keeper.stdin is not None
        try:
            print("[slurm] submitted job %s: %d node(s), folder %s%s" % (
                job_id, job.nodes, job.work_dir,
                ", over ssh %s" % " ".join(login.words) if login.words else ""), flush=True)
            status = watch(job, job_id, tails, login)
        except SlurmWatchInterrupted as ex:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            cancel(job, job_id, "interrupted (%s)" % ex, tails, login)
            status = 128 + ex.signum
        # Only a job known to be over is left alone: on any other way out, the guard cancels it.
        keeper.stdin.write(GUARD_DONE)
        keeper.stdin.close()
        return status
    finally:
        login.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
