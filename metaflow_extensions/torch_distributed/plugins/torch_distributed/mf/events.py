"""What happened in a gang, recorded as plain data for its card (card.py).

Nothing here runs on the way to the step body: a rank notes times in memory and writes one small
local file as it enters init_process_group and again when its body ends; node agents and node 0
read those files, and a remote node sends its share to node 0 through the gang's store in one
write, after its ranks are done. The record of a gang attempt is a `GangRecord` (see
`GangRecorder.collect`): frozen dataclasses read by attribute, each with a JSON round-trip
(`to_dict`, `from_dict`). Its JSON form is saved beside the attempt's own files in the task's
datastore (`<attempt>.torch_distributed_record`), never as an artifact: a join's
`merge_artifacts`, the client's `task.data` and `resume` see only the user's artifacts. A
retry's card reads the earlier attempts' records from there; `gang_record(task)` reads one with
Metaflow's client.

The records, from the smallest:

- `RankRecord`: what a rank wrote of itself (`RankLog`): its times, how its body ended, its
  scalars;
- `NodeInfo` and `NodeRecord`: where a node ran, and its share of the record (when each of its
  ranks was started and how its process ended, and, from a remote node, the ranks' own
  records);
- `RestartRecord` and `RoundRecord`: a round of a gang restarted in place (its root cause, and
  what its ranks did until the gang stopped them);
- `GangRecord`: the whole attempt.
"""

import collections
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Callable, Deque, Dict, Iterable, List, Mapping,
                    NamedTuple, Optional, Sequence, Tuple, TypeVar)

from ..mf import internals
from ..core import sealed
from ..core.failures import Failure, communication_error
from ..core.gangspec import GangSpec, TaskIdentity
from ..core.topology import Topology

if TYPE_CHECKING:
    from ..runtime.stacks import Report
    from ..runtime.supervisor import Slot

# Lines of each rank's stdout and of its stderr kept for the card.
TAIL_LINES = 30
# Values of one scalar a rank may record; older ones are dropped.
MAX_SCALAR_VALUES = 1000
# What a rank's probe sends for the live card (RankLog.live): the last value of at most
# LIVE_SCALARS of its scalars, and, from rank 0 (whose probe node 0 reads from its own disk),
# at most LIVE_SERIES_VALUES values of each of its first LIVE_SERIES scalars, to plot.
LIVE_SCALARS = 16
LIVE_SERIES = 8
LIVE_SERIES_VALUES = 200
# Seconds between two writes of node 0's tails file while the gang runs (TailKeeper): the live
# card shows each rank's last lines from it.
LIVE_TAILS_INTERVAL = 2.0
# The attempt file holding a gang attempt's record (internals.save_attempt_file).
RECORD_FILE = "torch_distributed_record"
# The version of the record's JSON form (GangRecord.to_dict).
RECORD_VERSION = 1

_RANK_PREFIX = b"[rank "

# The JSON form of a record (to_dict): a dict of JSON values, as json.load gives it back.
JsonDict = Dict[str, Any]
# Messages of the gang's store a process ignored, by kind (sealed.IGNORED.counts()).
Counts = Dict[str, int]
# The last lines of each rank's output: {rank: {"stdout" or "stderr": lines}}.
Tails = Dict[int, Dict[str, List[str]]]
# The values one rank recorded of one scalar: (seconds since the rank started, value).
ScalarValues = List[Tuple[float, float]]

_T = TypeVar("_T")


def _by_rank(data: Optional[Mapping[str, Any]], build: Callable[[Any], _T]) -> Dict[int, _T]:
    """{int(key): build(value)} of a JSON object keyed by rank or node number."""
    return {int(key): build(value) for key, value in (data or {}).items()}


@dataclass(frozen=True)
class RankRecord:
    """What a rank wrote of itself (RankLog): when it started, entered init_process_group and
    ended, how its body ended ("finished", "failed", None while it runs) and with which error
    ("Type: message"), whether that error told of a peer's failure
    (failures.communication_error), the scalars it recorded, and the messages of the gang's
    store its process ignored (sealed.IGNORED)."""

    rank: int
    started: float
    joined: Optional[float] = None
    ended: Optional[float] = None
    outcome: Optional[str] = None
    error: Optional[str] = None
    symptom: Optional[bool] = None
    scalars: Dict[str, ScalarValues] = field(default_factory=dict)
    ignored_messages: Counts = field(default_factory=dict)

    def to_dict(self) -> JsonDict:
        return dict(rank=self.rank, started=self.started, joined=self.joined, ended=self.ended,
                    outcome=self.outcome, error=self.error, symptom=self.symptom,
                    scalars={name: [[t, v] for t, v in values]
                             for name, values in self.scalars.items()},
                    ignored_messages=dict(self.ignored_messages))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RankRecord":
        return cls(rank=data["rank"], started=data["started"], joined=data.get("joined"),
                   ended=data.get("ended"), outcome=data.get("outcome"), error=data.get("error"),
                   symptom=data.get("symptom"),
                   scalars={name: [(t, v) for t, v in values]
                            for name, values in (data.get("scalars") or {}).items()},
                   ignored_messages=dict(data.get("ignored_messages") or {}))


@dataclass(frozen=True)
class RankProcess:
    """A rank's process as its node saw it: when it was started, its exit code (None while it
    ran), and (from a remote node, whose files node 0 cannot read) the rank's own record."""

    spawned: Optional[float]
    exitcode: Optional[int]
    events: Optional[RankRecord] = None

    def to_dict(self) -> JsonDict:
        return dict(spawned=self.spawned, exitcode=self.exitcode,
                    events=None if self.events is None else self.events.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RankProcess":
        events = data.get("events")
        return cls(spawned=data.get("spawned"), exitcode=data.get("exitcode"),
                   events=None if events is None else RankRecord.from_dict(events))


@dataclass(frozen=True)
class NodeInfo:
    """Where a node ran: its host name, its IP and the scheduler's name for it (an AWS Batch
    job and node index, a Kubernetes pod)."""

    node: int
    host: str
    ip: Optional[str]
    batch_job: Optional[str] = None
    batch_node_index: Optional[str] = None
    pod: Optional[str] = None

    def to_dict(self) -> JsonDict:
        return dict(node=self.node, host=self.host, ip=self.ip, batch_job=self.batch_job,
                    batch_node_index=self.batch_node_index, pod=self.pod)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NodeInfo":
        return cls(node=data["node"], host=data["host"], ip=data.get("ip"),
                   batch_job=data.get("batch_job"),
                   batch_node_index=data.get("batch_node_index"), pod=data.get("pod"))


@dataclass(frozen=True)
class NodeRecord:
    """A node's share of the record: where it ran (`info`), when it joined the gang, its ranks'
    processes by rank, and the messages of the gang's store its process ignored because their
    seal did not open (sealed.IGNORED). Its JSON form is flat: `info`'s fields, then the
    others."""

    info: NodeInfo
    joined_gang: Optional[float]
    ranks: Dict[int, RankProcess] = field(default_factory=dict)
    ignored_messages: Counts = field(default_factory=dict)

    @classmethod
    def of_node(cls, info: NodeInfo, slots: Iterable["Slot"], spawned: Mapping[int, float],
                joined_at: Optional[float], work_dir: Optional[str] = None) -> "NodeRecord":
        """The share of the node `info` tells of: when each of its ranks was started (`spawned`,
        {rank: time}) and how its process (of `slots`) ended, (when `work_dir` is given) its
        ranks' own files, and the messages this process ignored."""
        ranks = {}
        for slot in slots:
            if slot.rank is None:
                continue
            own = read_json(rank_file(work_dir, slot.rank)) if work_dir is not None else None
            ranks[slot.rank] = RankProcess(
                spawned.get(slot.rank), slot.member.poll(),
                None if own is None else RankRecord.from_dict(own))
        return cls(info, joined_at, ranks, sealed.IGNORED.counts())

    def to_dict(self) -> JsonDict:
        return dict(self.info.to_dict(), joined_gang=self.joined_gang,
                    ranks={str(rank): process.to_dict() for rank, process in self.ranks.items()},
                    ignored_messages=dict(self.ignored_messages))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NodeRecord":
        return cls(info=NodeInfo.from_dict(data), joined_gang=data.get("joined_gang"),
                   ranks=_by_rank(data.get("ranks"), RankProcess.from_dict),
                   ignored_messages=dict(data.get("ignored_messages") or {}))


@dataclass(frozen=True)
class RestartRecord:
    """A round of a gang restarted in place: its number (0 for the first), when its root cause
    was seen, and that cause in one sentence (Failure.sentence)."""

    round: int
    at: float
    sentence: str

    @classmethod
    def of_failure(cls, round_: int, root_cause: Failure) -> "RestartRecord":
        return cls(round_, root_cause.detected_at, root_cause.sentence())

    def to_dict(self) -> JsonDict:
        return dict(round=self.round, at=self.at, sentence=self.sentence)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RestartRecord":
        return cls(round=data["round"], at=data["at"], sentence=data["sentence"])


@dataclass(frozen=True)
class RoundRecord:
    """What the card shows of a round that was restarted in place: when it started and when
    the gang stopped it, its ranks' own records, its nodes' shares and its failures."""

    round: int
    started: float
    ended: float
    ranks: Dict[int, RankRecord] = field(default_factory=dict)
    node_info: Dict[int, NodeRecord] = field(default_factory=dict)
    failures: Tuple[Failure, ...] = ()

    def to_dict(self) -> JsonDict:
        return dict(round=self.round, started=self.started, ended=self.ended,
                    ranks={str(rank): own.to_dict() for rank, own in self.ranks.items()},
                    node_info={str(node): share.to_dict()
                               for node, share in self.node_info.items()},
                    failures=[f.to_dict() for f in self.failures])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RoundRecord":
        return cls(round=data["round"], started=data["started"], ended=data["ended"],
                   ranks=_by_rank(data.get("ranks"), RankRecord.from_dict),
                   node_info=_by_rank(data.get("node_info"), NodeRecord.from_dict),
                   failures=tuple(Failure(**f) for f in data.get("failures") or ()))


@dataclass(frozen=True)
class GangRecord:
    """The record of one gang attempt, what its card shows: the gang's shape and where its
    store listened; when it started and ended and its phases ((name, time): abort, restart);
    every node's share (`node_info`) and every rank's own record (`ranks`), by number; the
    failures seen and the root cause; the labels of the processes the gang stopped; each rank's
    last lines; the messages of the gang's store every process ignored; and, for a gang
    restarted in place, each restarted round (`restarts`, `rounds`)."""

    step: str
    attempt: int  # the Metaflow attempt
    gang_id: str
    nodes: int
    nproc_per_node: int
    accelerator: str
    backend: str  # "nccl" or "gloo"
    scheduler: str  # the Attempt's backend: "local", "batch", "kubernetes"
    start_method: str
    master_addr: str
    master_port: int
    started: float
    ended: float
    phases: Tuple[Tuple[str, float], ...] = ()
    node_info: Dict[int, NodeRecord] = field(default_factory=dict)
    ranks: Dict[int, RankRecord] = field(default_factory=dict)
    failures: Tuple[Failure, ...] = ()
    root_cause: Optional[Failure] = None
    stopped: Tuple[str, ...] = ()
    tails: Tails = field(default_factory=dict)
    ignored_messages: Counts = field(default_factory=dict)
    restarts: Tuple[RestartRecord, ...] = ()
    rounds: Tuple[RoundRecord, ...] = ()
    # what node 0's straggler watch saw last (core/stragglers.py): each rank's share of the
    # looks in which it waited in a collective, over `waiting_span_s` s, and the straggler
    waiting: Dict[int, float] = field(default_factory=dict)
    waiting_span_s: float = 0.0
    straggler: Optional[int] = None
    version: int = RECORD_VERSION

    def as_round(self, round_: int, started: float, ended: float) -> RoundRecord:
        """This record's ranks, nodes and failures as those of round `round_` of a gang
        restarted in place, which ran from `started` until the gang stopped it at `ended`."""
        return RoundRecord(round_, started, ended, self.ranks, self.node_info, self.failures)

    def to_dict(self) -> JsonDict:
        return dict(
            version=self.version, step=self.step, attempt=self.attempt, gang_id=self.gang_id,
            nodes=self.nodes, nproc_per_node=self.nproc_per_node, accelerator=self.accelerator,
            backend=self.backend, scheduler=self.scheduler, start_method=self.start_method,
            master_addr=self.master_addr, master_port=self.master_port, started=self.started,
            ended=self.ended, phases=[[name, t] for name, t in self.phases],
            node_info={str(node): share.to_dict() for node, share in self.node_info.items()},
            ranks={str(rank): own.to_dict() for rank, own in self.ranks.items()},
            failures=[f.to_dict() for f in self.failures],
            root_cause=None if self.root_cause is None else self.root_cause.to_dict(),
            stopped=list(self.stopped),
            tails={str(rank): {stream: list(lines) for stream, lines in streams.items()}
                   for rank, streams in self.tails.items()},
            ignored_messages=dict(self.ignored_messages),
            restarts=[r.to_dict() for r in self.restarts],
            rounds=[r.to_dict() for r in self.rounds],
            waiting={str(rank): share for rank, share in self.waiting.items()},
            waiting_span_s=self.waiting_span_s, straggler=self.straggler)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GangRecord":
        """A record from its JSON form, this release's or an earlier one's (which may lack the
        fields added since: each then has its empty value)."""
        root = data.get("root_cause")
        return cls(
            step=data["step"], attempt=data["attempt"], gang_id=data["gang_id"],
            nodes=data["nodes"], nproc_per_node=data["nproc_per_node"],
            accelerator=data["accelerator"], backend=data["backend"],
            scheduler=data["scheduler"], start_method=data["start_method"],
            master_addr=data["master_addr"], master_port=data["master_port"],
            started=data["started"], ended=data["ended"],
            phases=tuple((name, t) for name, t in data.get("phases") or ()),
            node_info=_by_rank(data.get("node_info"), NodeRecord.from_dict),
            ranks=_by_rank(data.get("ranks"), RankRecord.from_dict),
            failures=tuple(Failure(**f) for f in data.get("failures") or ()),
            root_cause=None if root is None else Failure(**root),
            stopped=tuple(data.get("stopped") or ()),
            tails=_by_rank(data.get("tails"), dict),
            ignored_messages=dict(data.get("ignored_messages") or {}),
            restarts=tuple(RestartRecord.from_dict(r) for r in data.get("restarts") or ()),
            rounds=tuple(RoundRecord.from_dict(r) for r in data.get("rounds") or ()),
            waiting=_by_rank(data.get("waiting"), float),
            waiting_span_s=float(data.get("waiting_span_s") or 0.0),
            straggler=data.get("straggler"),
            version=data.get("version", RECORD_VERSION))


class LiveView(NamedTuple):
    """A running gang as its live card shows it (Leader.live_view): its record so far, and
    where each rank stood when node 0's watch last read the hang probes (`reports`, {rank:
    stacks report}, read at `at` by the watch's monotonic clock; empty while hang detection
    is off or before the first read)."""

    record: GangRecord
    at: float
    reports: Dict[int, "Report"]


def rank_file(work_dir: str, rank: int) -> str:
    return os.path.join(work_dir, "events-rank-%d.json" % rank)


def node_file(work_dir: str, node: int) -> str:
    return os.path.join(work_dir, "events-node-%d.json" % node)


def tails_file(work_dir: str) -> str:
    return os.path.join(work_dir, "tails.json")


def write_json(path: str, data: object) -> None:
    """Write `data` to `path` in one rename, so a reader never sees half of it."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    """What `path` holds (JSON), or None if it cannot be read."""
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

    def __init__(self, rank: int, path: str, clock: Callable[[], float] = time.time) -> None:
        self.rank = rank
        self.path = path
        self.clock = clock
        self.started = clock()
        self.joined: Optional[float] = None
        self.scalars: Dict[str, ScalarValues] = {}
        # the last current.torch_distributed.progress(step, total): (step, total or None,
        # seconds since the rank started)
        self.progress: Optional[Tuple[float, Optional[float], float]] = None

    def joined_group(self, world_size: int) -> None:
        if self.joined is None:
            self.joined = self.clock()
            self._write(outcome=None, ended=None)

    def record(self, name: str, value: float) -> None:
        values = self.scalars.setdefault(str(name), [])
        values.append((round(self.clock() - self.started, 6), float(value)))
        del values[:-MAX_SCALAR_VALUES]

    def report_progress(self, step: float, total: Optional[float]) -> None:
        self.progress = (step, total, round(self.clock() - self.started, 6))

    def live(self, series: bool) -> JsonDict:
        """What the rank's probe sends for the live card (runtime/stacks.py Probe, read by
        node 0: card.py LiveCard): its last progress, the last value of its first LIVE_SCALARS
        scalars and, with `series` (rank 0), the values of its first LIVE_SERIES scalars,
        thinned to LIVE_SERIES_VALUES. Called from the probe's thread while the body records:
        it reads copies (list() of a dict or list is one step under the GIL)."""
        out: JsonDict = {}
        if self.progress is not None:
            out["progress"] = list(self.progress)
        names = list(self.scalars)[:LIVE_SCALARS]
        last = {name: values[-1][1] for name in names
                for values in [list(self.scalars.get(name) or ())] if values}
        if last:
            out["scalars"] = last
        if series and last:
            out["series"] = {name: [list(v) for v in thinned(list(self.scalars[name]),
                                                             LIVE_SERIES_VALUES)]
                             for name in names[:LIVE_SERIES]}
        return out

    def finish(self, outcome: str, error: Optional[str] = None,
               symptom: Optional[bool] = None) -> None:
        """`symptom`: whether the error told of a peer's failure (failures.communication_error)."""
        self._write(outcome, self.clock(), error, symptom)

    def _write(self, outcome: Optional[str], ended: Optional[float], error: Optional[str] = None,
               symptom: Optional[bool] = None) -> None:
        write_json(self.path, RankRecord(
            self.rank, self.started, self.joined, ended, outcome, error, symptom, self.scalars,
            # this process's (a forked rank 0 reads the gathered values)
            ignored_messages=sealed.IGNORED.counts()).to_dict())


_current: Optional[RankLog] = None


def current_rank_log() -> Optional[RankLog]:
    """The RankLog of this process's rank, or None outside a rank's body."""
    return _current


def live_of_rank(series: bool) -> Optional[JsonDict]:
    """RankLog.live of this process's rank (None outside its body): what its probe sends."""
    log = _current
    return None if log is None else log.live(series)


def thinned(values: Sequence[_T], most: int) -> List[_T]:
    """At most `most` of `values`, evenly spread, the last one always kept."""
    if len(values) <= most:
        return list(values)
    step = (len(values) - 1) / (most - 1)
    return [values[round(i * step)] for i in range(most)]


def note_join(world_size: int) -> None:
    """The rank of this process entered the rendezvous of a group of `world_size` processes."""
    if _current is not None:
        _current.joined_group(world_size)


def run_recorded(rank: int, path: str, body: Callable[[], object]) -> None:
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


def node_info(node: int, master_addr: str, environ: Mapping[str, str]) -> NodeInfo:
    """Where node `node` runs: host name, IP and the scheduler's name for it."""
    batch_job = environ.get("AWS_BATCH_JOB_ID") or None
    pod = None
    if environ.get("METAFLOW_KUBERNETES_POD_NAME"):  # set by Metaflow's @kubernetes
        pod = environ["METAFLOW_KUBERNETES_POD_NAME"]
    elif environ.get("KUBERNETES_SERVICE_HOST"):
        pod = environ.get("HOSTNAME")
    return NodeInfo(node, socket.gethostname(), _local_ip(master_addr), batch_job=batch_job,
                    batch_node_index=environ.get("AWS_BATCH_JOB_NODE_INDEX") if batch_job
                    else None, pod=pod)


def _local_ip(peer: str) -> Optional[str]:
    """The address this host uses to reach `peer` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((peer, 9))
            return str(s.getsockname()[0])
        except OSError:
            return None


def earlier_attempts(flow_datastore: Any, identity: TaskIdentity, step_name: str,
                     attempt: int) -> List[GangRecord]:
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
            found.append(GangRecord.from_dict(record))
    return found


def save_record(flow_datastore: Any, identity: TaskIdentity, step_name: str, attempt: int,
                record: GangRecord) -> None:
    """Keep `record` with the task's attempt `attempt` (see the module's docstring)."""
    internals.save_attempt_file(flow_datastore, identity.run_id, step_name, identity.task_id,
                                attempt, RECORD_FILE, record.to_dict())


def gang_record(task: Any) -> Optional[GangRecord]:
    """The gang's record of a Metaflow client `Task` (the attempt the Task object is of: pass
    `Task(pathspec, attempt=n)` for an earlier one), as its card shows it; None if the attempt
    kept none."""
    return _task_records(task, [task.current_attempt])[0]


def attempt_records(task: Any) -> Tuple[Optional[GangRecord], List[GangRecord]]:
    """(the record of the attempt of client `Task` task, the records of its attempts before,
    oldest first): what the gang's card of that attempt shows. An earlier attempt that kept
    no record is left out; the first is None if this attempt kept none."""
    attempt = task.current_attempt
    found = _task_records(task, range(attempt + 1))
    return found[-1], [record for record in found[:-1] if record is not None]


def _task_records(task: Any, attempts: Iterable[int]) -> List[Optional[GangRecord]]:
    meta = task.metadata_dict
    flow_datastore = internals.flow_datastore_at(
        task.pathspec.split("/")[0], "%s@%s" % (meta["ds-type"], meta["ds-root"]))
    run_id, step_name, task_id = task.pathspec.split("/")[1:]
    found = []
    for attempt in attempts:
        try:
            record = internals.load_attempt_file(flow_datastore, run_id, step_name, task_id,
                                                 attempt, RECORD_FILE)
        except Exception:  # noqa: BLE001 - that attempt left nothing readable: show the others
            record = None
        found.append(None if record is None else GangRecord.from_dict(record))
    return found


class TailKeeper:
    """A pump sink keeping the last TAIL_LINES lines of each rank's stdout and stderr (lines
    are told apart by their `[rank N]` prefix); with a `path`, it writes them there every
    `interval` seconds while lines come (the live card reads them; the pump calls `tick` when
    `due` says) and when it is closed. Node 0's log receiver feeds one from its own thread
    while the live card reads it: a lock keeps the two apart."""

    def __init__(self, path: Optional[str] = None, interval: float = LIVE_TAILS_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.interval = interval
        self.clock = clock
        self.tails: Dict[Tuple[int, str], Deque[str]] = collections.defaultdict(
            lambda: collections.deque(maxlen=TAIL_LINES))
        self._lock = threading.Lock()
        self._written = clock()  # when the file was last written
        self._dirty = False  # lines came since

    def __call__(self, target_fd: int, data: bytes) -> None:
        stream = "stdout" if target_fd == 1 else "stderr"
        with self._lock:
            for line in data.split(b"\n"):
                if not line.startswith(_RANK_PREFIX):
                    continue
                label, _, text = line.partition(b"] ")
                rank = label[len(_RANK_PREFIX):]
                if rank.isdigit():
                    self.tails[(int(rank), stream)].append(text.decode("utf-8", "replace"))
                    self._dirty = True
        self.tick(self.clock())

    def due(self) -> Optional[float]:
        """When the file is next to be written (by this sink's clock), or None: nothing new."""
        return self._written + self.interval if self._dirty and self.path is not None else None

    def tick(self, now: float) -> None:
        """Write the file if new lines came and it was last written `interval` s ago."""
        due = self.due()
        if due is not None and now >= due:
            self._write()

    def by_rank(self) -> Tails:
        out: Tails = {}
        with self._lock:
            for (rank, stream), lines in self.tails.items():
                out.setdefault(rank, {})[stream] = list(lines)
        return out

    def close(self) -> None:
        if self.path is not None:
            self._write()

    def _write(self) -> None:
        assert self.path is not None  # due() and close() say so
        self._written, self._dirty = self.clock(), False
        write_json(self.path, {str(rank): streams for rank, streams in self.by_rank().items()})


class GangRecorder:
    """Node 0's view of a gang attempt, put together when the gang has ended."""

    def __init__(self, spec: GangSpec, topology: Topology,
                 clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.topology = topology
        self.clock = clock
        self.started = clock()
        self.phases: List[Tuple[str, float]] = []  # (name, time)
        self.remote_tails = TailKeeper()

    def phase(self, name: str) -> None:
        self.phases.append((name, self.clock()))

    def collect(self, work_dir: str, slots: Sequence["Slot"], spawned: Mapping[int, float],
                remote_nodes: Optional[Mapping[int, Optional[JsonDict]]] = None,
                failures: Sequence[Failure] = (), root: Optional[Failure] = None,
                stopped: Iterable[str] = (), restarted: Sequence[Failure] = (),
                rounds: Iterable[RoundRecord] = ()) -> GangRecord:
        """The gang attempt's record. `slots` are node 0's processes (`spawned` when each rank
        was started), `remote_nodes` the node records remote nodes sent ({node: JSON form}),
        `failures` the Failures seen, `root` the root cause, `stopped` labels of the processes
        the gang stopped; for a gang restarted in place, `restarted` the root causes of the
        rounds restarted, oldest first, and `rounds` what the card shows of each."""
        spec = self.spec
        nodes = {0: NodeRecord.of_node(node_info(0, spec.attempt.master_addr, os.environ),
                                       slots, {0: self.started, **spawned}, self.started)}
        rank_events: Dict[int, RankRecord] = {}
        for rank in range(self.topology.world_size):
            found = read_json(rank_file(work_dir, rank))
            if found is not None:
                rank_events[rank] = RankRecord.from_dict(found)
        for node in range(1, self.topology.nodes):
            sent = (remote_nodes or {}).get(node) or read_json(node_file(work_dir, node))
            if sent is not None:
                share = nodes[node] = NodeRecord.from_dict(sent)
                for rank, process in share.ranks.items():
                    if process.events is not None and rank not in rank_events:
                        rank_events[rank] = process.events
        if 0 not in rank_events:
            found = read_json(rank_file(work_dir, 0))
            if found is not None:
                rank_events[0] = RankRecord.from_dict(found)
        tails: Tails = {int(rank): streams
                        for rank, streams in (read_json(tails_file(work_dir)) or {}).items()}
        for rank, streams in self.remote_tails.by_rank().items():
            tails.setdefault(rank, {}).update(streams)
        return GangRecord(
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
            phases=tuple(self.phases),
            node_info=nodes,
            ranks=rank_events,
            failures=tuple(failures),
            root_cause=root,
            stopped=tuple(stopped),
            tails=tails,
            ignored_messages=sealed.merge_counts(
                *(share.ignored_messages for share in nodes.values()),
                # each rank's own process
                *(own.ignored_messages for own in rank_events.values())),
            restarts=tuple(RestartRecord.of_failure(n, f) for n, f in enumerate(restarted)),
            rounds=tuple(rounds),
        )
