"""How long the gang takes to name its straggler (issue 41, point 1; core/stragglers.py), at
the default settings: a 2 x 2 gang (bench/flows/straggler_gang.py) whose rank 3 sleeps before
each step, for each --sleeps, and a control gang slow by turns, each `python flow.py run` in a
fresh folder, one after the other. Time to name: from rank 0's group forming to the moment
this script read the line from the run's output.

    .venv/bin/python bench/straggler_detect.py --reps 1 --sleeps 0.5,0.1 --seconds 90

Writes bench/results/straggler-<timestamp>.json and prints a line per run."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402

NAMED = "is the straggler:"


def one(arm, sleep, seconds):
    """{arm, sleep_s, named_after_s (None: never), lines, returncode} of one run."""
    root = Path(tempfile.mkdtemp(prefix="td-straggler-"))
    env = bench.flow_env(root)
    env.update(BENCH_SLOW_S=str(sleep), BENCH_SECONDS=str(seconds))
    env.update(BENCH_SLOW_RANK="3") if arm == "slow" else env.update(BENCH_BY_TURNS="1")
    proc = subprocess.Popen([sys.executable, str(HERE / "flows" / "straggler_gang.py"),
                             "--no-pylint", "run"], cwd=root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = []

    def read():
        for line in proc.stdout:
            if "straggler" in line:
                seen.append((time.time(), line.strip()))

    reader = threading.Thread(target=read)
    reader.start()
    proc.wait(timeout=seconds + 300)
    reader.join()
    formed = float((root / "formed").read_text()) if (root / "formed").exists() else None
    named = [t for t, line in seen if NAMED in line]
    return dict(arm=arm, sleep_s=sleep, returncode=proc.returncode,
                named_after_s=round(named[0] - formed, 1) if named and formed else None,
                lines=[line for _, line in seen], load_1min=os.getloadavg()[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--sleeps", default="0.5,0.1")
    parser.add_argument("--seconds", type=float, default=90)
    args = parser.parse_args(argv)
    sleeps = [float(s) for s in args.sleeps.split(",")]
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    runs = []
    for _ in range(args.reps):
        for arm, sleep in [("slow", s) for s in sleeps] + [("turns", sleeps[0])]:
            got = one(arm, sleep, args.seconds)
            runs.append(got)
            print("%-5s sleep %.2f s  named after %s s  rc %s  %s" % (
                arm, sleep, got["named_after_s"], got["returncode"],
                got["lines"][-1] if got["lines"] else "(no line)"), flush=True)
    data = dict(command=" ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
                started=started, cores=os.cpu_count(), seconds=args.seconds, runs=runs)
    path = HERE / "results" / ("straggler-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    path.write_text(json.dumps(data, indent=1))
    print(path)


if __name__ == "__main__":
    main()
