"""The gang's card: topology, a timeline of every rank, the outcome and each rank's last lines.

Every gang step gets a card of its own, of type and id `torch_distributed` (GANG_CARD; the card
type is plugins/cards/torch_distributed_card); the user's own cards and `current.card` are left
exactly as the user built them. The task draws it itself as it ends (TaskCard), from the
gang's record in memory, for a failed attempt too (which Metaflow's @card leaves unrendered):
no `card create` process on the task's way out. `render` draws it the way Metaflow's `card
create` does, from the gang records kept with the task (events.py), where the task could not.
`card_data` turns those records into what the card shows: plain data, tested by tables.
`components` turns that into Metaflow card components (Markdown, Table, VegaChart)."""

from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, TypedDict, Union

from ..mf import events
from ..mf.events import GangRecord, LiveView, NodeInfo, RoundRecord, Tails
from ..mf.livecard import LiveCard, LiveData, LiveFigures, live_components
from ..core import sealed
from ..core.gangspec import TaskIdentity
from ..core.failures import Failure, FailureKind

# The @card that @torch_distributed puts on its step: the card's type and its id, for
# `card get --id torch_distributed` and `current.card["torch_distributed"]` (which takes nothing:
# the card draws itself from the gang's record).
GANG_CARD_TYPE = "torch_distributed"
GANG_CARD = {"type": GANG_CARD_TYPE, "id": "torch_distributed"}

# Colours of the timeline's bars, by state.
STATES = {
    "starting": "#b0b7c3",  # started, not yet in init_process_group
    "finished": "#3a9a5b",
    "failed": "#d64545",
    "stopped": "#e59b2e",
    "peer failed": "#f0a0a0",  # failed with a communication error: a peer died first
    "running": "#4c78a8",  # no end known (the record was taken while it ran)
}
# Lines of a rank's log shown next to the root cause.
CAUSE_LINES = 15
# Characters of a log or traceback line per line of the card.
CODE_WIDTH = 100
# Width of the timeline in pixels, and the least distance between two of its labels: labels
# of phases closer than that (rendezvous done and nodes joined often are) share one label.
TIMELINE_WIDTH = 600
LABEL_GAP_PX = 14
# A failed rank whose error says it was stopped by the gang, not by its own fault.
_STOPPED_ERRORS = ("TorchDistributedAborted",)


# What the card shows (card_data): plain data, times in seconds since the attempt's gang started.

class RankRow(TypedDict):
    """One rank of the attempt: where it sat, how it ended (a STATES name) and when it started,
    entered init_process_group and ended; `heard` is whether it wrote a record of its own."""

    rank: int
    node: int
    local_rank: int
    outcome: str
    error: Optional[str]
    heard: bool
    started: float
    joined: Optional[float]
    ended: Optional[float]


class _Bar(TypedDict):
    rank: int
    label: str
    node: int
    outcome: str
    state: str
    start: float
    end: float


class Bar(_Bar, total=False):
    """A bar of the timeline: one state of one rank, from `start` to `end`; `round` is set on
    the bars of a round restarted in place."""

    round: int


class Marker(TypedDict):
    """A phase of the gang on the timeline (abort, nodes joined, gang ended...), at `t`."""

    name: str
    t: float


class _Outcome(TypedDict):
    ok: bool
    finished: List[int]


class Outcome(_Outcome, total=False):
    """How the attempt ended: `ok`, and the ranks that finished; for a failed one, its root
    cause (who, how, its message, traceback and last lines) and the ranks it stopped."""

    rank: Optional[int]
    node: int
    kind: FailureKind
    where: str
    summary: str
    error: str
    message: str
    traceback: str
    stderr: List[str]
    stdout: List[str]
    stopped: List[int]


class ScalarRow(TypedDict):
    """The last value of one scalar a rank recorded in one round of the gang (0, then one more
    per restart in place), and how many it recorded in that round."""

    rank: int
    name: str
    value: float
    count: int
    round: int


class CardData(TypedDict):
    """Everything the card of one attempt shows (card_data), for `components`."""

    title: str
    topology: List[List[str]]
    nodes: List[List[str]]
    ranks: List[RankRow]
    timeline: List[Bar]
    markers: List[Marker]
    outcome: Outcome
    tails: Tails
    scalars: List[ScalarRow]
    attempts: List[List[str]]
    ignored: Dict[str, int]
    restarts: List[List[str]]
    # waiting in collectives (core/stragglers.py): what the section says, then a row per rank
    # and a row per node; empty when the straggler watch took no window
    waiting_note: str
    waiting: List[List[str]]
    waiting_nodes: List[List[str]]
    # while the gang runs (LiveCard): where each rank stands now; None on the final card
    live: Optional[LiveData]


def card_data(record: GangRecord, history: Sequence[GangRecord] = (),
              live: Optional[LiveData] = None) -> CardData:
    """What the card of gang attempt `record` shows; `history` holds the earlier attempts'
    records, oldest first; `live`, while the gang runs, where each rank stands (the record is
    then the gang's so far: its `ended` is now). Times are seconds since the attempt's gang
    started."""
    t0 = record.started
    root = record.root_cause
    failed_at = _failed_at(record.failures)
    # the stop of the last round (a restart in place starts a round after an abort)
    phases = record.phases
    last_round = max((i for i, (name, _) in enumerate(phases) if name == "restart"), default=-1)
    abort = next((t for name, t in phases[last_round + 1:] if name == "abort"), None)
    ranks = []
    root_rank = root.rank if root is not None else None
    for rank in range(record.nodes * record.nproc_per_node):
        node, local_rank = divmod(rank, record.nproc_per_node)
        row = _rank_row(record, rank, node, local_rank, failed_at, abort, t0)
        # the rank's own record says whether its error told of a peer's failure
        own = record.ranks.get(rank)
        said = own.symptom if own is not None else None
        if row["outcome"] == "failed" and rank != root_rank and Failure(
                rank, node, FailureKind.EXCEPTION, 0, message=row["error"] or "",
                symptom=said).is_symptom():
            row["outcome"] = "peer failed"
        ranks.append(row)
    segments = [seg for earlier in record.rounds for seg in _round_segments(record, earlier, t0)]
    segments += [seg for row in ranks for seg in _segments(row)]
    outcome = _outcome(record, ranks, root)
    markers = _markers(record, ranks, t0)
    if live is not None:  # the record ends now, not with the gang
        markers = [Marker(name="now", t=m["t"]) if m["name"] == "gang ended" else m
                   for m in markers]
    return CardData(
        title="Gang of step %s, attempt %d%s" % (record.step, record.attempt,
                                                  ": running" if live is not None else ""),
        topology=_topology_rows(record),
        nodes=_node_rows(record, running=live is not None),
        ranks=ranks,
        timeline=segments,
        markers=markers,
        outcome=outcome,
        tails=dict(record.tails),
        scalars=_scalars(record),
        attempts=[_attempt_row(r) for r in [*history, record]],
        ignored=dict(record.ignored_messages),
        restarts=[[str(r.round), "%.1f s" % _since(r.at, t0), r.sentence]
                  for r in record.restarts],
        **_waiting(record),
        live=live,
    )


class _Waiting(TypedDict):
    waiting_note: str
    waiting: List[List[str]]
    waiting_nodes: List[List[str]]


def _waiting(record: GangRecord) -> _Waiting:
    """The card's rows of each rank's and each node's share of time waiting in collectives,
    from the straggler watch's last window (core/stragglers.py)."""
    if not record.waiting:
        return _Waiting(waiting_note="", waiting=[], waiting_nodes=[])
    span = "%.0f s" % record.waiting_span_s
    note = ("Over the last %s of training: each rank's share of the hang probe's looks in which "
            "it was waiting in a collective (or in backward, where DDP's all-reduces run). "
            % span)
    if record.straggler is None:
        note += "No rank was the straggler."
    else:
        note += ("**Rank %d (node %d) was the straggler**: in most looks it was the only rank "
                 "not in a collective, while the others waited for it."
                 % (record.straggler, record.straggler // record.nproc_per_node))
    rows = [[str(rank), str(rank // record.nproc_per_node), "%.0f%%" % (100 * share),
             "straggler" if rank == record.straggler else ""]
            for rank, share in sorted(record.waiting.items())]
    by_node: Dict[int, List[float]] = {}
    for rank, share in record.waiting.items():
        by_node.setdefault(rank // record.nproc_per_node, []).append(share)
    nodes = [[str(node), "%.0f%%" % (100 * sum(shares) / len(shares))]
             for node, shares in sorted(by_node.items())]
    return _Waiting(waiting_note=note, waiting=rows, waiting_nodes=nodes)


def _failed_at(failures: Iterable[Failure]) -> Dict[int, float]:
    """When each rank that failed was seen failing."""
    return {f.rank: f.detected_at for f in failures if f.rank is not None}


def _rank_row(seen: Union[GangRecord, RoundRecord], rank: int, node: int, local_rank: int,
              failed_at: Mapping[int, float], abort: Optional[float], t0: float) -> RankRow:
    """Rank `rank`'s row, as the attempt's record or one of its restarted rounds (`seen`)
    tells."""
    own = seen.ranks.get(rank)
    share = seen.node_info.get(node)
    process = share.ranks.get(rank) if share is not None else None
    spawned = process.spawned if process is not None else None
    started = (own.started if own is not None else None) or spawned or seen.started
    outcome = own.outcome if own is not None else None
    error = own.error if own is not None else None
    ended = own.ended if own is not None else None
    if outcome == "failed" and (error or "").startswith(_STOPPED_ERRORS):
        outcome = "stopped"
    if outcome is None:  # no word from the rank: killed, or stopped by the gang
        if rank in failed_at:
            outcome, ended = "failed", failed_at[rank]
        elif abort is not None:
            outcome, ended = "stopped", abort
        else:
            outcome, ended = "running", seen.ended
    joined = own.joined if own is not None else None
    return RankRow(rank=rank, node=node, local_rank=local_rank, outcome=outcome, error=error,
                   heard=own is not None, started=_since(started, t0), joined=_rel(joined, t0),
                   ended=_rel(ended, t0))


def _round_segments(record: GangRecord, earlier: RoundRecord, t0: float) -> List[Bar]:
    """The bars of a round that failed and was restarted in place (`earlier`, one of the
    record's `rounds`), on the same rows as the last round's: what each rank did until the
    round was stopped."""
    failed_at = _failed_at(earlier.failures)
    bars = []
    for rank in range(record.nodes * record.nproc_per_node):
        node, local_rank = divmod(rank, record.nproc_per_node)
        row = _rank_row(earlier, rank, node, local_rank, failed_at, earlier.ended, t0)
        for bar in _segments(row):
            bar["round"] = earlier.round
            bars.append(bar)
    return bars


def _since(t: float, t0: float) -> float:
    return round(t - t0, 3)


def _rel(t: Optional[float], t0: float) -> Optional[float]:
    return None if t is None else _since(t, t0)


def _segments(row: RankRow) -> List[Bar]:
    """The bars of one rank: starting (until it entered init_process_group), then its body. A
    rank that said nothing (killed, or on a lost node) gets one bar of its outcome."""
    label = "rank %d (node %d)" % (row["rank"], row["node"])
    end = row["ended"] if row["ended"] is not None else row["started"]
    split = row["joined"] if row["joined"] is not None else end if row["heard"] \
        else row["started"]

    def bar(state: str, since: float, until: float) -> Bar:
        return Bar(rank=row["rank"], label=label, node=row["node"], outcome=row["outcome"],
                   state=state, start=since, end=until)

    bars = []
    if split > row["started"]:
        bars.append(bar("starting", row["started"], split))
    if end > split or not bars:
        bars.append(bar(row["outcome"], split, max(end, split)))
    return bars


def _markers(record: GangRecord, ranks: Sequence[RankRow], t0: float) -> List[Marker]:
    markers = [Marker(name=name, t=_since(t, t0)) for name, t in record.phases]
    others = [share.joined_gang for n, share in record.node_info.items() if n != 0]
    joined_gang = [t for t in others if t]
    if record.nodes > 1 and len(others) == record.nodes - 1 and len(joined_gang) == len(others):
        markers.append(Marker(name="nodes joined", t=_since(max(joined_gang), t0)))
    joins = [r["joined"] for r in ranks if r["joined"] is not None]
    if ranks and len(joins) == len(ranks):
        markers.append(Marker(name="rendezvous done", t=max(joins)))
    markers.append(Marker(name="gang ended", t=_since(record.ended, t0)))
    return sorted(markers, key=lambda m: m["t"])


def _outcome(record: GangRecord, ranks: Sequence[RankRow], root: Optional[Failure]) -> Outcome:
    stopped = [r["rank"] for r in ranks if r["outcome"] in ("stopped", "peer failed")]
    finished = [r["rank"] for r in ranks if r["outcome"] == "finished"]
    if root is None:
        return Outcome(ok=True, finished=finished)
    tail = record.tails.get(root.rank, {}) if root.rank is not None else {}
    return Outcome(ok=False, rank=root.rank, node=root.node, kind=root.kind,
                   where=root.where(), summary=root.sentence(),
                   error=_error_name(root), message=root.message,
                   traceback=root.traceback,
                   stderr=tail.get("stderr", [])[-CAUSE_LINES:],
                   stdout=tail.get("stdout", [])[-CAUSE_LINES:],
                   stopped=stopped, finished=finished)


def _error_name(failure: Failure) -> str:
    if failure.kind is FailureKind.EXCEPTION:
        return failure.message.split(":", 1)[0]
    return failure.kind


def _topology_rows(record: GangRecord) -> List[List[str]]:
    return [
        ["Topology", "%d node%s x %d process%s per node = %d ranks" % (
            record.nodes, "" if record.nodes == 1 else "s", record.nproc_per_node,
            "" if record.nproc_per_node == 1 else "es",
            record.nodes * record.nproc_per_node)],
        ["Accelerator / backend", "%s / %s" % (record.accelerator, record.backend)],
        ["Nodes run", "on this machine" if record.scheduler == "local"
         else "as AWS Batch multi-node job" if record.scheduler == "batch"
         else "as one Kubernetes JobSet" if record.scheduler == "kubernetes"
         else record.scheduler],
        ["Start method", record.start_method],
        ["Rendezvous (MASTER_ADDR:MASTER_PORT)", "%s:%s" % (record.master_addr,
                                                           record.master_port)],
        ["Attempt", str(record.attempt)],
        ["Gang id (TORCHELASTIC_RUN_ID)", record.gang_id],
    ]


def _node_rows(record: GangRecord, running: bool = False) -> List[List[str]]:
    rows = []
    per = record.nproc_per_node
    for node in range(record.nodes):
        share = record.node_info.get(node)
        # a node that sent no word shows none of its places
        info = share.info if share is not None else NodeInfo(node, host="", ip=None)
        where = [info.batch_node_index and "Batch node index %s" % info.batch_node_index,
                 info.pod and "pod %s" % info.pod]
        rows.append([str(node), "%d-%d" % (node * per, node * per + per - 1),
                     info.host or ("(told as the gang ends)" if running
                                   else "(no word from this node)"), info.ip or "",
                     ", ".join(w for w in where if w)])
    return rows


def _scalars(record: GangRecord) -> List[ScalarRow]:
    """Each rank's last value of each scalar, in every round: the restarted rounds' first,
    then the last round's (numbered after the restarts)."""
    rounds = [(r.round, r.ranks) for r in record.rounds] + [(len(record.restarts),
                                                             record.ranks)]
    rows = []
    for round_, ranks in rounds:
        for rank, own in sorted(ranks.items()):
            for name, values in sorted(own.scalars.items()):
                if values:
                    rows.append(ScalarRow(rank=rank, name=name, value=values[-1][1],
                                          count=len(values), round=round_))
    return rows


def _attempt_row(record: GangRecord) -> List[str]:
    root = record.root_cause
    cause = "succeeded" if root is None else root.sentence()
    return [str(record.attempt), "%.1f s" % (record.ended - record.started), cause]


def marker_labels(markers: Iterable[Marker], width: float = TIMELINE_WIDTH,
                  gap_px: float = LABEL_GAP_PX) -> List[Marker]:
    """The labels of the timeline's phase rules: one per group of markers that lie closer than
    `gap_px` on an axis of `width` pixels (from 0 to the last marker), each at its group's
    first time, naming every marker of the group ("rendezvous done, nodes joined"). Pure."""
    ordered = sorted(markers, key=lambda m: m["t"])
    span = max([m["t"] for m in ordered] + [1e-9])
    labels: List[Marker] = []
    for marker in ordered:
        if labels and (marker["t"] - labels[-1]["t"]) * width / span < gap_px:
            labels[-1]["name"] += ", " + marker["name"]
        else:
            labels.append(Marker(name=marker["name"], t=marker["t"]))
    return labels


def timeline_spec(data: CardData) -> Dict[str, Any]:
    """A Vega-Lite chart: one row per rank, bars for its states, rules for the gang's phases."""
    order = [s["label"] for s in sorted(data["timeline"], key=lambda s: s["rank"])]
    y = {"field": "label", "type": "ordinal", "title": None,
         "sort": list(dict.fromkeys(order))}
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": "Every rank on one time axis (seconds since the gang started)",
        "width": TIMELINE_WIDTH,
        "height": max(60, 22 * len(data["ranks"])),
        "layer": [
            {"data": {"values": data["timeline"]},
             "mark": {"type": "bar", "height": 14},
             "encoding": {
                 "y": y,
                 "x": {"field": "start", "type": "quantitative", "title": "seconds"},
                 "x2": {"field": "end"},
                 "color": {"field": "state", "type": "nominal", "title": "state",
                           "scale": {"domain": list(STATES), "range": list(STATES.values())}},
                 "tooltip": [{"field": "label"}, {"field": "state"},
                             {"field": "start", "title": "from (s)"},
                             {"field": "end", "title": "to (s)"}]}},
            {"data": {"values": data["markers"]},
             "mark": {"type": "rule", "strokeDash": [4, 3], "color": "#333"},
             "encoding": {"x": {"field": "t", "type": "quantitative"},
                          "tooltip": [{"field": "name"}, {"field": "t", "title": "at (s)"}]}},
            {"data": {"values": marker_labels(data["markers"])},
             "mark": {"type": "text", "angle": 270, "align": "left", "dx": 4, "dy": -4,
                      "fontSize": 10, "color": "#333"},
             "encoding": {"x": {"field": "t", "type": "quantitative"}, "y": {"value": 0},
                          "text": {"field": "name"}}},
        ],
    }


def scalars_spec(rows: Iterable[ScalarRow], name: str) -> Dict[str, Any]:
    """A bar per rank of the last value of scalar `name` each rank recorded; with restarts in
    place, a bar per rank and round, side by side, coloured by round."""
    values = [r for r in rows if r["name"] == name]
    encoding: Dict[str, Any] = {
        "x": {"field": "rank", "type": "ordinal"},
        "y": {"field": "value", "type": "quantitative", "title": name},
        "tooltip": [{"field": "rank"}, {"field": "round"}, {"field": "value"},
                    {"field": "count"}]}
    several = len({r["round"] for r in values}) > 1
    if several:
        encoding["xOffset"] = {"field": "round", "type": "ordinal"}
        encoding["color"] = {"field": "round", "type": "ordinal", "title": "round"}
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": "%s (last value recorded by each rank%s)" % (
            name, " in each round" if several else ""),
        "data": {"values": values},
        "mark": "bar",
        "encoding": encoding,
    }


def components(data: CardData) -> List[Any]:
    """Metaflow card components showing `data` (from card_data)."""
    from metaflow.cards import Markdown, Table, VegaChart

    out: List[Any] = [
        Markdown("## %s" % data["title"]), Table(data["topology"], headers=["", ""]),
        Table(data["nodes"], headers=["Node", "Ranks", "Host", "IP", "Scheduler's name"]),
        Markdown("### Timeline"), VegaChart(timeline_spec(data))]
    live = data.get("live")
    if live is not None:
        out[1:1] = live_components(live)
    if live is None or not data["outcome"]["ok"]:  # a running gang has no outcome yet
        out += _outcome_components(data["outcome"], Markdown)
    if data.get("restarts"):
        out += [Markdown("### Restarts in place\n\nEach round below failed and the gang was "
                         "started again in the same attempt; the timeline shows every round, each "
                         "earlier round's bars ending where the gang stopped it."),
                Table(data["restarts"], headers=["Round", "Failed at", "Root cause"])]
    if data.get("waiting"):
        out += [Markdown("### Waiting in collectives\n\n%s" % data["waiting_note"]),
                Table(data["waiting"], headers=["Rank", "Node", "Waiting", ""]),
                Table(data["waiting_nodes"], headers=["Node", "Waiting (mean of its ranks)"])]
    if data["ignored"]:
        out.append(Markdown("### Ignored messages\n\n%s" % ignored_note(data["ignored"])))
    if len(data["attempts"]) > 1:
        out += [Markdown("### Attempts"),
                Table(data["attempts"], headers=["Attempt", "Duration", "Outcome"])]
    names = list(dict.fromkeys(r["name"] for r in data["scalars"]))
    if names:
        out.append(Markdown("### Per-rank values"))
        out += [VegaChart(scalars_spec(data["scalars"], name)) for name in names]
    tails = [Markdown("**rank %d, %s**\n\n%s" % (rank, stream, _code(lines)))
             for rank in sorted(data["tails"]) for stream in ("stdout", "stderr")
             for lines in [data["tails"][rank].get(stream)] if lines]
    out.append(Markdown("### Last lines of each rank" if tails else
                        "### Last lines of each rank\n\nNo rank wrote to its stdout or stderr."))
    return out + tails


def _outcome_components(outcome: Outcome, Markdown: Any) -> List[Any]:
    if outcome["ok"]:
        return [Markdown("### Outcome: success\n\nEvery rank finished its step body.")]
    text = ["### Outcome: failed", "**Root cause:** %s" % outcome["summary"]]
    if outcome["stopped"]:
        text.append("**Stopped because of it (or failed as their peer died):** ranks %s"
                    % ", ".join(map(str, outcome["stopped"])))
    if outcome["finished"]:
        text.append("**Had already finished:** ranks %s"
                    % ", ".join(map(str, outcome["finished"])))
    if outcome["traceback"]:
        text.append("Traceback of %s:\n\n%s" % (outcome["where"],
                                                 _code(outcome["traceback"].splitlines())))
    for stream in ("stderr", "stdout"):
        if outcome[stream]:
            text.append("Last %s lines of %s:\n\n%s" % (stream, outcome["where"],
                                                         _code(outcome[stream])))
    return [Markdown("\n\n".join(text))]


def ignored_note(counts: Dict[str, int]) -> str:
    """What the log and the card say of the messages the gang ignored (sealed.IGNORED)."""
    deleted = "" if not any(kind.endswith(" deleted") for kind in counts) else (
        " The kinds marked deleted are the gang's own messages that a process outside the gang "
        "deleted from the store before node 0 read them.")
    return ("The gang ignored %s messages in its rendezvous store that were not sealed under "
            "the attempt's secret (forged or corrupt): a process outside the gang wrote to "
            "the store at MASTER_ADDR:MASTER_PORT. None of them steered the gang.%s See "
            "docs/security.md." % (sealed.describe(counts), deleted))


def _code(lines: Iterable[str]) -> str:
    """A fenced block of `lines`, long lines folded (a card page does not wrap code, and one
    long line, such as a gloo error, would widen the whole page)."""
    folded = [line[i:i + CODE_WIDTH] for line in lines
              for i in range(0, max(len(line), 1), CODE_WIDTH)]
    return "```text\n%s\n```" % "\n".join(line.replace("```", "'''") for line in folded)


def render(task: Any) -> str:
    """The HTML of the gang's card of the attempt of `task`, a client Task (as `card create`
    gives it to the card type: where the task could not draw the card itself, TaskCard)."""
    from metaflow.cards import BlankCard

    record, history = events.attempt_records(task)
    return BlankCard(components=_parts(task.pathspec, task.current_attempt, record,
                                       history)).render(task)


def _parts(pathspec: str, attempt: int, record: Optional[GangRecord],
           history: Sequence[GangRecord]) -> List[Any]:
    """The components of the gang's card of attempt `attempt` of task `pathspec`."""
    from metaflow.cards import Markdown

    if record is not None:
        return components(card_data(record, history))
    return [Markdown("## Gang of step %s, attempt %d\n\nThis attempt kept no record of a gang: "
                     "it was @catch's fallback, which runs the step on its own, or its task "
                     "ended before the gang's record was kept (see the task's log)."
                     % (pathspec.split("/")[2], attempt))]


class TaskCard:
    """The gang's card of this attempt, drawn and saved by the task's own process as it ends
    (internals.finish_card_in_task), not by a `card create` process: what the gang's record
    holds is in memory here, and the page takes about 10 ms to draw. The step's decorator
    hands it the attempt's record once the gang has ended (`keep`). Without one (@catch's
    fallback attempt), a successful attempt's card says so, and a failed attempt gets none, as
    Metaflow renders no card of a failed attempt. If drawing or saving fails, Metaflow's `card
    create` draws it from the record kept with the task, as before."""

    def __init__(self, step_name: str, deco: Any, flow_datastore: Any) -> None:
        self.step_name = step_name
        self.deco = deco
        self.flow_datastore = flow_datastore
        self.led = False
        self.record: Optional[GangRecord] = None
        self.identity: Optional[TaskIdentity] = None
        self.live: Optional[LiveCard] = None  # drawing the card while the gang runs

    def go_live(self, view: Callable[[], Optional[LiveView]], interval: float, probes: bool,
                identity: TaskIdentity, pathspec: str, attempt: int) -> None:
        """Draw the card every `interval` s while the gang of attempt `attempt` of task
        `pathspec` runs (LiveCard), from `view()` (Leader.live_view); `probes`: whether the
        ranks' hang probes run; `identity` the task's, where the earlier attempts' records
        are (read once, by the first draw)."""
        earlier: List[GangRecord] = []
        read: List[bool] = []

        def draw(now: LiveView, figures: LiveFigures) -> List[Any]:
            if not read:
                read.append(True)
                earlier.extend(events.earlier_attempts(self.flow_datastore, identity,
                                                       self.step_name, attempt))
            return components(card_data(now.record, earlier,
                                        figures.data(now.record, now.reports, probes)))

        def save(parts: Sequence[Any], token: str) -> None:
            self._save(parts, pathspec, attempt, token)

        self.live = LiveCard(self.step_name, view, draw, save, interval).start()

    def keep(self, record: Optional[GangRecord], identity: TaskIdentity) -> None:
        """This attempt led a gang, which ended with `record` (None: it kept none); `identity`
        is the task's TaskIdentity, where the earlier attempts' records are. The live card
        stops."""
        if self.live is not None:
            self.live.stop()
        self.led, self.record, self.identity = True, record, identity

    def _save(self, parts: Sequence[Any], pathspec: str, attempt: int, token: str) -> None:
        """Save the card of `parts` with reload token `token` ("final" as the task ends),
        and, once a live card was saved, a data update with the same token: a viewer of the
        live card reloads it, and stops polling at "final"."""
        from ..mf import internals

        internals.save_card(self.deco, internals.card_page(parts, pathspec, token), pathspec,
                            attempt)
        if token != "final" or (self.live is not None and self.live.drawn):
            internals.save_card_data(self.deco, pathspec, token, {"torch_distributed": token})

    def __call__(self, is_task_ok: bool, pathspec: str, attempt: int) -> bool:
        """Draw and save the card (internals.finish_card_in_task); False leaves it to
        Metaflow's @card."""
        import sys

        from ..mf import internals

        if not (is_task_ok or self.led):
            return False
        try:
            history = [] if self.record is None or self.identity is None else (
                events.earlier_attempts(self.flow_datastore, self.identity, self.step_name,
                                        attempt))
            self._save(_parts(pathspec, attempt, self.record, history), pathspec, attempt,
                       "final")
        except Exception as ex:  # noqa: BLE001 - the card is a view: Metaflow draws it instead
            print("@torch_distributed on step *%s*: could not draw the gang's card in the task "
                  "(%s: %s); Metaflow's `card create` draws it from the gang's record instead."
                  % (self.step_name, type(ex).__name__, ex), file=sys.stderr, flush=True)
            if self.live is not None and self.live.drawn:
                try:  # a viewer of the live card stops polling once it reads "final"
                    internals.save_card_data(self.deco, pathspec, "final",
                                             {"torch_distributed": "final"})
                except Exception:  # noqa: BLE001 - as above
                    pass
            if not is_task_ok:  # Metaflow's @card renders no card of a failed attempt
                internals.render_failed_card(self.deco)
            return False
        return True


def add_to_step(step_name: str, decorators: List[Any], step_init_args: Sequence[Any]) -> TaskCard:
    """Put the gang's card on step `step_name` (a @card of GANG_CARD, from the decorator's
    step_init: `decorators` are the step's, `step_init_args` what step_init was given after
    the step name), drawn by the task itself as it ends (TaskCard)."""
    from ..mf import internals

    deco = internals.add_card(step_name, decorators, GANG_CARD, step_init_args)
    task_card = TaskCard(step_name, deco, step_init_args[3])
    internals.finish_card_in_task(deco, task_card)
    return task_card


def is_gang_card(deco: Any) -> bool:
    """True for the @card decorator that shows the gang (GANG_CARD)."""
    return deco.name == "card" and (deco.attributes.get("type") == GANG_CARD_TYPE
                                    or deco.attributes.get("id") == GANG_CARD["id"])


def wanted(on: bool, decorators: Iterable[Any], remote: bool, metadata: str) -> bool:
    """Whether a gang step gets the gang's card from step_init: `on` (its `card` setting),
    unless `decorators` (the step's) hold it already, or the step runs in a Batch job or a
    Kubernetes pod (`remote`) with local metadata (`metadata`), where no card can render
    (docs/seeing-the-gang.md, Limits)."""
    return on and not any(is_gang_card(d) for d in decorators) and not (
        remote and metadata == "local")
