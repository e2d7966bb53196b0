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

from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

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


def find(looks: Sequence[Tuple[float, Look]], window_s: float = WINDOW_S) -> Optional[Finding]:
    """The Finding of `looks` [(time, look)], oldest first, each of every rank of the gang;
    None while they span less than SUSTAINED of `window_s` or number fewer than MIN_LOOKS."""
    if len(looks) < MIN_LOOKS:
        return None
    span = looks[-1][0] - looks[0][0]
    if span < SUSTAINED * window_s:
        return None
    ranks = sorted(set().union(*(look.keys() for _, look in looks)))
    shares = {rank: sum(1 for _, look in looks if look.get(rank)) / len(looks)
              for rank in ranks}
    counts = {rank: 0 for rank in ranks}
    waited = 0
    for _, look in looks:
        waited += any(look.values())
        behind = last(look)
        if behind is not None:
            counts[behind] += 1
    top = max(ranks, key=lambda rank: counts[rank]) if ranks else None
    straggler = top if top is not None and waited and counts[top] > MOST * waited else None
    others = [shares[r] for r in ranks if r != straggler]
    others_waiting = sum(others) / len(others) if others else 0.0
    if straggler is not None and others_waiting < MIN_OTHERS_WAITING:
        straggler = None
    return Finding(shares, straggler, others_waiting, span)


class Window:
    """The looks of the last `window_s` seconds, by the caller's clock (node 0's watch adds one
    per hang check), and what changed: `add` answers a Finding only when its straggler differs
    from the one last answered (None at first)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.looks: List[Tuple[float, Look]] = []
        self.named: Optional[int] = None
        self.last: Optional[Finding] = None

    def add(self, now: float, look: Look) -> Optional[Finding]:
        self.looks.append((now, dict(look)))
        while self.looks and self.looks[0][0] < now - self.window_s:
            self.looks.pop(0)
        found = find(self.looks, self.window_s)
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
