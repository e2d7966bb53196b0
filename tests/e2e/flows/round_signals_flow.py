"""A 2 x 2 gang with max_restarts=1, @timeout and @catch, whose rank 3 (node 1) raises in every
round while the other ranks wait in Python until the gang stops them. At its body's start each
rank writes how its process handles the signals a supervisor takes for itself (SIGTERM,
SIGALRM, SIGUSR1) and its wakeup fd to $TD_MARK_DIR/signals-<round>-<rank>; rank 0's finally
block writes finally-<round> and sets self.left, which @catch keeps."""

import json
import os
import signal
import time

from metaflow import FlowSpec, catch, current, step, timeout, torch_distributed


def handler_name(signum):
    handler = signal.getsignal(signum)
    return getattr(handler, "__qualname__", None) or repr(handler)


class RoundSignalsFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @catch(var="err")
    @timeout(seconds=120)
    @torch_distributed(nodes=2, nproc_per_node=2, max_restarts=1)
    @step
    def train(self):
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, round_ = dist.get_rank(), current.torch_distributed.restart_count
        wakeup = signal.set_wakeup_fd(-1)
        if wakeup != -1:
            signal.set_wakeup_fd(wakeup)
        with open(os.path.join(os.environ["TD_MARK_DIR"], "signals-%d-%d" % (round_, rank)),
                  "w") as f:
            json.dump({"SIGTERM": handler_name(signal.SIGTERM),
                       "SIGALRM": handler_name(signal.SIGALRM),
                       "SIGUSR1": handler_name(signal.SIGUSR1), "wakeup_fd": wakeup}, f)
        dist.barrier()  # every rank has written its mark
        if rank == 3:
            time.sleep(0.3)
            raise ValueError("rank 3 fails round %d" % round_)
        try:
            while True:  # in Python, where the stop's SIGTERM reaches the rank's handler
                time.sleep(0.05)
        finally:
            if rank == 0:
                self.left = round_
                open(os.path.join(os.environ["TD_MARK_DIR"], "finally-%d" % round_), "w").close()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    RoundSignalsFlow()
