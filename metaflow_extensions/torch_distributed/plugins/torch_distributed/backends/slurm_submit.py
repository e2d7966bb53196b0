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

import os
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import BinaryIO, Dict, List, Optional, Sequence

from .slurm import SlurmJob, batch_script, down_nodes, ending, hostnames, job_state, \
    node_script, parse_job, partition_refusal, run_slurm, sbatch_argv

POLL_S = 0.5
# How long a cancelled job may stay in the queue (COMPLETING) before this process gives up
# waiting for it: the cluster's KillWait (30 s by default) and then some.
CANCEL_WAIT_S = 60.0
GUARD_DONE = b"done\n"
# How long `scontrol show job` may keep failing (the controller restarting, a network blip)
# before the watch gives up and cancels the job.
SCONTROL_PATIENCE_S = 60.0


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


def submit(job: SlurmJob, task_argv: Sequence[str]) -> str:
    """Write the job's scripts and submit it; its id."""
    node = os.path.join(job.work_dir, "node.sh")
    batch = os.path.join(job.work_dir, "job.sh")
    with open(node, "w") as f:
        f.write(node_script(job, task_argv))
    with open(batch, "w") as f:
        f.write(batch_script(job, node))
    argv = sbatch_argv(job, batch)
    if job.nodes > 1:
        shown = subprocess.run(["scontrol", "show", "partition", "-o"], capture_output=True,
                               text=True)
        refusal = partition_refusal(job.step_name, job.nodes, job.options.partition,
                                    shown.stdout)
        if refusal:
            raise SystemExit(refusal)
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit("@torch_slurm on step *%s*: sbatch refused the job of %d node(s): %s"
                         "\nThe command was: %s\nCheck the step's @torch_slurm options "
                         "(partition, account, qos, time, constraint, gpu, gres) against "
                         "`sinfo` and the cluster's limits." % (
                             job.step_name, job.nodes, done.stderr.strip(), " ".join(argv)))
    return done.stdout.strip().split(";")[0]


def show_job(job_id: str) -> Optional[Dict[str, str]]:
    """The job's fields, or None when Slurm no longer knows it (after MinJobAge)."""
    done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                          text=True)
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return None
        raise ScontrolFailed("scontrol show job %s failed: %s" % (job_id, done.stderr.strip()))
    return parse_job(done.stdout)


def in_queue(job_id: str) -> bool:
    done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                          text=True)
    return done.returncode == 0 and bool(done.stdout.strip())


def start_guard(job_id: str) -> subprocess.Popen:
    """A process of its own session that cancels the job unless told it is over."""
    return subprocess.Popen([sys.executable, "-m", __spec__.name, "--guard", job_id],
                            stdin=subprocess.PIPE, start_new_session=True)


def guard(job_id: str) -> int:
    said = sys.stdin.buffer.read()
    if said != GUARD_DONE:
        subprocess.run(["scancel", job_id], capture_output=True)
    return 0


class SlurmWatchInterrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, frame: Optional[FrameType]) -> None:
    raise SlurmWatchInterrupted(signum)


def cancel(job: SlurmJob, job_id: str, why: str, tails: List[Tail]) -> None:
    """scancel the job and wait until it has left the queue, forwarding what it still says."""
    print("@torch_slurm on step *%s*: %s: cancelling Slurm job %s (scancel)."
          % (job.step_name, why, job_id), file=sys.stderr, flush=True)
    subprocess.run(["scancel", job_id], capture_output=True)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while in_queue(job_id) and time.monotonic() < deadline:
        for tail in tails:
            tail.pump()
        time.sleep(POLL_S)
    for tail in tails:
        tail.pump()


def watch(job: SlurmJob, job_id: str, tails: List[Tail]) -> int:
    """Forward the job's output until it has ended; 0 when it COMPLETED."""
    state = None
    failing_since: Optional[float] = None
    while True:
        for tail in tails:
            tail.pump()
        try:
            fields = show_job(job_id)
        except ScontrolFailed as ex:
            now = time.monotonic()
            if failing_since is None:
                failing_since = now
                print("[slurm] %s; asking again for up to %d s" % (ex, SCONTROL_PATIENCE_S),
                      file=sys.stderr, flush=True)
            if now - failing_since > SCONTROL_PATIENCE_S:
                cancel(job, job_id, "the job's state could not be read for %d s (%s)"
                       % (SCONTROL_PATIENCE_S, ex), tails)
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
                    message += lost_nodes(fields.get("NodeList", ""))
                agents = ", ".join(job.node_log(n) for n in range(1, job.nodes))
                print(message + (" The other nodes' own output: %s." % agents if agents
                                 else ""), file=sys.stderr, flush=True)
                return 1
            return 0
        time.sleep(POLL_S)


def lost_nodes(node_list: str) -> str:
    """" The lost node: node 1 (n2, State=DOWN*, Reason=...)." for a job that ended in NODE_FAIL
    on `node_list`, or "" when Slurm does not say."""
    try:
        hosts = hostnames(node_list, run_slurm)
        nodes = run_slurm(["scontrol", "show", "node", "-o", node_list])
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
    job_id = submit(job, task_argv)
    keeper = start_guard(job_id)
    assert keeper.stdin is not None
    try:
        print("[slurm] submitted job %s: %d node(s), folder %s" % (job_id, job.nodes,
                                                                    job.work_dir), flush=True)
        status = watch(job, job_id, tails)
    except SlurmWatchInterrupted as ex:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        cancel(job, job_id, "interrupted (%s)" % ex, tails)
        status = 128 + ex.signum
    # Only a job known to be over is left alone: on any other way out, the guard cancels it.
    keeper.stdin.write(GUARD_DONE)
    keeper.stdin.close()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
