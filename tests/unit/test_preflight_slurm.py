"""The Slurm preflight's checks (preflight/slurm.py), pure functions of what Slurm answered:
the answers below are what the CI cluster (.ci/slurm, Slurm 22.05.8) printed, varied per case.
The same checks against that real cluster: tests/slurm/test_slurm_preflight.py."""

import subprocess
from types import SimpleNamespace

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import \
    Topology
from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight import \
    config as preflight_config, slurm as preflight_slurm
from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight.common import (
    FAILED, PASSED, UNKNOWN, WARNED, GangNeeds, step_needs)

PARTITION = ("PartitionName=debug AllowGroups=ALL Default=YES MaxNodes=UNLIMITED "
             "MaxTime=UNLIMITED MinNodes=0 Nodes=n[1-4] State=UP TotalCPUs=8 TotalNodes=4\n")
NODE = ("NodeName=n%d Arch=x86_64 CPUAlloc=0 CPUTot=%d Gres=%s NodeAddr=10.78.0.1%d "
        "OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 State=%s "
        "Partitions=%s  BootTime=2026-12-06T16:40:07\n")
CONFIG = ("Configuration data as of 2026-12-06T16:51:00\nKillWait                = %s\n"
          "MinJobAge               = %s\nSLURM_VERSION           = 22.05.8\n")


def nodes(cpus=2, gres="(null)", states=("IDLE",) * 4, partitions="debug"):
    return "".join(NODE % (i, cpus, gres, i, state, partitions)
                   for i, state in enumerate(states, 1))


def answers(**changed):
    found = {"version": "slurm-wlm 22.05.8\n", "ping": "Slurmctld(primary) at ctl is UP\n",
             "partitions": PARTITION, "nodes": nodes(),
             "config": CONFIG % ("30 sec", "300 sec")}
    found.update(changed)
    return preflight_slurm.SlurmFacts(answers=found)


def needs(nodes_=2, nproc=2, gpu=0, cpu=2, grace=25.0, **options):
    return GangNeeds("train", "torch_slurm", nodes_, nproc, cpu, 0, gpu,
                     options=dict(options, cpu=cpu, gpu=gpu), preempt_grace=grace)


def by_check(findings):
    return {f.check: f for f in findings}


def test_a_cluster_that_can_run_the_gang_passes_every_check_but_the_datastore():
    found = by_check(preflight_slurm.check(needs(), answers(), "/home/me/flow/.metaflow"))
    assert {c: f.status for c, f in found.items()} == {
        "Slurm": PASSED, "partition": PASSED, "nodes": PASSED, "KillWait": PASSED,
        "MinJobAge": PASSED, "datastore": UNKNOWN}
    assert "partition debug (the default) is up, with 4 nodes" in found["partition"].message
    assert "the gang needs 2" in found["partition"].message
    assert found["nodes"].message == "4 nodes of partition debug have 2 CPUs and take jobs now"
    assert "--smoke" in found["datastore"].fix


def test_no_sbatch_here_fails_at_once_naming_the_login_node():
    facts = answers()
    facts.refused["version"] = "FileNotFoundError: [Errno 2] No such file or directory: 'sbatch'"
    found = preflight_slurm.check(needs(), facts, "/x")
    assert [(f.check, f.status) for f in found] == [("Slurm", FAILED)]
    assert "sbatch could not be run on this machine" in found[0].message
    assert "login node" in found[0].fix


def test_a_controller_that_does_not_answer_fails():
    facts = answers(ping="Slurmctld(primary) at ctl is DOWN\n")
    found = preflight_slurm.check(needs(), facts, "/x")
    assert [(f.check, f.status) for f in found] == [("Slurm", FAILED)]
    assert "the controller does not answer" in found[0].message and "DOWN" in found[0].message


@pytest.mark.parametrize("options, partitions, says", [
    ({"partition": "gpu"}, PARTITION, "partition gpu does not exist here (the cluster has debug)"),
    ({}, PARTITION.replace("Default=YES", "Default=NO"),
     "the step names no partition and the cluster has no default one"),
    ({}, PARTITION.replace("State=UP", "State=DOWN"), "partition debug is DOWN"),
])
def test_a_partition_the_job_would_wait_in_for_ever_fails(options, partitions, says):
    found = by_check(preflight_slurm.check(needs(**options), answers(partitions=partitions),
                                           "/x"))
    assert found["partition"].status == FAILED and says in found["partition"].message, found


def test_a_gang_larger_than_the_partition_fails_with_its_numbers():
    found = by_check(preflight_slurm.check(needs(nodes_=8), answers(), "/x"))
    assert found["partition"].status == FAILED
    assert "the gang needs 8 nodes, but partition debug has 4 nodes" in found["partition"].message


@pytest.mark.parametrize("need, node_answers, status, says", [
    (needs(nproc=4, cpu=0), nodes(cpus=2), FAILED,
     "0 of partition debug's 4 nodes have 4 CPUs, and the gang needs 2 such nodes"),
    (needs(gpu=4, cpu=0, nproc=4), nodes(gres="gpu:a100:2(S:0-1)"), FAILED,
     "0 of partition debug's 4 nodes have 4 GPUs, and the gang needs 2"),
    (needs(gpu=4, cpu=0, nproc=4), nodes(gres="gpu:a100:4(S:0-1),shard:8"), PASSED,
     "4 nodes of partition debug have 4 GPUs and take jobs now"),
    (needs(), nodes(states=("IDLE", "DOWN*", "IDLE+DRAIN", "MIXED")), PASSED,
     "2 nodes of partition debug"),
    (needs(nodes_=3), nodes(states=("IDLE", "DOWN*", "IDLE+DRAIN", "MIXED")), WARNED,
     "only 2 of them take jobs now"),
    (needs(), nodes(partitions="other"), FAILED, "0 of partition debug's 0 nodes"),
])
def test_nodes_with_what_a_node_of_the_gang_asks(need, node_answers, status, says):
    found = by_check(preflight_slurm.check(need, answers(nodes=node_answers), "/x"))
    assert found["nodes"].status == status and says in found["nodes"].message, found["nodes"]


def test_gpus_are_read_from_every_gres_form():
    assert preflight_slurm.node_gpus("(null)") == 0
    assert preflight_slurm.node_gpus("gpu:8") == 8
    assert preflight_slurm.node_gpus("gpu:h100:8(S:0-1)") == 8
    assert preflight_slurm.node_gpus("gpu:a100:2,gpu:v100:2") == 4
    assert preflight_slurm.node_gpus("shard:8,mps:100") == 0


@pytest.mark.parametrize("kill_wait, grace, status, says", [
    ("30 sec", 25.0, PASSED, "KillWait=30 s: the step's preempt_grace of 25 s fits in it"),
    ("5 sec", 25.0, WARNED, "the step's preempt_grace of 25 s is cut to 2 s"),
    ("28 sec", 25.0, PASSED, "fits"),
    ("27 sec", 25.0, WARNED, "is cut to 24 s"),
])
def test_kill_wait_bounds_the_preemptions_grace(kill_wait, grace, status, says):
    found = by_check(preflight_slurm.check(
        needs(grace=grace), answers(config=CONFIG % (kill_wait, "300 sec")), "/x"))
    assert found["KillWait"].status == status and says in found["KillWait"].message


def test_a_short_min_job_age_warns_and_an_unreadable_config_is_unknown():
    found = by_check(preflight_slurm.check(needs(), answers(config=CONFIG % ("30 sec", "5 sec")),
                                           "/x"))
    assert found["MinJobAge"].status == WARNED
    assert "MinJobAge=5 s: Slurm forgets a job 5 s after it ends" in found["MinJobAge"].message
    found = by_check(preflight_slurm.check(needs(), answers(config=""), "/x"))
    assert found["KillWait"].status == UNKNOWN and found["MinJobAge"].status == UNKNOWN


def test_an_s3_datastore_is_known_by_the_smoke_job_and_another_object_store_fails():
    found = by_check(preflight_slurm.check(needs(), answers(), "s3://bucket/metaflow"))
    assert found["datastore"].status == UNKNOWN
    assert "whether every compute node reaches s3://bucket/metaflow" in \
        found["datastore"].message
    assert "--smoke" in found["datastore"].fix
    found = by_check(preflight_slurm.check(needs(), answers(), "gs://bucket/metaflow"))
    assert found["datastore"].status == FAILED
    assert "the datastore is gs://bucket/metaflow" in found["datastore"].message


def test_gather_keeps_each_refusal_by_its_question():
    def run(argv):
        if argv[:2] == ["scontrol", "ping"]:
            raise subprocess.CalledProcessError(1, argv, "", "slurm_load_ctl_conf error\n")
        if argv[-1] == "-o" and argv[2] == "node":
            raise subprocess.TimeoutExpired(argv, 30)
        return "answer of %s" % " ".join(argv)

    facts = preflight_slurm.gather(run)
    assert facts.refused["ping"] == "slurm_load_ctl_conf error"
    assert facts.refused["nodes"] == "no answer in 30 s"
    assert facts.answers["config"] == "answer of scontrol show config"
    assert set(facts.answers) | set(facts.refused) == set(preflight_slurm.QUESTIONS)


def test_without_sbatch_nothing_else_is_asked():
    """No sbatch here, or a login node ssh cannot reach: that alone fails the check, so the
    other questions (each another ssh's connect timeout) are not asked."""
    asked = []

    def run(argv):
        asked.append(argv)
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    facts = preflight_slurm.gather(run)
    assert asked == [["sbatch", "--version"]]
    assert facts.refused["version"].startswith("FileNotFoundError")
    assert [f.status for f in preflight_slurm.check(needs(), facts, "/flow/.metaflow")] == \
        [FAILED]


def test_step_needs_reads_torch_slurm_and_the_steps_grace():
    slurm_deco = SimpleNamespace(name="torch_slurm", attributes={
        "partition": "gpu", "gpu": 4, "cpu": 16, "time": None})
    ours = SimpleNamespace(name="torch_distributed",
                           settings=SimpleNamespace(preempt_grace_s=40.0))
    found = step_needs("train", Topology(2, 4), [ours, slurm_deco])
    assert (found.backend, found.nodes, found.nproc_per_node, found.gpu, found.cpu,
            found.memory, found.preempt_grace) == ("torch_slurm", 2, 4, 4, 16.0, 0, 40.0)
    assert found.options["partition"] == "gpu"
    assert found.per_node() == "16 CPU, 4 GPU"


def test_a_cpu_gang_naming_no_cpus_is_checked_with_the_one_per_process_it_asks_for():
    ours = SimpleNamespace(name="torch_distributed", settings=None)
    bare = SimpleNamespace(name="torch_slurm", attributes={"cpu": None, "gpu": None})
    found = step_needs("train", Topology(2, 4), [ours, bare])
    assert found.cpu == 4.0 and preflight_config.check_node_size(found) == []
    on_gpus = SimpleNamespace(name="torch_slurm", attributes={"cpu": None, "gpu": 4})
    assert step_needs("train", Topology(2, 4), [ours, on_gpus]).cpu == 1.0


def test_sbatch_that_ssh_cannot_run_on_the_login_node_says_how_to_reach_it():
    facts = answers()
    facts.refused["version"] = "ssh: connect to host login1 port 22: No route to host"
    facts.ssh = "-J bastion login1"
    found = by_check(preflight_slurm.check(needs(), facts, "/x"))
    assert found["Slurm"].status == FAILED
    assert found["Slurm"].message.startswith(
        "sbatch could not be run on the login node over `ssh -J bastion login1` (ssh: connect")
    assert "`ssh -J bastion login1 sbatch --version` must work" in found["Slurm"].fix


OCI_CONF = ('RunTimeQuery="runc --root=/run/runc state %n.%j.%s.%t"\n'
            'RunTimeRun="/usr/bin/runc --root=/run/runc run --bundle %b %n.%j.%s.%t"\n')


def test_a_step_in_a_container_is_checked_against_the_oci_conf_beside_slurm_conf():
    def run(argv):
        if argv == ["scontrol", "show", "config"]:
            return CONFIG % ("30 sec", "300 sec") + "SLURM_CONF              = /etc/slurm/slurm.conf\n"
        if argv == ["cat", "/etc/slurm/oci.conf"]:
            return OCI_CONF
        return answers().answers.get({"sbatch": "version"}.get(argv[0], argv[-1]), "")

    facts = preflight_slurm.gather(run)
    assert facts.oci_conf_path == "/etc/slurm/oci.conf" and facts.oci_conf == OCI_CONF
    bundle = needs(container="/shared/bundles/torch")
    found = by_check(preflight_slurm.check_container(bundle, facts))["container"]
    assert found.status == PASSED, found
    assert found.message == ("/etc/slurm/oci.conf runs srun --container with runc; the step's "
                             "bundle is /shared/bundles/torch")
    # a step without a container is not checked
    assert preflight_slurm.check_container(needs(), facts) == []


def test_no_oci_conf_is_unknown_and_one_without_a_runtime_fails():
    facts = answers()
    facts.oci_conf_path = "/etc/slurm/oci.conf"
    bundle = needs(container="/shared/b")
    found = by_check(preflight_slurm.check_container(bundle, facts))["container"]
    assert found.status == UNKNOWN and "no oci.conf beside slurm.conf" in found.message, found
    assert "--smoke" in found.fix
    facts.oci_conf = 'RunTimeQuery="runc state %n"\n'
    found = by_check(preflight_slurm.check_container(bundle, facts))["container"]
    assert found.status == FAILED and "names no RunTimeRun or RunTimeCreate" in found.message
    facts.oci_conf_path = ""  # slurm.conf's place was not said
    found = by_check(preflight_slurm.check_container(bundle, facts))["container"]
    assert found.status == UNKNOWN, found
