"""Launch time of @torch_distributed under two installs of the package, paired and interleaved.

    .venv/bin/python bench/ab_launch.py before=/path/a/.venv/bin/python \
        after=/path/b/.venv/bin/python --reps 7 --world 4
    .venv/bin/python bench/ab_launch.py before=... after=... --kind artifact --mb 200 \
        --launchers ours_fork

With `--kind artifact` the flow's rank 0 returns a state dict of `--mb` MB as an artifact
(bench/flows/work.py): the whole flow's time and the bytes it wrote to the datastore.

Each install is a Python (a venv) with the package installed from one commit. A repetition runs
`bench_ours.py` once per install and launcher (`ours_fork`: one node of --world processes;
`ours_nodes`: --world emulated nodes of one process, so node agents run too), in a shuffled
order, through the same `run_flow` as bench/run.py. Times are rank 0's, in seconds since the
train task was created; `collective` is when the first all_reduce completed. Each install's
package is compiled to bytecode first, as an installed one is (run.compile_bytecode). Writes
bench/results/ab-<timestamp>.json and prints medians of each arm and of the paired differences.
With `single` and `torchrun` among the launchers (bench/run.py's floor and torchrun in a
step), it also prints each arm's whole-flow ratios to them, paired by repetition (issue 41:
`--launchers single,torchrun,ours_fork,ours_nocard`, the last with the gang's card off).

An install needs no copy of torch: a venv made with `python -m venv --without-pip` whose
site-packages holds a `.pth` file naming a source tree of the package (e.g. `git archive`
of a commit, unpacked) and then this repository's `.venv/lib/python3.11/site-packages`.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

ONE_RUN = """
import json, sys
sys.path.insert(0, %r)
import run
print("AB_RECORD " + json.dumps(run.run_flow(%r, %r)))
"""


def run_once(python, launcher, settings):
    out = subprocess.run([python, "-c", ONE_RUN % (str(HERE), launcher, settings)],
                         capture_output=True, text=True, timeout=600,
                         cwd=str(HERE))  # not the repository: its package would shadow the arm's
    line = next((l for l in out.stdout.splitlines() if l.startswith("AB_RECORD ")), None)
    if line is None:
        raise RuntimeError("no record from %s %s:\n%s" % (python, launcher, out.stderr[-3000:]))
    return json.loads(line.split(" ", 1)[1])


def summary(runs, arms, launchers, metrics=("collective", "wall")):
    lines = []
    for launcher in launchers:
        by_arm = {a: {r["rep"]: r for r in runs if r["arm"] == a and r["launcher"] == launcher
                      and r["returncode"] == 0 and r["result"]} for a in arms}
        for metric in metrics:
            unit = "MB" if metric == "datastore_bytes" else "s"

            def value(r):
                if metric == "datastore_bytes":
                    return r[metric] / 1e6
                return r["wall"] if metric == "wall" else r["result"][metric]
            meds = {a: statistics.median(value(r) for r in by_arm[a].values()) for a in arms}
            reps = sorted(set.intersection(*(set(by_arm[a]) for a in arms)))
            diffs = [value(by_arm[arms[1]][i]) - value(by_arm[arms[0]][i]) for i in reps]
            lines.append("%-10s %-10s %s  paired %s - %s: median %+.3f %s (range %+.3f to %+.3f, "
                         "%d pairs)" % (
                             launcher, metric,
                             "  ".join("%s %.3f %s" % (a, meds[a], unit) for a in arms),
                             arms[1], arms[0], statistics.median(diffs), unit, min(diffs),
                             max(diffs), len(diffs)))
    return lines


def ratios(runs, arms, launchers, floors=("single", "torchrun")):
    """Per arm, each launcher's whole-flow time over each floor's (`floors` that were run) in
    the same arm and repetition: the median of those paired ratios and their range."""
    lines = []
    for arm in arms:
        walls = {(r["launcher"], r["rep"]): r["wall"] for r in runs
                 if r["arm"] == arm and r["returncode"] == 0 and r["result"]}
        for launcher in launchers:
            for floor in floors:
                if floor == launcher or floor not in launchers:
                    continue
                paired = [walls[(launcher, rep)] / walls[(floor, rep)]
                          for (name, rep) in walls if name == launcher and (floor, rep) in walls]
                if paired:
                    lines.append("%-7s %-12s / %-9s median %.2f (range %.2f to %.2f, %d pairs)"
                                 % (arm, launcher, floor, statistics.median(paired),
                                    min(paired), max(paired), len(paired)))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arms", nargs=2, help="LABEL=PYTHON, e.g. before=../a/.venv/bin/python")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--launchers", default="ours_fork,ours_nodes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="")
    parser.add_argument("--kind", choices=("launch", "artifact"), default="launch")
    parser.add_argument("--mb", type=float, default=200.0, help="the artifact's size")
    args = parser.parse_args(argv)
    arms = dict(a.split("=", 1) for a in args.arms)
    labels = list(arms)
    launchers = args.launchers.split(",")
    rng = random.Random(args.seed)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.path.insert(0, str(HERE))
    import run

    for python in arms.values():
        run.compile_bytecode(python)
    load_before = os.getloadavg()[0]
    t = time.monotonic()
    runs = []
    for rep in range(args.reps):
        pairs = [(a, l) for a in labels for l in launchers]
        rng.shuffle(pairs)
        for arm, launcher in pairs:
            settings = dict(BENCH_KIND=args.kind, BENCH_WORLD=args.world)
            if args.kind == "artifact":
                settings["BENCH_MB"] = args.mb
            rec = run_once(arms[arm], launcher, settings)
            rec.update(arm=arm, rep=rep)
            runs.append(rec)
            print("rep %d %-7s %-10s wall %6.2f s  collective %s  rc %s  load %.2f" % (
                rep, arm, launcher, rec["wall"], (rec["result"] or {}).get("collective"),
                rec["returncode"], rec["load_1min"]), flush=True)
    lines = summary(runs, labels, launchers, ("collective", "wall") if args.kind == "launch"
                    else ("wall", "datastore_bytes"))
    if args.kind == "launch":
        lines += ratios(runs, labels, launchers)
    print("\n".join(lines))
    data = dict(command=" ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
                note=args.note, arms=arms, world=args.world, launchers=launchers,
                kind=args.kind, mb=args.mb if args.kind == "artifact" else None,
                started=started, duration_s=round(time.monotonic() - t),
                load_1min_before=load_before, load_1min_after=os.getloadavg()[0],
                cores=os.cpu_count(), summary=lines, runs=runs)
    out = HERE / "results" / ("ab-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    out.write_text(json.dumps(data, indent=1))
    print(out)


if __name__ == "__main__":
    main()
