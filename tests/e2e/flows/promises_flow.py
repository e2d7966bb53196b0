"""Metaflow's promises on ganged steps (2 ranks each), one step per scenario:

- timed, timed_nodes, timed_exec: @timeout(seconds=2) on a short body, with forked ranks, with
  2 (emulated) nodes whose node 1 execs its rank, and with exec'd ranks on one node; the gang's
  start-up (importing torch, starting rank 1, a node agent or an exec'd rank importing Metaflow
  and torch and checking in) takes longer than that here and must not count.
- slow: @timeout(seconds=2) on a body that sleeps, on 2 nodes: the timeout (counted from the
  gang's assembly) stops the gang and @catch records Metaflow's TimeoutException, rank 0's:
  node 1's agent, whose own clock started earlier, does not time out by itself.
- slow_exec: the same with exec'd ranks, rank 0 a spin-step of the task: the task's alarm
  reaches it, and what its body set before it is handed back for @catch.
- caught: @retry(times=1) + @catch; every attempt, rank 0 sets an artifact and waits while rank 1
  raises the user's own DataError: @catch keeps rank 0's artifact of the last attempt and
  records DataError, not a gang error.
- both: rank 1 raises, then rank 0 raises too; @catch lets the run go on; the log names both.
- tagged: every rank reads the run with the client; only rank 0 writes (add_tag).
"""

import os
import signal
import time

from metaflow import (FlowSpec, Run, catch, current, retry, step, timeout,
                      torch_distributed)

GANG = dict(nodes=1, nproc_per_node=2)
NODES = dict(nodes=2, nproc_per_node=1)  # node 1 is a node agent on this host
NODES_EXEC = dict(NODES, start_method="exec")  # whose rank starts afresh
EXEC = dict(nodes=1, nproc_per_node=2, start_method="exec")


class DataError(Exception):
    """The user's own exception type."""


def sleep_past_timeout(flow):
    flow.slow_started = time.time()
    join_group()
    flow.slow_joined = time.time()
    try:
        time.sleep(60)
    finally:  # kept: @catch keeps what the body set before the timeout
        flow.slow_interrupted = time.time()


def join_group():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()


class PromisesFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.timed)

    @timeout(seconds=2)
    @torch_distributed(**GANG)
    @step
    def timed(self):
        join_group()
        time.sleep(0.3)
        self.timed_ok = True
        self.next(self.timed_nodes)

    @timeout(seconds=2)
    @torch_distributed(**NODES_EXEC)
    @step
    def timed_nodes(self):
        join_group()
        time.sleep(0.3)
        self.timed_nodes_ok = True
        self.next(self.timed_exec)

    @timeout(seconds=2)
    @torch_distributed(**EXEC)
    @step
    def timed_exec(self):
        join_group()
        time.sleep(0.3)
        self.timed_exec_ok = True
        self.next(self.slow)

    @catch(var="timeout_error")
    @timeout(seconds=2)
    @torch_distributed(**NODES)
    @step
    def slow(self):
        sleep_past_timeout(self)
        self.next(self.slow_exec)

    @catch(var="timeout_error")
    @timeout(seconds=2)
    @torch_distributed(**EXEC)
    @step
    def slow_exec(self):
        sleep_past_timeout(self)
        self.next(self.caught)

    @catch(var="failure")
    @retry(times=1, minutes_between_retries=0)
    @torch_distributed(**GANG)
    @step
    def caught(self):
        join_group()
        self.retry_with_catch = current.retry_count
        if current.torch_distributed.is_main:
            time.sleep(60)  # rank 1's failure stops rank 0 here
        raise DataError("rank %d: bad shard on attempt %d"
                        % (current.torch_distributed.rank, current.retry_count))
        self.next(self.both)  # never reached: @catch takes the step on to `both`

    @catch(var="both")
    @torch_distributed(**GANG)
    @step
    def both(self):
        join_group()
        rank = current.torch_distributed.rank
        if rank == 0:
            # a SIGTERM handler of its own holds off the gang's stop, which may come as soon
            # as rank 1's failure is recorded: rank 0 raises after rank 1 whatever the timing
            signal.signal(signal.SIGTERM, lambda *_: None)
            # raise once rank 1's failure is recorded, before the gang stops: its exception
            # and the time it was raised (failures.save_exception, written after the
            # torchelastic error file; waiting for that file alone let rank 0 raise while rank 1
            # was still recording, and the gang then stopped rank 1 before it had: seen in CI)
            theirs = os.environ["TORCHELASTIC_ERROR_FILE"].replace("rank-0", "rank-1") + ".pickle"
            while not os.path.exists(theirs):
                time.sleep(0.001)
        raise ValueError("rank %d broke" % rank)
        self.next(self.tagged)  # never reached: @catch takes the step on to `tagged`

    @torch_distributed(**GANG)
    @step
    def tagged(self):
        join_group()
        run = Run("%s/%s" % (current.flow_name, current.run_id))
        self.seen_by_client = run["start"].task.successful  # a read, on every rank
        if current.torch_distributed.is_main:
            run.add_tag("trained")
        self.next(self.end)

    @step
    def end(self):
        pass

if __name__ == "__main__":
    PromisesFlow()
