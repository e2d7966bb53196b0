"""A flow whose @torch_distributed attributes come from $TD_ARGS (JSON), to test validation."""

import json
import os

from metaflow import FlowSpec, step, torch_distributed

ARGS = json.loads(os.environ.get("TD_ARGS", "{}"))


class ConfigFlow(FlowSpec):
    @step
    def start(self):
        print("start step ran")
        self.next(self.train)

    @torch_distributed(**ARGS)
    @step
    def train(self):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ConfigFlow()
