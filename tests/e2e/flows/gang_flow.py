"""A configurable gang for end-to-end tests. The environment chooses the topology and, for
fault-injection tests, which rank fails, when and how (TD_FAIL_RANK, TD_FAIL_WHEN, TD_FAIL_HOW).
The failing rank writes the time it failed to $TD_MARK_DIR, so tests can measure detection.

When (TD_FAIL_WHEN): before_init (at once, first thing in the body), in_rendezvous (the other
ranks are already waiting inside init_process_group), after_init, in_collective (the other ranks
are already blocked in an all_reduce), in_loader (every rank iterates a DataLoader with persistent
workers, an all_reduce per batch, and the failing rank fails in its second epoch: the loader's
teardown keeps its process alive for seconds), after_body (the others have finished the step).
How (TD_FAIL_HOW): raise, exit (code 3), sigkill, hang (sleeps; TD_PG_TIMEOUT gives the process
group a short timeout so that the peers of a hung rank give up), raise_with_child (raises with
a torch.multiprocessing child running that ignores SIGTERM; the child writes its pid to
$TD_MARK_DIR/child-pid), oom (allocates until the kernel's OOM killer ends it).
TD_SLOW_RANK, TD_SLOW_S, TD_SLOW_STEPS: before the collective, every rank runs TD_SLOW_STEPS
all_reduces, and rank TD_SLOW_RANK sleeps TD_SLOW_S seconds before each (slow, never hung);
with TD_SLOW_BY_TURNS set, the rank that sleeps before step i is i % world size instead.
TD_RANK0_IGNORE_SIGCHLD: rank 0 (the task) ignores SIGCHLD first, as some libraries do.
TD_RANK0_LATE_COLLECTIVE: rank 0 calls one more all_reduce after the others left the body.
TD_RAISES_AS_STOPPED (a rank): that rank ignores SIGTERM (the failing rank waits for it to),
waits until the failing rank failed (its mark) and 0.6 s more (its node has seen the gang's
abort by then and is stopping it) and raises an error of its own, as ranks meeting the same
framework check a moment apart do.
Every rank leaves the mark body-<RANK> in $TD_MARK_DIR as its body starts.
TD_INTRUDER (the path of tests/intruder.py): rank 0 first starts it, an outside process that
reached the gang's store with MASTER_ADDR and MASTER_PORT only; it writes to $TD_MARK_DIR."""

import gc
import os
import runpy
import signal
import sys
import time
from datetime import timedelta

from metaflow import FlowSpec, current, step, torch_distributed

# A node agent that never joins: its process hangs while it loads the flow.
if os.environ.get("TD_HANG_NODE") and "--task-id" in sys.argv and \
        sys.argv[sys.argv.index("--task-id") + 1].endswith("-node-%s" % os.environ["TD_HANG_NODE"]):
    time.sleep(3600)

NODES = int(os.environ.get("TD_NODES", "1"))
NPROC = os.environ.get("TD_NPROC", "2")  # "auto": the CPUs the run may use
NPROC = NPROC if NPROC == "auto" else int(NPROC)
# Seconds the failing rank waits so that its peers are inside the rendezvous or the collective.
PEERS_INSIDE = 1.0


def failing_here(when):
    return (os.environ.get("TD_FAIL_WHEN") == when
            and int(os.environ.get("TD_FAIL_RANK", -1)) == int(os.environ["RANK"])
            and (not os.environ.get("TD_FAIL_ATTEMPT")
                 or int(os.environ["TD_FAIL_ATTEMPT"]) == current.retry_count))


def maybe_fail(when):
    if not failing_here(when):
        return
    rank = int(os.environ["RANK"])
    if when in ("in_rendezvous", "in_collective"):
        time.sleep(PEERS_INSIDE)
    while os.environ.get("TD_RAISES_AS_STOPPED") and not os.path.exists(
            os.path.join(os.environ["TD_MARK_DIR"], "ignoring-sigterm")):
        time.sleep(0.01)  # that rank is in its body, ignoring SIGTERM
    how = os.environ.get("TD_FAIL_HOW", "raise")
    if how == "raise_with_child":
        start_stubborn_child()
    with open(os.path.join(os.environ["TD_MARK_DIR"], "failed-at"), "w") as f:
        f.write(repr(time.time()))
    print("rank %d failing now (%s, %s)" % (rank, when, how), flush=True)
    print("last words of rank %d" % rank, file=sys.stderr, flush=True)
    if how in ("raise", "raise_with_child"):
        raise ValueError("injected failure on rank %d" % rank)
    if how == "exit":
        sys.exit(3)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "hang":
        time.sleep(3600)
    if how == "oom":  # until the kernel's OOM killer ends it (a test runs the flow in a
        hog = []      # memory cgroup with a limit)
        while True:
            hog.append(b"\x01" * (64 << 20))


def train_on_loader(dist):
    """Every rank iterates a DataLoader with persistent workers, an all_reduce per batch."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.arange(256.0)), batch_size=4, num_workers=2,
                        persistent_workers=True)
    for epoch in range(2):
        for i, (x,) in enumerate(loader):
            if (epoch, i) == (1, 5):
                maybe_fail("in_loader")
            dist.all_reduce(x.sum())


def _ignore_sigterm_and_sleep(pid_file):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(pid_file, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)


def start_stubborn_child():
    import torch.multiprocessing as mp

    pid_file = os.path.join(os.environ["TD_MARK_DIR"], "child-pid")
    child = mp.get_context("fork").Process(target=_ignore_sigterm_and_sleep, args=(pid_file,))
    child.start()
    while not os.path.exists(pid_file):
        time.sleep(0.01)


def raise_as_the_gang_stops():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(os.environ["TD_MARK_DIR"], "ignoring-sigterm"), "w").close()
    mark = os.path.join(os.environ["TD_MARK_DIR"], "failed-at")
    while not os.path.exists(mark):
        time.sleep(0.01)
    time.sleep(0.6)
    raise ValueError("rank %s's own error, raised as its node stops it" % os.environ["RANK"])


def listening_addresses():
    """(address, port) of every listening TCP socket of the gang: the task process (the
    store), its members and agents, and theirs; every rank is in its process group. Rank 0 is
    the task's fork (the same command line), or the task itself (start method exec)."""
    import psutil

    me = psutil.Process()
    task = me.parent() if me.parent().cmdline() == me.cmdline() else me
    found = set()
    for proc in [task, *task.children(recursive=True)]:
        try:
            found |= {(c.laddr.ip, c.laddr.port) for c in proc.net_connections("tcp")
                      if c.status == psutil.CONN_LISTEN}
        except psutil.NoSuchProcess:
            continue
    return sorted(found)


class GangFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=NODES, nproc_per_node=NPROC,
                       rendezvous_timeout=float(os.environ.get("TD_RDZV_TIMEOUT", "60")),
                       finish_timeout=float(os.environ["TD_FINISH_TIMEOUT"])
                       if os.environ.get("TD_FINISH_TIMEOUT") else None)
    @step
    def train(self):
        import torch
        import torch.distributed as dist

        # An artifact set before anything can fail: a failed attempt must not show it.
        self.started_attempt = current.retry_count
        open(os.path.join(os.environ["TD_MARK_DIR"], "body-%s" % os.environ["RANK"]), "w").close()
        if os.environ.get("TD_RANK0_IGNORE_SIGCHLD") and os.environ["RANK"] == "0":
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps every child
        before_gather = runpy.run_path(os.environ["TD_INTRUDER"])["intrude_from"](
            int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), NODES, os.environ["TD_MARK_DIR"]) \
            if os.environ.get("TD_INTRUDER") else (lambda: None)
        if os.environ.get("TD_ALL_SLEEP"):
            open(os.path.join(os.environ["TD_MARK_DIR"], "sleeping-%s" % os.environ["RANK"]), "w").close()
            time.sleep(3600)
        if os.environ.get("TD_RAISES_AS_STOPPED") == os.environ["RANK"]:
            raise_as_the_gang_stops()
        maybe_fail("before_init")
        maybe_fail("in_rendezvous")
        timeout = os.environ.get("TD_PG_TIMEOUT")
        dist.init_process_group("gloo", timeout=timedelta(seconds=float(timeout)) if timeout else None)
        maybe_fail("after_init")
        if os.environ.get("TD_INTRUDER") and dist.get_rank() == 0:
            self.listening = listening_addresses()
        if os.environ.get("TD_FAIL_WHEN") == "in_loader":
            train_on_loader(dist)
        for i in range(int(os.environ.get("TD_SLOW_STEPS", "0"))):
            slow = i % dist.get_world_size() if os.environ.get("TD_SLOW_BY_TURNS") else \
                int(os.environ.get("TD_SLOW_RANK", -1))
            if slow == dist.get_rank():
                time.sleep(float(os.environ["TD_SLOW_S"]))  # slow, but it gets there
            dist.all_reduce(torch.ones(1))
        t = torch.tensor([float(dist.get_rank() + 1)])
        maybe_fail("in_collective")
        dist.all_reduce(t)
        self.total = t.item()
        self.rank_seen = dist.get_rank()
        self.env_seen = {k: os.environ[k] for k in (
            "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
        info = current.torch_distributed
        before_gather()
        self.envs = info.gather(self.env_seen)
        # what each rank inherited from its task frozen out of the collector (procs.py)
        self.frozen = info.gather(gc.get_freeze_count())
        # the threads each rank was given (OMP_NUM_THREADS) and what torch took from it
        self.threads = info.gather((os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()))
        self.info = dict(rank=info.rank, local_rank=info.local_rank, world_size=info.world_size,
                         local_world_size=info.local_world_size, node_rank=info.node_rank,
                         num_nodes=info.num_nodes, is_main=info.is_main, device=str(info.device),
                         master_port=info.master_port)
        info.record("samples_per_s", 100.0 + dist.get_rank())  # a value for the gang's card
        print("hello from rank %d" % dist.get_rank())
        print("stderr of rank %d" % dist.get_rank(), file=sys.stderr)
        if os.environ.get("TD_RANK0_LATE_COLLECTIVE") and dist.get_rank() == 0:
            time.sleep(1.0)  # the other ranks leave the body meanwhile
            dist.all_reduce(t)  # a collective nobody else joins: gloo raises
        dist.destroy_process_group()
        maybe_fail("after_body")
        self.attempt = current.retry_count
        self.next(self.end)

    @step
    def end(self):
        print("total", self.total)


if __name__ == "__main__":
    GangFlow()
