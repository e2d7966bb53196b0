"""One worker of `torchrun --nnodes=N --rdzv-backend=c10d` in bench/scale.py's comparison: it
notes when it entered its body and when its process was created (SCALE_DIR/in-<rank>), and with
BENCH_FAIL_RANK set, that rank fails 1 s after every rank is in (the others sleep BENCH_SLEEP_S,
as long as torchrun leaves them). It imports nothing heavy: torchrun's launch at its cheapest,
no torch in the worker."""

import os
import sys
import time

# Seconds the failing rank waits after the last rank arrived before it fails.
FAIL_AFTER_S = 1.0

if __name__ == "__main__":
    arrived = time.time()
    out = os.environ["SCALE_DIR"]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        created = time.time() - (float(f.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK"))
    with open(os.path.join(out, "in-%d.tmp" % rank), "w") as f:
        f.write("%.6f %.6f" % (arrived, created))
    os.rename(os.path.join(out, "in-%d.tmp" % rank), os.path.join(out, "in-%d" % rank))
    fail = os.environ.get("BENCH_FAIL_RANK")
    if fail is not None and int(fail) == rank:
        while sum(name.startswith("in-") and not name.endswith(".tmp")
                  for name in os.listdir(out)) < world:
            time.sleep(0.05)
        time.sleep(FAIL_AFTER_S)
        with open(os.path.join(out, "failed"), "w") as f:
            f.write("%.6f %d" % (time.time(), os.getppid()))
        sys.exit(1)
    time.sleep(float(os.environ.get("BENCH_SLEEP_S", "0")))
