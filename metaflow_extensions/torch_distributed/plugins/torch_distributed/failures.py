"""What went wrong in a gang, as plain data, and which failure is the root cause."""

import json
import signal
from dataclasses import asdict, dataclass
from typing import Optional

# Exceptions a rank raises because a *peer* went away; they are symptoms, not causes.
_COMMUNICATION_ERRORS = ("DistBackendError", "DistNetworkError", "DistStoreError",
                         "TorchDistributedAborted")
_COMMUNICATION_HINTS = ("Connection closed by peer", "Connection reset by peer",
                        "Broken pipe", "gloo", "NCCL", "Socket Timeout")


@dataclass
class Failure:
    """One failed rank (or node). `kind` is exception, exit, signal, missing or agent."""

    rank: Optional[int]
    node: int
    kind: str
    detected_at: float
    exitcode: Optional[int] = None
    message: str = ""
    traceback: str = ""
    local_rank: Optional[int] = None

    def where(self):
        if self.rank is None:
            return "node %d" % self.node
        return "rank %d (node %d, local rank %d)" % (self.rank, self.node, self.local_rank)

    def describe(self):
        if self.kind == "signal":
            what = "was killed by %s" % _signal_name(-self.exitcode)
        elif self.kind == "exit":
            what = "exited with code %d" % self.exitcode
        elif self.kind == "exception":
            what = "raised %s" % self.message
        else:
            what = self.message
        text = "%s %s." % (self.where(), what)
        if self.kind == "exit" and self.message:
            text += " Its last error: %s" % self.message
        if self.traceback:
            text += "\n\n%s traceback:\n%s" % (self.where(), self.traceback.rstrip())
        return text

    def is_symptom(self):
        """True when this rank most likely failed because a peer died first."""
        if self.kind != "exception":
            return False
        name = self.message.split(":", 1)[0]
        return name in _COMMUNICATION_ERRORS or any(
            h in self.message for h in _COMMUNICATION_HINTS
        )

    def to_json(self):
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text):
        return cls(**json.loads(text))


def from_exit(rank, node, local_rank, returncode, detected_at, error_file=None):
    """The failure of a process that ended with `returncode` (negative: killed by a signal)."""
    recorded = read_error_file(error_file) if error_file else None
    if recorded is not None:
        message, tb = recorded
        return Failure(rank, node, "exception", detected_at, returncode, message, tb, local_rank)
    kind = "signal" if returncode < 0 else "exit"
    return Failure(rank, node, kind, detected_at, returncode, local_rank=local_rank)


def read_error_file(path):
    """(message, traceback) from a torchelastic error file, or None if there is none."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    message = data.get("message", {})
    if isinstance(message, str):
        return message, ""
    return message.get("message", ""), message.get("extraInfo", {}).get("py_callstack", "")


def root_cause(failures):
    """The failure to report: the earliest that is not a symptom of a peer's death."""
    if not failures:
        return None
    ordered = sorted(failures, key=lambda f: f.detected_at)
    causes = [f for f in ordered if not f.is_symptom()]
    return (causes or ordered)[0]


def _signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "signal %d" % signum
