"""A flow written for plain Metaflow, run with --with torch_distributed:... by the tests: a
@parallel step, a linear step that does no distributed work (tidy), and an unbounded foreach (Metaflow's
internal test implementation) whose mapper steps form a process group. Every body execution
writes a mark "exec-<step>-<task id>-<rank>-<pid>" into $TD_MARK_DIR."""

import os

from metaflow import FlowSpec, current, parallel, step, unbounded_test_foreach_internal
from metaflow.plugins.test_unbounded_foreach_decorator import InternalTestUnboundedForeachInput


def mark(step_name):
    name = "exec-%s-%s-%s-%d" % (step_name, current.task_id, os.environ.get("RANK", "none"),
                                 os.getpid())
    open(os.path.join(os.environ["TD_MARK_DIR"], name), "w").close()


class WithEverywhere(FlowSpec):
    @step
    def start(self):
        self.next(self.par, num_parallel=2)

    @parallel
    @step
    def par(self):
        mark("par")
        self.node = current.parallel.node_index
        self.next(self.par_join)

    @step
    def par_join(self, inputs):
        self.nodes = sorted(i.node for i in inputs)
        self.next(self.tidy)

    @step
    def tidy(self):  # ganged by --with, but it does no distributed work
        mark("tidy")
        self.tidied = True
        self.next(self.prep)

    @step
    def prep(self):
        self.items = InternalTestUnboundedForeachInput([10, 20])
        self.next(self.mapper, foreach="items")

    @unbounded_test_foreach_internal
    @step
    def mapper(self):
        import torch
        import torch.distributed as dist

        mark("mapper")
        dist.init_process_group("gloo")
        t = torch.tensor([float(self.input)])
        dist.all_reduce(t)
        self.total = t.item()
        self.world = dist.get_world_size()
        dist.destroy_process_group()
        self.next(self.map_join)

    @step
    def map_join(self, inputs):
        self.totals = sorted(i.total for i in inputs)
        self.worlds = [i.world for i in inputs]
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    WithEverywhere()
