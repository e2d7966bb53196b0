"""What went wrong in a gang, as plain data, and which failure is the root cause."""

import json
import os
import pickle
import re
import signal
import sys
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, TextIO, Tuple

from ..core.errors import TorchDistributedException
from ..core.naming import rank_label

# The exception types a rank raises because a *peer* went away, by where they are defined:
# symptoms, not causes (torch's DistBackendError, DistNetworkError and DistStoreError are
# DistError's subclasses). Only for a failure known by its message alone; see is_symptom.
_COMMUNICATION_ERRORS = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError",
                         "TorchDistributedAborted")


# This package's own code (every subpackage of plugins/torch_distributed/): a rank's traceback
# leaves its frames out (user_traceback), a stack its runner's (stacks.format_stack).
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBUG_ENV = "METAFLOW_TORCH_DISTRIBUTED_DEBUG"


def debug_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether METAFLOW_TORCH_DISTRIBUTED_DEBUG (or Metaflow's configuration) asks for
    tracebacks with this package's own frames."""
    environ = os.environ if environ is None else environ
    raw: Any = environ.get(DEBUG_ENV)
    if raw is None:
        from metaflow.metaflow_config import TORCH_DISTRIBUTED_DEBUG

        raw = TORCH_DISTRIBUTED_DEBUG
    return str(raw).strip().lower() in ("1", "true", "yes", "on")


def user_traceback(text: str, package_dir: Optional[str] = None) -> str:
    """A formatted traceback without the frames of code under `package_dir` (this package's:
    the gang's own calls between the task and the step's body), so that it starts at the
    user's code. Pure."""
    prefix = '  File "%s' % os.path.join(package_dir or PACKAGE_DIR, "")
    kept: List[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        if line.startswith("  File "):
            skipping = line.startswith(prefix)
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            kept.append(line)
    return "".join(kept)


def shown_traceback(text: str) -> str:
    """`text` as a failure shows it: without this package's frames unless debugging."""
    return text if debug_enabled() else user_traceback(text)


# Characters of a failure's message in the one-line note about the other ranks (others_note).
BRIEF_CHARS = 100
# How this package's own errors begin (errors.TorchDistributedException); inside a rank's
# failure, which already names the step, it is said once, not twice.
_OUR_PREFIX = re.compile(r"^(\w+: )@torch_distributed on step \*?[\w-]+\*?: ")


# The same error of two ranks differs in their numbers only ("rank 2 finished ...").
_DIGITS = re.compile(r"\d+")


def _without_our_prefix(message: str) -> str:
    """`message` ("Type: text") without the step prefix this package's own errors carry."""
    return _OUR_PREFIX.sub(r"\1", message, count=1)


class FailureKind(str, Enum):
    """How a rank or a node failed. The value is the failure's form in the gang's store and
    record (JSON), so it stays as it is."""

    EXCEPTION = "exception"  # a rank raised (its error file says what)
    EXIT = "exit"  # a rank exited with a non-zero code, no exception known
    SIGNAL = "signal"  # a rank was killed by a signal
    MISSING = "missing"  # a member did not join within the rendezvous timeout
    AGENT = "agent"  # a node agent exited before reporting a cause
    LOST = "lost"  # a node stopped sending heartbeats
    HUNG = "hung"  # a rank neither failed nor finished while its peers timed out on it
    UNFINISHED = "unfinished"  # ranks still running long after the others finished
    ABORTED = "aborted"  # (an agent's view) node 0 aborted the gang
    CONTROL = "control"  # (an agent's view) node 0's store could no longer be reached
    PREEMPTED = "preempted"  # a SIGTERM to a node preempted the gang (preempt.py)
    TAMPERED = "tampered"  # the gang's store was tampered with (a node's messages deleted)
    DIFFERS = "differs"  # a node runs with other versions or GPUs than node 0 (nodefacts.py)

    def __str__(self) -> str:
        return self.value


@dataclass
class Failure:
    """One failed rank (or node): how (`kind`), when, and what it said. `symptom` is whether
    the exception told of a peer's failure, decided from the exception itself where it was
    raised (communication_error); None when only its message is known."""

    rank: Optional[int]
    node: int
    kind: FailureKind
    detected_at: float
    exitcode: Optional[int] = None
    message: str = ""
    traceback: str = ""
    local_rank: Optional[int] = None
    symptom: Optional[bool] = None

    def __post_init__(self) -> None:
        self.kind = FailureKind(self.kind)  # a kind read back from JSON, or a wrong one: raise

    def where(self) -> str:
        if self.rank is None:
            return "node %d" % self.node
        if self.local_rank is None:  # a failure read back from a record that lacks it
            return "rank %d (node %d)" % (self.rank, self.node)
        return "rank %d (node %d, local rank %d)" % (self.rank, self.node, self.local_rank)

    def what(self) -> str:
        if self.kind is FailureKind.SIGNAL:
            killed = "was killed by %s" % _signal_name(-(self.exitcode or 0))
            return "%s: %s" % (killed, self.message) if self.message else killed
        if self.kind is FailureKind.EXIT:
            return "exited with code %s" % self.exitcode
        if self.kind is FailureKind.EXCEPTION:
            return "raised %s" % _without_our_prefix(self.message)
        return self.message

    def brief(self) -> str:
        """`what()` in a few words, without a closing period: an exception by its type and its
        message's first line, cut at a word after BRIEF_CHARS characters."""
        if self.kind is not FailureKind.EXCEPTION:
            return self.what().rstrip(".")
        first = _without_our_prefix(self.message).split("\n", 1)[0]
        if len(first) > BRIEF_CHARS:
            return "raised %s ..." % first[:BRIEF_CHARS].rsplit(" ", 1)[0]
        return "raised %s" % first.rstrip(".: ")  # an exception without a message

    def sentence(self) -> str:
        """Who failed and how, in one sentence (no traceback)."""
        text = "%s %s" % (self.where(), self.what())
        text += "" if text.endswith(".") else "."
        if self.kind is FailureKind.EXIT and self.message:
            text += " Its last error: %s" % self.message
        return text

    def describe(self) -> str:
        """The sentence, then where to read its traceback or the traceback itself."""
        text = self.sentence()
        if self.traceback and self.printed_its_traceback():
            text += " Its traceback is in its %s lines above." % rank_label(self.rank or 0)
        elif self.traceback:
            text += "\n\n%s traceback:\n%s" % (self.where(), self.traceback.rstrip())
        return text

    def printed_its_traceback(self) -> bool:
        """True when the rank printed this failure's whole traceback in its own lines
        (report_exception: a symptom says one line, unless debugging)."""
        return (self.kind is FailureKind.EXCEPTION and self.rank is not None
                and not self.is_symptom())

    def is_symptom(self) -> bool:
        """True when this rank most likely failed because a peer died first: what the exception
        was and where it came from decided it (communication_error); for a failure known by its
        message only, the type the message names. Never the words of the message."""
        if self.kind is not FailureKind.EXCEPTION:
            return False
        if self.symptom is not None:
            return self.symptom
        return self.message.split(":", 1)[0] in _COMMUNICATION_ERRORS

    def to_dict(self) -> Dict[str, Any]:
        """The failure as JSON's types; Failure(**it) reads it back."""
        return dict(asdict(self), kind=self.kind.value)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "Failure":
        return cls(**json.loads(text))


def from_exit(rank: Optional[int], node: int, local_rank: Optional[int], returncode: int,
              detected_at: float, error_file: Optional[str] = None) -> Failure:
    """The failure of a process that ended with `returncode` (negative: killed by a signal).
    An exception's time is when it was raised (see save_exception), not when the exit was seen."""
    recorded = read_error_file(error_file) if error_file else None
    if recorded is not None and error_file:
        message, tb = recorded
        saved = _saved(error_file)
        if saved is not None:
            detected_at = min(detected_at, saved[0])
        return Failure(rank, node, FailureKind.EXCEPTION, detected_at, returncode, message,
                       shown_traceback(tb), local_rank,
                       symptom=saved[2] if saved is not None else None)
    kind = FailureKind.SIGNAL if returncode < 0 else FailureKind.EXIT
    return Failure(rank, node, kind, detected_at, returncode, local_rank=local_rank)


def raised(rank: int, node: int, local_rank: int,
           error_file: Optional[str]) -> Optional[Failure]:
    """The failure of a process that raised an uncaught exception and may still be running
    (tearing down, e.g. its DataLoader workers), or None while it has not: a member's exception
    counts once it is recorded, not once its process is gone. Its exit code is not known yet."""
    saved = _saved(error_file) if error_file and os.path.exists(error_file + ".pickle") else None
    recorded = read_error_file(error_file) if saved is not None and error_file else None
    if saved is None or recorded is None:
        return None
    message, tb = recorded
    return Failure(rank, node, FailureKind.EXCEPTION, saved[0], None, message,
                   shown_traceback(tb), local_rank, symptom=saved[2])


def communication_error(ex: BaseException) -> bool:
    """True when `ex` is how a rank learns that a peer went away, judged by its type and where
    it was raised, never by its words: a torch.distributed error (DistError and its subclasses),
    the gang's own TorchDistributedAborted, or a RuntimeError raised inside torch.distributed's
    code (how gloo's transport reports a closed connection), or raised by torch's native code
    from a gloo or c10d source file (a collective that DDP's reducer runs during backward: the
    Python frame is autograd's, the C++ origin, which c10 puts first in the error, is
    gloo's). A user's own exception, whatever it says (ValueError("NCCL not built")), is a
    cause."""
    from ..core.errors import TorchDistributedAborted

    if isinstance(ex, TorchDistributedAborted):
        return True
    dist = sys.modules.get("torch.distributed")  # loaded by anything that raised from it
    if dist is None:
        return False
    if isinstance(ex, dist.DistError):
        return True
    # exactly RuntimeError: its subclasses (NotImplementedError, ...) report misuse, a cause
    if type(ex) is not RuntimeError or not dist.__file__:
        return False
    if _raised_in(ex, os.path.dirname(dist.__file__)):
        return True
    torch_dir = os.path.dirname(os.path.dirname(dist.__file__))
    return _raised_in(ex, torch_dir) and _native_origin_is_collective(ex)


# The source location c10 puts first in a native error: "[/path/to/file.cc:553] message".
_NATIVE_ORIGIN = re.compile(r"\[([^\]\s]+):\d+\]")


def _native_origin_is_collective(ex: BaseException) -> bool:
    """True when the native code that raised `ex` is gloo's or torch's c10d (collectives)."""
    found = _NATIVE_ORIGIN.match(str(ex))
    return found is not None and any(part in found.group(1) for part in ("/gloo/", "/c10d/"))


def _raised_in(ex: BaseException, directory: str) -> bool:
    """True when the innermost frame of `ex`'s traceback is code under `directory`."""
    tb = ex.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return path.startswith(os.path.join(os.path.abspath(directory), ""))


def read_error_file(path: str) -> Optional[Tuple[str, str]]:
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
    return (str(message.get("message", "")),
            str(message.get("extraInfo", {}).get("py_callstack", "")))


def report_exception(ex: BaseException, symptom: bool,
                     file: Optional[TextIO] = None) -> None:
    """Print a rank's uncaught exception `ex` to its stderr (`file`), as the interpreter would
    but from the user's code on; an exception that tells of a peer's failure (`symptom`) in
    one line, since the gang's error names the root cause (METAFLOW_TORCH_DISTRIBUTED_DEBUG:
    every traceback in full)."""
    import traceback

    file = sys.stderr if file is None else file
    if debug_enabled():
        traceback.print_exception(type(ex), ex, ex.__traceback__, file=file)
    elif symptom:
        first = ("%s" % ex).strip().splitlines()[:1] or [""]
        print("%s: %s (most likely because another rank failed first: the step's error names "
              "the root cause; %s=1 prints this traceback)" % (type(ex).__name__, first[0],
                                                                DEBUG_ENV), file=file)
    else:
        text = "".join(traceback.format_exception(type(ex), ex, ex.__traceback__))
        if isinstance(ex, TorchDistributedException):
            # The package's own message (a framework's shape that contradicts the gang's, say)
            # is the gang's error, said in full once, by node 0: here its first words only.
            said = "".join(traceback.format_exception_only(type(ex), ex))
            if text.endswith(said):
                brief = Failure(None, 0, FailureKind.EXCEPTION, 0.0,
                                message="%s: %s" % (type(ex).__name__, ex)).brief()
                text = text[:-len(said)] + "%s (the step's error, below, says it%s with its " \
                    "fix)\n" % ((brief[len("raised "):], " in full,") if brief.endswith("...")
                                else (type(ex).__name__, ","))
        print(user_traceback(text), end="", file=file)


def save_exception(ex: BaseException, raised_at: float, error_file: str) -> None:
    """Keep, beside `error_file` (write it first), when the exception was raised and the
    exception object itself: node 0 orders failures by that time and raises the user's own
    exception (type and message) when this rank's failure is the gang's error. Whether it is a
    symptom is decided here, where its traceback still says where it came from. Written whole
    or not at all: once it is there, the rank's failure is known (see `raised`)."""
    symptom = communication_error(ex)
    try:
        data = pickle.dumps((raised_at, ex, symptom))
    except Exception:  # noqa: BLE001 - an unpicklable exception is reported by its message
        data = pickle.dumps((raised_at, None, symptom))
    partial = error_file + ".pickle.partial"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, error_file + ".pickle")


def _saved(error_file: str) -> Optional[
        Tuple[float, Optional[BaseException], Optional[bool]]]:
    """(raised_at, exception or None, symptom) that save_exception kept for `error_file`, or
    None."""
    try:
        with open(error_file + ".pickle", "rb") as f:
            raised_at, ex, symptom = pickle.load(f)
    except Exception:  # noqa: BLE001 - missing, or a class that cannot be rebuilt here
        return None
    return (float(raised_at), ex if isinstance(ex, BaseException) else None,
            None if symptom is None else bool(symptom))


def load_exception(error_file: str) -> Optional[BaseException]:
    """The exception save_exception kept for `error_file`, or None."""
    saved = _saved(error_file)
    return saved[1] if saved else None


@dataclass
class GangOutcome:
    """How a failed gang ended, rank by rank: `failed` holds every rank (or node) that failed
    on its own, earliest first (the root cause); `stopped` the ranks that were still running,
    or failed only because a peer had, when the gang was stopped; `finished` the ranks that had
    already finished their step body."""

    failed: List[Failure]
    stopped: List[int] = field(default_factory=list)
    finished: List[int] = field(default_factory=list)

    @property
    def root_cause(self) -> Failure:
        return self.failed[0]

    def _said(self, failure: Failure) -> str:
        """How the note names another rank's failure: in brief, but this package's own error
        in full unless the root cause says the same but for its numbers (its rank printed only
        its first words, report_exception)."""
        if failure.kind is FailureKind.EXCEPTION and _OUR_PREFIX.match(failure.message) and \
                _DIGITS.sub("N", failure.message) != _DIGITS.sub("N", self.root_cause.message):
            return failure.what().rstrip(".")
        return failure.brief()

    def others_note(self) -> str:
        """What happened to the other ranks, one sentence each."""
        notes = []
        if len(self.failed) > 1:
            others = "; ".join("%s %s" % (f.where(), self._said(f)) for f in self.failed[1:])
            # once preempted, ranks end as their code reacts to the SIGTERM (a framework's
            # SIGTERMException, an exit): what they did in the grace, not failures of their own
            lead = ("While the ranks had their grace to save: "
                    if self.root_cause.kind is FailureKind.PREEMPTED
                    else "Also failed on their own, after it: ")
            notes.append("%s%s%s" % (lead, others, "" if others.endswith("...") else "."))
        if self.stopped:
            notes.append("The other ranks still running (%s) were stopped."
                         % ", ".join(map(str, sorted(self.stopped))))
        else:
            notes.append("No other rank was running.")
        if self.finished:
            notes.append("Ranks that had already finished their step: %s."
                         % ", ".join(map(str, sorted(self.finished))))
            if self.root_cause.is_symptom():
                # nothing failed but a connection: the peers that finished closed theirs
                notes.append(
                    "The error only says a peer went away, and no rank failed on its own: the "
                    "ranks that finished left the process group while this one still used it "
                    "(in init_process_group or a collective). End the step body with a "
                    "collective every rank calls, such as dist.barrier(), before "
                    "destroy_process_group().")
        return " ".join(notes)


def gang_outcome(failures: Iterable[Failure], ranks: Iterable[int],
                 exited: Optional[Iterable[Failure]] = None,
                 finished: Iterable[int] = ()) -> GangOutcome:
    """The GangOutcome of a failed gang of `ranks`, from the supervisor's `failures`, the
    failures of ranks found exited after it stopped watching (`exited`), and the ranks known to
    have finished. The root cause is the earliest failure that is not a symptom."""
    everything = list(failures) + list(exited or ())
    first = root_cause(everything)
    if first is None:
        raise ValueError("a gang's outcome needs at least one failure")
    own: Dict[object, Failure] = {}
    for failure in sorted(everything, key=lambda f: f.detected_at):
        key = failure.rank if failure.rank is not None else ("node", failure.node)
        if not failure.is_symptom() and key not in own:
            own[key] = failure
    failed = [first] + [f for f in own.values() if f is not first and (
        first.rank is None or f.rank != first.rank)]
    failed_ranks = {f.rank for f in failed if f.rank is not None}
    ranks, finished = list(ranks), set(finished)
    done = [r for r in ranks if r in finished and r not in failed_ranks]
    stopped = [r for r in ranks if r not in failed_ranks and r not in done]
    return GangOutcome(failed, stopped, done)


def root_cause(failures: Sequence[Failure]) -> Optional[Failure]:
    """The failure to report: the earliest that is not a symptom of a peer's death."""
    if not failures:
        return None
    ordered = sorted(failures, key=lambda f: f.detected_at)
    causes = [f for f in ordered if not f.is_symptom()]
    return (causes or ordered)[0]


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "signal %d" % signum
