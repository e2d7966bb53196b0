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
"""

import os
from dataclasses import replace

# metaflow-checkpoint's variables naming the task a checkpoint belongs to (its constants.py);
# its `Checkpoint` API writes for the task they name.
_IDENTITY_ENV = ("METAFLOW_CHECKPOINT_UID", "METAFLOW_CHECKPOINT_TASK_IDENTIFIER",
                 "METAFLOW_CHECKPOINT_ARTIFACT_STORE_CONFIG")


def gang_fields(current, environ):
    """What members need of this task's @checkpoint (a GangSpec field), None without one."""
    checkpointer = getattr(current, "checkpoint", None)
    if checkpointer is None:
        return None
    loaded = checkpointer.info.to_dict() if checkpointer.is_loaded else None
    return {"env": {k: environ[k] for k in _IDENTITY_ENV if k in environ},
            "loaded": loaded, "directory": checkpointer.directory, "node": 0}


def from_leader(spec):
    """What node 0 published of its @checkpoint, for the agent of a remote node; None when node
    0 cannot be reached (the agent then reports that the usual way)."""
    from .control import ControlPlane, GangMismatch

    try:
        control = ControlPlane.connect(spec.master_addr, spec.master_port, spec.gang_id,
                                       spec.rendezvous_timeout)
        return control.checkpoint()
    except (GangMismatch, RuntimeError):
        return None


def node_directory(spec):
    return os.path.join(spec.work_dir, "checkpoint-node-%d" % spec.node)


def install_member(spec):
    """Give this member process (agent or exec'd rank) `current.checkpoint`; the GangSpec its
    own members inherit (the checkpoint's files are then on this node)."""
    from metaflow import current

    fields = spec.checkpoint
    if fields is None:
        return spec
    os.environ.update(fields["env"])
    if fields["node"] != spec.node:  # the files are on another node: fetch them here
        directory = node_directory(spec)
        os.makedirs(directory, exist_ok=True)
        if fields["loaded"] is not None:
            _api().load(fields["loaded"], directory)
        fields = dict(fields, directory=directory, node=spec.node)
    current._update_env({"checkpoint": GangCheckpoint(fields["directory"], fields["loaded"])})
    return replace(spec, checkpoint=fields)


def _api():
    from metaflow import Checkpoint  # metaflow-checkpoint's public API

    return Checkpoint()


class GangCheckpoint:
    """`current.checkpoint` in a rank that @checkpoint's hooks did not run in.

    The same attributes as @checkpoint's own object for loading and saving: the checkpoint the
    task loaded is in `directory`, and `save` writes a checkpoint of the task (the one a retry
    loads when it is the latest).
    """

    def __init__(self, directory, loaded):
        self._directory = directory
        self._loaded = loaded

    @property
    def directory(self):
        """Where the loaded checkpoint's files are, and what `save()` saves by default."""
        return self._directory

    @property
    def is_loaded(self):
        """True when the task started from a checkpoint (a retry of a task that saved one)."""
        return self._loaded is not None

    @property
    def info(self):
        """The loaded checkpoint (metaflow-checkpoint's CheckpointArtifact), else None."""
        if self._loaded is None:
            return None
        from metaflow_extensions.obcheckpoint.plugins.machine_learning_utilities.datastructures \
            import CheckpointArtifact

        return CheckpointArtifact.hydrate(self._loaded)

    @property
    def task_identifier(self):
        return os.environ.get("METAFLOW_CHECKPOINT_TASK_IDENTIFIER")

    def save(self, path=None, **options):
        """Save `path` (default: `directory`) as a checkpoint of the task and return its
        reference; `options` (name, metadata, latest, storage_format) as @checkpoint's."""
        return _api().save(path=self._directory if path is None else path, **options)

    def load(self, reference, path=None):
        """Load the checkpoint `reference` into `path` (default: `directory`)."""
        return _api().load(reference, path=self._directory if path is None else path)
