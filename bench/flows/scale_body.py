"""The body of a scale rank (bench/scale.py): it exercises the gang's control plane, not the
network. No process group. Every time is wall-clock (time.time()), one clock for this host.

Phases, on a schedule rank 0 writes once every rank is in its body (SCALE_DIR/schedule.json):

1. arrival: every rank gathers (its arrival time, pid, parent pid) onto rank 0 (gather 1);
2. idle: nobody writes anything for BENCH_IDLE_S seconds (heartbeats and polling alone);
3. logs: each rank prints BENCH_LOG_RATE / world_size lines a second for BENCH_LOG_S seconds,
   each line "SCALELOG <rank> <seq> <time written>";
4. gather: every rank calls current.torch_distributed.gather(rank) at the same wall time
   (gather 2), rank 0 times it;
5. with BENCH_FAIL_RANK set, that rank raises instead of phase 3 and the others sleep until the
   gang stops them.

Rank 0 writes what it measured to SCALE_DIR/rank0.json.
"""

import json
import os
import sys
import time

# Seconds between the schedule and the idle window (every rank reads the schedule first, and
# bench/scale.py samples the gang's memory): BENCH_LEAD_S, else this.
LEAD_S = 1.0
# Seconds between the end of the logs phase and the timed gather.
SETTLE_S = 1.0
# Seconds a non-failing rank of a failing gang sleeps (the gang stops it long before).
FAIL_SLEEP_S = 600.0


def _env(name, kind=float, default=None):
    value = os.environ.get(name)
    return default if value in (None, "") else kind(value)


def _write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.rename(tmp, path)


def _wait_for(path, timeout):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            raise RuntimeError("scale bench: no %s within %ss" % (path, timeout))
        time.sleep(0.05)
    with open(path) as f:
        return json.load(f)


def _sleep_until(t):
    delay = t - time.time()
    if delay > 0:
        time.sleep(delay)


def run(td, task_created):
    """One rank's body. `td` is current.torch_distributed; `task_created` when the Metaflow task
    process of the step was created (rank 0 only needs it)."""
    arrived = time.time()
    out_dir = os.environ["SCALE_DIR"]
    schedule_path = os.path.join(out_dir, "schedule.json")
    world = td.world_size
    idle_s = _env("BENCH_IDLE_S", default=10.0)
    log_s = _env("BENCH_LOG_S", default=5.0)
    rate = _env("BENCH_LOG_RATE", default=10000.0)
    fail_rank = _env("BENCH_FAIL_RANK", int)

    arrivals = td.gather((arrived, os.getpid(), os.getppid()))
    if td.is_main:
        gathered_1 = time.time()
        start = gathered_1 + _env("BENCH_LEAD_S", default=LEAD_S)
        schedule = dict(
            task_pid=os.getppid(), master_port=int(os.environ["MASTER_PORT"]),
            task_created=task_created, gathered_1=gathered_1,
            idle=[start, start + idle_s],
            logs=[start + idle_s, start + idle_s + log_s],
            gather=start + idle_s + log_s + SETTLE_S,
            fail=start + idle_s if fail_rank is not None else None,
            ranks=[dict(rank=r, arrived=a[0], pid=a[1], ppid=a[2])
                   for r, a in enumerate(arrivals)])
        _write_json(schedule_path, schedule)
    else:
        schedule = _wait_for(schedule_path, 600)

    if fail_rank is not None:
        if td.rank == fail_rank:
            _sleep_until(schedule["fail"])
            _write_json(os.path.join(out_dir, "failed.json"),
                        dict(rank=td.rank, node=td.node_rank, at=time.time()))
            raise RuntimeError("scale bench: rank %d fails on purpose" % td.rank)
        time.sleep(FAIL_SLEEP_S)
        return

    # logs: line i of this rank is due at logs[0] + i / per_rank (a steady rate, every rank)
    per_rank = rate / world
    count = int(per_rank * log_s)
    start = schedule["logs"][0]
    write = sys.stdout.write
    for i in range(count):
        _sleep_until(start + i / per_rank)
        write("SCALELOG %d %d %.6f\n" % (td.rank, i, time.time()))
        sys.stdout.flush()

    _sleep_until(schedule["gather"])
    began = time.time()
    values = td.gather(td.rank)
    took = time.time() - began
    if td.is_main:
        _write_json(os.path.join(out_dir, "rank0.json"), dict(
            gather_s=took, gather_ok=values == list(range(world)), lines_per_rank=count,
            gather_began=began, schedule=schedule))
