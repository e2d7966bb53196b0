"""The Slurm backend's pure parts: the job's commands and scripts, its states, its options."""

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends import slurm
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedEnvironmentError, TorchSlurmConfigError)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends.slurm_decorator \
    import slurm_options


def job(**changes):
    fields = dict(step_name="train", name="F.train.2", nodes=2, work_dir="/shared/j",
                  cwd="/shared/flow", options=slurm.SlurmOptions(partition="gpu", time="10"),
                  task_env={slurm.MAIN_NODE_ENV: '{"step": "train", "nodes": 2}'},
                  agent_env={"A": "it's"},
                  agent_argv=["py", "flow.py", "spin-step", "train", "--task-id",
                              "2-node-${METAFLOW_TORCH_DISTRIBUTED_SLURM_NODE}"], agent_shell_words=[5])
    fields.update(changes)
    return slurm.SlurmJob(**fields)


def test_sbatch_asks_one_task_per_node_no_requeue_and_appended_output():
    argv = slurm.sbatch_argv(job(), "/shared/j/job.sh")
    assert argv[:2] == ["sbatch", "--parsable"]
    for word in ("--nodes=2", "--ntasks-per-node=1", "--no-requeue", "--open-mode=append",
                 "--output=/shared/j/job.out", "--error=/shared/j/job.err",
                 "--partition=gpu", "--time=10", "--chdir=/shared/flow"):
        assert word in argv
    assert argv[-1] == "/shared/j/job.sh"


def test_node_script_runs_the_task_on_node_0_and_the_agent_elsewhere():
    text = slurm.node_script(job(), ["py", "flow.py", "step", "train", "--input-paths", "a b"])
    zero, agents = text.split("\nfi\n")
    # the node's index is the script's argument (srun's --multi-prog %t): SLURM_NODEID is
    # missing inside a container of srun's --container
    assert zero.splitlines()[1] == 'export METAFLOW_TORCH_DISTRIBUTED_SLURM_NODE="$1"'
    assert "SLURM_NODEID" not in text
    assert 'if [ "$METAFLOW_TORCH_DISTRIBUTED_SLURM_NODE" = 0 ]' in zero
    assert "export METAFLOW_TORCH_DISTRIBUTED_SLURM_MAIN=" in zero
    assert "exec py flow.py step train --input-paths 'a b'" in zero
    assert "unset METAFLOW_TORCH_DISTRIBUTED_SLURM_MAIN" in agents  # the plan is node 0's
    assert "export A='it'\"'\"'s'" in agents
    # the node's shell expands it
    assert "--task-id 2-node-${METAFLOW_TORCH_DISTRIBUTED_SLURM_NODE}" in agents
    assert 'node-"$METAFLOW_TORCH_DISTRIBUTED_SLURM_NODE".log' in agents
    # node 0 decides the gang's end: an agent's status never trips srun's kill-on-bad-exit
    assert agents.rstrip().endswith("exit 0")
    assert "\nexec py flow.py spin-step" not in agents


def test_a_job_round_trips_through_its_file():
    assert slurm.SlurmJob.from_json(job().to_json()) == job()


@pytest.mark.parametrize("state, ends", [
    ("PENDING", None), ("RUNNING", None), ("COMPLETING", None), ("COMPLETED", ""),
    ("FAILED", "failed"), ("CANCELLED", "was cancelled"), ("NODE_FAIL", "lost a node"),
    ("TIMEOUT", "time limit"), ("PREEMPTED", "preempted"), ("OUT_OF_MEMORY", "out of memory"),
    ("BOOT_FAIL", "boot"), ("DEADLINE", "deadline"), ("SPECIAL_EXIT", "does not know"),
])
def test_only_completed_succeeds_and_completing_still_runs(state, ends):
    fields = slurm.parse_job("JobId=7 JobName=x JobState=%s Reason=NodeDown "
                             "ExitCode=0:9 NodeList=n[1-2]" % state)
    message = slurm.ending("train", "7", fields)
    if ends in (None, ""):
        assert message == ends
    else:
        assert ends in message and "JobState=%s" % state in message
        assert "Reason=NodeDown" in message and "NodeList=n[1-2]" in message


def test_node_0_address_is_the_first_host_resolved_and_never_loopback():
    run = lambda argv: "n3\nn4\n"  # noqa: E731
    env = {slurm.NODE_LIST: "n[3-4]"}
    assert slurm.node_zero_address("train", 2, env, run, lambda n: "10.0.0.3") == "10.0.0.3"
    with pytest.raises(TorchDistributedEnvironmentError, match="loopback address 127.0.1.1"):
        slurm.node_zero_address("train", 2, env, run, lambda n: "127.0.1.1")


def test_node_0_address_comes_from_the_batch_scripts_host_list_without_scontrol():
    def no_scontrol(argv):
        raise OSError("scontrol: not found")  # as in a container image without Slurm

    env = {slurm.NODE_LIST: "n[3-4]", slurm.HOSTS_ENV: "n3 n4 "}
    assert slurm.node_zero_address("train", 2, env, no_scontrol,
                                   {"n3": "10.0.0.3"}.__getitem__) == "10.0.0.3"


def test_a_job_of_another_size_than_planned_is_refused():
    env = {slurm.MAIN_NODE_ENV: '{"step": "train", "nodes": 2}', slurm.NUM_NODES: "3"}
    with pytest.raises(TorchDistributedEnvironmentError, match="needs 2 nodes"):
        slurm.planned_nodes(env, "train")
    assert slurm.planned_nodes(dict(env, **{slurm.NUM_NODES: "2"}), "train") == 2


@pytest.mark.parametrize("attributes, words", [
    ({}, []),
    ({"time": "1-02:00", "qos": "high", "gpu": 4, "cpu": "8"},
     ["--qos=high", "--time=1-02:00", "--gpus-per-node=4", "--cpus-per-task=8"]),
])
def test_options(attributes, words):
    assert slurm_options("train", attributes).sbatch_words() == words


@pytest.mark.parametrize("attributes, match", [
    ({"time": "2h"}, r"time='2h' is not one of Slurm's time forms"),
    ({"gpu": "four"}, r"gpu='four' is not a whole number of GPUs per node"),
    ({"partition": "a b"}, r"partition='a b' is not one word"),
])
def test_bad_options_name_the_step_the_value_and_the_fix(attributes, match):
    with pytest.raises(TorchSlurmConfigError, match=r"@torch_slurm on step \*train\*: " + match):
        slurm_options("train", attributes)


PARTITIONS = ("PartitionName=debug Default=YES MaxNodes=UNLIMITED Nodes=n[1-4] TotalNodes=4\n"
              "PartitionName=big Default=NO MaxNodes=8 Nodes=b[1-16] TotalNodes=16\n")


@pytest.mark.parametrize("nodes, wanted, refused", [
    (4, None, None), (5, None, "partition debug has 4 nodes"), (8, "big", None),
    (9, "big", "partition big has 8 nodes (TotalNodes=16 MaxNodes=8"), (50, "nope", None),
])
def test_a_gang_larger_than_its_partition_is_refused_with_the_partitions_numbers(
        nodes, wanted, refused):
    message = slurm.partition_refusal("train", nodes, wanted, PARTITIONS)
    assert message == refused if refused is None else refused in message


class Deco:
    def __init__(self, name):
        self.name = name


@pytest.mark.parametrize("other, says", [
    ("batch", "@batch, which sends it to another scheduler"),
    ("kubernetes", "@kubernetes, which sends it to another scheduler"),
    ("slurm", "@slurm, which sends it to metaflow-slurm's Slurm submission"),
])
def test_a_step_sent_to_another_scheduler_too_is_refused(other, says):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends.slurm_decorator \
        import refuse_other_senders

    with pytest.raises(TorchSlurmConfigError,
                       match=r"on step \*train\*: the step also has " + says):
        refuse_other_senders("train", [Deco("torch_slurm"), Deco(other), Deco("retry")])
    refuse_other_senders("train", [Deco("torch_slurm"), Deco("retry"), Deco("resources")])


def test_metaflow_slurms_single_task_decorator_is_refused_for_a_multi_node_gang():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends import (
        schedulers)
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
        TorchDistributedConfigError)
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import (
        plan_topology)

    two = plan_topology(None, 2, 2, None, None, None, None)
    with pytest.raises(TorchDistributedConfigError,
                       match=r"a gang of 2 nodes .* cannot run under metaflow-slurm's @slurm.*"
                             r"--with torch_slurm"):
        schedulers.check_single_task_senders("train", ["slurm", "step"], two)
    schedulers.check_single_task_senders("train", ["torch_slurm", "step"], two)
    one = plan_topology(None, 1, 2, None, None, None, None)
    schedulers.check_single_task_senders("train", ["slurm", "step"], one)


def test_a_slurm_nodes_interface_is_gloos_and_ncclls_unless_the_user_set_them():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.envcontract import (
        Rendezvous, rank_env)
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import (
        plan_topology)

    two = plan_topology(None, 2, 2, None, None, None, None)
    place = Rendezvous("10.0.0.1", 29500, "gang", 0, 0)
    env = rank_env(two, 1, 0, place, node_interface="ib0")
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("ib0", "ib0")
    mine = rank_env(two, 1, 0, place, base_env={"NCCL_SOCKET_IFNAME": "eth1"},
                    node_interface="ib0")
    assert "NCCL_SOCKET_IFNAME" not in mine and mine["GLOO_SOCKET_IFNAME"] == "ib0"
    assert "NCCL_SOCKET_IFNAME" not in rank_env(two, 1, 0, place)


def test_the_interface_toward_an_address_is_the_one_that_holds_the_route():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.control import (
        interface_toward, loopback_interface)

    assert interface_toward("127.0.0.1") == loopback_interface()


CONFIG = """Configuration data as of 2026-12-06T17:00:00
JobAcctGatherType       = jobacct_gather/none
KillOnBadExit           = 0
KillWait                = 30 sec
MinJobAge               = 300 sec
"""


def test_the_clusters_kill_wait_is_read_from_scontrol_and_bounds_the_grace():
    assert slurm.kill_wait({}, lambda argv: CONFIG) == 30.0
    assert slurm.kill_wait({}, lambda argv: CONFIG.replace("30 sec", "5 sec")) == 5.0
    # as the batch script read it, outside any container: scontrol is not asked
    assert slurm.kill_wait({slurm.KILL_WAIT_ENV: "7"}, lambda argv: CONFIG) == 7.0
    assert slurm.grace_limit(30.0) == 27.0
    assert slurm.grace_limit(2.0) == 1.0  # never below a second
    assert slurm.grace_limit(None) is None


def test_an_unreadable_kill_wait_leaves_the_grace_alone():
    def fails(argv):
        raise OSError("scontrol: not found")

    assert slurm.kill_wait({}, fails) is None
    assert slurm.kill_wait({}, lambda argv: "no such line") is None
    assert slurm.kill_wait({slurm.KILL_WAIT_ENV: ""}, fails) is None  # the batch script's failed


def test_a_grace_longer_than_the_schedulers_limit_is_cut_and_said(capsys):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import \
        NodeZero
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.decorator import \
        _within_grace_limit
    from tests.unit.test_spinstep import BLUEPRINT

    place = NodeZero("10.0.0.1", 1234, "s", "slurm", grace_limit_s=2.0,
                     grace_limit_why="Slurm sends SIGKILL ... KillWait=5 s after ...")
    cut = _within_grace_limit(BLUEPRINT, place)
    assert BLUEPRINT.preempt_grace_s > 2.0 and cut.preempt_grace_s == 2.0
    assert cut.step_name == BLUEPRINT.step_name and cut.nodes == BLUEPRINT.nodes
    said = capsys.readouterr().err
    assert "preempt_grace is cut from %gs to 2s: Slurm sends SIGKILL" \
        % BLUEPRINT.preempt_grace_s in said
    for limit in (None, BLUEPRINT.preempt_grace_s):
        same = NodeZero("10.0.0.1", 1234, "s", "slurm", grace_limit_s=limit)
        assert _within_grace_limit(BLUEPRINT, same) is BLUEPRINT
    assert capsys.readouterr().err == ""


SHOW_NODES = (
    "NodeName=n1 Arch=x86_64 CPUTot=2 NodeAddr=10.78.0.11 OS=Linux 6.18.44 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=1000 State=ALLOCATED ThreadsPerCore=1 Partitions=debug  "
    "BootTime=2026-12-06T16:40:07 ExtSensorsTemp=n/s\n"
    "NodeName=n2 Arch=x86_64 CPUTot=2 NodeAddr=10.78.0.12 OS=Linux 6.18.44 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=1000 State=DOWN+NOT_RESPONDING ThreadsPerCore=1 "
    "Partitions=debug  BootTime=2026-12-06T16:40:07 ExtSensorsTemp=n/s "
    "Reason=Not responding [root@2026-12-06T16:59:53]\n")


def test_the_nodes_a_node_fail_lost_are_named_by_their_index():
    """(`scontrol show node -o` of a 2-node job whose node n2 stopped answering, as the CI
    cluster printed it.)"""
    assert slurm.down_nodes(["n1", "n2"], SHOW_NODES) == [
        "node 1 (n2, State=DOWN+NOT_RESPONDING, Reason=Not responding "
        "[root@2026-12-06T16:59:53])"]
    assert slurm.down_nodes(["n2", "n1"], SHOW_NODES)[0].startswith("node 0 (n2, ")
    assert slurm.down_nodes(["n1"], SHOW_NODES) == []
    assert slurm.down_nodes(["n1", "n2"], SHOW_NODES.replace(
        "DOWN+NOT_RESPONDING", "IDLE*")) == ["node 1 (n2, State=IDLE*, Reason=Not responding "
                                             "[root@2026-12-06T16:59:53])"]


def _node(tmp_path, node, environ=None, **changes):
    """Run the node script of a job (changes applied) as node `node` of it would, with node
    0's task `sh -c 'echo task ...'` and the agent `sh -c 'echo agent ...'`: (status, stdout,
    stderr, the agent's log)."""
    import subprocess

    work = tmp_path / "job"
    work.mkdir(exist_ok=True)
    fields = dict(work_dir=str(work), cwd=str(tmp_path),
                  agent_argv=["sh", "-c", "echo agent from=${TD_FROM_SETUP:-none}"],
                  agent_shell_words=[])
    fields.update(changes)
    script = tmp_path / "node.sh"
    script.write_text(slurm.node_script(job(**fields), [
        "sh", "-c", "echo task from=${TD_FROM_SETUP:-none}"]))
    done = subprocess.run(["bash", str(script), str(node)],
                          env={"PATH": "/usr/bin:/bin", **(environ or {})},
                          capture_output=True, text=True, timeout=30)
    log = work / ("node-%d.log" % node)
    return done.returncode, done.stdout, done.stderr, log.read_text() if log.exists() else ""


def test_the_setup_runs_first_on_every_node_in_the_shell_of_the_task_and_the_agent(tmp_path):
    setup = "export TD_FROM_SETUP=setup # a comment ends the line"
    assert _node(tmp_path, 0, setup=setup)[:2] == (0, "task from=setup\n")
    code, _, _, log = _node(tmp_path, 1, setup=setup)
    assert code == 0 and log.startswith("agent from=setup\n"), log
    assert _node(tmp_path, 0)[:2] == (0, "task from=none\n")  # no setup: as before


def test_a_failed_setup_ends_the_node_naming_it_and_runs_nothing(tmp_path):
    code, out, err, log = _node(tmp_path, 1, setup='echo "loading $HOME" && false')
    assert code == 1 and out == "loading \n" and log == "", (out, log)  # the setup's own
    assert err.strip().endswith(
        "@torch_slurm on step *train*: the setup command failed with exit status 1 on node 1 "
        "(%s): echo \"loading $HOME\" && false" % __import__("socket").gethostname()), err


def test_the_nodes_interpreter_replaces_the_login_nodes(tmp_path):
    text = slurm.node_script(job(python="python"), ["/login/venv/bin/python", "flow.py",
                                                     "step", "train"])
    assert "exec python flow.py step train" in text
    assert "\npython flow.py spin-step train" in text  # the agent's too
    assert "/login/venv/bin/python" not in text


def test_setup_and_python_come_from_the_attributes_else_their_variables():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends.slurm_decorator \
        import node_environment

    env = {"METAFLOW_TORCH_SLURM_SETUP": "module load cuda",
           "METAFLOW_TORCH_SLURM_PYTHON": "python3"}
    assert node_environment("train", {}, env) == ("module load cuda", "python3")
    assert node_environment("train", {"setup": "source a/bin/activate", "python": "python"},
                            env) == ("source a/bin/activate", "python")
    assert node_environment("train", {"setup": None, "python": ""}, {}) == ("", "")
    with pytest.raises(TorchSlurmConfigError, match="python='python -u' is not one word"):
        node_environment("train", {"python": "python -u"}, {})
    with pytest.raises(TorchSlurmConfigError, match="setup=3 is not text"):
        node_environment("train", {"setup": 3}, {})


@pytest.mark.parametrize("datastore, refused", [("local", False), ("s3", False),
                                                ("azure", True), ("gs", True)])
def test_the_nodes_use_the_local_datastore_or_s3(datastore, refused):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends \
        .slurm_decorator import TorchSlurmDecorator

    class Datastore:
        TYPE = datastore

    deco = TorchSlurmDecorator(attributes={})
    if refused:
        with pytest.raises(TorchSlurmConfigError, match=r"on step \*?train\*?: the datastore is "
                           r"'%s'; .* or with S3" % datastore):
            deco.step_init(None, None, "train", [deco], None, Datastore(), None)
    else:
        deco.step_init(None, None, "train", [deco], None, Datastore(), None)
        assert deco.flow_datastore.TYPE == datastore


def test_slurm_commands_go_to_the_login_node_over_ssh_when_it_is_named():
    argv = ["scontrol", "show", "job", "-o", "7"]
    assert slurm.on_login_node(argv, {}) == argv
    ssh = {slurm.SSH_ENV: "-F '/my cfg' -J bastion me@login1"}
    assert slurm.on_login_node(argv, ssh) == [
        "ssh", "-o", "BatchMode=yes", "-F", "/my cfg", "-J", "bastion", "me@login1", "--",
        "scontrol show job -o 7"]
    # one command line for the remote shell, each word quoted; over the open connection
    assert slurm.on_login_node(["sbatch", "--job-name=a b", "/x/job.sh"], ssh, "/c/m")[1:7] == [
        "-o", "BatchMode=yes", "-o", "ControlPath=/c/m", "-o", "ControlMaster=no"]
    assert slurm.on_login_node(["sbatch", "--job-name=a b"], ssh)[-1] == \
        "sbatch '--job-name=a b'"


def test_a_job_over_ssh_gets_metaflows_awss_and_the_steps_own_variables_only():
    environ = {"METAFLOW_HOME": "/h", "AWS_PROFILE": "p", "USERNAME": "me", "PATH": "/bin",
               "HOME": "/root", "WANDB_KEY": "it's", "OTHER": "x", "bad-name": "y"}
    text = slurm.exported_env(environ, ["WANDB_KEY", "bad-name"])
    assert text == ("export AWS_PROFILE=p\nexport METAFLOW_HOME=/h\nexport USERNAME=me\n"
                    "export WANDB_KEY='it'\"'\"'s'\n")
    script = slurm.node_script(job(env_file="/shared/j/env.sh"), ["py", "flow.py"])
    lines = script.splitlines()
    # read first, before the setup and either command
    assert lines[3] == ". /shared/j/env.sh || exit 1", lines
    assert ". /shared" not in slurm.node_script(job(), ["py", "flow.py"])


@pytest.mark.parametrize("value, message", [
    ("-J 'bastion", "is not shell words"),
    ("-v", "names no host"),
])
def test_a_login_node_setting_ssh_cannot_use_is_refused(value, message):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends \
        .slurm_decorator import check_ssh

    with pytest.raises(TorchSlurmConfigError, match=r"METAFLOW_TORCH_SLURM_SSH=.* %s" % message):
        check_ssh("train", {slurm.SSH_ENV: value})
    check_ssh("train", {})
    check_ssh("train", {slurm.SSH_ENV: "-J bastion me@login1"})


def test_a_cpu_gang_asks_for_a_cpu_per_process_unless_it_names_cpus_or_gpus():
    bare = slurm.SlurmOptions()
    assert slurm.gang_options(bare, 4).sbatch_words() == ["--cpus-per-task=4"]
    assert slurm.gang_options(bare, 1) == bare  # Slurm's default is one already
    for named in (slurm.SlurmOptions(cpu=16), slurm.SlurmOptions(gpu=4),
                  slurm.SlurmOptions(gres="gpu:a100:4")):
        assert slurm.gang_options(named, 4) == named


def _batch(tmp_path, **changes):
    """Run the batch script of a job with stand-ins for `scontrol` (its hostnames and config)
    and `srun` (which prints its words and the environment the nodes get): srun's lines."""
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\ncase \"$2\" in hostnames) printf 'n3\\nn4\\n' ;; config) "
        "printf 'KillOnBadExit = 0\\nKillWait                = 12 sec\\n' ;; esac\n")
    (bin_dir / "srun").write_text(
        "#!/bin/sh\nfor w in \"$@\"; do echo \"word $w\"; done\n"
        "env | grep ^METAFLOW_TORCH_DISTRIBUTED_SLURM_ | sed 's/^/env /'\n")
    for tool in ("scontrol", "srun"):
        (bin_dir / tool).chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(slurm.batch_script(job(**changes), "/shared/j/nodes.conf"))
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30,
                          env={"PATH": "%s:/usr/bin:/bin" % bin_dir,
                               slurm.NODE_LIST: "n[3-4]"})
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_batch_script_asks_slurm_once_for_every_node_and_runs_one_task_per_node(tmp_path):
    said = _batch(tmp_path)
    words = [line[5:] for line in said if line.startswith("word ")]
    assert words == ["--kill-on-bad-exit=1", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                     "--multi-prog", "/shared/j/nodes.conf"]
    assert "env %s=n3 n4 " % slurm.HOSTS_ENV in said
    assert "env %s=12" % slurm.KILL_WAIT_ENV in said
    assert not any(line.startswith("env " + slurm.HOST_MOUNTS_ENV) for line in said)


def test_a_container_job_runs_srun_container_and_says_where_the_batch_script_ran(tmp_path):
    import os

    said = _batch(tmp_path, container="/shared/bundles/torch")
    assert "word --container=/shared/bundles/torch" in said
    assert said.index("word --container=/shared/bundles/torch") < said.index("word --multi-prog")
    assert "env %s=%s" % (slurm.HOST_MOUNTS_ENV, os.readlink("/proc/self/ns/mnt")) in said


def test_every_task_runs_the_node_script_with_its_node_index():
    assert slurm.programs_file("/shared/a b/job/node.sh") == \
        "* /bin/bash '/shared/a b/job/node.sh' %t\n"
    with pytest.raises(ValueError):
        slurm.programs_file("/shared/it's/node.sh")


def test_node_0_started_outside_its_container_ends_naming_the_step_and_the_fix(tmp_path):
    import os

    here = {slurm.HOST_MOUNTS_ENV: os.readlink("/proc/self/ns/mnt")}
    code, out, err, _ = _node(tmp_path, 0, environ=here, container="/shared/bundles/torch")
    assert code == 1 and out == "", out
    assert "@torch_slurm on step *train*: Slurm ran node 0" in err
    assert "outside the container /shared/bundles/torch" in err and "oci.conf" in err
    # in another mount namespace than the batch script's (inside the container), it runs
    elsewhere = {slurm.HOST_MOUNTS_ENV: "mnt:[1]"}
    assert _node(tmp_path, 0, environ=elsewhere, container="/b")[:2] == (0, "task from=none\n")
    # without a container, nothing is checked
    assert _node(tmp_path, 0, environ=here)[:2] == (0, "task from=none\n")


def test_a_container_is_an_oci_bundle_on_the_shared_filesystem(tmp_path):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends \
        .slurm_decorator import container_bundle

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    assert container_bundle("train", {}, {}) == ""
    with pytest.raises(TorchSlurmConfigError, match="has no config.json"):
        container_bundle("train", {"container": str(bundle)}, {})
    (bundle / "config.json").write_text("{}")
    assert container_bundle("train", {"container": str(bundle)}, {}) == str(bundle)
    assert container_bundle("train", {}, {"METAFLOW_TORCH_SLURM_CONTAINER": str(bundle)}) \
        == str(bundle)
    with pytest.raises(TorchSlurmConfigError,
                       match=r"step \*train\*.*container='nvcr.io#nvidia/pytorch:24.01-py3' "
                             r"is not an absolute path.*pyxis"):
        container_bundle("train", {"container": "nvcr.io#nvidia/pytorch:24.01-py3"}, {})
    with pytest.raises(TorchSlurmConfigError, match="METAFLOW_TORCH_SLURM_CONTAINER='b'"):
        container_bundle("train", {}, {"METAFLOW_TORCH_SLURM_CONTAINER": "b"})
    with pytest.raises(TorchSlurmConfigError, match="a quote or a space"):
        container_bundle("train", {"container": "/shared/my bundle"}, {})


def test_a_jobs_folder_the_multi_prog_file_cannot_quote_is_refused():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends \
        .slurm_decorator import check_work_root

    check_work_root("train", "/shared/a b/.torch_slurm")
    with pytest.raises(TorchSlurmConfigError, match="METAFLOW_TORCH_SLURM_WORK_ROOT"):
        check_work_root("train", "/shared/it's/.torch_slurm")


def test_a_nodes_shell_outlives_slurms_sigterm_until_its_agent_is_done(tmp_path):
    """In srun's --container the node script's shell is the container's first process, and
    Slurm removes a container whose first process ended (SIGKILL to every rank): the shell
    waits out Slurm's SIGTERM for the agent, which has the gang's grace."""
    import signal
    import subprocess
    import time

    work = tmp_path / "job"
    work.mkdir()
    script = tmp_path / "node.sh"
    script.write_text(slurm.node_script(job(
        work_dir=str(work), cwd=str(tmp_path), agent_shell_words=[],
        agent_argv=["sh", "-c", "trap 'echo agent got TERM' TERM; touch %s/started; sleep 1; "
                    "echo agent done" % work]), ["true"]))
    shell = subprocess.Popen(["bash", str(script), "1"], env={"PATH": "/usr/bin:/bin"})
    deadline = time.monotonic() + 10
    while not (work / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    shell.send_signal(signal.SIGTERM)  # what Slurm sends every process of the job
    assert shell.wait(timeout=10) == 0
    log = (work / "node-1.log").read_text()
    assert "agent done\n[node 1] the node agent exited with status 0" in log, log
