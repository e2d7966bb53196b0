"""The preflight on Slurm: Slurm's commands and controller from this login node, the step's
partition (its state and size), nodes with the CPUs and GPUs a node of the gang asks for, the
cluster's KillWait (the preemption's grace) and MinJobAge (how long a job's end is kept), the
OCI runtime of a step that runs in a container (oci.conf beside slurm.conf), and the
datastore (preflight/common.py).

`gather` asks Slurm through an injected `run(argv) -> stdout` (sbatch --version, scontrol ping,
show partition, show node, show config), which only reads; `check` is a pure function of what
it answered (a `SlurmFacts`). Whether the compute nodes see the flow's folder is known only by
running a job: `--smoke` does.
"""

import re
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional

from ..backends import slurm
from ..backends.slurm_submit import SCONTROL_PATIENCE_S
from ..preflight.common import Finding, GangNeeds, failed, passed, unknown, warned

# The questions `gather` asks, by the name its answer is kept under.
QUESTIONS = {
    "version": ["sbatch", "--version"],
    "ping": ["scontrol", "ping"],
    "partitions": ["scontrol", "show", "partition", "-o"],
    "nodes": ["scontrol", "show", "node", "-o"],
    "config": ["scontrol", "show", "config"],
}
# Node states in which a node takes no new job (a State word may carry several, "IDLE+DRAIN").
UNAVAILABLE = ("DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "FUTURE",
               "MAINT", "NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN", "RESERVED")
_CONFIG_LINE = re.compile(r"^(\w+)\s*=\s*(.*?)\s*$", re.MULTILINE)
_GPUS = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


@dataclass
class SlurmFacts:
    """What Slurm answered: each question's output by name (QUESTIONS); `refused` holds the
    error of each question that failed, by the same name."""

    answers: Dict[str, str] = field(default_factory=dict)
    refused: Dict[str, str] = field(default_factory=dict)
    # ssh's destination and options when the questions went to the login node over ssh
    # (METAFLOW_TORCH_SLURM_SSH), "" when they were asked on this machine
    ssh: str = ""
    # oci.conf beside the login node's slurm.conf: its path, and its text (None: there is none)
    oci_conf_path: str = ""
    oci_conf: Optional[str] = None


def oci_conf_path(config_text: str) -> str:
    """oci.conf's path: beside slurm.conf (`SLURM_CONF` of `scontrol show config`), or ""."""
    conf = config_values(config_text).get("SLURM_CONF", "")
    return conf.rsplit("/", 1)[0] + "/oci.conf" if conf.startswith("/") else ""


def gather(run: Callable[[List[str]], str], ssh: str = "") -> SlurmFacts:
    facts = SlurmFacts(ssh=ssh)
    for name, argv in QUESTIONS.items():
        try:
            facts.answers[name] = run(argv)
        except subprocess.CalledProcessError as ex:
            facts.refused[name] = ((ex.stderr or "") if isinstance(ex.stderr, str)
                                   else "").strip() or "exit code %d" % ex.returncode
        except subprocess.TimeoutExpired as ex:
            facts.refused[name] = "no answer in %g s" % ex.timeout
        except OSError as ex:  # not installed here
            facts.refused[name] = "%s: %s" % (type(ex).__name__, ex)
        if name == "version" and name in facts.refused:
            return facts  # no sbatch (or no login node): check_reach fails on that alone
    facts.oci_conf_path = oci_conf_path(facts.answers.get("config", ""))
    if facts.oci_conf_path:
        try:
            facts.oci_conf = run(["cat", facts.oci_conf_path])
        except (OSError, subprocess.SubprocessError):
            facts.oci_conf = None  # none (or unreadable: the same to the job's user)
    return facts


# -- the checks (pure) -----------------------------------------------------------------------

def check(needs: GangNeeds, facts: SlurmFacts, datastore_root: str) -> List[Finding]:
    findings = check_reach(needs, facts)
    if any(f.status == "FAILED" for f in findings):
        return findings  # nothing else could be asked
    partition = slurm.chosen_partition(needs.options.get("partition"),
                                       facts.answers.get("partitions", ""))
    found = check_partition(needs, facts, partition)
    findings += found
    if not any(f.status == "FAILED" for f in found):
        findings += check_nodes(needs, facts, partition)
    config = config_values(facts.answers.get("config", ""))
    findings += check_kill_wait(needs, config)
    findings += check_min_job_age(needs, config)
    findings += check_container(needs, facts)
    findings += check_datastore(needs, datastore_root)
    return findings


def check_reach(needs: GangNeeds, facts: SlurmFacts) -> List[Finding]:
    """sbatch on this machine's PATH, and a controller that answers."""
    if "version" in facts.refused and facts.ssh:
        return [failed(needs.step, "Slurm", "sbatch could not be run on the login node over "
                       "`ssh %s` (%s)" % (facts.ssh, facts.refused["version"]),
                       "`ssh %s sbatch --version` must work without a password (BatchMode): "
                       "a key of ssh-agent or of ~/.ssh/config, and Slurm's commands on the "
                       "login node's PATH" % facts.ssh)]
    if "version" in facts.refused:
        return [failed(needs.step, "Slurm", "sbatch could not be run on this machine (%s): "
                       "`run --with torch_slurm` submits with the local sbatch"
                       % facts.refused["version"],
                       "run the flow on a login node of the cluster, put Slurm's commands "
                       "on PATH (`which sbatch`), or name the login node in "
                       "METAFLOW_TORCH_SLURM_SSH")]
    version = facts.answers.get("version", "").strip()
    if "ping" in facts.refused or " is UP" not in facts.answers.get("ping", ""):
        said = facts.refused.get("ping") or facts.answers.get("ping", "").strip()
        return [failed(needs.step, "Slurm", "%s is here, but the controller does not answer "
                       "(`scontrol ping`: %s)" % (version, said),
                       "check SLURM_CONF and that slurmctld runs (`scontrol ping`); ask the "
                       "cluster's administrators")]
    return [passed(needs.step, "Slurm", "%s; %s" % (version, facts.answers["ping"].strip()))]


def _records(text: str) -> List[Dict[str, str]]:
    return [slurm.parse_job(line) for line in text.splitlines() if line.strip()]


def check_partition(needs: GangNeeds, facts: SlurmFacts,
                    partition: Optional[Mapping[str, str]]) -> List[Finding]:
    wanted = needs.options.get("partition")
    if "partitions" in facts.refused:
        return [unknown(needs.step, "partition", "the partitions could not be read (%s)"
                        % facts.refused["partitions"], "sinfo -s")]
    names = [f.get("PartitionName", "?") for f in _records(facts.answers.get("partitions", ""))]
    if partition is None:
        if wanted:
            return [failed(needs.step, "partition", "partition %s does not exist here (the "
                           "cluster has %s)" % (wanted, ", ".join(names) or "none"),
                           "@torch_slurm(partition=...) with one that `sinfo -s` lists")]
        return [failed(needs.step, "partition", "the step names no partition and the cluster "
                       "has no default one (it has %s)" % (", ".join(names) or "none"),
                       "@torch_slurm(partition=...) with one that `sinfo -s` lists")]
    name = partition.get("PartitionName", "?")
    state = partition.get("State", "?")
    if state != "UP":
        return [failed(needs.step, "partition", "partition %s is %s: a job there waits until an "
                       "administrator brings it up" % (name, state),
                       "another partition (@torch_slurm(partition=...)), or ask the cluster's "
                       "administrators")]
    refusal = slurm.partition_refusal(needs.step, needs.nodes, wanted,
                                      facts.answers.get("partitions", ""))
    if refusal:
        # (the refusal's own words, without its step and its fix, which the finding says)
        return [failed(needs.step, "partition", refusal.split(": ", 1)[1].split(". Use ")[0],
                       "fewer nodes (@torch_distributed(nodes=...)) or a larger partition "
                       "(@torch_slurm(partition=...))")]
    return [passed(needs.step, "partition", "partition %s%s is up, with %s nodes (MaxNodes=%s, "
                   "MaxTime=%s); the gang needs %d" % (
                       name, "" if wanted else " (the default)", partition.get("TotalNodes"),
                       partition.get("MaxNodes"), partition.get("MaxTime"), needs.nodes))]


def node_gpus(gres: str) -> int:
    """GPUs a node's Gres names ("gpu:4", "gpu:a100:4(S:0-1)"; "(null)": none)."""
    return sum(int(n) for n in _GPUS.findall(gres))


def check_nodes(needs: GangNeeds, facts: SlurmFacts,
                partition: Optional[Mapping[str, str]]) -> List[Finding]:
    """Nodes of the partition with a node's CPUs and GPUs: enough of them, and up now."""
    if partition is None:
        return []
    if "nodes" in facts.refused:
        return [unknown(needs.step, "nodes", "the nodes could not be read (%s)"
                        % facts.refused["nodes"], "sinfo -N -l")]
    name = partition.get("PartitionName")
    members = [n for n in _records(facts.answers.get("nodes", ""))
               if name in n.get("Partitions", "").split(",")]
    cpus = max(int(needs.options.get("cpu") or 0), 0 if needs.gpu else needs.nproc_per_node)
    big = [n for n in members if int(n.get("CPUTot", "0") or 0) >= cpus
           and node_gpus(n.get("Gres", "")) >= needs.gpu]
    want = " and ".join(["%d CPUs" % cpus] * bool(cpus) + ["%d GPUs" % needs.gpu] * bool(
        needs.gpu)) or "a CPU"
    if len(big) < needs.nodes:
        return [failed(needs.step, "nodes", "%d of partition %s's %d nodes have %s, and the "
                       "gang needs %d such nodes" % (len(big), name, len(members), want,
                                                      needs.nodes),
                       "fewer processes or GPUs per node (@torch_slurm(gpu=..., cpu=...), "
                       "@torch_distributed(nproc_per_node=...)), or a partition of larger "
                       "nodes (`sinfo -N -l`)")]
    up = [n for n in big if not set(re.split(r"[+*]", n.get("State", ""))) & set(UNAVAILABLE)]
    if len(up) < needs.nodes:
        return [warned(needs.step, "nodes", "%d nodes of partition %s have %s, but only %d of "
                       "them take jobs now (the others are down, drained or reserved): the "
                       "job waits for %d" % (len(big), name, want, len(up), needs.nodes),
                       "sinfo -N -p %s; ask the cluster's administrators" % name)]
    return [passed(needs.step, "nodes", "%d nodes of partition %s have %s and take jobs now"
                   % (len(up), name, want))]


def config_values(text: str) -> Dict[str, str]:
    """`scontrol show config`'s settings ("KillWait": "30 sec")."""
    return dict(_CONFIG_LINE.findall(text))


def _seconds(value: Optional[str]) -> Optional[float]:
    found = re.match(r"^(\d+)", value or "")
    return float(found.group(1)) if found else None


def check_kill_wait(needs: GangNeeds, config: Mapping[str, str]) -> List[Finding]:
    """After a scancel or a preemption Slurm kills every process KillWait seconds after its
    SIGTERM: the gang's preemption grace must fit (node 0 cuts it otherwise)."""
    kill_wait = _seconds(config.get("KillWait"))
    if kill_wait is None:
        return [unknown(needs.step, "KillWait", "the cluster's KillWait could not be read",
                        "scontrol show config | grep KillWait")]
    limit = slurm.grace_limit(kill_wait)
    assert limit is not None  # a KillWait was read
    if needs.preempt_grace > limit:
        return [warned(needs.step, "KillWait", "KillWait=%g s: after a scancel or a preemption "
                       "Slurm kills every process of the job %g s after its SIGTERM, so the "
                       "step's preempt_grace of %g s is cut to %g s" % (
                           kill_wait, kill_wait, needs.preempt_grace, limit),
                       "save within %g s of current.torch_distributed.preempted, or ask the "
                       "cluster's administrators for a longer KillWait" % limit)]
    return [passed(needs.step, "KillWait", "KillWait=%g s: the step's preempt_grace of %g s "
                   "fits in it" % (kill_wait, needs.preempt_grace))]


def check_min_job_age(needs: GangNeeds, config: Mapping[str, str]) -> List[Finding]:
    """The step's watcher reads the job's end from the controller, which forgets it MinJobAge
    seconds later; a controller that does not answer meanwhile hides it."""
    age = _seconds(config.get("MinJobAge"))
    if age is None:
        return [unknown(needs.step, "MinJobAge", "the cluster's MinJobAge could not be read",
                        "scontrol show config | grep MinJobAge")]
    if age < SCONTROL_PATIENCE_S:
        return [warned(needs.step, "MinJobAge", "MinJobAge=%g s: Slurm forgets a job %g s "
                       "after it ends; if the controller does not answer the step's watcher "
                       "for longer (it waits up to %g s), the step fails as unknown although "
                       "the job ended" % (age, age, SCONTROL_PATIENCE_S),
                       "ask the cluster's administrators for MinJobAge=300 (Slurm's default)")]
    return [passed(needs.step, "MinJobAge", "MinJobAge=%g s: a job's end is kept long enough "
                   "for the step's watcher" % age)]


# What a finding that only a job can settle says to run.
SMOKE = "python flow.py --with torch_slurm torch-distributed preflight --smoke"
_RUNTIME = re.compile(r"^\s*RunTime(Run|Create)\s*=\s*\"?\s*(\S+)", re.MULTILINE | re.IGNORECASE)


def check_container(needs: GangNeeds, facts: SlurmFacts) -> List[Finding]:
    """A step with `container=` runs `srun --container`, which Slurm ignores (running the step
    on the nodes' own system) where no oci.conf configures an OCI runtime."""
    bundle = needs.options.get("container")
    if not bundle:
        return []
    if not facts.oci_conf_path:
        return [unknown(needs.step, "container", "slurm.conf's folder could not be read "
                        "from `scontrol show config`, so whether oci.conf configures an OCI "
                        "runtime for srun --container is unknown", SMOKE)]
    if facts.oci_conf is None:
        return [unknown(needs.step, "container", "no oci.conf beside slurm.conf on the login "
                        "node (%s): where the compute nodes have none either, Slurm ignores "
                        "srun --container and the step fails before it starts; whether they "
                        "have one is known only by running a job" % facts.oci_conf_path, SMOKE)]
    found = _RUNTIME.search(facts.oci_conf)
    if not found:
        return [failed(needs.step, "container", "%s names no RunTimeRun or RunTimeCreate: "
                       "Slurm rejects it and runs no container" % facts.oci_conf_path,
                       "ask the cluster's administrators to configure an OCI runtime (runc "
                       "or crun) in oci.conf")]
    return [passed(needs.step, "container", "%s runs srun --container with %s; the step's "
                   "bundle is %s" % (facts.oci_conf_path, found.group(2).rsplit("/", 1)[-1],
                                     bundle))]


def check_datastore(needs: GangNeeds, datastore_root: str) -> List[Finding]:
    if datastore_root.startswith("s3://"):
        return [unknown(needs.step, "datastore", "whether every compute node reaches %s (with "
                        "the environment a job inherits, or the shared home's ~/.aws) and sees "
                        "the flow's folder is known only by running a job" % datastore_root,
                        SMOKE)]
    if "://" in datastore_root:
        return [failed(needs.step, "datastore", "the datastore is %s; @torch_slurm runs with "
                       "Metaflow's local datastore on a filesystem every node shares, or S3"
                       % datastore_root,
                       "--datastore=local, with the flow's folder on the shared home; or "
                       "--datastore=s3")]
    return [unknown(needs.step, "datastore", "whether every compute node sees %s (the flow's "
                    "local datastore, and the jobs' folders beside it) is known only by running "
                    "a job" % datastore_root, SMOKE)]
