"""Names derived from a gang's identity, defined once: ids, hidden task ids, ports, store keys,
labels."""

import hashlib

# Prefix of every key our control plane writes to the gang's TCPStore; torch's own keys
# (written by init_process_group) live under other prefixes.
_KEY_PREFIX = "mftd/"


def gang_id(run_id, step_name, task_id, attempt):
    """Unique per task attempt: TORCHELASTIC_RUN_ID, and the guard against cross-gang joins."""
    return "%s-%s-%s-%s" % (run_id, step_name, task_id, attempt)


# Ports a remote gang's store may use: above the privileged and well-known service ports and
# below Linux's default ephemeral range (32768-60999), so no outgoing connection holds one.
REMOTE_PORT_RANGE = (20000, 32767)


def remote_port(run_id, step_name, task_id, attempt):
    """The store port of a gang whose nodes are separate machines (node 0 cannot bind port 0
    and tell the others): fixed by run, step, task and attempt, so a retry moves to another."""
    digest = hashlib.sha256(gang_id(run_id, step_name, task_id, attempt).encode()).digest()
    low, high = REMOTE_PORT_RANGE
    return low + int.from_bytes(digest[:4], "big") % (high - low + 1)


def hidden_task_id(task_id, node, local_rank=None):
    """The task id a member process runs under (never registered with the real metadata)."""
    if local_rank is None:
        return "%s-node-%d" % (task_id, node)
    return "%s-node-%d-rank-%d" % (task_id, node, local_rank)


def rank_label(rank):
    return "[rank %d]" % rank


def agent_label(node):
    return "[node %d agent]" % node


def node_join_id(node):
    """The control-plane check-in of a node agent."""
    return "node%d" % node


def rank_join_id(rank):
    """The control-plane check-in of an exec'd rank."""
    return "rank%d" % rank


class Keys:
    """Keys of the control plane in the gang's store."""

    gang = _KEY_PREFIX + "gang"
    abort = _KEY_PREFIX + "abort"
    # node 0's @checkpoint, for the agents of remote nodes (checkpoints.gang_fields, JSON)
    checkpoint = _KEY_PREFIX + "checkpoint"

    @staticmethod
    def joined(join_id):
        return "%sjoined/%s" % (_KEY_PREFIX, join_id)

    @staticmethod
    def done(node):
        return "%snode/%d/done" % (_KEY_PREFIX, node)

    @staticmethod
    def failure(node):
        return "%snode/%d/failure" % (_KEY_PREFIX, node)

    @staticmethod
    def running(node):
        """The ranks of node `node` still running when its agent reported a failure (JSON)."""
        return "%snode/%d/running" % (_KEY_PREFIX, node)

    @staticmethod
    def rank_done(rank):
        """Set when rank `rank` (a member on a node other than 0) finished its step body."""
        return "%srank/%d/done" % (_KEY_PREFIX, rank)

    @staticmethod
    def beat(node):
        """A counter node `node` increments while it is alive."""
        return "%snode/%d/beat" % (_KEY_PREFIX, node)

    @staticmethod
    def log_count(node):
        """How many log chunks node `node` has shipped to node 0."""
        return "%snode/%d/log" % (_KEY_PREFIX, node)

    @staticmethod
    def log_chunk(node, seq):
        return "%snode/%d/log/%d" % (_KEY_PREFIX, node, seq)

    @staticmethod
    def log_end(node):
        """Set when node `node` has shipped its last log chunk."""
        return "%snode/%d/log/end" % (_KEY_PREFIX, node)

    @staticmethod
    def node_events(node):
        """Node `node`'s share of the gang's record for its card (JSON, see events.py)."""
        return "%snode/%d/events" % (_KEY_PREFIX, node)

    @staticmethod
    def gather(seq, rank):
        return "%sgather/%d/%d" % (_KEY_PREFIX, seq, rank)
