"""Commands and environments of exec'd members (spin-step), built from data."""

import dataclasses
import json

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import (
    ORDER_ENV,
    SPEC_ENV,
    AgentOrder,
    Attempt,
    Blueprint,
    GangSpec,
    Role,
    TaskIdentity,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.spinstep import (
    Shell,
    SpinOptions,
    shell_text,
    spin_env,
    spin_step_words,
)

IDENTITY = TaskIdentity(run_id="1700", task_id="5", input_paths="1700/start/1",
                        split_index=3, retry_count=1, max_user_code_retries=2,
                        namespace="user:tester", orig_datastore="local@/data/.metaflow")
BLUEPRINT = Blueprint(step_name="train", nodes=2, nproc_per_node=2, rendezvous_timeout_s=300.0,
                      finish_timeout_s=300.0, start_method="auto", heartbeat_timeout_s=30.0,
                      hang_timeout_s=600.0, preempt_grace_s=25.0, max_restarts=1,
                      group_check_default="error")
ATTEMPT = Attempt(gang_id="1700-train-5-1", task=IDENTITY, backend="local",
                  master_addr="127.0.0.1", master_port=40123,
                  secret="0123456789abcdef0123456789abcdef",
                  top_args=("--quiet", "--datastore", "local"))


def _spec(**overrides):
    fields = dict(role=Role.AGENT, blueprint=BLUEPRINT, attempt=ATTEMPT, node=1,
                  work_dir="/tmp/torch-distributed-x", accelerator="cpu", start_method="fork",
                  restart_count=1)
    fields.update(overrides)
    return GangSpec(**fields)


def test_spin_step_words_golden():
    words = spin_step_words("train", SpinOptions.of_task(IDENTITY, "5-node-1"))
    assert words == [
        "spin-step", "train",
        "--run-id", "1700",
        "--task-id", "5-node-1",
        "--input-paths", "1700/start/1",
        "--retry-count", "1",
        "--max-user-code-retries", "2",
        "--orig-flow-datastore", "local@/data/.metaflow",
        "--no-persist",
        "--split-index", "3",
        "--namespace", "user:tester",
    ]


def test_spin_step_words_without_split_index_or_namespace():
    identity = TaskIdentity("1700", "5", "1700/start/1", None, 0, 0, None, "local@/d")
    words = spin_step_words("train", SpinOptions.of_task(identity, "5-node-1-rank-1"))
    assert "--split-index" not in words and "--namespace" not in words
    assert words[words.index("--task-id") + 1] == "5-node-1-rank-1"
    assert words[:2] == ["spin-step", "train"]


def test_split_index_zero_is_kept():
    identity = TaskIdentity("1", "2", "1/start/1", 0, 0, 0, None, "local@/d")
    words = spin_step_words("train", SpinOptions.of_task(identity, "2-node-1"))
    assert words[words.index("--split-index") + 1] == "0"


def test_every_option_is_one_metaflows_spin_step_accepts():
    import metaflow  # noqa: F401 - loads the CLI components in the right order
    from metaflow.cli_components.step_cmd import spin_step

    accepted = {opt for p in spin_step.params for opt in p.opts + p.secondary_opts}
    words = spin_step_words("train", SpinOptions.of_task(IDENTITY, "5-node-1"))
    options = [a for a in words[words.index("train") + 1:] if a.startswith("--")]
    assert options and set(options) <= accepted, set(options) - accepted


def test_shell_text_quotes_values_and_leaves_the_nodes_words_to_its_shell():
    options = SpinOptions.of_task(
        dataclasses.replace(IDENTITY, namespace="user:o'brien"),
        Shell("5-node-$AWS_BATCH_JOB_NODE_INDEX"), input_paths=Shell("${METAFLOW_INPUT_PATHS_0}"))
    text = shell_text(spin_step_words("train", options))
    assert "--task-id 5-node-$AWS_BATCH_JOB_NODE_INDEX " in text
    assert "--input-paths ${METAFLOW_INPUT_PATHS_0} " in text
    assert '"' not in text  # it runs inside Metaflow's bash -c "..."
    # what bash sees once Metaflow's shlex took its double-quoted string apart
    import shlex
    words = shlex.split(shlex.split('bash -c "%s"' % text)[2])
    assert words[words.index("--namespace") + 1] == "user:o'brien"


def _allowed(env):
    return json.loads(env["METAFLOW_SPIN_ALLOWED_DECORATORS"])


def test_spin_env_adds_the_decorator_to_metaflows_defaults():
    # What this Metaflow allows in spin-step when nothing is configured (the tests run with a
    # clean environment): the member must keep all of it.
    from metaflow.metaflow_config import SPIN_ALLOWED_DECORATORS as metaflow_defaults

    assert metaflow_defaults
    env = spin_env({"PATH": "/bin"}, _spec(), "torch_distributed", "/tmp/spin")
    allowed = _allowed(env)
    assert "torch_distributed" in allowed
    assert set(metaflow_defaults) <= set(allowed), set(metaflow_defaults) - set(allowed)
    assert {"conda", "pypi", "environment", "timeout", "card"} <= set(allowed)


def test_spin_env_keeps_the_users_entries():
    base = {"METAFLOW_SPIN_ALLOWED_DECORATORS": json.dumps(["environment", "my_deco"])}
    allowed = _allowed(spin_env(base, _spec(), "torch_distributed", "/tmp/spin"))
    assert allowed == ["environment", "my_deco", "torch_distributed"]


def test_spin_env_does_not_repeat_the_decorator():
    base = {"METAFLOW_SPIN_ALLOWED_DECORATORS": json.dumps(["torch_distributed", "card"])}
    allowed = _allowed(spin_env(base, _spec(), "torch_distributed", "/tmp/spin"))
    assert allowed == ["torch_distributed", "card"]


@pytest.mark.parametrize("raw", ["", "null"])
def test_spin_env_empty_setting_means_defaults(raw):
    allowed = _allowed(spin_env({"METAFLOW_SPIN_ALLOWED_DECORATORS": raw}, _spec(),
                                "torch_distributed", "/tmp/spin"))
    assert "conda" in allowed and allowed[-1] == "torch_distributed"


def test_spin_env_carries_the_spec_and_keeps_the_base_env():
    base = {"PATH": "/bin", "HOME": "/home/u"}
    spec = _spec()
    env = spin_env(base, spec, "torch_distributed", "/tmp/gang/spin")
    assert env["PATH"] == "/bin" and env["HOME"] == "/home/u"
    assert env["METAFLOW_DATASTORE_SYSROOT_SPIN"] == "/tmp/gang/spin"
    assert GangSpec.from_env(env) == spec
    assert base == {"PATH": "/bin", "HOME": "/home/u"}


def test_gang_spec_env_round_trip():
    spec = _spec(role=Role.RANK, node=0, local_rank=1, cuda_visible_devices="0,1",
                 attempt=dataclasses.replace(ATTEMPT, checkpoint={"loaded": None, "node": 0}))
    env = spec.to_env()
    assert list(env) == [SPEC_ENV]
    back = GangSpec.from_env(env)
    assert back == spec
    assert back.attempt.task == IDENTITY and back.role is Role.RANK
    assert back.attempt.top_args == ("--quiet", "--datastore", "local")
    assert back.local_rank == 1 and back.cuda_visible_devices == "0,1"


def test_gang_spec_absent():
    assert GangSpec.from_env({"PATH": "/bin"}) is None


def test_an_agent_order_carries_the_blueprint_and_nothing_of_the_attempt():
    order = AgentOrder(BLUEPRINT, "batch")
    env = order.to_env()
    assert list(env) == [ORDER_ENV]
    assert AgentOrder.from_env(env) == order
    assert "secret" not in env[ORDER_ENV] and "gang_id" not in env[ORDER_ENV]
    assert Blueprint.from_json(BLUEPRINT.to_json()) == BLUEPRINT
