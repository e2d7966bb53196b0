"""The live card's figures (mf/livecard.py), what a rank tells it (events.RankLog.live,
current.torch_distributed.progress), node 0's tails written while lines come (TailKeeper), and
the LiveCard thread's handling of a failed draw. Tables of plain data, no gang."""

import json
import threading

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedConfigError)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import (
    Topology)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import (
    card, events, livecard)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.current import (
    TorchDistributedInfo)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.events import (
    GangRecord, RankLog, TailKeeper)


def _record(nodes=1, nproc=2, tails=None, waiting=None, straggler=None):
    return GangRecord(step="train", attempt=0, gang_id="g", nodes=nodes, nproc_per_node=nproc,
                      accelerator="cpu", backend="gloo", scheduler="local", start_method="fork",
                      master_addr="127.0.0.1", master_port=1, started=100.0, ended=160.0,
                      tails=tails or {}, waiting=waiting or {}, waiting_span_s=120.0,
                      straggler=straggler)


def _report(seq, waiting=None, where="train.py:9 in train", done=False, live=None):
    return {"quiet_s": 0.0, "seq": seq, "waiting": waiting, "where": where, "stack": "",
            "age_s": 0.1, "done": done, "history": None, "live": live}


def test_rates_come_from_successive_reads_and_a_restart_starts_them_afresh():
    figures = livecard.LiveFigures(window=60)
    figures.add(10.0, {0: _report(100, live={"progress": [10, 100, 5.0]})})
    figures.add(10.0, {0: _report(999)})  # the same read again: nothing added
    figures.add(20.0, {0: _report(150, live={"progress": [30, 100, 15.0]})})
    [row] = figures.data(_record(nproc=1), {0: _report(150, live={
        "progress": [30, 100, 15.0], "scalars": {"loss": 0.5}})}, probes=True)["ranks"]
    assert (row["collectives"], row["collectives_per_s"], row["step"], row["total"],
            row["steps_per_s"], row["scalars"]) == (150, 5.0, 30, 100, 2.0, {"loss": 0.5})
    figures.add(30.0, {0: _report(3, live={"progress": [1, 100, 1.0]})})  # a new round
    [row] = figures.data(_record(nproc=1), {0: _report(3)}, probes=True)["ranks"]
    assert (row["collectives_per_s"], row["steps_per_s"]) == (None, None)


def test_rates_are_taken_over_the_window_only():
    figures = livecard.LiveFigures(window=10)
    for t, seq in [(0, 0), (5, 100), (10, 110), (15, 120), (20, 130)]:
        figures.add(float(t), {0: _report(seq)})
    [row] = figures.data(_record(nproc=1), {0: _report(130)}, probes=True)["ranks"]
    assert row["collectives_per_s"] == 2.0  # (130 - 110) / (20 - 10), the burst before is out


@pytest.mark.parametrize("report, doing", [
    (None, "no word yet"),
    (_report(None, where="train.py:3 in train"), "not in a process group yet (at train.py:3 in "
     "train)"),
    (_report(4, waiting="all_reduce"), "in all_reduce"),
    (_report(4), "computing at train.py:9 in train"),
    (_report(4, where=None), "computing"),
    (_report(4, done=True), "finished its body"),
])
def test_what_a_rank_is_doing(report, doing):
    reports = {} if report is None else {0: report}
    [row] = livecard.LiveFigures().data(_record(nproc=1), reports, probes=True)["ranks"]
    assert row["doing"] == doing


@pytest.mark.parametrize("ranks, line", [
    ([], ""),
    ([(None, None, None)], ""),
    ([(5, None, 1.0)], ""),  # a step without a total: no percent
    ([(25, 100, 2.5)], "25% (step 25 of 100, rank 0), about 30 s left at 2.5 steps/s"),
    ([(25, 100, None)], "25% (step 25 of 100, rank 0)"),
    ([(100, 100, 3.0)], "100% (step 100 of 100, rank 0)"),
    ([(1, 7200, 0.5)], "0% (step 1 of 7200, rank 0), about 3 h 59 min left at 0.5 steps/s"),
    # rank 0 told no total: the first rank that did
    ([(3, None, 1.0), (50, 200, 10.0)], "25% (step 50 of 200, rank 1), about 15 s left at 10 "
     "steps/s"),
    ([(2.5, 10, 0.5)], "25% (step 2.5 of 10, rank 0), about 15 s left at 0.5 steps/s"),
])
def test_progress_line(ranks, line):
    rows = [livecard.LiveRank(rank=i, node=0, doing="", collectives=None,
                              collectives_per_s=None, step=step, total=total, steps_per_s=rate,
                              scalars={}, stdout="", stderr="")
            for i, (step, total, rate) in enumerate(ranks)]
    assert livecard.progress_line(rows) == line


def test_the_live_data_of_a_gang():
    tails = {0: {"stdout": ["epoch 1", "epoch 2"], "stderr": ["x" * 100]}}
    record = _record(nproc=2, tails=tails, waiting={0: 0.4, 1: 0.05}, straggler=1)
    reports = {0: _report(7, waiting="all_reduce", live={
        "progress": [7, 10, 3.0], "series": {"loss": [[1.0, 0.9], [2.0, 0.5]]}}),
        1: _report(6)}
    data = livecard.LiveFigures().data(record, reports, probes=True)
    assert data["straggler"] == ("rank 1 (node 0): the other ranks wait 40% of their time for "
                                 "it, over the last 2 min 0 s")
    assert data["progress"] == "70% (step 7 of 10, rank 0)"
    assert data["series"] == {"loss": [(1.0, 0.9), (2.0, 0.5)]}
    assert data["note"] == ""
    assert livecard.live_rows(data) == [
        ["0", "0", "in all_reduce", "7", "", "7 of 10", "", "", "epoch 2", "x" * 79 + "\u2026"],
        ["1", "0", "computing at train.py:9 in train", "6", "", "", "", "", "", ""]]


@pytest.mark.parametrize("probes, reports, note", [
    (False, {}, "Hang detection is off for this step (hang_timeout=0), so no probe samples the "
     "ranks: this live card shows the timeline and each rank's last lines only."),
    (True, {}, "No rank's probe has been read yet (the first read comes within a probe "
     "interval)."),
    (True, {0: _report(1), 1: _report(1)}, ""),
])
def test_the_live_card_says_what_it_cannot_show(probes, reports, note):
    assert livecard.LiveFigures().data(_record(), reports, probes)["note"] == note


def test_the_live_card_is_a_running_card_with_no_outcome_yet():
    """card_data with live data: the title says running, the last marker is now, node rows of
    nodes whose share comes at the end say so, and the components hold the live section and
    no outcome."""
    record = _record(nodes=2, nproc=1)
    live = livecard.LiveFigures().data(record, {}, probes=True)
    data = card.card_data(record, live=live)
    assert data["title"] == "Gang of step train, attempt 0: running"
    assert data["markers"][-1] == {"name": "now", "t": 60.0}
    assert data["nodes"][1][2] == "(told as the gang ends)"
    sources = [getattr(c, "_source", None) or getattr(c, "text", "") for c in
               card.components(data)]
    rendered = json.dumps([c.render() for c in card.components(data)])
    assert "### Now" in rendered and "Outcome" not in rendered, sources
    final = card.card_data(record)
    assert final["title"] == "Gang of step train, attempt 0"
    assert final["markers"][-1]["name"] == "gang ended"
    assert "Outcome: success" in json.dumps([c.render() for c in card.components(final)])


def test_a_ranks_live_word_carries_its_progress_scalars_and_rank_0s_series(tmp_path):
    clock = iter(float(t) for t in range(100, 10000))
    log = RankLog(0, str(tmp_path / "rank"), clock=lambda: next(clock))
    assert log.live(series=True) == {}
    for i in range(500):
        log.record("loss", 1.0 / (i + 1))
    log.record("lr", 0.1)
    log.report_progress(500, 1000)
    other = log.live(series=False)
    assert other == {"progress": [500, 1000, 502.0], "scalars": {"loss": 1.0 / 500, "lr": 0.1}}
    zero = log.live(series=True)
    loss = zero["series"]["loss"]
    assert len(loss) == events.LIVE_SERIES_VALUES and loss[0] == [1.0, 1.0]
    assert loss[-1] == [500.0, 1.0 / 500]  # the last value always kept
    assert zero["series"]["lr"] == [[501.0, 0.1]]
    json.dumps(zero)  # what the probe writes


def test_thinned_keeps_at_most_so_many_evenly_spread():
    assert events.thinned([1, 2, 3], 5) == [1, 2, 3]
    assert events.thinned(list(range(11)), 3) == [0, 5, 10]
    assert events.thinned(list(range(1000)), 200)[-1] == 999


def _info():
    return TorchDistributedInfo(Topology(1, 2), 0, 0, "127.0.0.1", 1, "cpu", "g", "s")


@pytest.mark.parametrize("step, total", [(-1, 10), ("a", 10), (None, None), (1, 0), (1, -5),
                                         (1, "x"), (float("nan"), None), (True, None),
                                         (1, float("inf"))])
def test_progress_refuses_what_is_not_a_step(monkeypatch, step, total):
    from metaflow import current

    monkeypatch.setattr(type(current), "step_name", property(lambda _: "train"), raising=False)
    with pytest.raises(TorchDistributedConfigError) as raised:
        _info().progress(step, total=total)
    assert "progress(%r, total=%r)" % (step, total) in str(raised.value)
    assert "train" in str(raised.value)


def test_progress_outside_a_ranks_body_is_kept_nowhere_and_fails_nothing():
    assert events.current_rank_log() is None
    _info().progress(3, total=10)
    _info().progress(3.5)


def test_node_0s_tails_are_written_while_lines_come(tmp_path):
    now = [0.0]
    path = tmp_path / "tails.json"
    keeper = TailKeeper(str(path), interval=2.0, clock=lambda: now[0])
    assert keeper.due() is None
    keeper(1, b"[rank 0] one\n")
    assert keeper.due() == 2.0 and not path.exists()  # written at most every 2 s
    now[0] = 1.0
    keeper.tick(now[0])
    assert not path.exists()
    now[0] = 2.5
    keeper.tick(now[0])  # the pump's tick: written though no line came since
    assert json.loads(path.read_text()) == {"0": {"stdout": ["one"]}}
    assert keeper.due() is None  # nothing new
    keeper(2, b"[rank 1] two\n")
    now[0] = 5.0
    keeper(2, b"not a rank's line\n")  # a line comes: written, as the interval passed
    assert json.loads(path.read_text()) == {"0": {"stdout": ["one"]}, "1": {"stderr": ["two"]}}
    keeper.close()
    assert json.loads(path.read_text()) == {"0": {"stdout": ["one"]}, "1": {"stderr": ["two"]}}


def test_the_pump_ticks_a_sink_that_writes_on_its_own_clock(tmp_path):
    """A rank's line followed by silence reaches the tails file within the interval: the pump's
    select wakes for the sink's due time (procs._pump), not only for the next line."""
    import os

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import procs

    path = tmp_path / "tails.json"
    r, w = os.pipe()
    pumped = threading.Thread(target=procs._pump, args=([(r, b"[rank 0] ", 1)],
                                                        TailKeeper(str(path), interval=0.2)))
    pumped.start()
    try:
        os.write(w, b"first\n")
        os.write(w, b"second\n")  # within the interval of the first: written on a tick
        deadline = threading.Event()
        for _ in range(50):
            found = events.read_json(str(path))
            if found == {"0": {"stdout": ["first", "second"]}}:
                break
            deadline.wait(0.1)
        assert events.read_json(str(path)) == {"0": {"stdout": ["first", "second"]}}
    finally:
        os.close(w)
        pumped.join(timeout=10)
        os.close(r)


def test_a_live_card_that_cannot_draw_says_so_once_and_goes_on(capsys):
    views = []

    def view():
        views.append(1)
        raise OSError("disk full")

    live = livecard.LiveCard("train", view, lambda v, f: [], lambda parts, token: None, 60)
    assert live.refresh() is False and live.refresh() is False
    assert len(views) == 2 and live.drawn == 0
    err = capsys.readouterr().err
    assert err.count("could not refresh the gang's live card (OSError: disk full)") == 1


def test_a_live_card_draws_numbered_tokens_and_never_after_its_stop():
    record = _record()
    saved = []
    live = livecard.LiveCard("train", lambda: events.LiveView(record, 1.0, {}),
                             lambda v, f: ["parts"], lambda parts, token: saved.append(token),
                             60)
    assert live.view() is not None
    assert live.refresh() and live.refresh()
    assert saved == ["live-1", "live-2"] and live.drawn == 2
    live.stop()  # never started: stop still holds
    assert live.refresh() is False and saved == ["live-1", "live-2"]
