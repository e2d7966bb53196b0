"""Names derived from a gang's identity, defined once: ids, hidden task ids, store keys, labels."""

# Prefix of every key our control plane writes to the gang's TCPStore; torch's own keys
# (written by init_process_group) live under other prefixes.
_KEY_PREFIX = "mftd/"


def gang_id(run_id, step_name, task_id, attempt):
    """Unique per task attempt: TORCHELASTIC_RUN_ID, and the guard against cross-gang joins."""
    return "%s-%s-%s-%s" % (run_id, step_name, task_id, attempt)


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
    def gather(seq, rank):
        return "%sgather/%d/%d" % (_KEY_PREFIX, seq, rank)
