"""An existing torchrun-style script (torchrun_script.py, beside this flow) run in every rank
with current.torch_distributed.run_script. TD_NODES x TD_NPROC; TD_SCRIPT_FAIL_RANK makes that
rank's script exit with code 3."""

import os

from metaflow import FlowSpec, current, step, torch_distributed

NODES, NPROC = int(os.environ.get("TD_NODES", 1)), int(os.environ.get("TD_NPROC", 2))


class ScriptFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train)

    @torch_distributed(nodes=NODES, nproc_per_node=NPROC)
    @step
    def train(self):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_script.py")
        current.torch_distributed.run_script(script, {"out": os.environ["TD_MARK_DIR"],
                                                      "verbose": True})
        self.ran = current.torch_distributed.rank
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ScriptFlow()
