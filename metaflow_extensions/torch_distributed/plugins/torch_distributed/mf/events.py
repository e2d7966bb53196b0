"""What happened in a gang, recorded as plain data for its card (card.py).

Nothing here runs on the way to the step body: a rank notes times in memory and writes one small
local file as it enters init_process_group and again when its body ends; node agents and node 0
read those files, and a remote node sends its share to node 0 through the gang's store in one
write, after its ranks are done. The record of a gang
attempt is a JSON-able dict (see `GangRecorder.collect`), saved beside the attempt's own files
in the task's datastore (`<attempt>.torch_distributed_record`), never as an artifact: a join's
`merge_artifacts`, the client's `task.data` and `resume` see only the user's artifacts. A
retry's card reads the earlier attempts' records from there; `gang_record(task)` reads one with
Metaflow's client.
"""

import collections
import json
import os
import socket
import time

from ..mf import internals
from ..core import sealed
from ..core.failures import communication_error

# Lines of each rank's stdout and of its stderr kept for the card.
TAIL_LINES = 30
# Values of one scalar a rank may record; older ones are dropped.
MAX_SCALAR_VALUES = 1000
# The attempt file holding a gang attempt's record (internals.save_attempt_file).
RECORD_FILE = "torch_distributed_record"

_RANK_PREFIX = b"[rank "


def rank_file(work_dir, rank):
    return os.path.join(work_dir, "events-rank-%d.json" % rank)


def node_file(work_dir, node):
    return os.path.join(work_dir, "events-node-%d.json" % node)


def tails_file(work_dir):
    return os.path.join(work_dir, "tails.json")


def write_json(path, data):
    """Write `data` to `path` in one rename, so a reader never sees half of it."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class RankLog:
    """The events of the rank running in this process: when it entered init_process_group,
    when its body ended and how, and the scalars it recorded. They are written to `path` when
    the rank joins a group (a local file, no communication: a rank stopped later still shows
    when it joined) and when its body ends."""

    def __init__(self, rank, path, clock=time.time):
        self.rank = rank
        self.path = path
        self.clock = clock
        self.started = clock()
        self.joined = None
        self.scalars = {}

    def joined_group(self, world_size):
        if self.joined is None:
            self.joined = self.clock()
            self._write(outcome=None, ended=None)

    def record(self, name, value):
        values = self.scalars.setdefault(str(name), [])
        values.append([round(self.clock() - self.started, 6), float(value)])
        del values[:-MAX_SCALAR_VALUES]

    def finish(self, outcome, error=None, symptom=None):
        """`symptom`: whether the error told of a peer's failure (failures.communication_error)."""
        self._write(outcome, self.clock(), error, symptom)

    def _write(self, outcome, ended, error=None, symptom=None):
        write_json(self.path, dict(rank=self.rank, started=self.started, joined=self.joined,
                                   ended=ended, outcome=outcome, error=error, symptom=symptom,
                                   scalars=self.scalars,
                                   # this process's (a forked rank 0 reads the gathered values)
                                   ignored_messages=sealed.IGNORED.counts()))


_current = None


def current_rank_log():
    """The RankLog of this process's rank, or None outside a rank's body."""
    return _current


def note_join(world_size):
    """The rank of this process entered the rendezvous of a group of `world_size` processes."""
    if _current is not None:
        _current.joined_group(world_size)


def run_recorded(rank, path, body):
    """Run `body()` as rank `rank`'s step body, recording its events to `path`."""
    global _current
    _current = log = RankLog(rank, path)
    try:
        body()
    except SystemExit as ex:
        log.finish("finished" if ex.code in (None, 0) else "failed",
                   None if ex.code in (None, 0) else "SystemExit: %s" % ex.code)
        raise
    except BaseException as ex:
        log.finish("failed", "%s: %s" % (type(ex).__name__, ex), communication_error(ex))
        raise
    else:
        log.finish("finished")
    finally:
        _current = None


def node_info(node, master_addr, environ):
    """Where node `node` runs: host name, IP and the scheduler's name for it."""
    info = dict(node=node, host=socket.gethostname(), ip=_local_ip(master_addr))
    if environ.get("AWS_BATCH_JOB_ID"):
        info["batch_job"] = environ.get("AWS_BATCH_JOB_ID")
        info["batch_node_index"] = environ.get("AWS_BATCH_JOB_NODE_INDEX")
    if environ.get("METAFLOW_KUBERNETES_POD_NAME"):  # set by Metaflow's @kubernetes
        info["pod"] = environ["METAFLOW_KUBERNETES_POD_NAME"]
    elif environ.get("KUBERNETES_SERVICE_HOST"):
        info["pod"] = environ.get("HOSTNAME")
    return info


def _local_ip(peer):
    """The address this host uses to reach `peer` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer, 9))
            return s.getsockname()[0]
        except OSError:
            return None


def node_record(info, slots, spawned, joined_at, work_dir=None):
    """A node's share of the record: where it ran, when each of its ranks was started
    (`spawned`, {rank: time}) and how its process ended, (when `work_dir` is given) its
    ranks' own files, and the messages of the gang's store this process ignored because
    their seal did not open (sealed.IGNORED)."""
    ranks = {}
    for slot in slots:
        if slot.rank is None:
            continue
        entry = dict(spawned=spawned.get(slot.rank), exitcode=slot.member.poll())
        if work_dir is not None:
            entry["events"] = read_json(rank_file(work_dir, slot.rank))
        ranks[str(slot.rank)] = entry
    return dict(info, joined_gang=joined_at, ranks=ranks,
                ignored_messages=sealed.IGNORED.counts())


def earlier_attempts(flow_datastore, identity, step_name, attempt):
    """The records of this task's attempts before `attempt`, oldest first; an attempt that
    ended before it saved one (its task process was killed) is left out."""
    found = []
    for earlier in range(attempt):
        try:
            record = internals.load_attempt_file(flow_datastore, identity.run_id, step_name,
                                                 identity.task_id, earlier, RECORD_FILE)
        except Exception:  # noqa: BLE001 - that attempt left nothing readable: show the others
            continue
        if record is not None:
            found.append(record)
    return found


def save_record(flow_datastore, identity, step_name, attempt, record):
    """Keep `record` with the task's attempt `attempt` (see the module's docstring)."""
    internals.save_attempt_file(flow_datastore, identity.run_id, step_name, identity.task_id,
                                attempt, RECORD_FILE, record)


def gang_record(task):
    """The gang's record of a Metaflow client `Task` (the attempt the Task object is of: pass
    `Task(pathspec, attempt=n)` for an earlier one), as its card shows it; None if the attempt
    kept none."""
    return _task_records(task, [task.current_attempt])[0]


def attempt_records(task):
    """(the record of the attempt of client `Task` task, the records of its attempts before,
    oldest first): what the gang's card of that attempt shows. An earlier attempt that kept
    no record is left out; the first is None if this attempt kept none."""
    attempt = task.current_attempt
    found = _task_records(task, range(attempt + 1))
    return found[-1], [record for record in found[:-1] if record is not None]


def _task_records(task, attempts):
    meta = task.metadata_dict
    flow_datastore = internals.flow_datastore_at(
        task.pathspec.split("/")[0], "%s@%s" % (meta["ds-type"], meta["ds-root"]))
    run_id, step_name, task_id = task.pathspec.split("/")[1:]
    found = []
    for attempt in attempts:
        try:
            found.append(internals.load_attempt_file(flow_datastore, run_id, step_name,
                                                     task_id, attempt, RECORD_FILE))
        except Exception:  # noqa: BLE001 - that attempt left nothing readable: show the others
            found.append(None)
    return found


class TailKeeper:
    """A pump sink keeping the last TAIL_LINES lines of each rank's stdout and stderr (lines
    are told apart by their `[rank N]` prefix); `close` writes them to `path`."""

    def __init__(self, path=None):
        self.path = path
        self.tails = collections.defaultdict(lambda: collections.deque(maxlen=TAIL_LINES))

    def __call__(self, target_fd, data):
        stream = "stdout" if target_fd == 1 else "stderr"
        for line in data.split(b"\n"):
            if not line.startswith(_RANK_PREFIX):
                continue
            label, _, text = line.partition(b"] ")
            rank = label[len(_RANK_PREFIX):]
            if rank.isdigit():
                self.tails[(int(rank), stream)].append(text.decode("utf-8", "replace"))

    def as_dict(self):
        out = {}
        for (rank, stream), lines in self.tails.items():
            out.setdefault(str(rank), {})[stream] = list(lines)
        return out

    def close(self):
        if self.path is not None:
            write_json(self.path, self.as_dict())


class GangRecorder:
    """Node 0's view of a gang attempt, put together when the gang has ended."""

    def __init__(self, spec, topology, clock=time.time):
        self.spec = spec
        self.topology = topology
        self.clock = clock
        self.started = clock()
        self.phases = []  # [name, time]
        self.remote_tails = TailKeeper()

    def phase(self, name):
        self.phases.append([name, self.clock()])

    def collect(self, work_dir, slots, spawned, remote_nodes=None, failures=(), root=None,
                stopped=()):
        """The gang attempt's record. `slots` are node 0's processes (`spawned` when each rank
        was started), `remote_nodes` the node
        records remote nodes sent ({node: record}), `failures` the Failures seen, `root` the
        root cause, `stopped` labels of the processes the gang stopped."""
        spec = self.spec
        nodes = {0: node_record(node_info(0, spec.attempt.master_addr, os.environ), slots,
                                {0: self.started, **spawned}, self.started)}
        rank_events = {}
        for rank in range(self.topology.world_size):
            found = read_json(rank_file(work_dir, rank))
            if found is not None:
                rank_events[rank] = found
        for node in range(1, self.topology.nodes):
            found = (remote_nodes or {}).get(node) or read_json(node_file(work_dir, node))
            if found is not None:
                nodes[node] = found
                for rank, entry in found.get("ranks", {}).items():
                    if entry.get("events") and int(rank) not in rank_events:
                        rank_events[int(rank)] = entry["events"]
        rank_events.setdefault(0, read_json(rank_file(work_dir, 0)))
        tails = read_json(tails_file(work_dir)) or {}
        for rank, streams in self.remote_tails.as_dict().items():
            tails.setdefault(rank, {}).update(streams)
        return dict(
            version=1,
            step=spec.blueprint.step_name,
            attempt=spec.attempt.task.retry_count,  # the Metaflow attempt
            gang_id=spec.attempt.gang_id,
            nodes=self.topology.nodes,
            nproc_per_node=self.topology.nproc_per_node,
            accelerator=spec.accelerator,
            backend="nccl" if spec.accelerator == "cuda" else "gloo",
            scheduler=spec.attempt.backend,
            start_method=spec.start_method,
            master_addr=spec.attempt.master_addr,
            master_port=spec.attempt.master_port,
            started=self.started,
            ended=self.clock(),
            phases=self.phases,
            node_info={str(n): r for n, r in nodes.items()},
            ranks={str(r): e for r, e in rank_events.items() if e is not None},
            failures=[json.loads(f.to_json()) for f in failures],
            root_cause=json.loads(root.to_json()) if root is not None else None,
            stopped=list(stopped),
            tails=tails,
            ignored_messages=sealed.merge_counts(
                *(n.get("ignored_messages") for n in nodes.values()),
                # each rank's own process, but a rank 0 that ran in the task (node 0's record)
                *((e or {}).get("ignored_messages") for r, e in rank_events.items()
                  if r != 0 or spec.start_method == "fork")),
        )
