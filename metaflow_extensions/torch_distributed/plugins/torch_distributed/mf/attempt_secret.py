"""Where the nodes of a remote gang find its attempt's secret: the attempt's place in the
run's datastore.

Node 0 draws a fresh secret for each attempt (naming.new_secret) and writes it beside the
attempt's other files in the run's datastore; every node agent reads it there, with the
credentials it already uses for the code package and the artifacts. Nothing a scheduler's API
shows (a job definition or description, a pod spec, a state machine, a WorkflowTemplate)
carries it or anything it is derived from: whoever can read the secret can already read and
change the run's artifacts (docs/security.md).
"""

import time
from typing import Any, Callable

from ..mf import internals
from ..core.errors import TorchDistributedEnvironmentError
from ..core.gangspec import TaskIdentity

# The file's name in the task's datastore directory: `<attempt>.torch_distributed_gang` (JSON).
NAME = "torch_distributed_gang"
# Seconds between two looks for node 0's file.
POLL_S = 0.5


def publish(flow_datastore: Any, identity: TaskIdentity, step_name: str, gang_id: str,
            secret: str) -> None:
    """On node 0, before anything of the gang starts."""
    internals.save_attempt_file(flow_datastore, identity.run_id, step_name, identity.task_id,
                                identity.retry_count, NAME, {"gang_id": gang_id,
                                                             "secret": secret})


def fetch(flow_name: str, identity: TaskIdentity, step_name: str, gang_id: str,
          timeout_s: float, clock: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep) -> str:
    """On a node agent: the secret node 0 published for the attempt `gang_id` of the task
    `identity` (TaskIdentity; its datastore is `identity.orig_datastore`). Waits up to
    `timeout_s` for node 0 to start."""
    flow_datastore = internals.flow_datastore_at(flow_name, identity.orig_datastore)
    deadline = clock() + timeout_s
    while True:
        found = internals.load_attempt_file(flow_datastore, identity.run_id, step_name,
                                            identity.task_id, identity.retry_count, NAME)
        if found is not None and found.get("gang_id") == gang_id:
            return found["secret"]
        if clock() >= deadline:
            raise TorchDistributedEnvironmentError(
                step_name, "node 0 of the gang (task %s/%s/%s, attempt %d) did not publish the "
                "attempt's secret in the run's datastore (%s) within the rendezvous timeout of "
                "%ss: node 0 did not start, or this node cannot read the datastore. Node 0's "
                "log (the task's) tells which." % (identity.run_id, step_name, identity.task_id,
                                                   identity.retry_count,
                                                   identity.orig_datastore, timeout_s))
        sleep(POLL_S)
