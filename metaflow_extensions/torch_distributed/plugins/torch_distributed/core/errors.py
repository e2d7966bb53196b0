"""Every error @torch_distributed raises. Each names the step and the value and says how to fix it."""

import tempfile
import traceback
from typing import TYPE_CHECKING, Optional, Sequence

from metaflow.exception import MetaflowException

if TYPE_CHECKING:
    from .failures import GangOutcome


class TorchDistributedException(MetaflowException):  # type: ignore[misc]  # untyped base
    headline = "@torch_distributed error"

    def __init__(self, step_name: str, msg: str) -> None:
        self.step_name = step_name
        super().__init__("@torch_distributed on step *%s*: %s" % (step_name, msg))


class TorchDistributedConfigError(TorchDistributedException):
    """The decorator's attributes, or their combination with the step, are invalid."""

    headline = "Invalid @torch_distributed configuration"


class TorchSlurmConfigError(TorchDistributedConfigError):
    """@torch_slurm's attributes, or their combination with the step, are invalid."""

    headline = "Invalid @torch_slurm configuration"

    def __init__(self, step_name: str, msg: str) -> None:
        self.step_name = step_name
        MetaflowException.__init__(self, "@torch_slurm on step *%s*: %s" % (step_name, msg))


class TorchDistributedEnvironmentError(TorchDistributedException):
    """The machine cannot run the planned gang (too few GPUs, wrong Metaflow version, ...)."""

    headline = "@torch_distributed cannot run here"


class TorchDistributedCompileError(TorchDistributedException):
    """What Metaflow built for the step (its command, job or workflow) is not what this release
    knows how to turn into a gang: Metaflow's internals moved (mf/versions.compile_error)."""

    headline = "@torch_distributed cannot compile this step"


class TorchDistributedGangFailed(TorchDistributedException):
    """A rank of the gang failed; the whole gang was stopped. `outcome` (a GangOutcome) says
    who failed on their own, who was stopped and who had finished; `failure` is the root cause."""

    headline = "@torch_distributed gang failed"

    def __init__(self, step_name: str, outcome: "GangOutcome", note: str = "") -> None:
        self.outcome = outcome
        self.failure = outcome.root_cause
        msg = "%s\n%s" % (self.failure.describe(), outcome.others_note())
        if note:  # restarts in place: why the gang stopped restarting, and each earlier round
            msg += "\n" + note
        super().__init__(step_name, msg)


class TorchDistributedRendezvousTimeout(TorchDistributedGangFailed):
    """Some nodes or ranks did not check in before the rendezvous timeout."""

    headline = "@torch_distributed rendezvous timed out"


class TorchDistributedStoreTampered(TorchDistributedException):
    """A value torch reads from the gang's store to bootstrap its process groups (a peer's
    address, NCCL's unique id) was not written by a member of the gang: a process outside the
    gang wrote to node 0's port. The rank stops instead of connecting where it points."""

    headline = "@torch_distributed: the gang's store was tampered with"


class TorchDistributedAborted(Exception):
    """Raised in rank 0 when another rank failed and the gang is being stopped.

    It derives from Exception (not MetaflowException) so that user code in rank 0 is unwound
    like any other error; the step then fails with TorchDistributedGangFailed.
    """


class NotInTorchDistributedStep(MetaflowException):  # type: ignore[misc]  # untyped base
    headline = "current.torch_distributed is not available"

    def __init__(self) -> None:
        super().__init__(
            "current.torch_distributed exists only inside a step decorated with "
            "@torch_distributed, while that step runs. Decorate the step with "
            "@torch_distributed, or read it only from inside the step's body."
        )


class TorchDistributedFrameworkError(TorchDistributedException):
    """The step's framework did not train as one gang: a rank never joined the gang's process
    group, or the framework was configured with a shape that contradicts the gang's."""

    headline = "@torch_distributed: the ranks did not train as one gang"


class TorchDistributedPreflightFailed(MetaflowException):  # type: ignore[misc]
    """`torch-distributed preflight` found what would stop a gang step on its backend (or
    nothing to check); each failed check was printed with its fix."""

    headline = "@torch_distributed preflight failed"

    def __init__(self, steps: Sequence[str], msg: str) -> None:
        self.steps = list(steps)
        where = "on step%s %s: " % ("" if len(steps) == 1 else "s",
                                    ", ".join("*%s*" % s for s in steps)) if steps else ""
        super().__init__("@torch_distributed preflight %s%s" % (where, msg))


class TorchDistributedScriptFailed(TorchDistributedException):
    """A script run with current.torch_distributed.run_script exited with a non-zero code."""

    headline = "@torch_distributed: the step's script failed"

    def __init__(self, step_name: str, rank: int, argv: Sequence[str], code: int) -> None:
        self.code = code
        super().__init__(step_name, (
            "rank %d ran `%s` (current.torch_distributed.run_script), which exited with code "
            "%d. Its output is in the rank's [rank %d] lines above; fix the script, then rerun."
            % (rank, " ".join(argv[1:]), code, rank)))


class TorchDistributedUnexpectedError(TorchDistributedException):
    """The gang's own machinery stopped on an error that is neither the user's code's nor one
    this package names: a bug of the package, reported with its traceback (see `presented`)."""

    headline = "@torch_distributed stopped on an unexpected error"


def presented(step_name: str, ex: BaseException) -> Optional[TorchDistributedException]:
    """`ex`, which reached the task from the gang's own machinery (not from the step's code),
    as an error of this package that names the cause and what to do, or None when it needs no
    presenting (a MetaflowException already has a headline; SystemExit and KeyboardInterrupt are
    no errors). Metaflow prints any other exception as `Internal error`, with a traceback whose
    last frame is this package's, whether the cause was the machine or the package."""
    if isinstance(ex, MetaflowException) or not isinstance(ex, Exception):
        return None
    if type(ex).__module__.split(".")[0] in ("botocore", "boto3"):  # a permission, a network
        return TorchDistributedEnvironmentError(step_name, (
            "AWS refused a call of the gang or could not be reached: %s: %s. This is the "
            "account's or the network's doing, not your step's code: give the job's role "
            "(METAFLOW_ECS_S3_ACCESS_IAM_ROLE or @batch(iam_role=...)) the permission named, or "
            "this machine the credentials and region `run --with batch` uses; `python flow.py "
            "--with batch torch-distributed preflight` checks both." % (type(ex).__name__, ex)))
    if isinstance(ex, OSError):  # a full disk, a folder it may not write, a limit
        return TorchDistributedEnvironmentError(step_name, (
            "the gang could not be set up on this machine: %s: %s. This is the machine's "
            "doing, not your step's code: free disk space, or make writable the folder named "
            "(the gang keeps its files under %s, set by TMPDIR), or raise the limit it names, "
            "then rerun. METAFLOW_TORCH_DISTRIBUTED_DEBUG=1 shows where it was raised."
            % (type(ex).__name__, ex, tempfile.gettempdir())))
    return TorchDistributedUnexpectedError(step_name, (
        "the gang stopped on %s: %s, an error of metaflow-torch-distributed's own, not of your "
        "step's code. Please report it with this traceback; a rerun may pass.\n%s"
        % (type(ex).__name__, ex, "".join(traceback.format_exception(
            type(ex), ex, ex.__traceback__)).rstrip())))
