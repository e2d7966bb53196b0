"""What one draw of the gang's live card costs node 0's task (issue 41): the CPU time of turning
the gang's state into the card's page, as mf/card.py's LiveCard does every
METAFLOW_TORCH_DISTRIBUTED_CARD_REFRESH seconds in a thread of the task (which runs no rank: the
ranks are processes of their own). The save to the card store (a write of the page and its
data update) depends on the datastore and is not counted.

    .venv/bin/python bench/live_card_draw.py --sizes 4,64,512 --draws 30

For each world size: a gang record of nodes of 8 ranks (4: one node of 4) whose every rank
has 30 last lines of stdout and of stderr, and a probe report per rank as RankLog.live makes
it after 10,000 training steps (progress, 16 recorded names; rank 0 also their series, 8 of
them thinned to 200 values). Each draw adds a new read of the probes (the counts moved on) and
renders the whole page (livecard.LiveFigures, card.card_data, card.components,
internals.card_page). Prints and writes bench/results/livecard-<timestamp>.json: the median
and the largest draw, in ms of CPU of this process.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import (  # noqa: E402
    card, events, internals, livecard)


def rank_live(rank, steps, tmp):
    log = events.RankLog(rank, os.path.join(tmp, "rank-%d.json" % rank))
    for step in range(steps):
        if step % 10 == 0:
            for name in range(16):
                log.record("metric_%d" % name, step * 0.001 + name)
        log.report_progress(step, 20000)
    return log.live(rank == 0)


def record_of(world, nproc):
    lines = ["step %d loss 0.1234 lr 3e-4 samples/s 1234.5" % i for i in range(30)]
    now = time.time()
    return events.GangRecord(
        step="train", attempt=0, gang_id="g", nodes=world // nproc, nproc_per_node=nproc,
        accelerator="cpu", backend="gloo", scheduler="local", start_method="fork",
        master_addr="10.0.0.1", master_port=29500, started=now - 3600, ended=now,
        phases=(("nodes joined", now - 3590), ("rendezvous done", now - 3580)),
        ranks={rank: events.RankRecord(rank, now - 3595, joined=now - 3585)
               for rank in range(world)},
        tails={rank: {"stdout": lines, "stderr": lines} for rank in range(world)})


def measure(world, draws):
    nproc = 4 if world == 4 else 8
    with tempfile.TemporaryDirectory() as tmp:
        live = {rank: rank_live(rank, 10000, tmp) for rank in range(min(world, 8))}
    record = record_of(world, nproc)
    figures = livecard.LiveFigures()
    times = []
    for draw in range(draws):
        reports = {rank: {"quiet_s": 0.0, "seq": 100 * draw + rank, "waiting": "all_reduce",
                          "where": "train.py:42 in train", "stack": "", "age_s": 0.2,
                          "done": False, "history": None, "live": live[rank % len(live)]}
                   for rank in range(world)}
        started = time.process_time()
        figures.add(float(draw) * 10, reports)
        data = card.card_data(record, [], figures.data(record, reports, True))
        page = internals.card_page(card.components(data), "F/1/train/2", "live-%d" % draw)
        times.append((time.process_time() - started) * 1000)
    return {"world": world, "median_ms": statistics.median(times), "max_ms": max(times),
            "page_bytes": len(page)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="4,64,512")
    parser.add_argument("--draws", type=int, default=30)
    args = parser.parse_args()
    results = [measure(int(size), args.draws) for size in args.sizes.split(",")]
    for r in results:
        print("world %(world)4d: a draw takes %(median_ms).1f ms of CPU (largest "
              "%(max_ms).1f ms), a page of %(page_bytes)d bytes" % r)
    when = time.strftime("%Y%m%dT%H%M%S")
    out = HERE / "results" / ("livecard-%s.json" % when)
    out.write_text(json.dumps({"when": when, "draws": args.draws, "results": results,
                               "load": os.getloadavg()}, indent=1) + "\n")
    print("written", out)


if __name__ == "__main__":
    main()
