"""Training that resumes from @checkpoint after a lost rank (tests/e2e/test_checkpoints.py).

A tiny linear model is trained with DDP for STEPS steps; rank 0 saves the model every EVERY
steps as a new user would: torch.save to model.pt in current.checkpoint.directory (the name it
loaded from), then current.checkpoint.save() (metadata {"step": ...}). TD_KILL_RANK is SIGKILLed at step TD_KILL_STEP on attempt 0;
under @retry the next attempt starts from the latest checkpoint on every rank of every node.
TD_KILL_IN_SAVE=<step> SIGKILLs rank 0 inside its save of that step on attempt 0, after the files
were uploaded and before the save became the task's latest checkpoint.
TD_PREEMPT=1: every step the ranks agree (an all_reduce of max) whether any of them was told of a
preemption (current.torch_distributed.preempted); then rank 0 saves the current step with
current.checkpoint.save() (metadata why="preempted"), every rank marks preempt-saved-<rank> and
leaves its body; each rank writes training-<rank> ({pid}) at its first step of attempt 0 and
trains 0.05 s slower per step, so that a test can send the SIGTERM between two saves.
Each rank's batch depends only on (step, rank), so a resumed run ends with exactly the weights of
an uninterrupted one. TD_BUG=1 makes every attempt raise a ValueError instead (a user's bug).
TD_MAX_RESTARTS=N gives the gang max_restarts=N: the marks and the kill then count the gang's
rounds (current.torch_distributed.restart_count) instead of the attempts, and TD_BUG=changing
raises a ValueError whose message names the round (rank 1), TD_BUG=one the same ValueError in
every round (rank 1). TD_TERM_TASK_ON_STOP=1: rank 0 of the first round passes the SIGTERM of
the gang's stop on to the task (and, should gloo fail it first, waits for that stop);
TD_TERM_AGENT_ON_STOP=1: rank 2 does the same to its parent, node 1's agent.
TD_KILL_AGENT_STEP=<step>: rank 2 SIGKILLs its parent, node 1's agent, at that step of the first
round of attempt 0 (a node lost as a whole)."""

import contextlib
import json
import os
import signal
import tempfile
import time

from metaflow import FlowSpec, checkpoint, current, retry, step, torch_distributed

NODES = int(os.environ.get("TD_NODES", "2"))
NPROC = int(os.environ.get("TD_NPROC", "2"))
STEPS = 60
EVERY = 10
MAX_RESTARTS = int(os.environ.get("TD_MAX_RESTARTS", "0"))


def mark(name, value):
    with open(os.path.join(os.environ["TD_MARK_DIR"], name), "w") as f:
        f.write(repr(value))


def die_before_marking_latest():
    """Make the next save SIGKILL this process where metaflow-checkpoint (0.2.14) would write
    the task's "latest" pointer: the worst moment, every file of the new checkpoint stored."""
    from metaflow_extensions.obcheckpoint.plugins.machine_learning_utilities.datastore.core \
        import ObjectStorage

    save_metadata = ObjectStorage._save_metadata

    def dying(self, key, metadata):
        if key == "latest":
            mark("killed-at", time.time())
            os.kill(os.getpid(), signal.SIGKILL)
        return save_metadata(self, key, metadata)

    ObjectStorage._save_metadata = dying


@contextlib.contextmanager
def waiting_for_the_stop(waiting):
    """With `waiting`, a failure of this rank (gloo's error once a peer died) waits for the
    gang's stop instead of ending the rank first: the stop's SIGTERM must find the handler."""
    try:
        yield
    except Exception:
        if waiting:
            time.sleep(60)
        raise


class CheckpointFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @retry(times=1, minutes_between_retries=0)
    @checkpoint
    @torch_distributed(nodes=NODES, nproc_per_node=NPROC, max_restarts=MAX_RESTARTS)
    @step
    def train(self):
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        # what the marks count: the gang's rounds with restarts in place, else the attempts
        attempt = current.torch_distributed.restart_count if MAX_RESTARTS else current.retry_count
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        first = 0
        if current.checkpoint.is_loaded:
            path = os.path.join(current.checkpoint.directory, "model.pt")
            state = torch.load(path)
            model.load_state_dict(state["model"])
            first = state["step"]
            mark("loaded-%d-rank-%d" % (attempt, rank), state.get("why", "every"))
        preempting = os.environ.get("TD_PREEMPT") == "1" and current.retry_count == 0
        # every rank records where it started (tests read these marks)
        mark("start-%d-rank-%d" % (attempt, rank), first)
        mark("restart-count-%d-rank-%d" % (attempt, rank),
             int(os.environ["TORCHELASTIC_RESTART_COUNT"]))
        term_on_stop = attempt == 0 and (
            (os.environ.get("TD_TERM_TASK_ON_STOP") == "1" and rank == 0)
            or (os.environ.get("TD_TERM_AGENT_ON_STOP") == "1" and rank == 2))
        if term_on_stop:
            # the gang's stop of this round (a SIGTERM to this rank) passes a SIGTERM on to the
            # rank's parent, the task (rank 0) or node 1's agent (rank 2): it reaches that
            # process while it stops the failed round
            def pass_it_on(signum, frame):
                os.kill(os.getppid(), signal.SIGTERM)
                os._exit(1)
            signal.signal(signal.SIGTERM, pass_it_on)
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        with waiting_for_the_stop(term_on_stop):
            for i in range(first, STEPS):
                if os.environ.get("TD_BUG") == "1" and i == 5:
                    raise ValueError("a bug in the training loop at step %d" % i)
                if os.environ.get("TD_BUG") == "one" and i == 5 and rank == 1:
                    raise ValueError("a bug in rank 1's training loop at step %d" % i)
                if os.environ.get("TD_BUG") == "changing" and i == 5 and rank == 1:
                    raise ValueError("a flaky failure in round %d" % attempt)
                if (attempt == 0 and rank == int(os.environ.get("TD_KILL_RANK", -1))
                        and i == int(os.environ["TD_KILL_STEP"])):
                    mark("killed-at", time.time())
                    os.kill(os.getpid(), signal.SIGKILL)
                if (current.retry_count == 0 and attempt == 0 and rank == 2
                        and i == int(os.environ.get("TD_KILL_AGENT_STEP", -1))):
                    mark("agent-killed-at", time.time())
                    os.kill(os.getppid(), signal.SIGKILL)  # node 1's agent: a lost node
                if i == first:  # when the first training step of this attempt began
                    mark("first-step-%d-rank-%d" % (attempt, rank), time.time())
                    if preempting:
                        mark("training-%d" % rank, os.getpid())
                if preempting:
                    time.sleep(0.05)
                    told = torch.tensor([1.0 if current.torch_distributed.preempted.is_set()
                                         else 0.0])
                    dist.all_reduce(told, op=dist.ReduceOp.MAX)
                    if told.item():  # save where we are, in the preemption's window
                        if rank == 0:
                            folder = tempfile.mkdtemp()
                            torch.save({"model": model.state_dict(), "step": i, "why": "preempted"},
                                       os.path.join(folder, "model.pt"))
                            current.checkpoint.save(folder, metadata={"step": i})
                        dist.barrier()
                        mark("preempt-saved-%d" % rank, i)
                        break
                gen = torch.Generator().manual_seed(1000 * i + rank)
                x = torch.randn(16, 8, generator=gen)
                y = x.sum(dim=1, keepdim=True)
                opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
                if (i + 1) % EVERY == 0:
                    # every rank reached step i + 1 before rank 0 saves it
                    dist.barrier()
                    if rank == 0:
                        if (current.retry_count == 0
                                and os.environ.get("TD_KILL_IN_SAVE") == str(i + 1)):
                            die_before_marking_latest()
                        # the usual way: the loaded file's name written again where it was
                        # loaded, then the directory saved (a stored checkpoint never changes)
                        torch.save({"model": model.state_dict(), "step": i + 1},
                                   os.path.join(current.checkpoint.directory, "model.pt"))
                        current.checkpoint.save(metadata={"step": i + 1})
                    dist.barrier()
        self.weights = json.dumps([p.detach().tolist() for p in model.parameters()])
        self.resumed_from = first
        self.restart_count = current.torch_distributed.restart_count
        dist.destroy_process_group()
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    CheckpointFlow()
