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


def _run(tmp_path):
    env = {"METAFLOW_DEFAULT_DATASTORE": "local",
           "METAFLOW_DATASTORE_SYSROOT_LOCAL": str(tmp_path),
           "METAFLOW_HOME": str(tmp_path / "mfhome"), "USERNAME": "tester",
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), json.dumps(IDENTITY)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.rsplit("@@", 1)[1])


def test_members_get_the_checkpoint_node_0_loaded(tmp_path):
    got = _run(tmp_path)
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
                      "node": 0}
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
