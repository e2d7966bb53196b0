"""`@checkpoint` (package metaflow-checkpoint) on every rank of every node of a gang.

@checkpoint's hooks run in the Metaflow task: its task_pre_step makes `current.checkpoint` and,
on a retry (load_policy "fresh"), loads the task's latest checkpoint into
`current.checkpoint.directory`. Rank 0 and the ranks forked from it share that object and that
directory. A node agent or an exec'd rank is a spin-step process under a hidden task id, where
@checkpoint cannot serve: its identity (current.task_id, the spin datastore) is not the task's,
so it would look for checkpoints of a task that never existed. Instead the leader hands members
what its own @checkpoint resolved (`gang_fields`), and each other node loads the same checkpoint
through metaflow-checkpoint's public `Checkpoint` API into a directory of its own
(`install_member`), so every rank starts with the same files and the same `current.checkpoint`
shape (directory, is_loaded, info, save, load). Saves from any rank go to the task's checkpoints,
as with @checkpoint under @parallel.

Two guarantees of a stored checkpoint, whatever the ranks do (issue 38):
* it never changes: every checkpoint loaded for the ranks (by @checkpoint, again between rounds,
  on another node, by `GangCheckpoint.load`) is made of files of the directory's own (`own_files`):
  metaflow-checkpoint loads from the local datastore as links to the stored files;
* a restarted round never replaces an earlier round's saves: its writers number their saves on
  from the attempt's stored ones (`continue_numbering`), where a new writer would number them
  from 0 again, the keys of round 0's saves.
"""

import importlib
import json
import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, Dict, Iterable, Mapping, Optional

from ..core.errors import TorchDistributedConfigError
from ..core.gangspec import GangSpec

if TYPE_CHECKING:
    from ..mf.current import TorchDistributedInfo

# The one file of a sharded save's checkpoint: the references of every rank's shard.
MANIFEST = "torch_distributed_shards.json"

# metaflow-checkpoint's variables naming the task a checkpoint belongs to (its constants.py);
# its `Checkpoint` API writes for the task they name.
_IDENTITY_ENV = ("METAFLOW_CHECKPOINT_UID", "METAFLOW_CHECKPOINT_TASK_IDENTIFIER",
                 "METAFLOW_CHECKPOINT_ARTIFACT_STORE_CONFIG")


def gang_fields(current: Any, environ: Mapping[str, str], restore: bool = True,
                next_version: int = 0) -> Optional[Dict[str, Any]]:
    """What members need of this task's @checkpoint (a GangSpec field), None without one.
    A checkpoint @checkpoint loaded is completed on node 0 first (`complete`), unless `restore`
    is False (reload_latest did it). `next_version`: the number of the round's first save
    (`continue_numbering`; 0 in the first round of an attempt)."""
    checkpointer = getattr(current, "checkpoint", None)
    if checkpointer is None:
        return None
    if checkpointer.is_loaded and restore:
        complete(checkpointer.directory)
    loaded = checkpointer.info.to_dict() if checkpointer.is_loaded else None
    return {"env": {k: environ[k] for k in _IDENTITY_ENV if k in environ},
            "loaded": loaded, "directory": checkpointer.directory, "node": 0,
            "next_version": next_version}


def reload_latest(load_policy: Optional[str]) -> Optional[str]:
    """(Node 0's task, between two rounds of a gang restarted in place.) Load the task's
    latest checkpoint, a save of the round that failed included, into a fresh
    current.checkpoint.directory with @checkpoint's `load_policy`, sharded ones whole; the
    ranks of the next round are forked from this process and find it there. What was loaded
    (its key), or None (no @checkpoint, its policy "none", nothing saved yet)."""
    from metaflow import current

    from ..mf import internals

    checkpointer = getattr(current, "checkpoint", None)
    if checkpointer is None or load_policy not in ("fresh", "eager"):
        return None
    loaded = internals.reload_task_checkpoint(checkpointer, load_policy)
    if loaded is None:
        return None
    complete(checkpointer.directory)
    return getattr(loaded, "key", None) or str(loaded)


def continue_numbering(current: Any) -> int:
    """(Node 0's task, between two rounds of a gang restarted in place.) Make the saves of the
    next round's ranks forked from this task number on from every save of the attempt stored so
    far, by any round; return the number of the first (what the other members are told:
    gang_fields). metaflow-checkpoint names a save <task>.<attempt>.<name>.<number>, numbered
    per writer from 0: a round's new writers would store round 0's keys again."""
    from ..mf import internals

    checkpointer = current.checkpoint
    version = next_version(checkpointer.list(attempt=current.retry_count))
    internals.number_saves_from(checkpointer, version)
    return version


def next_version(saves: Iterable[Mapping[str, Any]]) -> int:
    """The number after every one of `saves` (metaflow-checkpoint's checkpoint dicts, any
    name): 0 for none."""
    return 1 + max((int(save["version_id"]) for save in saves), default=-1)


def load_policy(decorators: Iterable[Any]) -> Optional[str]:
    """The load policy of the step's @checkpoint (None without one)."""
    for deco in decorators:
        if deco.name == "checkpoint":
            return deco.attributes.get("load_policy") or "fresh"
    return None


def from_leader(spec: GangSpec) -> Optional[Dict[str, Any]]:
    """What node 0 published of its @checkpoint, for the agent of a remote node; None when node
    0 cannot be reached (the agent then reports that the usual way)."""
    from ..runtime.control import ControlPlane, GangMismatch

    try:
        control = ControlPlane.of_attempt(spec.attempt, spec.blueprint.rendezvous_timeout_s)
        return control.checkpoint(spec.blueprint.rendezvous_timeout_s)
    except (GangMismatch, RuntimeError):
        return None


def node_directory(spec: GangSpec) -> str:
    """Where a node other than 0 keeps the checkpoint its ranks load, one per round of the
    gang (a restart in place loads the latest again)."""
    return os.path.join(spec.work_dir, "checkpoint-node-%d%s" % (
        spec.node, "-round-%d" % spec.restart_count if spec.restart_count else ""))


def install_member(spec: GangSpec) -> GangSpec:
    """Give this member process (agent or exec'd rank) `current.checkpoint`; the GangSpec its
    own members inherit (the checkpoint's files are then on this node)."""
    from ..mf import internals

    fields = spec.attempt.checkpoint
    if fields is None:
        return spec
    os.environ.update(fields["env"])
    if fields["node"] != spec.node:  # the files are on another node: fetch them here
        directory = node_directory(spec)
        os.makedirs(directory, exist_ok=True)
        if fields["loaded"] is not None:
            _api().load(fields["loaded"], directory)
            complete(directory)
        fields = dict(fields, directory=directory, node=spec.node)
    internals.set_current("checkpoint", GangCheckpoint(fields["directory"], fields["loaded"],
                                                       fields.get("next_version", 0)))
    return spec.with_attempt(checkpoint=fields)


def save_sharded(info: "TorchDistributedInfo", path: str, options: Dict[str, Any]) -> Any:
    """current.torch_distributed.save_sharded: every rank stores its shard (the files in `path`)
    as a checkpoint of the task that is never the latest; once all are stored, rank 0 saves the
    list of them as the task's latest checkpoint. A save cut short never becomes the latest."""
    from metaflow import current

    checkpointer = getattr(current, "checkpoint", None)
    if checkpointer is None:
        raise TorchDistributedConfigError(
            current.step_name, "current.torch_distributed.save_sharded() stores shards with "
            "@checkpoint, which the step does not have. Add @checkpoint (package "
            "metaflow-checkpoint) to the step.")
    shard = checkpointer.save(path=path, name="shard-%d" % info.rank, latest=False)
    shards = info.gather(shard)
    if not info.is_main:
        return None
    with tempfile.TemporaryDirectory() as manifest_dir:
        with open(os.path.join(manifest_dir, MANIFEST), "w") as f:
            json.dump({"shards": shards}, f)
        return checkpointer.save(path=manifest_dir, **options)


def complete(directory: str) -> None:
    """Make `directory`, where a checkpoint was just loaded, what every rank starts from: the
    shards a sharded checkpoint lists loaded next to it, and every file its own."""
    restore_shards(directory)
    own_files(directory)


def own_files(directory: str) -> None:
    """Replace each symbolic link under `directory` by a copy of the file it points to.
    metaflow-checkpoint (0.2.14, ObjectStorage._load_objects) loads a checkpoint of the local
    datastore as links to the stored files: a rank that wrote the loaded file's name again
    would write into the stored checkpoint, and saving that file again under the same key
    fails (shutil.SameFileError). A checkpoint downloaded from S3 is files already."""
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            if os.path.islink(path):
                stored = os.path.realpath(path)
                os.unlink(path)
                shutil.copy2(stored, path)


def restore_shards(directory: str) -> None:
    """Load every shard a sharded checkpoint in `directory` lists, next to it."""
    manifest = os.path.join(directory, MANIFEST)
    if not os.path.exists(manifest):
        return
    with open(manifest) as f:
        shards = json.load(f)["shards"]
    for shard in shards:
        _api().load(shard, directory)


def _api() -> Any:
    from metaflow import Checkpoint  # metaflow-checkpoint's public API

    return Checkpoint()


class GangCheckpoint:
    """`current.checkpoint` in a rank that @checkpoint's hooks did not run in.

    The same attributes as @checkpoint's own object for loading and saving: the checkpoint the
    task loaded is in `directory`, and `save` writes a checkpoint of the task (the one a retry
    loads when it is the latest).
    """

    def __init__(self, directory: str, loaded: Optional[Dict[str, Any]],
                 next_version: int = 0) -> None:
        self._directory = directory
        self._loaded = loaded
        # One writer for the life of the rank: metaflow-checkpoint numbers the saves per
        # writer, and a fresh writer per save would store every save under the same key. Its
        # first save takes `next_version`, after the saves of the attempt's earlier rounds.
        self._writer: Any = None
        self._next_version = next_version

    @property
    def directory(self) -> str:
        """Where the loaded checkpoint's files are, and what `save()` saves by default."""
        return self._directory

    @property
    def is_loaded(self) -> bool:
        """True when the task started from a checkpoint (a retry of a task that saved one)."""
        return self._loaded is not None

    @property
    def info(self) -> Any:
        """The loaded checkpoint (metaflow-checkpoint's CheckpointArtifact), else None."""
        if self._loaded is None:
            return None
        # metaflow-checkpoint's module, which ships no type information (its names are Any)
        datastructures = importlib.import_module(
            "metaflow_extensions.obcheckpoint.plugins.machine_learning_utilities.datastructures")
        return datastructures.CheckpointArtifact.hydrate(self._loaded)

    def save(self, path: Optional[str] = None, **options: Any) -> Any:
        """Save `path` (default: `directory`) as a checkpoint of the task and return its
        reference; `options` (name, metadata, latest, storage_format) as @checkpoint's."""
        if self._writer is None:
            from ..mf import internals

            self._writer = _api()
            internals.number_saves_from(self._writer, self._next_version)
        return self._writer.save(path=self._directory if path is None else path, **options)

    def load(self, reference: Any, path: Optional[str] = None) -> Any:
        """Load the checkpoint `reference` into `path` (default: `directory`), as files of its
        own (writing them never changes the stored checkpoint)."""
        path = self._directory if path is None else path
        loaded = _api().load(reference, path=path)
        own_files(path)
        return loaded
