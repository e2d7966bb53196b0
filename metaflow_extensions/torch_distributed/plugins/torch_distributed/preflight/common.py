"""The preflight: what a gang step needs from the user's cloud, checked before its first run.

`python flow.py --with batch torch-distributed preflight` (or `--with kubernetes`) reads, and
never changes, the infrastructure each gang step of the flow would run on, and reports every
check as passed, failed (with the exact fix: an AWS CLI or kubectl command, or a Metaflow
setting) or unknown (the API would not say; what to check by hand). The checks themselves
are pure functions of what the APIs returned (preflight_batch.py, preflight_kubernetes.py);
this module holds what they share: a step's needs, the findings, the report.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

from ..backends import slurm
from ..backends.kubernetes import MIN_SHARED_MEMORY_MIB
from ..core.topology import Topology

PASSED, FAILED, UNKNOWN, WARNED = "ok", "FAILED", "unknown", "warning"


@dataclass(frozen=True)
class Finding:
    """One check of one step: its status, what was found, and for a failure the fix."""

    step: str
    check: str
    status: str
    message: str
    fix: str = ""


def passed(step: str, check: str, message: str) -> Finding:
    return Finding(step, check, PASSED, message)


def failed(step: str, check: str, message: str, fix: str) -> Finding:
    return Finding(step, check, FAILED, message, fix)


def warned(step: str, check: str, message: str, fix: str) -> Finding:
    """The gang can run, but less safely than it should: `fix` says how. A warning does not
    fail the preflight."""
    return Finding(step, check, WARNED, message, fix)


def unknown(step: str, check: str, message: str, fix: str) -> Finding:
    """The API did not answer (no permission, not emulated by this cloud): `fix` says what to
    look at by hand. An unknown does not fail the preflight."""
    return Finding(step, check, UNKNOWN, message, fix)


@dataclass(frozen=True)
class GangNeeds:
    """What one gang step asks of its backend: per node `cpu`, `memory` (MiB), `gpu`,
    `shared_memory` (MiB or None) and the backend's own attributes (`options`: queue,
    iam_role, namespace, labels, ...)."""

    step: str
    backend: str  # "batch", "kubernetes" or "" (the step runs on this machine)
    nodes: int
    nproc_per_node: int
    cpu: float
    memory: int
    gpu: int
    shared_memory: Union[int, float, str, None] = None
    image: str = ""
    options: Dict[str, Any] = field(default_factory=dict)
    preempt_grace: float = 0.0  # the step's preempt_grace, seconds

    def per_node(self) -> str:
        return "%g CPU%s%s" % (self.cpu, ", %d MiB" % self.memory if self.memory else "",
                               ", %d GPU" % self.gpu if self.gpu else "")

    def describe(self) -> str:
        return "%d node%s x (%s)" % (self.nodes, "" if self.nodes == 1 else "s", self.per_node())


BACKEND_DECORATORS = ("batch", "kubernetes", "torch_slurm")


def _number(value: Union[int, float, str, None], default: float = 0.0) -> float:
    return default if value in (None, "") else float(value)


def step_needs(step_name: str, topology: Topology, decorators: Iterable[Any]) -> GangNeeds:
    """The GangNeeds of a gang step of `topology` from its decorators, as their step_init left
    their attributes (@resources merged into @batch's and @kubernetes')."""
    decorators = list(decorators)
    backend = next((d for d in decorators if d.name in BACKEND_DECORATORS), None)
    if backend is None:
        return GangNeeds(step_name, "", topology.nodes, topology.nproc_per_node, 0, 0, 0)
    attributes = dict(backend.attributes)
    ours = next((d for d in decorators if d.name == "torch_distributed"), None)
    settings = getattr(ours, "settings", None)
    return GangNeeds(
        step=step_name, backend=backend.name, nodes=topology.nodes,
        nproc_per_node=topology.nproc_per_node,
        cpu=_number(attributes.get("cpu"), _default_cpu(backend.name, attributes, topology)),
        # (@torch_slurm asks for no memory: its nodes' own)
        memory=int(_number(attributes.get("memory"), 0 if backend.name == "torch_slurm"
                           else 4096)),
        gpu=int(_number(attributes.get("gpu"))),
        shared_memory=attributes.get("shared_memory"),
        image=attributes.get("image") or "",
        options=attributes,
        preempt_grace=float(getattr(settings, "preempt_grace_s", 0.0) or 0.0))


def _default_cpu(backend: str, attributes: Mapping[str, Any], topology: Topology) -> float:
    """The CPUs a node of the gang asks for when its decorator names none: on Slurm a CPU
    gang's one per process (slurm.gang_options), elsewhere 1."""
    if backend != "torch_slurm":
        return 1.0
    options = slurm.SlurmOptions(gpu=int(_number(attributes.get("gpu"))),
                                 gres=attributes.get("gres"))
    return float(slurm.gang_options(options, topology.nproc_per_node).cpu or 1)


def check_backend(needs: GangNeeds) -> List[Finding]:
    """A gang step that no remote backend runs: the preflight has nothing to check there."""
    if needs.backend:
        return []
    return [failed(needs.step, "backend", "the step runs on this machine: neither @batch nor "
                   "@kubernetes nor @torch_slurm is on it, so there is no remote infrastructure "
                   "to check",
                   "python flow.py --with batch torch-distributed preflight (or --with "
                   "kubernetes, --with torch_slurm), the same --with you give `run`")]


def check_shared_memory(needs: GangNeeds, attribute: str) -> List[Finding]:
    """NCCL keeps its buffers in /dev/shm, which a container gets at the runtime's default
    size (64 MiB) unless the step asks for more: a GPU gang with less may hang or crash."""
    if not needs.gpu:
        return []
    value = needs.shared_memory
    mib = None if value in (None, "") else int(float(value))
    if mib is not None and mib >= MIN_SHARED_MEMORY_MIB:
        return [passed(needs.step, "shared memory", "/dev/shm of %d MiB per node" % mib)]
    return [failed(
        needs.step, "shared memory",
        "the GPU gang's containers get %s of /dev/shm, and NCCL may hang or fail with that "
        "little" % ("the default 64 MiB" if mib is None else "%d MiB" % mib),
        "@%s(shared_memory=%d) (MiB) or more on step %s"
        % (attribute, MIN_SHARED_MEMORY_MIB, needs.step))]


def check_image(needs: GangNeeds, backend: str) -> List[Finding]:
    """What is known of the image without running it: its name only."""
    return [unknown(
        needs.step, "image", "image %s: whether it has torch (a CUDA build for GPUs) and what "
        "the flow imports is known only by running it" % (needs.image or "(Metaflow's default)"),
        "python flow.py --with %s torch-distributed preflight --smoke (runs one small job on "
        "it); docs/images.md says what it needs" % backend)]


# -- the report ----------------------------------------------------------------------------

MARKS = {PASSED: "ok", FAILED: "FAILED", UNKNOWN: "??", WARNED: "warning"}


def report_lines(findings: Iterable[Finding]) -> List[str]:
    """The report, one line per finding (and its fix), grouped by step."""
    lines: List[str] = []
    step: Optional[str] = None
    for finding in findings:
        if finding.step != step:
            step = finding.step  # a step's name, or a section's ("Metaflow's AWS ...")
            lines.append(("%s:" if " " in step else "step %s:") % step)
        lines.append("  [%s] %s: %s" % (MARKS[finding.status], finding.check, finding.message))
        if finding.fix:
            lines.append("       %s %s" % ("check:" if finding.status == UNKNOWN else "fix:",
                                            finding.fix))
    return lines


def failures(findings: Iterable[Finding]) -> List[Finding]:
    return [f for f in findings if f.status == FAILED]
