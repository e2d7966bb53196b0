"""The gang's record (events.py): each record's JSON round-trip, a record in the JSON form an
earlier release kept (its card still renders), and GangRecorder.collect putting a record
together from node 0's files, a remote node's share and the tails."""

import json
import socket
from types import SimpleNamespace

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import sealed
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import Failure
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import card, events
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.events import (
    GangRecord, NodeInfo, NodeRecord, RankProcess, RankRecord, RestartRecord, RoundRecord)

T0 = 1000.0
KILLED = Failure(3, 1, "signal", T0 + 5, -9, local_rank=1)
RAISED = Failure(1, 0, "exception", T0 + 3, 1, "ValueError: bad batch", "Traceback ...",
                 local_rank=1, symptom=False)
RANK = RankRecord(2, T0 + 0.3, T0 + 1.0, T0 + 9.0, "failed", "DistBackendError: reset", True,
                  {"loss": [(0.5, 1.25), (1.0, 0.75)]}, {"gather": 2})
NODE = NodeRecord(NodeInfo(1, "host-1", "10.0.0.2", batch_job="job-1", batch_node_index="1"),
                  T0 + 0.5, {2: RankProcess(T0 + 0.2, 1, RANK), 3: RankProcess(T0 + 0.2, -9)},
                  {"abort": 1})
ROUND = RoundRecord(0, T0, T0 + 3.1, {2: RANK}, {1: NODE}, (KILLED,))
GANG = GangRecord(
    step="train", attempt=1, gang_id="1-train-2-1", nodes=2, nproc_per_node=2,
    accelerator="cpu", backend="gloo", scheduler="batch", start_method="fork",
    master_addr="10.0.0.1", master_port=29500, started=T0, ended=T0 + 10,
    phases=(("abort", T0 + 5.1), ("restart", T0 + 6)),
    node_info={0: NodeRecord(NodeInfo(0, "host-0", None, pod="train-0"), T0), 1: NODE},
    ranks={0: RankRecord(0, T0), 2: RANK}, failures=(KILLED, RAISED), root_cause=KILLED,
    stopped=("[rank 0]", "[node 1 agent]"), tails={3: {"stdout": ["a"], "stderr": ["b"]}},
    ignored_messages={"abort": 1, "gather": 2},
    restarts=(RestartRecord.of_failure(0, KILLED),), rounds=(ROUND,))


@pytest.mark.parametrize("original", [
    RANK, RankRecord(0, T0), RankProcess(None, None), NODE, NODE.info, ROUND,
    RestartRecord(2, T0 + 1, "rank 1 (node 0, local rank 1) exited with code 3."), GANG,
    GangRecord("train", 0, "g", 1, 1, "cpu", "gloo", "local", "exec", "127.0.0.1", 1, T0, T0),
], ids=lambda r: type(r).__name__)
def test_every_record_comes_back_from_its_json_form(original):
    text = json.dumps(original.to_dict())
    again = type(original).from_dict(json.loads(text))
    assert again == original
    assert json.dumps(again.to_dict()) == text


def test_the_json_form_keeps_its_keys_as_strings_and_its_failures_as_failure_json():
    form = GANG.to_dict()
    assert form["version"] == events.RECORD_VERSION == 1
    assert set(form["node_info"]) == {"0", "1"} and set(form["ranks"]) == {"0", "2"}
    assert form["node_info"]["1"]["host"] == "host-1"  # a node's share is flat
    assert form["node_info"]["1"]["ranks"]["2"]["events"]["scalars"] == {
        "loss": [[0.5, 1.25], [1.0, 0.75]]}
    assert form["root_cause"] == json.loads(KILLED.to_json())
    assert form["tails"] == {"3": {"stdout": ["a"], "stderr": ["b"]}}
    assert form["phases"] == [["abort", T0 + 5.1], ["restart", T0 + 6]]


# A record as events.py kept it before the record was typed (a 2 x 2 gang on AWS Batch whose
# rank 3 was killed): node 0's share has no rank records, node 1's has its ranks'; rank 1's own
# record is of a release before `symptom` and `ignored_messages`; no restarts.
EARLIER_FORM = {
    "version": 1, "step": "train", "attempt": 0, "gang_id": "1-train-2-0", "nodes": 2,
    "nproc_per_node": 2, "accelerator": "cpu", "backend": "gloo", "scheduler": "batch",
    "start_method": "fork", "master_addr": "10.0.0.1", "master_port": 29500,
    "started": T0, "ended": T0 + 6, "phases": [["abort", T0 + 5.1]],
    "node_info": {
        "0": {"node": 0, "host": "ip-10-0-0-1", "ip": "10.0.0.1", "batch_job": "j",
              "batch_node_index": "0", "joined_gang": T0, "ignored_messages": {},
              "ranks": {"0": {"spawned": T0, "exitcode": 0},
                        "1": {"spawned": T0 + 0.1, "exitcode": 0}}},
        "1": {"node": 1, "host": "ip-10-0-0-2", "ip": "10.0.0.2", "batch_job": "j",
              "batch_node_index": "1", "joined_gang": T0 + 0.5, "ignored_messages": {},
              "ranks": {"2": {"spawned": T0 + 0.6, "exitcode": 1, "events": {
                  "rank": 2, "started": T0 + 0.6, "joined": T0 + 1.0, "ended": T0 + 5.2,
                  "outcome": "failed", "error": "DistBackendError: Connection reset",
                  "symptom": True, "scalars": {}, "ignored_messages": {}}},
                        "3": {"spawned": T0 + 0.6, "exitcode": -9, "events": None}}}},
    "ranks": {
        "0": {"rank": 0, "started": T0, "joined": T0 + 1.0, "ended": T0 + 5.3,
              "outcome": "failed", "error": "TorchDistributedAborted: x", "symptom": True,
              "scalars": {"loss": [[1.0, 0.5]]}, "ignored_messages": {}},
        "1": {"rank": 1, "started": T0 + 0.1, "joined": T0 + 1.0, "ended": T0 + 2.0,
              "outcome": "finished", "error": None, "scalars": {}},
        "2": {"rank": 2, "started": T0 + 0.6, "joined": T0 + 1.0, "ended": T0 + 5.2,
              "outcome": "failed", "error": "DistBackendError: Connection reset",
              "symptom": True, "scalars": {}, "ignored_messages": {}}},
    "failures": [json.loads(KILLED.to_json())], "root_cause": json.loads(KILLED.to_json()),
    "stopped": ["[rank 0]"], "tails": {"3": {"stdout": ["last words of rank 3"]}},
    "ignored_messages": {},
}


def test_a_record_kept_by_an_earlier_release_still_makes_its_card():
    record = GangRecord.from_dict(EARLIER_FORM)
    assert record.ranks[1].symptom is None and record.ranks[1].ignored_messages == {}
    assert record.node_info[0].ranks[0].events is None
    assert record.restarts == () and record.rounds == ()
    data = card.card_data(record)
    assert data["outcome"]["summary"] == "rank 3 (node 1, local rank 1) was killed by SIGKILL."
    assert data["outcome"]["stdout"] == ["last words of rank 3"]
    assert [r["outcome"] for r in data["ranks"]] == ["stopped", "finished", "peer failed",
                                                     "failed"]
    assert data["nodes"][1] == ["1", "2-3", "ip-10-0-0-2", "10.0.0.2", "Batch node index 1"]
    assert data["scalars"] == [dict(rank=0, name="loss", value=0.5, count=1, round=0)]
    assert card.components(data)  # every component can be made
    # kept again in this release's form, the card is the same
    assert card.card_data(GangRecord.from_dict(json.loads(json.dumps(record.to_dict())))) == data


class _Member:
    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code


def _slot(rank, code):
    return SimpleNamespace(rank=rank, member=_Member(code))


def test_a_nodes_share_reads_its_ranks_files_and_travels_as_json(tmp_path):
    work_dir = str(tmp_path)
    events.write_json(events.rank_file(work_dir, 2), RANK.to_dict())
    info = NodeInfo(1, "host-1", "10.0.0.2")
    slots = [_slot(None, None), _slot(2, 1), _slot(3, None)]  # the agent, then its ranks
    share = NodeRecord.of_node(info, slots, {2: T0 + 0.2, 3: T0 + 0.3}, T0 + 0.5, work_dir)
    assert share.ranks == {2: RankProcess(T0 + 0.2, 1, RANK), 3: RankProcess(T0 + 0.3, None)}
    assert share.ignored_messages == sealed.IGNORED.counts()
    assert NodeRecord.from_dict(json.loads(json.dumps(share.to_dict()))) == share
    # node 0's own share: its ranks' files are read once, for the whole gang
    assert NodeRecord.of_node(info, slots, {}, None).ranks[2] == RankProcess(None, 1)


def test_node_info_names_the_schedulers_place():
    batch = events.node_info(1, "127.0.0.1", {"AWS_BATCH_JOB_ID": "j#1",
                                              "AWS_BATCH_JOB_NODE_INDEX": "1"})
    assert (batch.node, batch.host, batch.ip) == (1, socket.gethostname(), "127.0.0.1")
    assert (batch.batch_job, batch.batch_node_index, batch.pod) == ("j#1", "1", None)
    pod = events.node_info(0, "127.0.0.1", {"METAFLOW_KUBERNETES_POD_NAME": "train-0",
                                            "AWS_BATCH_JOB_NODE_INDEX": "7"})
    assert (pod.pod, pod.batch_job, pod.batch_node_index) == ("train-0", None, None)
    assert events.node_info(0, "127.0.0.1", {"KUBERNETES_SERVICE_HOST": "k",
                                             "HOSTNAME": "worker-1"}).pod == "worker-1"


def _recorder(tmp_path):
    times = iter([T0, T0 + 5.1, T0 + 10])
    spec = SimpleNamespace(
        blueprint=SimpleNamespace(step_name="train"), accelerator="cpu", start_method="fork",
        attempt=SimpleNamespace(task=SimpleNamespace(retry_count=1), gang_id="1-train-2-1",
                                master_addr="127.0.0.1", master_port=29500, backend="local"))
    recorder = events.GangRecorder(spec, Topology(2, 2), clock=lambda: next(times))
    work_dir = str(tmp_path)
    events.write_json(events.rank_file(work_dir, 0), RankRecord(0, T0, T0 + 1).to_dict())
    events.write_json(events.rank_file(work_dir, 1), RankRecord(
        1, T0 + 0.1, ignored_messages={"gather": 1}).to_dict())
    events.write_json(events.tails_file(work_dir), {"0": {"stdout": ["hi"]}})
    recorder.remote_tails(2, b"[rank 2] oops\n")
    return recorder, work_dir


def test_the_recorder_puts_the_record_together_from_every_node(tmp_path):
    recorder, work_dir = _recorder(tmp_path)
    recorder.phase("abort")
    record = recorder.collect(work_dir, [_slot(0, 0), _slot(1, None)], {1: T0 + 0.1},
                              {1: NODE.to_dict()}, [KILLED], KILLED, ["[rank 0]"],
                              restarted=[RAISED], rounds=[ROUND])
    assert (record.step, record.attempt, record.scheduler) == ("train", 1, "local")
    assert (record.started, record.ended, record.phases) == (T0, T0 + 10, (("abort", T0 + 5.1),))
    # each rank's own record: node 0's from its files, node 1's from the share it sent
    assert set(record.ranks) == {0, 1, 2} and record.ranks[2] == RANK
    assert record.node_info[1] == NODE
    assert record.node_info[0].ranks == {0: RankProcess(T0, 0), 1: RankProcess(T0 + 0.1, None)}
    assert record.tails == {0: {"stdout": ["hi"]}, 2: {"stderr": ["oops"]}}
    # node 1's and rank 1's (a process of its own); rank 2's own counts are node 1's to add
    assert record.ignored_messages == sealed.merge_counts(
        sealed.IGNORED.counts(), {"abort": 1}, {"gather": 1}, {"gather": 2})
    assert (record.failures, record.root_cause, record.stopped) == ((KILLED,), KILLED,
                                                                    ("[rank 0]",))
    assert record.restarts == (RestartRecord(0, RAISED.detected_at, RAISED.sentence()),)
    assert record.rounds == (ROUND,)
    assert GangRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    assert card.card_data(record)["outcome"]["where"] == "rank 3 (node 1, local rank 1)"
