"""What drawing the gang's card costs the end of a gang task (issue 41): Metaflow's `card
create` process, which drew it until then, against the task drawing it itself (card.TaskCard:
the page from the record in memory, then Metaflow's card store), paired and interleaved.

    .venv/bin/python bench/card_draw.py --reps 7 --world 4

One real flow (`flows/bench_ours.py`, --world ranks on one node, card on) gives a task with a
gang record; then each repetition runs, in a shuffled order, `python bench_ours.py card create
RUN/train/TASK --type torch_distributed ...` (the command @card runs at the end of a task,
with Metaflow's own options) and, in a fresh interpreter that imported Metaflow and torch as a
task has, the task's own drawing of the same card (mf/card.py `_parts`, internals.card_page,
the card store's save_card) timed around the call. Writes bench/results/card-<timestamp>.json
and prints medians."""

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
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402

IN_TASK = r"""
import json, sys, time
import torch, metaflow
from metaflow.datastore import FlowDataStore
from metaflow.plugins.cards.card_datastore import CardDatastore
from metaflow.plugins.datastores.local_storage import LocalStorage
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import card, events, internals
root, pathspec = sys.argv[1], sys.argv[2]
flow, run_id, step, task = pathspec.split("/")
ds = FlowDataStore(flow, storage_impl=LocalStorage, ds_root=root + "/.metaflow")
record = events.GangRecord.from_dict(internals.load_attempt_file(ds, run_id, step, task, 0,
                                                                 events.RECORD_FILE))
cards = FlowDataStore(flow, storage_impl=LocalStorage, ds_root=root + "/.metaflow/mf.cards")
t = time.perf_counter()
html = internals.card_page(card._parts(pathspec, 0, record, []), pathspec)
CardDatastore(cards, pathspec=pathspec).save_card("benchdraw%d" % time.time_ns(),
                                                  "torch_distributed", html,
                                                  card_id="torch_distributed")
print("DRAW %.6f" % (time.perf_counter() - t))
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="td-card-"))
    env = bench.flow_env(root)
    env.update(BENCH_KIND="launch", BENCH_WORLD=str(args.world), BENCH_START_METHOD="fork")
    flow = str(bench.FLOWS / "bench_ours.py")
    out = subprocess.run([sys.executable, flow, "--no-pylint", "run"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(out.stdout[-3000:] + out.stderr[-3000:])
    run_id = next(p.name for p in (root / ".metaflow" / "BenchOurs").iterdir()
                  if p.name.isdigit())
    task = next(p.name for p in (root / ".metaflow" / "BenchOurs" / run_id / "train").iterdir())
    pathspec = "%s/train/%s" % (run_id, task)
    create = [sys.executable, flow, "--quiet", "--metadata", "local", "--environment", "local",
              "--datastore", "local", "--datastore-root", str(root / ".metaflow"), "--no-pylint",
              "--event-logger", "nullSidecarLogger", "--monitor", "nullSidecarMonitor", "card",
              "create", pathspec, "--mode", "render", "--type", "torch_distributed",
              "--timeout", "45", "--id", "torch_distributed", "--render-error-card"]
    rng = random.Random(args.seed)
    started, load_before = time.strftime("%Y-%m-%d %H:%M:%S"), os.getloadavg()[0]
    times = {"card create": [], "in the task": []}
    for rep in range(args.reps):
        for way in rng.sample(sorted(times), 2):
            t = time.monotonic()
            if way == "card create":
                done = subprocess.run(create, cwd=root, env=env, capture_output=True, text=True)
                took = time.monotonic() - t
            else:
                done = subprocess.run([sys.executable, "-c", IN_TASK, str(root),
                                       "BenchOurs/" + pathspec], cwd=root, env=env,
                                      capture_output=True, text=True)
                took = float(done.stdout.rsplit("DRAW ", 1)[1]) if "DRAW " in done.stdout \
                    else float("nan")
            if done.returncode:
                raise SystemExit("%s failed:\n%s" % (way, done.stdout[-2000:] + done.stderr[-2000:]))
            times[way].append(round(took, 4))
            print("rep %d %-12s %.3f s  load %.2f" % (rep, way, took, os.getloadavg()[0]),
                  flush=True)
    summary = {way: statistics.median(v) for way, v in times.items()}
    print(json.dumps(summary))
    data = dict(command=" ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
                world=args.world, started=started, load_1min_before=load_before,
                load_1min_after=os.getloadavg()[0], cores=os.cpu_count(), times=times,
                medians=summary)
    path = HERE / "results" / ("card-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    path.write_text(json.dumps(data, indent=1))
    print(path)


if __name__ == "__main__":
    main()
