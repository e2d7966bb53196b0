"""The gang's card while the gang runs: drawn again every `card_refresh` seconds by node 0's
task (LiveCard), with where each rank stands now.

What it shows comes from what node 0 already has: the hang probe's last sample of every rank
(runtime/stacks.py: its collective count, the call it is in, and what the rank told of its
progress and scalars, events.RankLog.live), the straggler watch's window, the ranks' own
files and the last lines node 0's pump keeps. `LiveFigures` turns successive samples into
rates (collectives and steps per second) and rank 0's percent done and time left: plain data,
tested by tables; `live_components` draws it. `LiveCard` is the thread that draws the whole
card in the task's own process and saves it where `card create` saves a runtime card, with a
data update whose reload token changes each time: `card server` and the Metaflow UI reload
the card when it does (plugins/cards/card_viewer: a token other than the page's reloads it)."""

import collections
import sys
import threading
from typing import (TYPE_CHECKING, Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence,
                    Tuple, TypedDict)

from ..mf.events import GangRecord, LiveView, ScalarValues

if TYPE_CHECKING:
    from ..runtime.stacks import Report

# Seconds of samples a rate is taken over (collectives and steps per second).
RATE_WINDOW = 60.0
# Characters of a rank's last line shown in the live table.
LINE_WIDTH = 80


class LiveRank(TypedDict):
    """Where one rank stands: what it is doing, its collectives done and their rate, its step
    (and the total it gave) and their rate, its last recorded values and last lines."""

    rank: int
    node: int
    doing: str
    collectives: Optional[int]
    collectives_per_s: Optional[float]
    step: Optional[float]
    total: Optional[float]
    steps_per_s: Optional[float]
    scalars: Dict[str, float]
    stdout: str
    stderr: str


class LiveData(TypedDict):
    """What the live card shows above the usual card: a note on what it is drawn from, rank
    0's progress (percent done, time left), the straggler now, a row per rank and rank 0's
    recorded values ({name: [(seconds since rank 0 started, value)]})."""

    note: str
    progress: str
    straggler: str
    ranks: List[LiveRank]
    series: Dict[str, ScalarValues]


class LiveFigures:
    """Successive reads of the hang probes (`add`), as rates; `data` what the card shows."""

    def __init__(self, window: float = RATE_WINDOW) -> None:
        self.window = window
        self._read_at: Optional[float] = None
        # rank -> (watch's time, collective count) and (rank's own time, step), in the window
        self._counts: Dict[int, Deque[Tuple[float, float]]] = collections.defaultdict(
            collections.deque)
        self._steps: Dict[int, Deque[Tuple[float, float]]] = collections.defaultdict(
            collections.deque)

    def add(self, at: float, reports: Mapping[int, "Report"]) -> None:
        """The watch's read of every rank's probe at `at` (its clock); a read seen already
        adds nothing. A count or step that went back (a restart in place) starts afresh."""
        if at == self._read_at:
            return
        self._read_at = at
        for rank, report in reports.items():
            seq = report.get("seq")
            if seq is not None:
                _keep(self._counts[rank], at, float(seq), self.window)
            progress = (report.get("live") or {}).get("progress")
            if progress:
                step, _, told_at = progress
                _keep(self._steps[rank], float(told_at), float(step), self.window)

    def data(self, record: GangRecord, reports: Mapping[int, "Report"], probes: bool
             ) -> LiveData:
        """What the live card shows of `record` (the gang so far) and the last `reports`;
        `probes`: whether the ranks' probes run (hang detection on)."""
        ranks = []
        for rank in range(record.nodes * record.nproc_per_node):
            report = reports.get(rank)
            told = (report.get("live") if report is not None else None) or {}
            progress = told.get("progress") or (None, None, None)
            tails = record.tails.get(rank, {})
            ranks.append(LiveRank(
                rank=rank, node=rank // record.nproc_per_node, doing=_doing(report),
                collectives=report.get("seq") if report is not None else None,
                collectives_per_s=_rate(self._counts.get(rank)),
                step=progress[0], total=progress[1], steps_per_s=_rate(self._steps.get(rank)),
                scalars=dict(told.get("scalars") or {}),
                stdout=_last(tails.get("stdout")), stderr=_last(tails.get("stderr"))))
        first = reports.get(0)
        zero = (first.get("live") if first is not None else None) or {}
        return LiveData(
            note=_note(probes, bool(reports)),
            progress=progress_line(ranks),
            straggler=_straggler(record),
            ranks=ranks,
            series={name: [(t, v) for t, v in values]
                    for name, values in (zero.get("series") or {}).items()})


def _keep(points: Deque[Tuple[float, float]], t: float, value: float, window: float) -> None:
    if points and (value < points[-1][1] or t < points[-1][0]):
        points.clear()  # a new round's process
    if points and t == points[-1][0]:
        return
    points.append((t, value))
    while len(points) > 2 and points[0][0] < t - window:
        points.popleft()


def _rate(points: Optional[Deque[Tuple[float, float]]]) -> Optional[float]:
    """Per second, from the first to the last of `points` ((time, value)); None with fewer
    than two."""
    if not points or len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    (t0, v0), (t1, v1) = points[0], points[-1]
    return (v1 - v0) / (t1 - t0)


def _doing(report: Optional["Report"]) -> str:
    if report is None:
        return "no word yet"
    if report.get("done"):
        return "finished its body"
    if report.get("seq") is None:
        return "not in a process group yet" + (
            " (at %s)" % report["where"] if report.get("where") else "")
    if report.get("waiting"):
        return "in %s" % report["waiting"]
    return "computing" + (" at %s" % report["where"] if report.get("where") else "")


def _note(probes: bool, heard: bool) -> str:
    if not probes:
        return ("Hang detection is off for this step (hang_timeout=0), so no probe samples the "
                "ranks: this live card shows the timeline and each rank's last lines only.")
    if not heard:
        return "No rank's probe has been read yet (the first read comes within a probe interval)."
    return ""


def progress_line(ranks: Sequence[LiveRank]) -> str:
    """Percent done and time left, from rank 0's progress (else the first rank that gave a
    total); empty when no rank said its total."""
    told = [r for r in ranks if r["step"] is not None and r["total"]]
    if not told:
        return ""
    rank = told[0]
    step, total = rank["step"], rank["total"]
    assert step is not None and total is not None  # told
    text = "%.0f%% (step %s of %s, rank %d)" % (100 * min(step / total, 1.0), _number(step),
                                                 _number(total), rank["rank"])
    rate = rank["steps_per_s"]
    if rate and rate > 0 and step < total:
        text += ", about %s left at %.3g steps/s" % (duration((total - step) / rate), rate)
    return text


def _straggler(record: GangRecord) -> str:
    if record.straggler is None:
        return ""
    others = [share for rank, share in record.waiting.items() if rank != record.straggler]
    waited = sum(others) / len(others) if others else 0.0
    return ("rank %d (node %d): the other ranks wait %.0f%% of their time for it, over the last "
            "%s" % (record.straggler, record.straggler // record.nproc_per_node, 100 * waited,
                    duration(record.waiting_span_s)))


def duration(seconds: float) -> str:
    """'45 s', '3 min 20 s', '2 h 5 min'."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return "%d s" % seconds
    if seconds < 3600:
        return "%d min %d s" % divmod(seconds, 60)
    return "%d h %d min" % (seconds // 3600, seconds % 3600 // 60)


def _number(value: float) -> str:
    return "%d" % value if value == int(value) else "%.4g" % value


def _last(lines: Optional[Sequence[str]]) -> str:
    line = lines[-1] if lines else ""
    return line if len(line) <= LINE_WIDTH else line[:LINE_WIDTH - 1] + "\u2026"


def live_rows(data: LiveData) -> List[List[str]]:
    """The live table's rows, one per rank."""
    def rate(value: Optional[float]) -> str:
        return "" if value is None else "%.3g" % value

    rows = []
    for r in data["ranks"]:
        step = "" if r["step"] is None else _number(r["step"]) + (
            " of %s" % _number(r["total"]) if r["total"] else "")
        rows.append([str(r["rank"]), str(r["node"]), r["doing"],
                     "" if r["collectives"] is None else str(r["collectives"]),
                     rate(r["collectives_per_s"]), step, rate(r["steps_per_s"]),
                     ", ".join("%s=%.4g" % kv for kv in sorted(r["scalars"].items())),
                     r["stdout"], r["stderr"]])
    return rows


LIVE_HEADERS = ["Rank", "Node", "Doing", "Collectives", "Collectives/s", "Step", "Steps/s",
                "Recorded (last)", "Last stdout line", "Last stderr line"]


def series_spec(name: str, values: ScalarValues) -> Dict[str, Any]:
    """A Vega-Lite line of rank 0's values of scalar `name` so far."""
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": "%s (rank 0, so far)" % name,
        "width": 400,
        "data": {"values": [{"t": t, "value": v} for t, v in values]},
        "mark": {"type": "line", "point": len(values) < 30},
        "encoding": {"x": {"field": "t", "type": "quantitative",
                           "title": "seconds since rank 0 started"},
                     "y": {"field": "value", "type": "quantitative", "title": name}},
    }


def live_components(data: LiveData) -> List[Any]:
    """The live section of the card (card.components puts it under the title)."""
    from metaflow.cards import Markdown, Table, VegaChart

    text = ["### Now"]
    if data["progress"]:
        text.append("**Progress:** %s" % data["progress"])
    if data["straggler"]:
        text.append("**Straggler:** %s" % data["straggler"])
    if data["note"]:
        text.append(data["note"])
    out: List[Any] = [Markdown("\n\n".join(text)), Table(live_rows(data), headers=LIVE_HEADERS)]
    out += [VegaChart(series_spec(name, values)) for name, values in data["series"].items()
            if values]
    return out


class LiveCard:
    """The thread of node 0's task that draws the gang's card every `interval` seconds while
    the gang runs, from `view()` (Leader.live_view; None before the gang started), and saves
    it with `save(html, token)` (card.TaskCard.save_live). `stop` ends it before the final
    card is drawn. A failure to draw or save is said once and the thread goes on: the card
    is a view, the step's result never depends on it."""

    def __init__(self, step_name: str, view: Callable[[], Optional[LiveView]],
                 draw: Callable[[LiveView, LiveFigures], Sequence[Any]],
                 save: Callable[[Sequence[Any], str], None], interval: float) -> None:
        self.step_name = step_name
        self.view = view
        self.draw_components = draw
        self.save = save
        self.interval = interval
        self.figures = LiveFigures()
        self.drawn = 0  # cards saved so far
        self._said = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="torch-distributed-live-card",
                                        daemon=True)

    def start(self) -> "LiveCard":
        self._thread.start()
        return self

    def stop(self) -> None:
        """No draw after this returns (one under way ends first)."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.refresh()

    def refresh(self) -> bool:
        """Draw and save the card once; False when there is no gang yet or it failed."""
        try:
            view = self.view()
            if view is None:
                return False
            self.figures.add(view.at, view.reports)
            parts = self.draw_components(view, self.figures)
            if self._stop.is_set():
                return False  # the final card is being drawn: never save over it
            self.save(parts, "live-%d" % (self.drawn + 1))
            self.drawn += 1
            return True
        except Exception as ex:  # noqa: BLE001 - the card is a view: said once, tried again
            if not self._said:
                self._said = True
                print("@torch_distributed on step *%s*: could not refresh the gang's live card "
                      "(%s: %s); the step goes on and its final card is drawn as it ends."
                      % (self.step_name, type(ex).__name__, ex), file=sys.stderr, flush=True)
            return False

