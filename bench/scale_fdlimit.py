"""What node 0's open-file limit does to the gang's store (bench/scale.py's part 3): every rank
and every node agent holds a connection to node 0's TCPStore, one descriptor each in node 0's
task. This hosts the product's ControlPlane store in a process whose RLIMIT_NOFILE is
--limit, connects --clients store clients from another process (as ranks and agents do), and
counts those that could not.

    .venv/bin/python bench/scale_fdlimit.py --limit 64 --clients 100

Writes bench/results/scale-fdlimit-<timestamp>.json.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

CLIENTS = r"""
import json, sys
from datetime import timedelta
from torch.distributed import TCPStore
port, count, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
held, failed = [], []
for i in range(count):
    try:
        held.append(TCPStore("127.0.0.1", port, None, False, timedelta(seconds=timeout)))
        held[-1].check(["mftd/gang"])
    except Exception as ex:
        failed.append("%s: %s" % (type(ex).__name__, str(ex).splitlines()[0][:120]))
print("FDLIMIT " + json.dumps(dict(connected=len(held), failed=len(failed),
                                   first_failures=failed[:2])))
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=3.0, help="a client's connect timeout")
    args = parser.parse_args(argv)
    # the soft limit, as a shell's `ulimit -Sn` sets it; the clients' process, which inherits
    # it, raises its own back to the hard limit (preexec): only node 0's side is limited
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.limit, hard))
    sys.path.insert(0, str(REPO))
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.control import (
        ControlPlane,
        bind_listener,
    )

    listener = bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    host = ControlPlane.host(listener, "scale-fdlimit-1-0", "f" * 64, 10)  # kept: it serves
    listener.close()
    open_fds = len(os.listdir("/proc/self/fd"))
    started = time.time()
    out = subprocess.run([sys.executable, "-c", CLIENTS, str(port), str(args.clients),
                          str(args.timeout)], capture_output=True, text=True, timeout=3600,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                               (hard, hard)))
    found = [line for line in out.stdout.splitlines() if line.startswith("FDLIMIT ")]
    result = dict(limit=args.limit, hard_limit=hard, clients=args.clients,
                  fds_open_before=open_fds,
                  took_s=round(time.time() - started, 1),
                  **(json.loads(found[0].split(" ", 1)[1]) if found else
                     dict(error=out.stderr[-2000:])))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = HERE / "results" / ("scale-fdlimit-%s.json" % stamp)
    path.write_text(json.dumps(result, indent=1))
    del host
    print(json.dumps(result))
    print("wrote", path.relative_to(REPO))


if __name__ == "__main__":
    main()
