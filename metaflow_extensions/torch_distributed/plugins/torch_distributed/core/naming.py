"""Names derived from a gang's identity, defined once: ids, hidden task ids, ports, store keys,
labels."""

import hashlib
import secrets
from typing import Optional, Union

# Prefix of every key our control plane writes to the gang's TCPStore; torch's own keys
# (written by init_process_group) live under other prefixes. Key names are public (anyone who
# reaches the store can list them): nothing secret is in them, and every value the package
# reads is sealed under the attempt's secret instead (sealed.py).
_KEY_PREFIX = "mftd/"
KEY_PREFIX = _KEY_PREFIX  # every key the package writes begins with it
# The one value not sealed: the gang id, so that a node that reached another gang's store can
# say whose it is (ControlPlane.connect). Nothing is decided on its value.
PUBLIC_GANG_KEY = _KEY_PREFIX + "gang"


# Prefix of torch's own keys (init_process_group's, gloo's, NCCL's) in the gang's store: ranks
# reach the store through runtime/rendezvous_seal.py, which puts them under a prefix of their
# round, so a round never reads what a stopped round's process groups wrote.
TORCH_KEY_PREFIX = "torch/"


def torch_key_prefix(round_: int) -> str:
    """Where the process groups of the gang's round `round_` keep their keys."""
    return "%sr%d/" % (TORCH_KEY_PREFIX, round_)


def gang_id(run_id: str, step_name: str, task_id: str, attempt: int) -> str:
    """Unique per task attempt: TORCHELASTIC_RUN_ID, and the guard against cross-gang joins."""
    return "%s-%s-%s-%s" % (run_id, step_name, task_id, attempt)


# Ports a remote gang's store may use: above the privileged and well-known service ports and
# below Linux's default ephemeral range (32768-60999), so no outgoing connection holds one.
REMOTE_PORT_RANGE = (20000, 32767)


def remote_port(run_id: str, step_name: str, task_id: str, attempt: int) -> int:
    """The store port of a gang whose nodes are separate machines (node 0 cannot bind port 0
    and tell the others): fixed by run, step, task and attempt, so a retry moves to another."""
    digest = hashlib.sha256(gang_id(run_id, step_name, task_id, attempt).encode()).digest()
    low, high = REMOTE_PORT_RANGE
    return low + int.from_bytes(digest[:4], "big") % (high - low + 1)


def new_secret() -> str:
    """A gang attempt's secret, drawn by node 0 when the attempt starts: every value the
    package reads from the gang's store is sealed under it (sealed.py), so a client that
    merely reaches node 0's port can neither steer the gang nor run code in it. Locally it
    reaches members in memory or in their process environment; remote nodes read it from the
    attempt's place in the run's datastore (secret_store.py), never from a job definition."""
    return secrets.token_hex(32)


def hidden_task_id(task_id: str, node: Union[int, str],
                   local_rank: Optional[int] = None) -> str:
    """The task id a member process runs under (never registered with the real metadata).
    `task_id` and `node` may be shell words the member's node expands (a remote node agent's
    command: its node index is known on its node only)."""
    hidden = "%s-node-%s" % (task_id, node)
    return hidden if local_rank is None else "%s-rank-%d" % (hidden, local_rank)


def task_of_agent(hidden: str, node: int) -> Optional[str]:
    """The task id of the node agent of `node` whose hidden task id is `hidden`, or None when
    `hidden` is not one (hidden_task_id)."""
    suffix = "-node-%d" % node
    return hidden[:-len(suffix)] if hidden.endswith(suffix) else None


def rank_label(rank: int) -> str:
    return "[rank %d]" % rank


def agent_label(node: int) -> str:
    return "[node %d agent]" % node


def node_join_id(node: int) -> str:
    """The control-plane check-in of a node agent."""
    return "node%d" % node


def rank_join_id(rank: int) -> str:
    """The control-plane check-in of an exec'd rank."""
    return "rank%d" % rank


class Keys:
    """Keys of the control plane in the gang's store (public names: see _KEY_PREFIX).

    A restart in place starts a new round of the gang on the same store: what a round's
    ranks and nodes say (check-ins, failures, the abort, gathers, progress) is under a prefix
    of its own from round 1 on, so nothing a stopped round wrote is read as the new one's.
    The store's claim, heartbeats, stacks requests and shipped logs belong to the attempt."""

    _prefix = _KEY_PREFIX

    def __init__(self, round_: int = 0) -> None:
        self.round = round_
        self._round = "" if not round_ else "round/%d/" % round_

    @property
    def gang(self) -> str:
        """node 0's claim of the store for its gang attempt (sealed: ControlPlane.connect)"""
        return self._prefix + "claim"

    @property
    def abort(self) -> str:
        return self._prefix + self._round + "abort"

    @property
    def checkpoint(self) -> str:
        """node 0's @checkpoint, for the agents of remote nodes (checkpoints.gang_fields, JSON)"""
        return self._prefix + self._round + "checkpoint"

    def joined(self, join_id: str) -> str:
        return "%sjoined/%s" % (self._prefix + self._round, join_id)

    def done(self, node: int) -> str:
        return "%snode/%d/done" % (self._prefix + self._round, node)

    def failure(self, node: int) -> str:
        return "%snode/%d/failure" % (self._prefix + self._round, node)

    def own_failures(self, node: int) -> str:
        """The failures of node `node`'s ranks that failed on their own, as its agent found them
        once it stopped them (JSON)."""
        return "%snode/%d/own-failures" % (self._prefix + self._round, node)

    def running(self, node: int) -> str:
        """The ranks of node `node` still running when its agent reported a failure (JSON)."""
        return "%snode/%d/running" % (self._prefix + self._round, node)

    def rank_done(self, rank: int) -> str:
        """Set when rank `rank` (a member on a node other than 0) finished its step body."""
        return "%srank/%d/done" % (self._prefix + self._round, rank)

    def beat(self, node: int) -> str:
        """How many heartbeats node `node` has sent while it is alive."""
        return "%snode/%d/beat" % (self._prefix, node)

    @property
    def preempt(self) -> str:
        """Set by node 0 when the gang is preempted: every node forwards SIGTERM to its ranks."""
        return self._prefix + self._round + "preempt"

    @property
    def stacks(self) -> str:
        """How many times node 0 asked for every rank's stacks (SIGUSR1 to the task): each
        node has its ranks dump theirs when the count grows (stacks.py, on demand)."""
        return self._prefix + "stacks"

    def preempted(self, node: int) -> str:
        """Set by node `node`'s agent when a SIGTERM reached it (node 0 preempts the gang)."""
        return "%snode/%d/preempted" % (self._prefix + self._round, node)

    def progress(self, node: int) -> str:
        """Where node `node`'s ranks stand, for node 0's hang verdict (JSON, see stacks.py)."""
        return "%snode/%d/progress" % (self._prefix + self._round, node)

    def log_chunk(self, node: int, seq: int) -> str:
        """The `seq`-th (from 1) chunk of output node `node` shipped to node 0."""
        return "%snode/%d/log/%d" % (self._prefix, node, seq)

    def log_end(self, node: int) -> str:
        """Set when node `node` has shipped its last log chunk."""
        return "%snode/%d/log/end" % (self._prefix, node)

    def facts(self, node: int) -> str:
        """What node `node` runs with (versions, code package, GPUs), as it reported it at the
        rendezvous (JSON, see nodefacts.py): node 0's is what every other node must match."""
        return "%snode/%d/facts" % (self._prefix, node)

    def checked(self, node: int) -> str:
        """Set by node `node`'s agent once its facts matched node 0's: no rank of the gang
        runs the step's code before every node's is set (gang/common.py: wait_for_nodes)."""
        return "%snode/%d/checked" % (self._prefix, node)

    def node_events(self, node: int) -> str:
        """Node `node`'s share of the gang's record for its card (JSON, see events.py)."""
        return "%snode/%d/events" % (self._prefix, node)

    def stopped(self, node: int) -> str:
        """Set by node `node`'s agent once every rank of its round has stopped, as it waits
        for node 0's word on the next round (restarts in place)."""
        return "%snode/%d/stopped" % (self._prefix + self._round, node)

    @property
    def word(self) -> str:
        """Node 0's word on what follows the round, for the nodes that wait for it (restarts
        in place): "restart" (the next round starts) or "end"."""
        return self._prefix + self._round + "word"

    @property
    def nodes_news(self) -> str:
        """A token nodes 1..N-1 renew after each message for node 0 (unsealed: it only says
        "look again", runtime/control.py)."""
        return self._prefix + "news/nodes"

    @property
    def leader_news(self) -> str:
        """A token node 0 renews after each message for the other nodes (as nodes_news)."""
        return self._prefix + "news/leader"

    def gather(self, seq: int, rank: int) -> str:
        return "%sgather/%d/%d" % (self._prefix + self._round, seq, rank)
