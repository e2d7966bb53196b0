"""Recovery from a lost rank: restart in place vs @retry vs torchrun --max-restarts, paired.

    .venv/bin/python bench/recovery.py --reps 5

The same training (a tiny DDP model on gloo, 60 steps, rank 0 saving every 10, one node of 4
processes) loses rank 3 to a SIGKILL at step 35, and the time is taken from that SIGKILL to the
first training step of the last rank of the resumed gang (marks the training writes):
* `inplace`: tests/e2e/flows/checkpoint_flow.py with max_restarts=1: the gang is started again
  in the same attempt, every rank loading @checkpoint's latest;
* `inplace2n`: the same, the world as 2 nodes (node agents on this machine) of world/2 each;
* `inplaceexec`: `inplace` under start_method="exec": the restart starts every rank, rank 0
  included, as a fresh interpreter (a spin-step of the task), which imports torch again;
* `retry`: the same flow with max_restarts=0: @retry's next attempt (a new task) resumes;
* `torchrun`: bench/flows/recovery_torchrun.py, a plain step running the same training under
  `torchrun --standalone --max-restarts=1`, which saves to a file.
Each repetition runs them all in a shuffled order. Writes bench/results/recovery-<ts>.json and
prints the medians, the paired ratios inplace/torchrun and inplace/retry.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ARMS = {
    "inplace": (REPO / "tests" / "e2e" / "flows" / "checkpoint_flow.py",
                {"TD_MAX_RESTARTS": 1, "TD_KILL_RANK": 3, "TD_KILL_STEP": 35}),
    # the same world as 2 nodes x world/2 (node agents, the restart's word through the store)
    "inplace2n": (REPO / "tests" / "e2e" / "flows" / "checkpoint_flow.py",
                  {"TD_MAX_RESTARTS": 1, "TD_KILL_RANK": 3, "TD_KILL_STEP": 35, "TD_NODES": 2}),
    "inplaceexec": (REPO / "tests" / "e2e" / "flows" / "checkpoint_flow.py",
                    {"TD_MAX_RESTARTS": 1, "TD_KILL_RANK": 3, "TD_KILL_STEP": 35,
                     "METAFLOW_TORCH_DISTRIBUTED_START_METHOD": "exec"}),
    "retry": (REPO / "tests" / "e2e" / "flows" / "checkpoint_flow.py",
              {"TD_MAX_RESTARTS": 0, "TD_KILL_RANK": 3, "TD_KILL_STEP": 35}),
    "torchrun": (HERE / "flows" / "recovery_torchrun.py", {"BENCH_KILL_RANK": 3}),
}


def run_arm(arm, world):
    flow, extra = ARMS[arm]
    root = Path(tempfile.mkdtemp(prefix="td-recovery-"))
    marks = root / "marks"
    marks.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("METAFLOW_", "BENCH_", "TD_"))}
    env.update({"METAFLOW_HOME": str(root / "mfhome"), "METAFLOW_DEFAULT_DATASTORE": "local",
                "METAFLOW_DEFAULT_METADATA": "local",
                "METAFLOW_DATASTORE_SYSROOT_LOCAL": str(root), "USERNAME": "bench",
                "TD_MARK_DIR": str(marks), "TD_NODES": "1", "TD_NPROC": str(world),
                "BENCH_WORLD": str(world),
                "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")})
    env.update({k: str(v) for k, v in extra.items()})
    if "TD_NODES" in extra:
        env["TD_NPROC"] = str(world // int(extra["TD_NODES"]))
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(flow), "--no-pylint", "run"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (arm, (out.stdout + out.stderr)[-4000:]))
    killed = float((marks / "killed-at").read_text())
    resumed = max(float((marks / ("first-step-1-rank-%d" % r)).read_text())
                  for r in range(world))
    return {"arm": arm, "recovery_s": round(resumed - killed, 3), "wall_s": round(wall, 3)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--world", type=int, default=4)
    args = parser.parse_args()
    runs = []
    for rep in range(args.reps):
        order = list(ARMS)
        random.shuffle(order)
        for arm in order:
            record = dict(run_arm(arm, args.world), rep=rep, load=round(os.getloadavg()[0], 2))
            runs.append(record)
            print(json.dumps(record), flush=True)
    by = {a: {r["rep"]: r["recovery_s"] for r in runs if r["arm"] == a} for a in ARMS}
    summary = {a: statistics.median(by[a].values()) for a in ARMS}
    ratios = {}
    for arm, other in (("inplace", "torchrun"), ("inplace", "retry"), ("inplace2n", "torchrun"),
                       ("inplace2n", "inplace"), ("inplaceexec", "torchrun"),
                       ("inplaceexec", "inplace")):
        ratios["%s/%s" % (arm, other)] = statistics.median(
            by[arm][i] / by[other][i] for i in range(args.reps))
    result = {"world": args.reps and args.world, "reps": args.reps, "median_recovery_s": summary,
              "paired_median_ratio": ratios, "runs": runs, "cpus": os.cpu_count()}
    path = HERE / "results" / ("recovery-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"median_recovery_s": summary, "paired_median_ratio": ratios}, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
