"""Who gives a gang its nodes: the deploy-time and run-time guards as tables, and the contract
of the two Metaflow internals they read."""

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends import schedulers
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedConfigError,
    TorchDistributedEnvironmentError,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology

TWO_NODES = Topology(2, 2)
ONE_NODE = Topology(1, 8)


@pytest.mark.parametrize("words, target", [
    (["step-functions", "create", "--only-json"], "step-functions"),
    (["step-functions", "--name", "x", "create"], "step-functions"),
    (["argo-workflows", "create"], "argo-workflows"),
    (["airflow", "create", "dag.py"], "airflow"),
    (["my-scheduler", "create"], "my-scheduler"),  # a deployer an extension adds
    (["step-functions", "trigger"], None),
    (["argo-workflows", "delete"], None),
    (["run"], None),
    (["step", "train", "--run-id", "1"], None),
    (["batch", "step", "train"], None),
    (["other", "create"], None),  # not a scheduler
    ([], None),
])
def test_deploy_target_is_the_compiling_command(words, target):
    assert schedulers.deploy_target(words, deployers=["my-scheduler"]) == target


@pytest.mark.parametrize("target, where", [
    ("airflow", "Airflow"),
    ("my-scheduler", "`my-scheduler`"),
])
def test_a_multi_node_gang_is_refused_where_the_scheduler_runs_one_machine(target, where):
    with pytest.raises(TorchDistributedConfigError) as refused:
        schedulers.check_deploy_target("train", target, TWO_NODES)
    reason = str(refused.value)
    assert ("step *train*: a gang of 2 nodes (2 nodes x 2 processes per node = world size 4) "
            "cannot be deployed to %s" % where) in reason
    assert "nodes=1" in reason and "--with batch" in reason and "step-functions create" in reason
    assert "argo-workflows create" in reason


def test_one_node_gangs_deploy_and_other_commands_are_not_checked():
    for target in ("step-functions", "argo-workflows", "airflow", None):
        schedulers.check_deploy_target("train", target, ONE_NODE)
    schedulers.check_deploy_target("train", None, TWO_NODES)


def test_step_functions_and_argo_workflows_deploy_a_multi_node_gang():
    # compiled into one multi-node AWS Batch job (stepfunctions.py), one JobSet (argo.py)
    schedulers.check_deploy_target("train", "step-functions", TWO_NODES)
    schedulers.check_deploy_target("train", "argo-workflows", TWO_NODES)


@pytest.mark.parametrize("environ, backend", [
    ({"AWS_BATCH_JOB_ID": "j", "SFN_STATE_MACHINE": "m"}, "AWS Step Functions"),
    ({"ARGO_WORKFLOW_NAME": "w", "METAFLOW_KUBERNETES_WORKLOAD": "1"}, "Argo Workflows"),
    ({"METAFLOW_AIRFLOW_DAG_RUN_ID": "r", "METAFLOW_KUBERNETES_WORKLOAD": "1"}, "Airflow"),
    ({"AWS_BATCH_JOB_ID": "j", "METAFLOW_RUNTIME_ENVIRONMENT": "aws-batch"}, "AWS Batch"),
    ({"METAFLOW_KUBERNETES_WORKLOAD": "1"}, "Kubernetes"),
    ({"METAFLOW_RUNTIME_ENVIRONMENT": "slurm"}, "slurm"),  # any other backend of Metaflow's
    ({"METAFLOW_RUNTIME_ENVIRONMENT": "local"}, None),
    ({"AWS_BATCH_JOB_ID": ""}, None),
    ({}, None),
])
def test_remote_backends_are_known_by_their_markers(environ, backend):
    assert schedulers.remote_backend(environ) == backend


def test_a_remote_task_without_its_nodes_is_refused_with_the_fix():
    with pytest.raises(TorchDistributedEnvironmentError) as refused:
        schedulers.check_single_host("train", TWO_NODES, {"AWS_BATCH_JOB_ID": "j"}, False)
    reason = str(refused.value)
    assert "step *train*: a gang of 2 nodes" in reason and "on AWS Batch" in reason
    assert "did not give it 2 machines" in reason
    assert "--with batch" in reason and "nodes=1" in reason
    assert "METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL=1" in reason


def test_emulating_nodes_stays_allowed_locally_on_one_node_and_on_purpose():
    remote = {"METAFLOW_KUBERNETES_WORKLOAD": "1"}
    schedulers.check_single_host("train", TWO_NODES, {}, False)  # the user's machine
    schedulers.check_single_host("train", ONE_NODE, remote, False)  # nothing to emulate
    schedulers.check_single_host("train", TWO_NODES, remote, True)  # CPU rehearsal


# -- the contract with Metaflow: fails here, clearly, if Metaflow changes what we read ---------

def test_metaflow_keeps_the_command_words_on_its_root_click_context():
    """Metaflow's top-level group (cli_components/utils.py, the class of cli.py::start) keeps
    the words after the top-level options as `saved_args` on its context before it runs its own
    callback, where step_init is called. `schedulers.cli_words` reads them there."""
    from metaflow._vendor import click
    from metaflow.cli_components.utils import LazyPluginCommandCollection

    seen = []

    @click.group()
    def deployer():
        pass

    @deployer.command()
    @click.option("--only-json", is_flag=True)
    def create(only_json):
        pass

    @click.group(invoke_without_command=True)
    def plugins():
        pass

    plugins.add_command(deployer, "my-scheduler")

    @click.command(cls=LazyPluginCommandCollection, sources=[plugins],
                   invoke_without_command=True)
    @click.option("--no-pylint", is_flag=True)
    def start(no_pylint):
        seen.append(schedulers.cli_words())  # where cli.py::start calls step_init

    start.main(["--no-pylint", "my-scheduler", "create", "--only-json"], standalone_mode=False)
    assert seen == [["my-scheduler", "create", "--only-json"]], (
        "Metaflow no longer keeps the command words as `saved_args` on its root click context: "
        "update schedulers.cli_words, or the deploy-time guard never fires")
    assert schedulers.cli_words() == []  # outside a CLI


def test_metaflow_lists_its_deployers_by_command():
    commands = schedulers.deployer_commands()
    assert {"step-functions", "argo-workflows"} <= set(commands), (
        "metaflow.plugins.DEPLOYER_IMPL_PROVIDERS no longer names the deployers by their "
        "command (TYPE): update schedulers.deployer_commands. Found %r" % commands)
