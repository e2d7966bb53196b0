import os

from metaflow import FlowSpec, kubernetes, step, torch_distributed


class PreflightKubernetesFlow(FlowSpec):
    """A 2-node gang on Kubernetes whose GPUs, shared memory and Kueue queue come from TD_GPU,
    TD_SHM and TD_QUEUE (the preflight's cases); its body never runs in the preflight tests."""

    @kubernetes(cpu=1, memory=1024, gpu=int(os.environ.get("TD_GPU", "0")) or None,
                shared_memory=int(os.environ.get("TD_SHM", "0")) or None,
                labels={"kueue.x-k8s.io/queue-name": os.environ["TD_QUEUE"]}
                if os.environ.get("TD_QUEUE") else None)
    @torch_distributed(nodes=2, nproc_per_node=1)
    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    PreflightKubernetesFlow()
