"""Which rank the others wait for while the gang trains (issue 41, point 1). Pure.

Node 0 already looks at every rank's probe once per probe interval for hang detection
(runtime/stacks.py): each rank's collective count and whether its main thread is inside a
torch.distributed or autograd call (DDP's all-reduces run in backward). One such look of the
whole gang is a `Look`: {rank: waiting}. Over a window of looks:

- a rank's *waiting share* is the share of looks in which it was waiting in a collective;
- in a look where every rank but one waits, that one is *last*: the others are in a
  collective that it has not reached yet.

The probes of different ranks sample at different moments, up to one interval apart, so a look
is not an instant of the gang and the collective counts of two ranks in one look are not
comparable; a rank that is not in a collective while all the others are is. A rank that is
last in more than half of the looks in which anybody waits, while the other ranks' mean waiting
share is high, is the straggler (`find`). A gang whose ranks are balanced, or slow by turns,
spreads its last places over its ranks and names none; two ranks slow together are not one
straggler either (no look has a single last rank).
"""

from collections import deque
from typing import Deque, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

# {rank: whether its main thread was waiting in a collective} for every rank of the gang.
Look = Mapping[int, bool]

# The window a straggler is named over, by default (METAFLOW_TORCH_DISTRIBUTED_STRAGGLER_WINDOW).
WINDOW_S = 120.0
# A straggler is named only once the looks kept span at least this share of the window...
SUSTAINED = 0.5
# ...and there are at least this many of them.
MIN_LOOKS = 6
# It must be last in more than this share of the looks in which some rank waits...
MOST = 0.5
# Once named, it stays named while it is last in more than this share (a rank near MOST
# would otherwise be named, then not, then named again, a line each time)...
HOLD = 0.35
# ...while the other ranks wait, on average, at least this share of their time.
MIN_OTHERS_WAITING = 0.2


class Finding(NamedTuple):
    """What a window of looks says: every rank's waiting share, the straggler (None: none)
    and the other ranks' mean waiting share, over `span_s` seconds of looks."""

    shares: Dict[int, float]
    straggler: Optional[int]
    others_waiting: float
    span_s: float


def last(look: Look) -> Optional[int]:
    """The rank of `look` that every other rank waits for: the only one not in a collective
    (None when there is no such rank, or the gang has one rank)."""
    free = [rank for rank, w in look.items() if not w]
    return free[0] if len(free) == 1 and len(look) > 1 else None


def find(looks: Sequence[Tuple[float, Look]], window_s: float = WINDOW_S,
         named: Optional[int] = None) -> Optional[Finding]:
    """The Finding of `looks` [(time, look)], oldest first, each of every rank of the gang;
    None while they span less than SUSTAINED of `window_s` or number fewer than MIN_LOOKS.
    `named` is the straggler named so far (Tally.finding)."""
    tally = Tally()
    for _, look in looks:
        tally.add(look)
    span = looks[-1][0] - looks[0][0] if looks else 0.0
    return tally.finding(span, window_s, named)


class Tally:
    """The counts a Finding is made of, kept as looks come and go (`add`, `remove`), so that a
    window of a big gang costs node 0 one pass over a look per look, not over the window."""

    def __init__(self) -> None:
        self.looks = 0
        self.waited = 0  # looks in which some rank waits
        self.waiting: Dict[int, int] = {}  # rank -> looks in which it waits
        self.last: Dict[int, int] = {}  # rank -> looks in which it alone does not wait

    def add(self, look: Look, sign: int = 1) -> None:
        self.looks += sign
        free = 0
        for rank, waits in look.items():
            self.waiting[rank] = self.waiting.get(rank, 0) + (sign if waits else 0)
            free += not waits
        self.waited += sign if free < len(look) else 0
        behind = last(look) if free == 1 else None
        if behind is not None:
            self.last[behind] = self.last.get(behind, 0) + sign

    def remove(self, look: Look) -> None:
        self.add(look, -1)

    def finding(self, span_s: float, window_s: float,
                named: Optional[int] = None) -> Optional[Finding]:
        """The Finding of the looks counted, which span `span_s` s; None while that is less
        than SUSTAINED of `window_s` or they number fewer than MIN_LOOKS. `named`, the
        straggler named so far, stays it down to HOLD."""
        if self.looks < MIN_LOOKS or span_s < SUSTAINED * window_s:
            return None
        ranks = sorted(self.waiting)
        shares = {rank: self.waiting[rank] / self.looks for rank in ranks}
        top = max(ranks, key=lambda rank: self.last.get(rank, 0)) if ranks else None
        least = HOLD if top is not None and top == named else MOST
        straggler = top if top is not None and self.waited and \
            self.last.get(top, 0) > least * self.waited else None
        others = [shares[r] for r in ranks if r != straggler]
        others_waiting = sum(others) / len(others) if others else 0.0
        if straggler is not None and others_waiting < MIN_OTHERS_WAITING:
            straggler = None
        return Finding(shares, straggler, others_waiting, span_s)


class Window:
    """The looks of the last `window_s` seconds, by the caller's clock (node 0's watch adds one
    per hang check), and what changed: `add` answers a Finding only when its straggler differs
    from the one last answered (None at first)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.looks: Deque[Tuple[float, Look]] = deque()
        self.tally = Tally()
        self.named: Optional[int] = None
        self.last: Optional[Finding] = None

    def add(self, now: float, look: Look) -> Optional[Finding]:
        kept = dict(look)
        self.looks.append((now, kept))
        self.tally.add(kept)
        while self.looks and self.looks[0][0] < now - self.window_s:
            self.tally.remove(self.looks.popleft()[1])
        found = self.tally.finding(now - self.looks[0][0], self.window_s, self.named)
        if found is None:
            return None
        self.last = found
        if found.straggler == self.named:
            return None
        self.named = found.straggler
        return found


def line(found: Finding, locate_node: Mapping[int, int]) -> str:
    """The run's line (after '@torch_distributed on step ...: ') for a changed Finding;
    `locate_node` {rank: node}."""
    span = found.span_s
    over = "%d min" % round(span / 60) if span >= 90 else "%d s" % round(span)
    if found.straggler is None:
        return ("no rank is the straggler any more (over the last %s, no rank is the one the "
                "others wait for)" % over)
    return ("rank %d (node %d) is the straggler: the other ranks wait %d%% of their time for "
            "it, over the last %s" % (found.straggler, locate_node.get(found.straggler, 0),
                                      round(100 * found.others_waiting), over))
