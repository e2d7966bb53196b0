"""The one interface every backend implements: where a gang's nodes come from.

A backend answers four questions, each asked by the decorator at one moment of a run:

1. `launch_env`, in Metaflow's runtime, as it builds the step's command for an attempt: which
   variables tell the process that submits the step (`batch step`, `kubernetes step`: the
   trampoline) to make it a gang.
2. `install`, in step_init of every process that loads the flow: in the process that submits
   the step (at launch) or compiles the flow (at deploy time, `step-functions create`,
   `argo-workflows create`), wrap what Metaflow builds for that step so that it starts the
   gang's nodes. Every wrap is tied to its own step: a flow of N gang steps is N gangs.
3. `node_zero`, in the task: whether this process is node 0 of a gang this backend placed, and
   where it hosts the gang's store.
4. `agent_place`, in a node agent on another machine: its node's index and node 0's address.

The local backend (every node a process of this machine) answers 3 for any task no other
backend placed; the deploy-time backends (Step Functions, Argo Workflows) answer 2 only: at
run time their nodes are those of an AWS Batch job or a JobSet, placed by those backends.
"""

import abc
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Mapping, NoReturn, Optional, Sequence

from ..core.errors import TorchDistributedEnvironmentError, TorchDistributedException
from ..core.gangspec import AgentOrder, Blueprint, NodeZero, TaskIdentity
from ..core.topology import Topology


@dataclass(frozen=True)
class GangStep:
    """What the decorator knows of a gang step when a backend is asked about it."""

    blueprint: Blueprint
    topology: Topology
    decorator_name: str
    # the step's decorators, as Metaflow gave them to step_init (which ones send it away)
    decorators: Sequence[Any]
    graph: Any  # Metaflow's FlowGraph
    # METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL: emulate the nodes here even on a remote backend
    rehearsal: bool = False

    @property
    def step_name(self) -> str:
        return self.blueprint.step_name

    def decorated_with(self, name: str) -> bool:
        return any(d.name == name for d in self.decorators)


@dataclass(frozen=True)
class AgentPlace:
    """Where a node agent on another machine stands, as its scheduler tells it."""

    node: int
    master_addr: str  # node 0's address, where its store listens


class Backend(abc.ABC):
    """Where a gang's nodes come from. Every method has a default that does nothing (or, for
    `agent_place`, refuses): each backend answers the questions of its moments."""

    #: Attempt.backend of the gangs it places; for a deploy-time backend, its scheduler's
    #: command (schedulers.deploy_target)
    name: ClassVar[str]

    def launch_env(self, step: GangStep) -> Dict[str, str]:
        """Variables of the step's command (Metaflow's runtime, every attempt this backend
        runs) that make the process that submits it install this backend."""
        return {}

    def install(self, step: GangStep, environ: Mapping[str, str],
                deploy_target: Optional[str]) -> None:
        """Wrap what Metaflow builds for `step` in this process, when this process submits the
        step to this backend (`environ` says so) or compiles the flow for it (`deploy_target`,
        the scheduler the command deploys to)."""

    def node_zero(self, step: GangStep, environ: Mapping[str, str],
                  identity: TaskIdentity) -> Optional[NodeZero]:
        """This process's place when it is node 0 of a gang this backend placed, else None."""
        return None

    def agent_place(self, order: AgentOrder, environ: Mapping[str, str]) -> AgentPlace:
        """A node agent's place, read from what its scheduler set on its node."""
        raise TorchDistributedEnvironmentError(
            order.blueprint.step_name, "a node agent of backend %r cannot run here: %s places "
            "no agents." % (order.backend, self.name))

    def agent_misplaced(self, error: TorchDistributedException) -> NoReturn:
        """What a node agent that cannot take its place does: raise `error` (the step fails
        with it), unless the scheduler needs another way."""
        raise error
