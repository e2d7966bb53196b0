"""The run-time guard, through `python flow.py run`: a task of a multi-node gang that runs on a
remote backend which did not give it its nodes fails before any rank starts, instead of
emulating the nodes on its one machine. Each backend is recognised by the variables it sets in
its containers (schedulers.REMOTE_MARKERS); here they are set on a local run."""

import pytest

GANG = {"TD_NODES": 2, "TD_NPROC": 2}

BACKENDS = {
    "AWS Batch": {"AWS_BATCH_JOB_ID": "a1b2", "METAFLOW_RUNTIME_ENVIRONMENT": "aws-batch"},
    "AWS Step Functions": {"AWS_BATCH_JOB_ID": "a1b2", "SFN_STATE_MACHINE": "GangFlow",
                           "METAFLOW_RUNTIME_ENVIRONMENT": "aws-batch"},
    "Kubernetes": {"METAFLOW_KUBERNETES_WORKLOAD": 1, "METAFLOW_RUNTIME_ENVIRONMENT": "kubernetes"},
    "Argo Workflows": {"METAFLOW_KUBERNETES_WORKLOAD": 1, "ARGO_WORKFLOW_NAME": "gangflow-x",
                       "METAFLOW_RUNTIME_ENVIRONMENT": "kubernetes"},
    "Airflow": {"METAFLOW_KUBERNETES_WORKLOAD": 1, "METAFLOW_AIRFLOW_DAG_RUN_ID": "r1",
                "METAFLOW_RUNTIME_ENVIRONMENT": "kubernetes"},
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_remote_task_without_its_nodes_fails_before_any_rank_starts(flow_runner, backend):
    # Every rank that starts its body marks it and sleeps: a gang the guard let through hangs.
    res = flow_runner.run("gang_flow.py", env={**GANG, **BACKENDS[backend], "TD_ALL_SLEEP": 1},
                          timeout=120)
    assert res.returncode != 0, res
    assert ("@torch_distributed on step train: a gang of 2 nodes (2 nodes x 2 processes per "
            "node = world size 4) runs here in one task on %s, which did not give it 2 "
            "machines" % backend) in res.output, res
    assert "METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL=1" in res.output
    assert not list(flow_runner.marks.glob("sleeping-*")), "a rank started"


def test_cpu_rehearsal_emulates_the_nodes_on_purpose_even_there(flow_runner):
    res = flow_runner.run("gang_flow.py", env={**GANG, **BACKENDS["AWS Batch"],
                                               "METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL": 1})
    assert res.returncode == 0, res
    total = flow_runner.client("result = Flow('GangFlow').latest_run['train'].task['total'].data")
    assert total == 1 + 2 + 3 + 4
