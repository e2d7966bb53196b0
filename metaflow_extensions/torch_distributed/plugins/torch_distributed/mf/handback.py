"""Rank 0's results, handed from the process that ran its body to the Metaflow task.

Rank 0's body runs in a process the task's supervisor started (gang/), so that no user code
runs where the gang is supervised. What the body leaves must still reach the task as if the
body had run there:

- its artifacts: rank 0's process saves them itself, into the task's datastore (its blobs,
  once), and hands back only their keys; the task's own save at the end of the step ends with
  those keys (internals.adopt_artifacts), so a 200 MB artifact is written once, by rank 0;
- `self.next()`'s transition and foreach state, which Metaflow and its deployers read from the
  flow object after the step: handed back as values (internals.NEXT_STATE);
- `current.card`'s components, rendered, for @card to render in the task
  (internals.card_state).

The hand-back is one pickle file in the gang's work directory, written whole (a rename) after
the body returned: a rank 0 killed before it wrote it has handed back nothing, and its exit
says why. An exception's own hand-back is for @catch, which keeps a failed body's artifacts.
"""

import os
import pickle
from typing import Any, Dict, List

from . import internals

FILE = "rank0-handback.pickle"


def path_in(work_dir: str) -> str:
    return os.path.join(work_dir, FILE)


class Sender:
    """In rank 0's process: what the flow held when the body began, then the hand-back."""

    def __init__(self, flow: Any, task_datastore: Any, path: str) -> None:
        self.flow = flow
        self.task_datastore = task_datastore
        self.path = path
        self.before = internals.flow_attributes(flow)

    def send(self) -> None:
        """Save the body's artifacts into the task's datastore and write the hand-back."""
        now = internals.flow_attributes(self.flow)
        names = [name for name in handed_names(now, self.before)
                 if internals.is_artifact(self.flow, name, now[name])]
        state = {name: now[name] for name in internals.NEXT_STATE if name in now}
        cards = internals.card_state()
        keys = internals.persist_artifacts(self.task_datastore, {name: now[name] for name in names})
        record = {"keys": keys, "state": state, "cards": cards}
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump(record, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.rename(tmp, self.path)


def handed_names(now: Dict[str, object], before: Dict[str, object]) -> List[str]:
    """The names whose stored artifacts rank 0's body decides: every public attribute the flow
    holds after the body (one changed in place looks unchanged), and every private one it set;
    not Metaflow's own state, which travels as values or is the task's to set."""
    skip = set(internals.NEXT_STATE) | set(internals.AFTER_STEP)
    return sorted(name for name, value in now.items()
                  if name not in skip and (not name.startswith("_")
                                           or name not in before or before[name] is not value))


def receive(flow: Any, task_datastore: Any, path: str) -> bool:
    """In the task, after the gang: take rank 0's hand-back (False when there is none)."""
    try:
        with open(path, "rb") as f:
            record = pickle.load(f)
    except FileNotFoundError:
        return False
    for name, value in record["state"].items():
        setattr(flow, name, value)
    internals.adopt_artifacts(task_datastore, record["keys"])
    internals.restore_card_state(record["cards"])
    return True
