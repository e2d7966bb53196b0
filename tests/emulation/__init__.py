"""Local AWS for tests: moto for S3/IAM/EC2/Batch queues, plus an AWS Batch emulator that runs
jobs (including multi-node parallel jobs) as local process groups.

    from tests.emulation.aws import moto_aws
    from tests.emulation.batch_emulator import BatchEmulator

    with moto_aws() as aws, BatchEmulator(aws.endpoint_url, image_env=aws.container_env) as batch:
        env = {**aws.env, **batch.env}   # `python flow.py run --with batch` with this env

Modules: aws (moto and Metaflow settings), batch_emulator (HTTP front and lifecycle),
batch_api (Batch operations), batch_jobs (job/node state machine), batch_describe
(DescribeJobs/ListJobs shapes), batch_spec (pure request rules), node_process (process groups).

Kubernetes: k8s_api (a loopback Kubernetes API for `--with kubernetes`, reached through the
kubeconfig in `emulator.env`), jobset_controller (JobSets and Jobs whose pods are local process
groups; JobSets validated against schemas/jobset.x-k8s.io_jobsets.yaml), k8s_dns (cluster DNS
inside the emulated pods).
"""
