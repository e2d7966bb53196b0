"""What the seal of torch's own rendezvous (issue 37) costs a whole flow: the launch flow of
bench/run.py (start, a 4-rank @torch_distributed step that imports torch, forms the group and
does one all-reduce, end; one node, fork), run as it is ("sealed") and with the seal's install
skipped in the flow file ("unsealed", BENCH_UNSEALED=1 in bench/flows/bench_ours.py: a switch
of the bench's flow, not of the package).

    .venv/bin/python bench/seal_launch.py --arm sealed      # one flow, for an outside timer
    .venv/bin/python bench/seal_launch.py --pairs 7         # paired and alternated, here

With --arm it runs one flow in a fresh folder and exits non-zero if the flow failed: time it
as a whole process (`/usr/bin/time -v`, or any tool that runs two commands in turn and pairs
them). With --pairs it runs the two arms in turn (the order alternating), times each flow's
wall clock (bench/run.py's run_flow), writes bench/results/seal-launch-<timestamp>.json and
prints each arm's median, the median of the pairs' ratios sealed/unsealed and their range.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402 - bench/run.py, beside this file

ARMS = {"sealed": {}, "unsealed": {"BENCH_UNSEALED": "1"}}


def one(arm, world):
    settings = dict(ARMS[arm], BENCH_KIND="launch", BENCH_WORLD=world)
    record = run.run_flow("ours_fork", settings)
    record["arm"] = arm
    return record


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--arm", choices=sorted(ARMS))
    parser.add_argument("--pairs", type=int, default=0)
    parser.add_argument("--world", type=int, default=4)
    args = parser.parse_args()
    if args.arm:
        record = one(args.arm, args.world)
        sys.exit(0 if record["returncode"] == 0 and record["result"] else 1)
    runs = []
    for i in range(args.pairs):
        order = ("sealed", "unsealed") if i % 2 == 0 else ("unsealed", "sealed")
        pair = {arm: one(arm, args.world) for arm in order}
        runs.append(pair)
        print("pair %d: sealed %.2f s, unsealed %.2f s (load %.1f)" % (
            i, pair["sealed"]["wall"], pair["unsealed"]["wall"], os.getloadavg()[0]), flush=True)
    ok = [p for p in runs if all(r["returncode"] == 0 and r["result"] for r in p.values())]
    out = HERE / "results" / ("seal-launch-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    out.write_text(json.dumps({"world": args.world, "cpus": os.cpu_count(), "pairs": runs},
                              indent=1))
    print("%d pairs of %d, sealed and unsealed (medians), sealed/unsealed by pair (median, "
          "range):" % (len(ok), len(runs)))
    # the whole flow's wall clock; rank 0's init_process_group within it (group formed less
    # torch imported)
    for label, of in (("whole flow, wall", lambda r: r["wall"]),
                      ("rank 0's init_process_group",
                       lambda r: r["result"]["init"] - r["result"]["import"])):
        values = {arm: [of(p[arm]) for p in ok] for arm in ARMS}
        ratios = [of(p["sealed"]) / of(p["unsealed"]) for p in ok]
        print("  %s: %.3f s, %.3f s; %.3f (%.3f to %.3f)" % (
            label, statistics.median(values["sealed"]), statistics.median(values["unsealed"]),
            statistics.median(ratios), min(ratios), max(ratios)))
    print("written to %s" % out.relative_to(HERE.parent))


if __name__ == "__main__":
    main()
