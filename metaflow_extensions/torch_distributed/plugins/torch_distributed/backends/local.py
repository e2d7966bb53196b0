"""The user's own machine: every node of a gang is a process of this host (`python flow.py
run`). Node 0's task starts the other nodes' agents itself (gang.Leader), so this backend
submits and compiles nothing; it places node 0 of every gang no other backend placed, and
refuses to emulate nodes on a remote backend's machine that was not given them
(schedulers.check_single_host)."""

from typing import Mapping

from ..core import naming
from ..core.gangspec import LOCAL, NodeZero, TaskIdentity
from . import schedulers
from .base import Backend, GangStep

# The store listens on the loopback address only, on any free port (bound before any rank
# starts: no port race).
LOOPBACK = "127.0.0.1"


class LocalBackend(Backend):
    name = LOCAL

    def node_zero(self, step: GangStep, environ: Mapping[str, str],
                  identity: TaskIdentity) -> NodeZero:
        schedulers.check_single_host(step.step_name, step.topology, environ, step.rehearsal)
        return NodeZero(LOOPBACK, 0, naming.new_secret(), self.name)


BACKEND = LocalBackend()
