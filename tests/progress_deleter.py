"""An outside process that reached a gang's store knowing only MASTER_ADDR and MASTER_PORT and
deletes node 1's progress (hang detection's reports, a public key name) in a loop, for at most
LIFETIME_S seconds: `python progress_deleter.py ADDR PORT OUT_DIR`. It writes the time its
first deletion went out to OUT_DIR/deleting-since.

Test flows call `runpy.run_path(path)["intrude_from"](rank, world size, nodes, out dir)` in
every rank (gang_flow's TD_INTRUDER): rank 0 starts it, detached, and goes on."""

import os
import sys
import time
from datetime import timedelta

KEY = "mftd/node/1/progress"
LIFETIME_S = 90.0


def main(addr, port, out_dir):
    from torch.distributed import TCPStore

    store = TCPStore(addr, int(port), None, False, timedelta(seconds=30))
    store.delete_key(KEY)
    with open(os.path.join(out_dir, "deleting-since"), "w") as f:
        f.write(repr(time.time()))
    deadline = time.monotonic() + LIFETIME_S
    while time.monotonic() < deadline:
        store.delete_key(KEY)


def intrude_from(rank, world_size, nodes, out_dir):
    import subprocess

    if rank == 0:
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__),
                                 os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], out_dir],
                                env=env, start_new_session=True)
        with open(os.path.join(out_dir, "deleter-pid"), "w") as f:
            f.write(str(proc.pid))
    return lambda: None


if __name__ == "__main__":
    main(*sys.argv[1:])
