"""Launch time of a 2 x 2 gang on a real Slurm cluster: `python flow.py run --with torch_slurm`
against a hand-written `sbatch` script that runs `srun torchrun` (issue 43's figures), paired
and interleaved, on the CI cluster of .ci/slurm (4 nodes, each its own network namespace of
this machine). Needs root.

    .venv/bin/python bench/slurm_launch.py --reps 5

Each repetition runs both, in a shuffled order, from the controller host (the login node):

* `ours`: `python bench/flows/slurm_gang.py run --with torch_slurm`, a flow of three steps, so
  three Slurm jobs (start and end are one-node jobs, the gang one 2-node job);
* `ours_container`: the same with METAFLOW_TORCH_SLURM_CONTAINER, every node's task in an OCI
  bundle through `srun --container` (runc; the bundle of tests/slurm/bundle.py, this machine's
  system read-only);
* `srun_torchrun`: `sbatch` of a script whose one line is `srun torchrun --nnodes=2
  --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=<first node>:29500
  bench/flows/slurm_torchrun_train.py`, its end read by polling `scontrol show job` every 0.5 s
  (as @torch_slurm's watcher does: `sbatch --wait` took tens of seconds to notice an end).

Times, in seconds from the command's start: `rendezvous`, when the last rank's process group
formed and its first all_reduce completed (each rank writes its time; every node shares this
machine's clock); `whole`, when the command (ours) or the job (torchrun) was seen to end. For
ours also `gang_job`: from the gang's own submission (its `[slurm] submitted job` line) to the
rendezvous, the part one multi-node job costs. Writes bench/results/slurm-<timestamp>.json and
prints the medians and the paired ratios.
"""

import argparse
import datetime
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from tests.slurm.bundle import oci_bundle  # noqa: E402
SLURM = ROOT / ".ci" / "slurm"
PYTHON = sys.executable
TORCHRUN = str(Path(PYTHON).with_name("torchrun"))
RANKS = 4
SUBMITTED = re.compile(r"^(\S+ \S+) \[[^]]*\] \[slurm\] submitted job \d+: 2 node")

SBATCH = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=%(folder)s/job-%%j.out
#SBATCH --no-requeue
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --kill-on-bad-exit=1 %(torchrun)s --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d \\
    --rdzv-endpoint="$first:29500" --rdzv-id="$SLURM_JOB_ID" %(script)s
"""


def on_controller(state, *argv):
    return [str(SLURM), "exec", state, *argv]


def rendezvous(marks, started):
    """Seconds from `started` to the last rank's first all_reduce, or None if a rank is
    missing."""
    times = []
    for rank in range(RANKS):
        path = marks / ("rank-%d.json" % rank)
        if not path.exists():
            return None
        times.append(json.loads(path.read_text())["collective"])
    return max(times) - started


def run_ours(state, folder, env):
    marks = Path(tempfile.mkdtemp(dir=folder, prefix="marks-"))
    flow = folder / "slurm_gang.py"
    started = time.time()
    done = subprocess.run(on_controller(state, PYTHON, str(flow), "--no-pylint", "run",
                                        "--with", "torch_slurm"),
                          cwd=folder, env=dict(env, BENCH_MARKS=str(marks)),
                          capture_output=True, text=True, timeout=600)
    whole = time.time() - started
    if done.returncode != 0:
        raise SystemExit("the flow failed:\n%s\n%s" % (done.stdout[-3000:], done.stderr[-3000:]))
    found = [SUBMITTED.match(line) for line in (done.stdout + done.stderr).splitlines()]
    submitted = next(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
                     for m in found if m)
    meeting = rendezvous(marks, started)
    return {"rendezvous": meeting, "whole": whole,
            "gang_job": meeting + started - submitted if meeting is not None else None}


def run_srun_torchrun(state, folder, env):
    marks = Path(tempfile.mkdtemp(dir=folder, prefix="marks-"))
    script = folder / "job.sbatch"
    script.write_text(SBATCH % {"folder": folder, "torchrun": TORCHRUN,
                                "script": HERE / "flows" / "slurm_torchrun_train.py"})
    started = time.time()
    out = subprocess.run(on_controller(state, "sbatch", "--parsable",
                                       "--export=ALL,BENCH_MARKS=%s" % marks, str(script)),
                         cwd=folder, env=env, capture_output=True, text=True, check=True,
                         timeout=60).stdout
    job_id = out.strip().split(";")[0]
    while True:
        shown = subprocess.run(on_controller(state, "scontrol", "show", "job", "-o", job_id),
                               capture_output=True, text=True, timeout=60).stdout
        state_word = re.search(r"JobState=(\S+)", shown)
        if state_word and state_word.group(1) not in ("PENDING", "CONFIGURING", "RUNNING",
                                                      "COMPLETING"):
            break
        time.sleep(0.5)
    whole = time.time() - started
    if state_word.group(1) != "COMPLETED":
        log = "".join(p.read_text() for p in folder.glob("job-%s.out" % job_id))
        raise SystemExit("the torchrun job ended %s:\n%s" % (state_word.group(1), log[-3000:]))
    return {"rendezvous": rendezvous(marks, started), "whole": whole}


def run_ours_container(state, folder, env):
    return run_ours(state, folder, dict(env, METAFLOW_TORCH_SLURM_CONTAINER=str(
        folder / "bundle")))


ARMS = {"ours": run_ours, "ours_container": run_ours_container,
        "srun_torchrun": run_srun_torchrun}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (.ci/slurm starts a cluster of network namespaces)")
    state = subprocess.run([str(SLURM), "up"], check=True, capture_output=True,
                           text=True).stdout.strip().splitlines()[-1]
    folder = Path(tempfile.mkdtemp(prefix="slurm-bench-"))
    os.chmod(folder, 0o755)
    shutil.copy(HERE / "flows" / "slurm_gang.py", folder / "slurm_gang.py")
    oci_bundle(folder / "bundle", [str(folder), str(ROOT)], "bench")
    env = {k: v for k, v in os.environ.items() if not k.startswith("METAFLOW_")}
    env.update(USER=env.get("USER") or "bench", METAFLOW_USER="bench",
               METAFLOW_HOME=str(folder / "home"))
    reps = []
    try:
        run_ours(state, folder, env)  # warm: the first run makes the datastore, caches bytecode
        for rep in range(args.reps):
            order = list(ARMS)
            random.shuffle(order)
            reps.append({arm: ARMS[arm](state, folder, env) for arm in order})
            print("rep %d: %s" % (rep + 1, json.dumps(reps[-1])), flush=True)
    finally:
        subprocess.run([str(SLURM), "down", state], check=False)
        shutil.rmtree(folder, ignore_errors=True)
    summary = {}
    for arm in ARMS:
        for key in ("rendezvous", "whole", "gang_job"):
            values = [r[arm][key] for r in reps if r[arm].get(key) is not None]
            if values:
                summary["%s.%s" % (arm, key)] = statistics.median(values)
    for key in ("rendezvous", "whole"):
        summary["ratio.%s" % key] = statistics.median(
            r["ours"][key] / r["srun_torchrun"][key] for r in reps)
        summary["ratio.container_to_ours.%s" % key] = statistics.median(
            r["ours_container"][key] / r["ours"][key] for r in reps)
    result = {"when": time.strftime("%Y%m%dT%H%M%S"), "reps": reps, "median": summary,
              "load": os.getloadavg(), "cpus": os.cpu_count()}
    out = HERE / "results" / ("slurm-%s.json" % result["when"])
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print("written", out)


if __name__ == "__main__":
    main()
