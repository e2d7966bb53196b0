"""`torch-distributed preflight --smoke`: one small gang on the step's own backend, queue (or
namespace) and image, which is what the preflight cannot learn by reading APIs.

A flow of three steps is written to a temporary folder: its gang step carries the gang step's
@batch (or @kubernetes) attributes and @torch_distributed(nodes=2, nproc_per_node=1) (one node
for a one-node gang, which needs no second machine and may run where multi-node jobs cannot). Every
rank imports torch, reports CUDA and NCCL availability and the size of /dev/shm, forms a
process group across the two nodes (NCCL on GPUs, else gloo) and all-reduces once; rank 0
prints what every rank reported as one line the preflight reads from the run's output. The run
is bounded (`timeout_s`); `verdict` turns what came back into findings (pure).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..preflight.common import FAILED, Finding, GangNeeds, failed, passed, unknown
from ..backends.kubernetes import MIN_SHARED_MEMORY_MIB

NODES = 2
# run(argv, cwd, env, timeout_s, echo): (exit code, or None when stopped at the timeout; output)
Runner = Callable[[List[str], str, Dict[str, str], int, Callable[[str], object]],
                  Tuple[Optional[int], str]]


def smoke_nodes(needs: GangNeeds) -> int:
    return NODES if needs.nodes > 1 else 1

REPORT_MARK = "TORCH_DISTRIBUTED_SMOKE "
DEFAULT_TIMEOUT_S = 1200
# Seconds Metaflow gets after SIGTERM to stop its remote job (its atexit hook) before SIGKILL.
STOP_GRACE_S = 30
# The backend decorator's attributes the smoke job keeps: where and on what it runs.
KEPT = {
    "batch": ("queue", "image", "iam_role", "execution_role", "cpu", "memory", "gpu",
              "shared_memory", "efa"),
    "kubernetes": ("image", "namespace", "service_account", "cpu", "memory", "gpu",
                   "gpu_vendor", "shared_memory", "labels", "node_selector", "tolerations"),
    "torch_slurm": ("partition", "account", "qos", "time", "constraint", "gres", "gpu", "cpu",
                    "setup", "python", "container"),
}
FLOW_NAME = "TorchDistributedSmokeFlow"

_FLOW = '''"""The smoke job of `torch-distributed preflight --smoke` (written by preflight_smoke.py)."""
import json
import os

from metaflow import FlowSpec, current, step, torch_distributed, %(backend)s


class %(name)s(FlowSpec):
    @step
    def start(self):
        self.next(self.smoke)

    @%(backend)s(**%(attributes)s)
    @torch_distributed(nodes=%(nodes)d, nproc_per_node=1, rendezvous_timeout=%(rendezvous)d)
    @step
    def smoke(self):
        import torch
        import torch.distributed as dist

        gang = current.torch_distributed
        shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
        cuda = torch.cuda.is_available()
        info = {"rank": gang.rank, "node": gang.node_rank, "torch": torch.__version__,
                "cuda": cuda, "cuda_version": torch.version.cuda,
                "nccl": dist.is_nccl_available(),
                "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
                "shm_mib": shm.f_blocks * shm.f_frsize // 2 ** 20 if shm else None}
        dist.init_process_group("nccl" if cuda else "gloo")
        ones = torch.ones(1, device="cuda:%%d" %% gang.local_rank if cuda else "cpu")
        dist.all_reduce(ones)
        info["all_reduce"] = ones.item()
        dist.destroy_process_group()
        report = gang.gather(info)
        if gang.is_main:
            print(%(mark)r + json.dumps({"world_size": gang.world_size, "ranks": report}),
                  flush=True)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    %(name)s()
'''


def kept_attributes(needs: GangNeeds) -> Dict[str, Any]:
    """The backend decorator's attributes of the gang step that the smoke job gets: on Slurm
    also the CPUs the step's CPU gang asks for without naming them (slurm.gang_options), so the
    smoke job's nodes are the size of the step's."""
    kept = {k: needs.options[k] for k in KEPT[needs.backend]
            if needs.options.get(k) not in (None, "", {}, [])}
    if needs.backend == "torch_slurm" and "cpu" not in kept and needs.cpu > 1:
        kept["cpu"] = int(needs.cpu)
    return kept


def flow_source(needs: GangNeeds, timeout_s: int) -> str:
    """The smoke flow's source for the gang step of `needs`."""
    return _FLOW % {"backend": needs.backend, "name": FLOW_NAME, "nodes": smoke_nodes(needs),
                    "attributes": repr(kept_attributes(needs)),
                    "rendezvous": max(60, timeout_s // 2), "mark": REPORT_MARK}


def announcement(needs: GangNeeds, timeout_s: int, placement: str = "") -> str:
    """What the smoke job starts, on what, and for how long, said before it is submitted."""
    nodes = smoke_nodes(needs)
    if needs.backend == "torch_slurm":
        return ("smoke: this RUNS one job: a gang of %d node%s x (%s) on Slurm partition %s, "
                "for up to %d s (Ctrl-C stops it and cancels its job)\n"
                "smoke: expect %s" % (nodes, "s" if nodes > 1 else "", needs.per_node(),
                                      needs.options.get("partition") or "(the default)",
                                      timeout_s, EXPECTED_SLURM))
    where = ("AWS Batch queue %s" % needs.options.get("queue") if needs.backend == "batch"
             else "Kubernetes namespace %s" % (needs.options.get("namespace") or "default"))
    return ("smoke: this RUNS one job: a gang of %d node%s x (%s) on %s with image %s, for up "
            "to %d s (Ctrl-C stops it and its job)\n"
            "smoke: it starts %d instance%s (%s); expect %s"
            % (nodes, "s" if nodes > 1 else "", needs.per_node(), where,
               needs.image or "(Metaflow's default)", timeout_s, nodes,
               "s" if nodes > 1 else "", placement or "of the size above", EXPECTED))


# How long a smoke job takes, said before it starts: the instances (from the compute
# environment's minimum, often 0) and the image pull dominate; the work is a minute.
EXPECTED = ("about 5 to 15 minutes: instances to start, the image to pull on each, then about a "
            "minute of work; billed for that time")
# On Slurm the nodes are there: the queue's wait for two free nodes, then the work (about 20 s
# on the CI cluster, mostly `import torch` on each node).
EXPECTED_SLURM = ("the queue's wait for 2 free nodes, then under a minute of work; it counts "
                  "against the account's allocation")
# Where to look at a smoke job that did not finish, by backend.
LOOK = {"batch": "look at the job in the AWS Batch console",
        "kubernetes": "look at its pods (`kubectl get pods`)",
        "torch_slurm": "look at its job (`squeue --me`, `scontrol show job`)"}


# -- the verdict (pure) ------------------------------------------------------------------------

def report_of(output: str) -> Optional[Dict[str, Any]]:
    """The report rank 0 printed, or None."""
    found = re.findall(re.escape(REPORT_MARK) + r"(\{.*\})", output)
    return json.loads(found[-1]) if found else None


def _tail(output: str, lines: int = 15) -> str:
    return "\n".join(output.strip().splitlines()[-lines:])


def verdict(needs: GangNeeds, returncode: Optional[int], output: str,
            timeout_s: int) -> List[Finding]:
    """Findings of the smoke job from its exit code (None: stopped at the timeout) and output."""
    step = needs.step
    if returncode is None:
        return [failed(step, "smoke", "the smoke job did not finish in %d s; a job that "
                       "waits for instances stays RUNNABLE (or its pods Pending), one whose "
                       "nodes cannot reach each other hangs at the rendezvous. Its last lines:\n%s"
                       % (timeout_s, _tail(output)),
                       "%s, and at the checks above" % LOOK.get(needs.backend, "look at the job"))]
    report = report_of(output)
    if report is None:
        missing = re.search(r"No module named '([^']+)'", output)
        if missing:
            return [failed(step, "smoke", "the image lacks the Python module %s (the smoke "
                           "job failed with `No module named %r`)" % (missing.group(1),
                                                                       missing.group(1)),
                           "install it in the image (docs/images.md), e.g. "
                           "`pip install torch` for a CPU image or the CUDA build for GPUs")]
        return [failed(step, "smoke", "the smoke job failed (exit code %d) before its gang "
                       "reported. Its last lines:\n%s" % (returncode, _tail(output)),
                       "read the lines above (the step's log: `python smoke_flow.py logs "
                       "<run id>/smoke` in the folder the preflight names), and "
                       "docs/troubleshooting.md")]
    findings: List[Finding] = []
    ranks = report["ranks"]
    for info in ranks:
        findings.append(passed(step, "smoke node %d" % info["node"], "torch %s, CUDA %s, "
                               "NCCL %s, /dev/shm %s MiB" % (
                                   info["torch"], info["cuda_version"] if info["cuda"] else "no",
                                   info["nccl_version"] or ("yes" if info["nccl"] else "no"),
                                   info["shm_mib"])))
    if needs.gpu:
        without = sorted({i["node"] for i in ranks if not i["cuda"]})
        if without:
            findings.append(failed(step, "smoke", "the step asks for GPUs, but torch sees no "
                                   "CUDA device on node %s: the image has a CPU build of torch, "
                                   "or no GPU driver reaches the container"
                                   % ", ".join(map(str, without)),
                                   "use an image with a CUDA build of torch that matches the "
                                   "instances' driver (docs/images.md)"))
        small = sorted({i["node"] for i in ranks
                        if (i["shm_mib"] or 0) < MIN_SHARED_MEMORY_MIB})
        if small:
            findings.append(failed(step, "smoke", "/dev/shm on node %s is below %d MiB, and "
                                   "NCCL may hang or fail with that little"
                                   % (", ".join(map(str, small)), MIN_SHARED_MEMORY_MIB),
                                   "@%s(shared_memory=%d) (MiB) or more on step %s"
                                   % (needs.backend, MIN_SHARED_MEMORY_MIB, step)))
    sums = {i["all_reduce"] for i in ranks}
    if sums != {float(report["world_size"])}:
        findings.append(failed(step, "smoke", "the all-reduce across the nodes gave %s, not %d"
                               % (sorted(sums), report["world_size"]),
                               "report it with the smoke job's log"))
    else:
        findings.append(passed(step, "smoke", "a process group formed across %d nodes and "
                               "all-reduced once (%d ranks)" % (len({i["node"] for i in ranks}),
                                                                report["world_size"])))
    return findings


# -- running it ----------------------------------------------------------------------------------

def run_bounded(argv: Sequence[str], cwd: str, env: Mapping[str, str], timeout_s: float,
                echo: Callable[[str], object]) -> Tuple[Optional[int], str]:
    """(exit code, or None when stopped at `timeout_s`; the output), echoing each line. The run
    gets its own session; at the timeout it is sent SIGTERM (Metaflow then stops its remote job)
    and, STOP_GRACE_S later, SIGKILL."""
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: List[str] = []

    def pump() -> None:
        assert process.stdout is not None  # stdout=PIPE
        for line in process.stdout:
            lines.append(line)
            echo(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        process.wait(timeout=timeout_s)
        returncode: Optional[int] = process.returncode
    except subprocess.TimeoutExpired:
        returncode = None
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reader.join(timeout=5)
    return returncode, "".join(lines)


def smoke(needs: GangNeeds, echo: Callable[[str], object], timeout_s: int = DEFAULT_TIMEOUT_S,
          runner: Runner = run_bounded,
          environ: Optional[Mapping[str, str]] = None, placement: str = "",
          confirm: Optional[Callable[[str], bool]] = None) -> List[Finding]:
    """Run the smoke job of a gang step and return its findings; said first, and only once
    `confirm(question)` agrees (None: --yes)."""
    echo(announcement(needs, timeout_s, placement))
    if confirm is not None and not confirm("smoke: submit it?"):
        return [unknown(needs.step, "smoke", "not run: the job was not confirmed",
                        "answer y, or pass --yes to run it without asking")]
    # On Slurm the job's nodes read the flow and its local datastore from this folder: under
    # the working directory, on the filesystem they share (as the user's own flow is), not /tmp
    shared = os.path.join(os.getcwd(), ".torch_slurm") if needs.backend == "torch_slurm" \
        else None
    if shared is not None:
        os.makedirs(shared, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="torch-distributed-smoke-", dir=shared)
    started = time.monotonic()
    flow = os.path.join(folder, "smoke_flow.py")
    with open(flow, "w") as f:
        f.write(flow_source(needs, timeout_s))
    env = dict(os.environ if environ is None else environ)
    returncode, output = runner([sys.executable, flow, "--no-pylint", "run"], folder, env,
                                timeout_s, echo)
    findings = verdict(needs, returncode, output, timeout_s)
    if any(f.status == FAILED for f in findings):
        # its flow and local metadata, for `python smoke_flow.py logs ...`
        echo("smoke: failed after %.0f s; its flow is kept in %s"
             % (time.monotonic() - started, folder))
    else:
        shutil.rmtree(folder, ignore_errors=True)
        echo("smoke: passed in %.0f s" % (time.monotonic() - started))
        if shared is not None:
            findings.append(passed(needs.step, "datastore", _shared_seen(shared, env)))
    return findings


def _shared_seen(shared: str, env: Mapping[str, str]) -> str:
    """What a passed Slurm smoke job showed of the datastore its nodes used."""
    if env.get("METAFLOW_DEFAULT_DATASTORE") == "s3":
        return ("the smoke job's nodes read its flow from %s, beside this flow's, and wrote "
                "its artifacts to %s" % (shared, env.get("METAFLOW_DATASTORE_SYSROOT_S3")
                                         or "the configured S3 datastore"))
    return "the smoke job's nodes read its flow and local datastore from %s, beside this " \
        "flow's" % shared
