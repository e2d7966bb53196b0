"""A step whose own code uses SIGUSR1: the gang neither takes the user's handler nor calls it.

The flow file installs a SIGUSR1 handler as it is loaded (before any gang starts), and each
rank's body installs another one. With TD_SIGNAL_FAIL=1 rank 1 fails while rank 0 sleeps: the
gang must still stop rank 0 at once with rank 1's error, without calling the user's handler.
Marks (TD_MARK_DIR) record what rank 0 saw in a `finally` and at its process's exit."""

import atexit
import json
import os
import signal
import time

from metaflow import FlowSpec, step, torch_distributed

CALLS = []


def loaded_handler(signum, frame):
    CALLS.append("loaded")


signal.signal(signal.SIGUSR1, loaded_handler)


def mark(name, value):
    with open(os.path.join(os.environ["TD_MARK_DIR"], name), "w") as f:
        json.dump(value, f)


def body_handler(signum, frame):
    CALLS.append("body")


def after_the_gang():
    """At the task's exit, after the gang and Metaflow's teardown: the body's handler is still
    installed, and it runs."""
    kept = signal.getsignal(signal.SIGUSR1) is body_handler
    os.kill(os.getpid(), signal.SIGUSR1)
    mark("after-gang", {"kept": kept, "calls": CALLS})


class UserSignalFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(world_size=2)
    @step
    def train(self):
        import torch.distributed as dist

        self.loaded_handler_kept = signal.getsignal(signal.SIGUSR1) is loaded_handler
        os.kill(os.getpid(), signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, body_handler)
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        os.kill(os.getpid(), signal.SIGUSR1)
        if os.environ.get("TD_SIGNAL_FAIL") == "1":
            if rank == 1:
                time.sleep(1)
                mark("rank1-failed", time.time())
                raise RuntimeError("rank 1 fails on purpose")
            try:
                time.sleep(60)
            finally:  # where the gang's interruption lands
                mark("rank0-stopped", {"at": time.time(), "calls": CALLS})
        dist.barrier()
        self.calls = list(CALLS)
        if rank == 0:
            atexit.register(after_the_gang)
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    UserSignalFlow()
