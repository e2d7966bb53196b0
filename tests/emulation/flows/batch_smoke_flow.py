import os

from metaflow import FlowSpec, batch, step


class BatchSmokeFlow(FlowSpec):
    """start runs on (emulated) AWS Batch; with `--with batch`, end does too."""

    @batch(cpu=1, memory=512)
    @step
    def start(self):
        self.batch_job_id = os.environ["AWS_BATCH_JOB_ID"]
        print("hello from AWS Batch job %s" % self.batch_job_id)
        self.next(self.end)

    @step
    def end(self):
        print("start ran as AWS Batch job %s" % self.batch_job_id)


if __name__ == "__main__":
    BatchSmokeFlow()
