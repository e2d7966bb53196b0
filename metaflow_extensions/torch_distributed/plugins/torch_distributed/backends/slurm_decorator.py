"""@torch_slurm: run a step as a Slurm job (`python flow.py run --with torch_slurm` on a login
node); a @torch_distributed gang of N nodes is one job of N nodes (backends/slurm.py).

Named torch_slurm, not slurm: metaflow-slurm (Outerbounds) registers a step decorator called
`slurm`, and two extensions cannot both define one name. With both on one step, @torch_slurm
refuses at validation: the step would be submitted twice.

Parameters
----------
partition, account, qos, constraint, gres : str, optional
    sbatch's options of the same names.
time : str, optional
    The job's time limit in one of Slurm's forms (minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]).
gpu : int, optional
    GPUs per node (`--gpus-per-node`); a @torch_distributed gang starts one rank per GPU.
cpu : int, optional
    CPUs per node (`--cpus-per-task`, one Slurm task per node).
setup : str, optional
    Shell lines every node of the job runs first, in the shell that then runs the task or the
    node agent (`module load cuda/12.4 && source /shared/envs/train/bin/activate`); a setup
    that fails ends the job, naming the node. Default: METAFLOW_TORCH_SLURM_SETUP, else none.
python : str, optional
    The interpreter the nodes run the task and the node agent with (`python`: the one the
    setup put on PATH). Default: METAFLOW_TORCH_SLURM_PYTHON, else the interpreter of the run
    on the login node (its path must then exist on every node).
container : str, optional
    An OCI bundle (a folder holding config.json and its root filesystem, on the filesystem
    every node shares) each node's task runs in, through srun's --container: Slurm's own
    container support, which the cluster configures in oci.conf. Default:
    METAFLOW_TORCH_SLURM_CONTAINER, else none (the nodes' own system).
"""

import dataclasses
import os
import re
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

from metaflow.decorators import StepDecorator

from . import slurm, trampoline

from ..core import naming
from ..core.errors import TorchSlurmConfigError
from ..core.gangspec import AgentOrder, TaskIdentity
from ..mf import internals
from ..mf.spinstep import Shell, SpinOptions, spin_env_additions, spin_step_words

# The submitter, run with `python -m`: named, not imported (runpy would find it imported).
SUBMITTER = __name__.rsplit(".", 1)[0] + ".slurm_submit"
# Where each attempt's job folder is made; it must be on a filesystem every node shares.
WORK_ROOT_ENV = "METAFLOW_TORCH_SLURM_WORK_ROOT"
DEFAULT_WORK_ROOT = ".torch_slurm"
# Defaults of @torch_slurm(setup=..., python=...).
SETUP_ENV = "METAFLOW_TORCH_SLURM_SETUP"
PYTHON_ENV = "METAFLOW_TORCH_SLURM_PYTHON"
# Default of @torch_slurm(container=...).
CONTAINER_ENV = "METAFLOW_TORCH_SLURM_CONTAINER"
# The datastores a job's nodes can use: the local one on the filesystem they share with the
# login node, and S3, reached with the environment the job inherits (--export=ALL) or the
# shared home's ~/.aws. (Azure and GCS would go the same way, untested: refused.)
DATASTORES = ("local", "s3")
# Decorators that send a step to another scheduler (metaflow-slurm's is `slurm`).
OTHER_SENDERS = ("batch", "kubernetes", "slurm")
_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}(:\d{1,2})?)?)$")
_WORD = re.compile(r"^\S+$")


def slurm_options(step_name: str, attributes: Dict[str, Any]) -> slurm.SlurmOptions:
    """The sbatch options of @torch_slurm's attributes; raises naming the bad one."""
    words: Dict[str, Optional[str]] = {}
    for name in ("partition", "account", "qos", "constraint", "gres", "time"):
        value = attributes.get(name)
        if value in (None, ""):
            words[name] = None
            continue
        if not isinstance(value, str) or not _WORD.match(value):
            raise TorchSlurmConfigError(
                step_name, "%s=%r is not one word of text: give it as sbatch's --%s takes it, "
                "e.g. %s." % (name, value, name, _EXAMPLES[name]))
        words[name] = value
    if words["time"] is not None and not _TIME.match(words["time"]):
        raise TorchSlurmConfigError(
            step_name, "time=%r is not one of Slurm's time forms: minutes (\"30\"), "
            "\"MM:SS\", \"HH:MM:SS\" or \"D-HH[:MM[:SS]]\" (e.g. time=\"2:00:00\")."
            % words["time"])
    counts = {name: _count(step_name, name, attributes.get(name)) for name in ("gpu", "cpu")}
    return slurm.SlurmOptions(gpu=counts["gpu"], cpu=counts["cpu"], **words)


_EXAMPLES = {"partition": 'partition="gpu"', "account": 'account="proj123"',
             "qos": 'qos="normal"', "constraint": 'constraint="a100"',
             "gres": 'gres="gpu:a100:4"', "time": 'time="2:00:00"'}


def _count(step_name: str, name: str, value: Any) -> int:
    if value in (None, ""):
        return 0
    try:
        count = int(str(value))
    except ValueError:
        count = -1
    if count < 0 or str(count) != str(value).strip():
        raise TorchSlurmConfigError(
            step_name, "%s=%r is not a whole number of %ss per node (e.g. %s=4)."
            % (name, value, name.upper(), name))
    return count


def check_ssh(step_name: str, environ: Mapping[str, str]) -> None:
    """METAFLOW_TORCH_SLURM_SSH, when set, is ssh's destination and options as shell words."""
    value = environ.get(slurm.SSH_ENV, "")
    try:
        words = slurm.ssh_words(environ)
    except ValueError as ex:
        raise TorchSlurmConfigError(
            step_name, "%s=%r is not shell words (%s): give ssh's destination and options as "
            "you would write them after `ssh`, e.g. %s=login1 or %s=\"-J bastion me@login1\"."
            % (slurm.SSH_ENV, value, ex, slurm.SSH_ENV, slurm.SSH_ENV)) from ex
    if value.strip() and not any(not w.startswith("-") for w in words):
        raise TorchSlurmConfigError(
            step_name, "%s=%r names no host: give ssh's destination (and its options), e.g. "
            "%s=login1." % (slurm.SSH_ENV, value, slurm.SSH_ENV))


def node_environment(step_name: str, attributes: Dict[str, Any],
                     environ: Mapping[str, str]) -> Tuple[str, str]:
    """(setup, python) of the step's nodes: its attributes, else their variables."""
    found = []
    for name, variable in (("setup", SETUP_ENV), ("python", PYTHON_ENV)):
        value = attributes.get(name)
        if value in (None, ""):
            value = environ.get(variable, "")
        if not isinstance(value, str):
            raise TorchSlurmConfigError(
                step_name, "%s=%r is not text: give it as a string, e.g. %s." % (
                    name, value, 'setup="source /shared/envs/train/bin/activate"'
                    if name == "setup" else 'python="python"'))
        found.append(value.strip())
    if found[1] and any(c.isspace() for c in found[1]):
        raise TorchSlurmConfigError(
            step_name, "python=%r is not one word: name the interpreter only (a path, or "
            "`python` as the setup puts it on PATH); what must run first goes in setup=."
            % found[1])
    return found[0], found[1]


def container_bundle(step_name: str, attributes: Dict[str, Any],
                     environ: Mapping[str, str]) -> str:
    """The OCI bundle the step's nodes run in (its attribute, else its variable), or "";
    refused unless it is an absolute path to a folder with a config.json here (the bundle is
    on the filesystem the nodes share with this machine, as the flow's folder is; in the
    job, the task validates the flow again inside the container, where it need not be)."""
    value = attributes.get("container")
    named = "container=%r" % (value,)
    if value in (None, ""):
        value = environ.get(CONTAINER_ENV, "")
        named = "%s=%r" % (CONTAINER_ENV, value)
    if not isinstance(value, str):
        raise TorchSlurmConfigError(
            step_name, "%s is not text: give the path of an OCI bundle, e.g. "
            "container=\"/shared/bundles/pytorch\"." % named)
    value = value.strip()
    if not value:
        return ""
    if not os.path.isabs(value):
        raise TorchSlurmConfigError(
            step_name, "%s is not an absolute path. @torch_slurm runs each node in an OCI "
            "bundle through srun's --container (Slurm's own container support): give the "
            "bundle's folder on the shared filesystem, e.g. container=\"/shared/bundles/"
            "pytorch\". An image name (pyxis' --container-image) is not supported; unpack "
            "the image into a bundle (`skopeo copy` and `umoci unpack`, or `podman export`)."
            % named)
    if "'" in value or any(c.isspace() for c in value):
        raise TorchSlurmConfigError(
            step_name, "%s has a quote or a space, which srun's --container cannot take: "
            "move the bundle to a path without them." % named)
    if slurm.NODE_ID in environ:
        return value  # the task on node 0, in the container, which need not mount its bundle
    if not os.path.isfile(os.path.join(value, "config.json")):
        raise TorchSlurmConfigError(
            step_name, "%s is not an OCI bundle seen from this machine: %s has no "
            "config.json. A bundle is a folder with config.json and the root filesystem it "
            "names (`runc spec` writes one); it must be on the filesystem every node shares, "
            "at the same path." % (named, value))
    return value


def check_work_root(step_name: str, root: str) -> None:
    """The jobs' folders go in srun's --multi-prog file, which quotes with single quotes and
    has no escape."""
    if "'" in root or "\n" in root:
        raise TorchSlurmConfigError(
            step_name, "the jobs' folder %r has a quote or a line break, which srun's "
            "--multi-prog file cannot hold: run from another folder or set %s to a path "
            "without them." % (root, WORK_ROOT_ENV))


def refuse_other_senders(step_name: str, decorators: List[Any]) -> None:
    for deco in decorators:
        if deco.name in OTHER_SENDERS:
            raise TorchSlurmConfigError(
                step_name, "the step also has @%s, which sends it to %s: a step runs on one "
                "scheduler. Remove @%s from the step (or run without --with torch_slurm)."
                % (deco.name, "metaflow-slurm's Slurm submission" if deco.name == "slurm"
                   else "another scheduler", deco.name))


def work_root() -> str:
    return os.path.abspath(os.environ.get(WORK_ROOT_ENV, DEFAULT_WORK_ROOT))


def gang_of(decorators: List[Any]) -> Any:
    """The step's @torch_distributed when it makes the step a gang of several nodes."""
    for deco in decorators:
        if deco.name == "torch_distributed" and getattr(deco, "active", False) \
                and deco.topology.nodes > 1:
            return deco
    return None


class TorchSlurmDecorator(StepDecorator):
    name = "torch_slurm"
    defaults = {"partition": None, "account": None, "qos": None, "time": None,
                "constraint": None, "gres": None, "gpu": None, "cpu": None, "setup": None,
                "python": None, "container": None}

    def step_init(self, flow: Any, graph: Any, step_name: str, decorators: List[Any],
                  environment: Any, flow_datastore: Any, logger: Any) -> None:
        self.step_name = step_name
        self.decorators = decorators
        self.flow_datastore = flow_datastore
        refuse_other_senders(step_name, decorators)
        self.options = slurm_options(step_name, self.attributes)
        self.setup, self.python = node_environment(step_name, self.attributes, os.environ)
        self.container = container_bundle(step_name, self.attributes, os.environ)
        self.attributes["container"] = self.container or None  # (what the preflight reads)
        check_work_root(step_name, work_root())
        check_ssh(step_name, os.environ)
        if flow_datastore.TYPE not in DATASTORES:
            raise TorchSlurmConfigError(
                step_name, "the datastore is %r; @torch_slurm runs with Metaflow's local "
                "datastore on a filesystem every node shares, or with S3 (--datastore=local, "
                "the flow's folder on the shared home; or --datastore=s3)." % flow_datastore.TYPE)

    def runtime_step_cli(self, cli_args: Any, retry_count: int, max_user_code_retries: int,
                         ubf_context: Any) -> None:
        if retry_count > max_user_code_retries:
            return  # @catch's fallback attempt runs here, as with @batch
        task = cli_args.task
        work_dir = os.path.join(work_root(), task.flow.name, str(task.run_id), self.step_name,
                                str(task.task_id), "attempt-%d" % retry_count)
        os.makedirs(work_dir, exist_ok=True)
        job = slurm.SlurmJob(
            step_name=self.step_name, name="%s.%s.%s" % (task.flow.name, self.step_name,
                                                         task.task_id),
            nodes=1, work_dir=work_dir, cwd=os.getcwd(), options=self.options,
            setup=self.setup, python=self.python, container=self.container,
            exported=sorted(name for deco in self.decorators if deco.name == "environment"
                            for name in (deco.attributes.get("vars") or {})))
        gang = gang_of(self.decorators)
        if gang is not None:
            job = self._gang_job(job, gang, cli_args, retry_count, max_user_code_retries)
        job_file = os.path.join(work_dir, "job.json")
        with open(job_file, "w") as f:
            f.write(job.to_json())
        cli_args.entrypoint = [sys.executable, "-m", SUBMITTER, job_file, "--",
                               *cli_args.entrypoint]

    def _gang_job(self, job: slurm.SlurmJob, gang: Any, cli_args: Any, retry_count: int,
                  max_user_code_retries: int) -> slurm.SlurmJob:
        """`job` with N nodes: node 0 the task with the plan, the others the node agent."""
        options = cli_args.command_options
        identity = TaskIdentity(
            run_id=str(options["run-id"]), task_id=str(options["task-id"]),
            input_paths=str(options["input-paths"]),
            split_index=None if options.get("split-index") is None
            else int(options["split-index"]),
            retry_count=retry_count, max_user_code_retries=max_user_code_retries,
            namespace=options.get("namespace") or None,
            orig_datastore=internals.orig_datastore(self.flow_datastore))
        spin = SpinOptions.of_task(identity, Shell(naming.hidden_task_id(identity.task_id,
                                                                         slurm.NODE_WORD)))
        argv = [*cli_args.entrypoint, *internals.runtime_top_level_words(cli_args),
                *spin_step_words(self.step_name, spin)]
        nodes = gang.topology.nodes
        return dataclasses.replace(
            job, nodes=nodes, options=slurm.gang_options(job.options, gang.topology.nproc_per_node),
            task_env=trampoline.plan_env(slurm.MAIN_NODE_ENV, self.step_name, nodes),
            agent_env=spin_env_additions(os.environ, AgentOrder(gang.blueprint,
                                                                slurm.BACKEND.name), gang.name),
            agent_argv=[str(word) for word in argv],
            agent_shell_words=[i for i, word in enumerate(argv) if isinstance(word, Shell)])
