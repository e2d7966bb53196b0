"""The gang card's data, from recorded gang events: success, a member's failure, a lost node,
a retry. Records are built as GangRecorder.collect builds them (events.GangRecord)."""

import dataclasses
import json
from types import SimpleNamespace

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import card, events
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import Failure

T0 = 1000.0


def record(nodes=2, nproc=2, ranks=None, failures=(), root=None, phases=(), attempt=0,
           node_info=None, tails=None, ended=T0 + 10, restarts=(), rounds=()):
    return events.GangRecord(
        step="train", attempt=attempt, gang_id="1-train-2-%d" % attempt,
        nodes=nodes, nproc_per_node=nproc, accelerator="cpu", backend="gloo",
        scheduler="local", start_method="fork", master_addr="127.0.0.1", master_port=29500,
        started=T0, ended=ended, phases=tuple(phases),
        node_info=node_info if node_info is not None else {
            n: node_share(n, "host-%d" % n, "10.0.0.%d" % n, T0 + 0.5 * n)
            for n in range(nodes)},
        ranks=ranks if ranks is not None else {},
        failures=tuple(failures), root_cause=root, tails=tails or {},
        restarts=tuple(restarts), rounds=tuple(rounds))


def node_share(node, host, ip, joined_gang):
    return events.NodeRecord(events.NodeInfo(node, host, ip), joined_gang)


def rank_events(rank, started, joined, ended, outcome="finished", error=None, scalars=None):
    return events.RankRecord(rank, T0 + started, None if joined is None else T0 + joined,
                             T0 + ended, outcome, error, scalars=scalars or {})


def test_success_every_rank_on_one_axis_with_phases():
    ranks = {r: rank_events(r, 0.1 * r, 1.0 + r, 9.0) for r in range(4)}
    data = card.card_data(record(ranks=ranks))
    assert [(r["rank"], r["node"], r["outcome"]) for r in data["ranks"]] == [
        (0, 0, "finished"), (1, 0, "finished"), (2, 1, "finished"), (3, 1, "finished")]
    # rank 3 entered init_process_group 4 s after it started: its grey bar says so
    bars = [(b["rank"], b["state"], b["start"], b["end"]) for b in data["timeline"]]
    assert (3, "starting", 0.3, 4.0) in bars and (3, "finished", 4.0, 9.0) in bars
    markers = {m["name"]: m["t"] for m in data["markers"]}
    assert markers == {"nodes joined": 0.5, "rendezvous done": 4.0, "gang ended": 10.0}
    assert data["outcome"] == dict(ok=True, finished=[0, 1, 2, 3])
    assert data["nodes"][1][:4] == ["1", "2-3", "host-1", "10.0.0.1"]
    assert data["topology"][0][1] == "2 nodes x 2 processes per node = 4 ranks"


def test_member_killed_root_cause_tail_and_who_was_stopped():
    killed = Failure(3, 1, "signal", T0 + 5.0, -9, local_rank=1)
    ranks = {0: rank_events(0, 0, 1, 5.4, "failed",
                            "TorchDistributedAborted: another rank of the gang failed"),
             1: rank_events(1, 0, 1, 2.0),  # finished before the failure
             2: rank_events(2, 0.2, 1, 5.3, "failed", "DistBackendError: Connection reset"),
             # what rank 3 wrote as it joined the group, before it was killed
             3: dataclasses.replace(rank_events(3, 0.3, 1.2, 0, outcome=None), ended=None)}
    tails = {3: {"stdout": ["step 1", "step 2"], "stderr": ["warning"]}}
    data = card.card_data(record(ranks=ranks, failures=[killed], root=killed, tails=tails,
                                 phases=[("abort", T0 + 5.1)]))
    outcome = data["outcome"]
    assert not outcome["ok"]
    assert (outcome["rank"], outcome["node"], outcome["error"]) == (3, 1, "signal")
    assert outcome["summary"] == "rank 3 (node 1, local rank 1) was killed by SIGKILL."
    assert outcome["stdout"] == ["step 1", "step 2"] and outcome["stderr"] == ["warning"]
    # rank 0 was aborted by the gang, rank 2 failed as its peer died: neither is a cause
    assert outcome["stopped"] == [0, 2] and outcome["finished"] == [1]
    by_rank = {r["rank"]: r for r in data["ranks"]}
    assert by_rank[3]["outcome"] == "failed" and by_rank[3]["ended"] == 5.0
    assert (by_rank[0]["outcome"], by_rank[2]["outcome"]) == ("stopped", "peer failed")
    assert [(b["state"], b["start"], b["end"]) for b in data["timeline"] if b["rank"] == 3] == [
        ("starting", 0.3, 1.2), ("failed", 1.2, 5.0)]
    assert {m["name"] for m in data["markers"]} >= {"abort", "gang ended"}


def test_node_lost_its_ranks_are_stopped_and_it_says_nothing():
    lost = Failure(None, 1, "lost", T0 + 8.0, message="stopped sending heartbeats 10s ago")
    info = {0: node_share(0, "a", "10.0.0.1", T0)}
    ranks = {0: rank_events(0, 0, 1, 8.2, "failed", "TorchDistributedAborted: x"),
             1: rank_events(1, 0, 1, 8.2, "failed", "TorchDistributedAborted: x")}
    data = card.card_data(record(ranks=ranks, failures=[lost], root=lost, node_info=info,
                                 phases=[("abort", T0 + 8.1)]))
    assert data["outcome"]["where"] == "node 1"
    assert data["outcome"]["error"] == "lost"
    assert data["outcome"]["stopped"] == [0, 1, 2, 3]
    assert data["nodes"][1][2] == "(no word from this node)"
    # no word from node 1's ranks: they show from the gang's start until the abort
    assert {(b["rank"], b["state"], b["end"]) for b in data["timeline"] if b["node"] == 1} == {
        (2, "stopped", 8.1), (3, "stopped", 8.1)}
    assert "nodes joined" not in {m["name"] for m in data["markers"]}


def test_retry_shows_every_attempt():
    first_cause = Failure(1, 0, "exception", T0 + 3, 1, "ValueError: bad batch", "Traceback",
                          local_rank=1)
    first = record(failures=[first_cause], root=first_cause, ended=T0 + 4)
    ranks = {r: rank_events(r, 0, 1, 2) for r in range(4)}
    second = record(ranks=ranks, attempt=1)
    data = card.card_data(second, history=[first])
    assert data["title"] == "Gang of step train, attempt 1"
    assert data["attempts"] == [
        ["0", "4.0 s", "rank 1 (node 0, local rank 1) raised ValueError: bad batch."],
        ["1", "10.0 s", "succeeded"]]


def test_an_exception_root_cause_shows_its_type_message_and_traceback():
    tb = ('Traceback (most recent call last):\n  File "flow.py", line 42, in train\n'
          '    raise ValueError("bad batch")\nValueError: bad batch\n')
    cause = Failure(2, 1, "exception", T0 + 3, 1, "ValueError: bad batch", tb, local_rank=0)
    ranks = {2: rank_events(2, 0, 1, 3, "failed", "ValueError: bad batch")}
    tails = {2: {"stderr": ["about to fail"]}}
    data = card.card_data(record(ranks=ranks, failures=[cause], root=cause, tails=tails))
    outcome = data["outcome"]
    assert (outcome["error"], outcome["message"]) == ("ValueError", "ValueError: bad batch")
    assert outcome["summary"] == "rank 2 (node 1, local rank 0) raised ValueError: bad batch."
    assert outcome["traceback"] == tb
    # what the card shows: the traceback and the rank's last stderr lines, under the cause
    [text] = [c.render()["source"] for c in card.components(data)
              if "Outcome: failed" in str(c.render())]
    assert "Traceback of rank 2 (node 1, local rank 0):" in text
    assert 'raise ValueError("bad batch")' in text
    assert "Last stderr lines of rank 2 (node 1, local rank 0):" in text
    assert "about to fail" in text


def test_scalars_last_value_per_rank():
    ranks = {r: rank_events(r, 0, 1, 2, scalars={"samples_per_s": [(0.5, 10.0),
                                                                  (1.0, 100.0 + r)]})
             for r in range(2)}
    data = card.card_data(record(nodes=1, ranks=ranks))
    assert data["scalars"] == [
        dict(rank=0, name="samples_per_s", value=100.0, count=2, round=0),
        dict(rank=1, name="samples_per_s", value=101.0, count=2, round=0)]
    spec = card.scalars_spec(data["scalars"], "samples_per_s")
    assert [v["value"] for v in spec["data"]["values"]] == [100.0, 101.0]
    assert "xOffset" not in spec["encoding"]  # one round: a bar per rank


def test_scalars_of_every_round_of_a_gang_restarted_in_place():
    """Round 0 recorded a value, was restarted, and round 1 recorded its own: the card keeps
    both, a bar per rank and round (before, only the last round's were shown)."""
    def ranks(base):
        return {r: rank_events(r, 0, 1, 2, scalars={"loss": [(1.0, base + r)]})
                for r in range(2)}

    earlier = events.RoundRecord(round=0, started=0.0, ended=1.0, ranks=ranks(10.0))
    restart = events.RestartRecord.of_failure(0, Failure(1, 0, "signal", 1.0, local_rank=1))
    rec = dataclasses.replace(record(nodes=1, ranks=ranks(20.0)), rounds=(earlier,),
                              restarts=(restart,))
    data = card.card_data(rec)
    assert [(r["round"], r["rank"], r["value"]) for r in data["scalars"]] == [
        (0, 0, 10.0), (0, 1, 11.0), (1, 0, 20.0), (1, 1, 21.0)]
    spec = card.scalars_spec(data["scalars"], "loss")
    assert spec["encoding"]["xOffset"]["field"] == "round" and "each round" in spec["title"]


def test_components_are_metaflow_card_components():
    from metaflow.cards import Markdown, VegaChart

    ranks = {r: rank_events(r, 0, 1, 2, scalars={"loss": [(1.0, 0.5)]}) for r in range(4)}
    comps = card.components(card.card_data(record(ranks=ranks,
                                                  tails={2: {"stderr": ["```x"]}})))
    charts = [c for c in comps if isinstance(c, VegaChart)]
    assert len(charts) == 2  # the timeline and one scalar
    rendered = [c.render() for c in comps]
    timeline = charts[0].render()["spec"]
    assert {s["rank"] for s in timeline["layer"][0]["data"]["values"]} == {0, 1, 2, 3}
    texts = [r.get("source", "") for r in rendered if isinstance(r, dict)]
    assert any("'''x" in t for t in texts)  # a fence in a log line cannot end the block
    assert all(isinstance(c, (Markdown, VegaChart)) or c.__class__.__name__ == "Table"
               for c in comps)


def test_tail_keeper_splits_ranks_and_streams(tmp_path):
    keeper = events.TailKeeper(str(tmp_path / "tails.json"))
    keeper(1, b"[rank 0] hello\n[rank 12] x\n[node 1 agent] joined\n")
    keeper(2, b"[rank 0] oops\n")
    for i in range(events.TAIL_LINES + 5):
        keeper(1, b"[rank 3] line %d\n" % i)
    keeper.close()
    tails = json.loads((tmp_path / "tails.json").read_text())
    assert tails["0"] == {"stdout": ["hello"], "stderr": ["oops"]}
    assert tails["12"] == {"stdout": ["x"]}
    assert tails["3"]["stdout"][0] == "line 5" and len(tails["3"]["stdout"]) == events.TAIL_LINES


@pytest.mark.parametrize("raised, outcome, error", [
    (None, "finished", None),
    (ValueError("bad"), "failed", "ValueError: bad"),
    (SystemExit(0), "finished", None),
    (SystemExit(3), "failed", "SystemExit: 3"),
])
def test_rank_log_records_the_body(tmp_path, raised, outcome, error):
    path = str(tmp_path / "r.json")

    def body():
        events.current_rank_log().joined_group(4)
        events.current_rank_log().record("loss", 0.25)
        if raised is not None:
            raise raised

    if raised is None:
        events.run_recorded(2, path, body)
    else:
        with pytest.raises(type(raised)):
            events.run_recorded(2, path, body)
    got = json.loads(open(path).read())
    assert (got["rank"], got["outcome"], got["error"]) == (2, outcome, error)
    assert got["started"] <= got["joined"] <= got["ended"]
    assert got["scalars"]["loss"][0][1] == 0.25
    assert events.current_rank_log() is None


def test_record_keeps_numbers_and_refuses_anything_else(tmp_path):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.current import \
        TorchDistributedInfo
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import \
        TorchDistributedConfigError
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology

    info = TorchDistributedInfo(Topology(1, 2), 0, 1, "127.0.0.1", 29500, "cpu", "g", "s")
    path = str(tmp_path / "r.json")

    def body():
        info.record("samples_per_s", 12)
        with pytest.raises(TorchDistributedConfigError, match="must be a number"):
            info.record("samples_per_s", "fast")

    events.run_recorded(1, path, body)
    assert [v for _, v in json.loads(open(path).read())["scalars"]["samples_per_s"]] == [12.0]


def test_long_lines_are_folded_so_the_page_keeps_its_width():
    text = card._code(["x" * 250, ""])
    assert text.splitlines()[1:-1] == ["x" * 100, "x" * 100, "x" * 50, ""]


class _Broken:
    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise RuntimeError("boom")
        return fail


def test_a_card_that_cannot_be_made_never_hides_the_step_result(capsys, tmp_path):
    """The record cannot be put together, or the datastore cannot keep it: a line on stderr,
    no exception (these run as the step ends, in a `finally`)."""
    from types import SimpleNamespace

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.decorator import \
        TorchDistributedDecorator
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import Leader

    leader = Leader.__new__(Leader)
    leader.step_name, leader.remote = "train", False
    attempt = SimpleNamespace(spec=SimpleNamespace(work_dir="/nonexistent"), store=None,
                              rounds=[], round_records=[],
                              round_watch=None, recorder=_Broken(),
                              runner=SimpleNamespace(slots=[], spawned={}, stopped=[]))
    assert leader._collect(attempt) is None
    assert "@torch_distributed on step *train*: could not record the gang for its card: boom" \
        in capsys.readouterr().err

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import internals
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import \
        TaskIdentity

    deco = TorchDistributedDecorator.__new__(TorchDistributedDecorator)
    deco.step_name, deco.task_card = "train", None
    identity = TaskIdentity("1", "2", "", None, 0, 0, None, "local@%s" % tmp_path)
    flow = SimpleNamespace()
    # a datastore that cannot take the record: said, not raised
    deco.flow_datastore = _Broken()
    deco._show_gang(flow, record(), identity, 0)
    assert "@torch_distributed on step *train*: could not keep the gang's record: boom" \
        in capsys.readouterr().err
    # the record is kept beside the attempt's files, never as an artifact
    deco.flow_datastore = internals.flow_datastore_at("Flow", "local@%s" % tmp_path)
    deco._show_gang(flow, record(), identity, 0)
    assert vars(flow) == {}
    kept = internals.load_attempt_file(deco.flow_datastore, "1", "train", "2", 0,
                                       events.RECORD_FILE)
    assert kept["step"] == "train"  # its JSON form
    assert events.earlier_attempts(deco.flow_datastore, identity, "train", 1) == [record()]


def test_joining_a_group_is_noted_as_the_rank_enters_the_rendezvous(tmp_path):
    """A real (one-process) gloo group through torch's rendezvous, with the group check off."""
    import socket

    import torch.distributed as dist

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.groupcheck import \
        run_body
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def step():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=0,
                                world_size=1)
        dist.destroy_process_group()

    path = str(tmp_path / "r.json")
    env = {"METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK": "off", "RANK": "0"}
    events.run_recorded(0, path, lambda: run_body(step, (), "train", Topology(1, 2), env,
                                                  on_join=events.note_join))
    got = json.loads(open(path).read())
    assert got["started"] < got["joined"] < got["ended"]


def test_phase_labels_that_would_be_drawn_over_each_other_share_one():
    # nodes joined and rendezvous done 10 ms apart near 3.3 s, the gang's end at 3.4 s: drawn
    # over each other before; now one label for the first two, 17 px before the third
    ranks = {r: rank_events(r, 0, 3.3, 3.35) for r in range(4)}
    data = card.card_data(record(ranks=ranks, ended=T0 + 3.4, node_info={
        n: node_share(n, "h", "i", T0 + 3.29) for n in range(2)}))
    spec = card.timeline_spec(data)
    labels = spec["layer"][2]["data"]["values"]
    assert [label["name"] for label in labels] == ["nodes joined, rendezvous done", "gang ended"]
    apart = card.marker_labels([dict(name="a", t=0.0), dict(name="b", t=0.01),
                                dict(name="c", t=5.0), dict(name="d", t=10.0)])
    assert apart == [dict(name="a, b", t=0.0), dict(name="c", t=5.0), dict(name="d", t=10.0)]
    xs = [label["t"] * spec["width"] / 10.0 for label in apart]
    assert all(b - a >= card.LABEL_GAP_PX for a, b in zip(xs, xs[1:]))
    # every phase is still a rule of its own, with its name in the tooltip
    assert len(spec["layer"][1]["data"]["values"]) == 3


def test_a_card_whose_ranks_printed_nothing_says_so():
    comps = card.components(card.card_data(record(ranks={
        r: rank_events(r, 0, 1, 2) for r in range(4)})))
    last = comps[-1].render()
    assert "### Last lines of each rank" in last.get("source", "")
    assert "No rank wrote to its stdout or stderr." in last.get("source", ""), last


def _deco(name, **attributes):
    return SimpleNamespace(name=name, attributes=attributes)


@pytest.mark.parametrize("on, decorators, remote, metadata, expected", [
    (True, [], False, "local", True),
    (True, [_deco("card", type="default", id=None)], False, "local", True),  # the user's own
    (False, [], False, "local", False),  # card=False / METAFLOW_TORCH_DISTRIBUTED_CARD=0
    (True, [_deco("card", type="torch_distributed", id=None)], False, "local", False),  # there
    (True, [_deco("card", type="blank", id="torch_distributed")], False, "local", False),
    (True, [], True, "local", False),  # in a Batch job or a pod, no card can render
    (True, [], True, "service", True),
])
def test_which_gang_steps_get_the_gangs_card(on, decorators, remote, metadata, expected):
    assert card.wanted(on, decorators, remote, metadata) is expected


def test_a_gang_restarted_in_place_shows_each_round_and_its_last_rounds_ranks():
    killed = Failure(3, 0, "signal", T0 + 3, -9, local_rank=3)
    ranks = {r: rank_events(r, 4.0, 4.5, 9.0) for r in range(4)}  # round 1's
    rec = record(nodes=1, nproc=4, ranks=ranks, phases=[("abort", T0 + 3.1), ("restart", T0 + 4)],
                 restarts=[events.RestartRecord(0, T0 + 3, killed.sentence())])
    data = card.card_data(rec)
    assert data["restarts"] == [["0", "3.0 s", "rank 3 (node 0, local rank 3) was killed by "
                                 "SIGKILL."]]
    # round 0's abort does not cut short the bars of round 1, which finished
    assert [r["outcome"] for r in data["ranks"]] == ["finished"] * 4
    assert "restart" in {m["name"] for m in data["markers"]}
    shown = [c for c in card.components(data) if "Restarts in place" in str(vars(c))]
    assert shown, "the card has a section for the restarts"
    assert "restarts" not in card.card_data(record()) or not card.card_data(record())["restarts"]


def test_the_timeline_shows_every_round_of_a_gang_restarted_in_place():
    """Round 0's bars (rank 3 killed at 3 s, the others stopped at the abort) and round 1's,
    on the same rows: each rank's row shows both of its processes."""
    killed = Failure(3, 0, "signal", T0 + 3, -9, local_rank=3)
    first = {r: rank_events(r, 0.2, 0.5, 3.0, outcome="failed") for r in range(3)}
    rec = record(nodes=1, nproc=4, phases=[("abort", T0 + 3.1), ("restart", T0 + 4)],
                 ranks={r: rank_events(r, 4.0, 4.5, 9.0) for r in range(4)},
                 restarts=[events.RestartRecord(0, T0 + 3, killed.sentence())])
    rec = dataclasses.replace(rec, rounds=(events.RoundRecord(
        0, started=T0, ended=T0 + 3.1, ranks=first, node_info=rec.node_info,
        failures=(killed,)),))
    data = card.card_data(rec)
    rank3 = [s for s in data["timeline"] if s["rank"] == 3]
    assert [(s.get("round"), s["outcome"]) for s in rank3] == [(0, "failed"), (None, "finished"),
                                                                (None, "finished")], rank3
    assert rank3[0]["end"] == 3.0  # its round-0 process was killed at 3 s
    assert {s["label"] for s in rank3} == {"rank 3 (node 0)"}  # one row
    round0 = [s for s in data["timeline"] if s.get("round") == 0]
    assert all(s["end"] <= 3.1 for s in round0), round0
    assert max(s["end"] for s in data["timeline"]) == 9.0


def test_waiting_in_collectives_per_rank_and_node_with_the_straggler():
    """Issue 41 point 1: the straggler watch's last window on the card (core/stragglers.py)."""
    from metaflow.cards import Markdown

    named = dataclasses.replace(record(), waiting={0: 0.9, 1: 1.0, 2: 0.8, 3: 0.0},
                                waiting_span_s=60.0, straggler=3)
    again = events.GangRecord.from_dict(json.loads(json.dumps(named.to_dict())))
    data = card.card_data(again)
    assert data["waiting"] == [["0", "0", "90%", ""], ["1", "0", "100%", ""],
                               ["2", "1", "80%", ""], ["3", "1", "0%", "straggler"]]
    assert data["waiting_nodes"] == [["0", "95%"], ["1", "40%"]]
    assert "Over the last 60 s" in data["waiting_note"]
    assert "**Rank 3 (node 1) was the straggler**" in data["waiting_note"]
    texts = [c.render().get("source", "") for c in card.components(data)
             if isinstance(c, Markdown)]
    assert any(t.startswith("### Waiting in collectives") for t in texts)
    balanced = card.card_data(dataclasses.replace(named, straggler=None))
    assert "No rank was the straggler." in balanced["waiting_note"]
    assert all(row[3] == "" for row in balanced["waiting"])
    # no window taken (hang detection off, or a gang too short): no section
    plain = card.card_data(record())
    assert plain["waiting"] == [] and not any(
        t.startswith("### Waiting") for t in
        [c.render().get("source", "") for c in card.components(plain) if isinstance(c, Markdown)])
