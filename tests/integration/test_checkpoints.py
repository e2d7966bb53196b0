"""The @checkpoint seam (checkpoints.py) against the real metaflow-checkpoint package: what node 0
hands over, and what a member on another node makes of it, with a real local datastore.

Each case runs in a fresh interpreter: metaflow and metaflow-checkpoint read their datastore
settings once per process."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import checkpoints
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import \
    TorchDistributedConfigError
from tests import records

IDENTITY = {"METAFLOW_CHECKPOINT_UID": "SeamFlow/1/train/2/abcdef123456/default/0",
            "METAFLOW_CHECKPOINT_TASK_IDENTIFIER": "abcdef123456"}

# Node 0 saves a checkpoint of the task; members of node 0 and node 1 then take their places.
SCRIPT = r"""
import json, os, sys
from metaflow import current
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import checkpoints
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import Role
from tests import records

root, identity = sys.argv[1], json.loads(sys.argv[2])
os.environ.update(identity)
node0 = os.path.join(root, "node0")
os.makedirs(node0)
with open(os.path.join(node0, "model.pt"), "w") as f:
    f.write("weights of step 30")
saver = checkpoints.GangCheckpoint(node0, None)
earlier = saver.save(metadata={"step": 20})
ref = saver.save(metadata={"step": 30})
for key in identity:  # a member starts from what node 0 hands it, not from this environment
    del os.environ[key]
fields = {"env": identity, "loaded": ref, "directory": node0, "node": 0}

def member(node, role):
    spec = records.spec(role=Role(role), node=node, restart_count=1,
                        work_dir=os.path.join(root, "work"),
                        attempt_changes=dict(master_port=1, checkpoint=fields))
    placed = checkpoints.install_member(spec)
    chk = current.checkpoint
    files = {n: open(os.path.join(chk.directory, n)).read() for n in os.listdir(chk.directory)}
    return dict(directory=chk.directory, is_loaded=chk.is_loaded, key=chk.info.key,
                files=files, node=placed.attempt.checkpoint["node"],
                uid=os.environ["METAFLOW_CHECKPOINT_UID"])

result = dict(ref_key=ref["key"], earlier_key=earlier["key"], node0=node0,
              exec_rank_on_node_0=member(0, "rank"), agent_of_node_1=member(1, "agent"))
print("@@" + json.dumps(result))
"""


def _run(tmp_path, script, *args, timeout=120):
    """What `script` printed after "@@", run with its datastore under tmp_path."""
    env = {"METAFLOW_DEFAULT_DATASTORE": "local",
           "METAFLOW_DATASTORE_SYSROOT_LOCAL": str(tmp_path),
           "METAFLOW_HOME": str(tmp_path / "mfhome"), "USERNAME": "tester",
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path), *args],
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.rsplit("@@", 1)[1])


def test_members_get_the_checkpoint_node_0_loaded(tmp_path):
    got = _run(tmp_path, SCRIPT, json.dumps(IDENTITY))
    # two saves of one rank are two checkpoints (the second does not overwrite the first)
    assert got["earlier_key"] != got["ref_key"]
    same_node, other_node = got["exec_rank_on_node_0"], got["agent_of_node_1"]
    # a member on node 0 uses rank 0's directory as it is: no second download
    assert same_node["directory"] == got["node0"] and same_node["node"] == 0
    # node 1's agent fetched the same checkpoint into a directory of its node ...
    # a directory per round of the gang (the spec's restart_count is 1)
    assert other_node["directory"] == str(tmp_path / "work" / "checkpoint-node-1-round-1")
    assert other_node["node"] == 1  # ... which its own members then use
    for member in (same_node, other_node):
        assert member["is_loaded"] and member["key"] == got["ref_key"]
        assert member["files"] == {"model.pt": "weights of step 30"}
        # and saves from it are checkpoints of the task
        assert member["uid"] == IDENTITY["METAFLOW_CHECKPOINT_UID"]


class _Loaded:
    def to_dict(self):
        return {"key": "k"}


def test_gang_fields_carry_the_task_identity_and_the_loaded_checkpoint():
    environ = dict(IDENTITY, OTHER="x")
    checkpointer = SimpleNamespace(is_loaded=True, info=_Loaded(), directory="/tmp/chk")
    fields = checkpoints.gang_fields(SimpleNamespace(checkpoint=checkpointer), environ)
    assert fields == {"env": IDENTITY, "loaded": {"key": "k"}, "directory": "/tmp/chk",
                      "node": 0, "next_version": 0}
    fresh = SimpleNamespace(is_loaded=False, info=None, directory="/tmp/chk")
    assert checkpoints.gang_fields(SimpleNamespace(checkpoint=fresh), environ)["loaded"] is None


def test_no_checkpoint_decorator_no_fields_and_members_are_left_alone():
    assert checkpoints.gang_fields(SimpleNamespace(), IDENTITY) is None
    spec = records.spec()
    assert spec.attempt.checkpoint is None and checkpoints.install_member(spec) is spec


def test_save_sharded_without_checkpoint_decorator_says_what_to_add():
    info = SimpleNamespace(rank=0, is_main=True)
    with pytest.raises(TorchDistributedConfigError, match="Add @checkpoint"):
        checkpoints.save_sharded(info, "/tmp/shard", {})


# A property of the restart path, on a real local datastore: one or two attempts of a task, each
# of one to three rounds, every round but the last ending at a random step, saving every `every`
# steps. Each round's ranks start from what the
# gang loads for them (node 0: the task's latest, completed as reload_latest does; node 1: its
# agent's install_member) and write the loaded file's name again (after truncating or deleting
# it, at random); rank 0 saves the directory, rank 2 sometimes an extra of its own. Rank 0 is
# @checkpoint's writer (forked from the task, numbered by continue_numbering) or, at random,
# an exec'd rank's GangCheckpoint (told next_version). Prints what every scenario stored.
ROUNDS = r"""
import json, os, random, sys, tempfile, types
from metaflow import Checkpoint
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import checkpoints
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import Role
from tests import records

root, seed, scenarios = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
STATE = "state.json"


def train(w, i):  # a step of training: the weights after step i + 1
    return (w * 31 + i + 7) % 1000003


def latest_of_task():  # metaflow-checkpoint's "latest" of the task, as @checkpoint reads it
    writer = Checkpoint()
    writer._init_checkpoint_for_writes(writer)
    found = writer._checkpointer._checkpoint_datastore.latest(current_task=True, safe=True)
    return None if found is None else found.to_dict()


def write_state(directory, step, w):
    path = os.path.join(directory, STATE)
    if os.path.exists(path):  # what a user may do to a loaded file before writing it again
        os.truncate(path, 0) if rng.random() < 0.5 else os.remove(path)
    with open(path, "w") as f:
        json.dump({"step": step, "w": w}, f)


def scenario(n):
    steps, every = rng.randint(6, 24), rng.randint(1, 5)
    uninterrupted = 0
    for i in range(steps):
        uninterrupted = train(uninterrupted, i)
    expected, loaded_steps, w, done = [], [], 0, False
    attempts = rng.randint(1, 2)
    for attempt in range(attempts):
        os.environ["METAFLOW_CHECKPOINT_UID"] = "F/1/train/%d/idf%d/default/%d" % (n, n, attempt)
        os.environ["METAFLOW_CHECKPOINT_TASK_IDENTIFIER"] = "idf%d" % n
        task_writer, version = Checkpoint(), 0  # @checkpoint's writer in the attempt's task
        rounds = rng.randint(1, 3)
        for restart in range(rounds):
            if restart:  # what the task does between two rounds
                version = checkpoints.continue_numbering(
                    types.SimpleNamespace(checkpoint=task_writer, retry_count=attempt))
            node0 = tempfile.mkdtemp(dir=root)
            latest = latest_of_task()
            first, w = 0, 0
            if latest is not None:
                Checkpoint().load(latest, path=node0)
                checkpoints.complete(node0)
                with open(os.path.join(node0, STATE)) as f:
                    state = json.load(f)
                first, w = state["step"], state["w"]
            loaded_steps.append(first)
            fields = {"env": {k: os.environ[k] for k in checkpoints._IDENTITY_ENV
                              if k in os.environ},
                      "loaded": latest, "directory": node0, "node": 0, "next_version": version}
            spec = records.spec(role=Role.AGENT, node=1, restart_count=restart,
                                work_dir=os.path.join(root, "work-%d-%d" % (n, attempt)),
                                attempt_changes=dict(master_port=1, checkpoint=fields))
            checkpoints.install_member(spec)
            from metaflow import current
            node1 = current.checkpoint  # rank 2's, on node 1
            rank0 = (checkpoints.GangCheckpoint(node0, latest, version)
                     if rng.random() < 0.5 else task_writer)
            last = (attempt, restart) == (attempts - 1, rounds - 1)  # the one that finishes
            end = steps if last else rng.randint(first, steps)
            for i in range(first, end):
                w = train(w, i)
                if (i + 1) % every == 0:
                    write_state(node0, i + 1, w)
                    if isinstance(rank0, checkpoints.GangCheckpoint):
                        rank0.save(metadata={"step": i + 1})
                    else:
                        rank0.save(path=node0, metadata={"step": i + 1})
                    expected.append([attempt, i + 1])
                    if rng.random() < 0.3:
                        write_state(node1.directory, i + 1, w)
                        node1.save(name="extra-2", latest=False, metadata={"step": i + 1})
                        expected.append([attempt, i + 1])
            if end == steps:
                done = True
                break
        if done:
            break
    stored = []
    for c in sorted(Checkpoint().list(), key=lambda c: (c["attempt"], int(c["version_id"]))):
        folder = tempfile.mkdtemp(dir=root)
        Checkpoint().load(c, path=folder)
        with open(os.path.join(folder, STATE)) as f:
            held = json.load(f)["step"]
        stored.append(dict(attempt=int(c["attempt"]), version=int(c["version_id"]),
                           name=c["name"], saved_at=c["metadata"]["step"], holds=held))
    return dict(steps=steps, every=every, done=done, w=w, uninterrupted=uninterrupted,
                expected=sorted(expected), loaded=loaded_steps, stored=stored)


print("@@" + json.dumps([scenario(n) for n in range(scenarios)]))
"""


def test_every_save_of_every_round_keeps_the_step_it_was_saved_at(tmp_path):
    """Issue 38: random save intervals, rounds ended at random steps, restarts in place and
    retries; afterwards every stored checkpoint holds the step it was saved at, no save
    replaced another, and each round started from the last save before it."""
    seed = 38
    for n, got in enumerate(_run(tmp_path, ROUNDS, str(seed), "30", timeout=300)):
        where = "seed %d, scenario %d: %s" % (seed, n, got)
        stored = got["stored"]
        # what each stored checkpoint holds is what was saved, and every save is one of them
        assert all(s["holds"] == s["saved_at"] for s in stored), where
        assert sorted([s["attempt"], s["saved_at"]] for s in stored) == got["expected"], where
        # a save of a later round is numbered after the saves of the earlier ones
        for attempt in {s["attempt"] for s in stored}:
            mains = [s["saved_at"] for s in stored
                     if s["attempt"] == attempt and s["name"] == "mfchckpt"]
            assert mains == sorted(mains), where
        # each round started from the last save before it (of any round, any attempt)
        saved = sorted(s["saved_at"] for s in stored if s["name"] == "mfchckpt")
        assert all(first == 0 or first in saved for first in got["loaded"]), where
        assert got["loaded"] == sorted(got["loaded"]), where
        # the recovered training ends with the weights of an uninterrupted one
        assert got["done"] and got["w"] == got["uninterrupted"], where
