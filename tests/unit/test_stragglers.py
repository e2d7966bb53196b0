"""The straggler named from the hang probe's looks at the gang (core/stragglers.py, issue 41
point 1): tables of looks, pure."""

from collections import deque

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import stragglers as S

W, F = True, False  # a rank waiting in a collective, a rank not in one


def looks(*rows, every=5.0):
    """[(time, look)] from rows of waiting flags (one per rank, rank 0 first), `every` s apart."""
    return [(i * every, dict(enumerate(row))) for i, row in enumerate(rows)]


@pytest.mark.parametrize("look, last", [
    ({0: W, 1: W, 2: W, 3: F}, 3),       # the only one not in the collective
    ({0: F, 1: W, 2: W, 3: W}, 0),
    ({0: W, 1: W, 2: F, 3: F}, None),    # two ranks behind: no single last one
    ({0: W, 1: W, 2: W, 3: W}, None),    # everybody waits
    ({0: F, 1: F, 2: F, 3: F}, None),    # nobody waits: all compute
    ({0: F}, None),                      # a gang of one
    ({0: W, 1: F}, 1),
])
def test_the_last_rank_of_one_look(look, last):
    assert S.last(look) == last


SLOW_3 = [W, W, W, F]


@pytest.mark.parametrize("rows, straggler, others", [
    # rank 3 sleeps before every step: the others wait for it in every look
    ([SLOW_3] * 13, 3, 1.0),
    # ... in most looks (9 of 11 waited looks), the others computing now and then
    ([SLOW_3] * 9 + [[F, F, F, F]] * 2 + [[W, W, F, W]] * 2, 3, (11 + 11 + 9) / 39),
    # slow by turns: each rank last in a quarter of the looks
    ([[F if r == i % 4 else W for r in range(4)] for i in range(16)], None, 0.75),
    # balanced: every rank computes, then all wait together
    ([[F, F, F, F], [W, W, W, W]] * 7, None, 0.5),
    # two ranks slow together: never a single last rank
    ([[W, W, F, F]] * 13, None, 0.5),
    # last in exactly half of the waited looks: not more than half
    ([SLOW_3] * 7 + [[W, W, W, W]] * 7, None, 1.0),
    # rank 3 last in every look, but the others hardly wait (compute-bound, one short wait)
    ([SLOW_3] + [[F, F, F, F]] * 12, None, 1 / 13),
])
def test_the_straggler_of_a_window(rows, straggler, others):
    found = S.find(looks(*rows), window_s=120)
    assert found is not None
    assert found.straggler == straggler
    if straggler is not None:
        assert found.others_waiting == pytest.approx(others)
    assert found.span_s == 5.0 * (len(rows) - 1)


def test_the_waiting_share_of_every_rank():
    found = S.find(looks(*([SLOW_3] * 10 + [[F, W, W, F]] * 3)), window_s=120)
    assert found.shares == {0: 10 / 13, 1: 1.0, 2: 1.0, 3: 0.0}
    assert found.straggler == 3
    assert found.others_waiting == pytest.approx((10 / 13 + 2) / 3)


@pytest.mark.parametrize("count, every, window, named", [
    (13, 5.0, 120, True),    # 60 s of looks: half the window
    (12, 5.0, 120, False),   # 55 s: not sustained yet
    (5, 30.0, 120, False),   # 120 s, but fewer looks than MIN_LOOKS
    (7, 1.0, 10, True),      # a short window: 6 s of 7 looks
])
def test_a_straggler_is_named_only_over_a_sustained_window(count, every, window, named):
    found = S.find(looks(*([SLOW_3] * count), every=every), window_s=window)
    assert (found is not None and found.straggler == 3) is named


def test_the_window_answers_only_when_the_straggler_changes():
    window = S.Window(window_s=20)
    answers = []
    t = 0.0
    for rows in ([SLOW_3] * 12, [[F, W, W, W]] * 30, [[W, W, W, W]] * 30):
        for row in rows:
            answers.append((t, window.add(t, dict(enumerate(row)))))
            t += 1.0
    changed = [(at, found.straggler) for at, found in answers if found is not None]
    # rank 3 once its looks span 10 s; rank 0 once it is last in more than half of the last
    # 20 s; then nobody, once rank 0's looks have left the window
    assert [s for _, s in changed] == [3, 0, None]
    assert changed[0][0] == 10.0
    assert all(at - 12 <= 20 for at, _ in changed[1:2])
    assert window.looks[0][0] >= t - 1 - 20  # older looks left the window


def test_the_runs_line():
    found = S.Finding({0: 0.3, 1: 0.32, 2: 0.31, 3: 0.0}, 3, 0.31, 118.0)
    assert S.line(found, {0: 0, 1: 0, 2: 1, 3: 1}) == (
        "rank 3 (node 1) is the straggler: the other ranks wait 31% of their time for it, "
        "over the last 2 min")
    assert S.line(found._replace(span_s=64.4), {3: 1}).endswith("over the last 64 s")
    gone = S.line(found._replace(straggler=None), {})
    assert gone.startswith("no rank is the straggler any more")


def test_the_windows_running_counts_agree_with_a_fresh_count():
    """Window keeps its counts as looks come and go (Tally); at every look its Finding is
    find's over the looks it holds."""
    import random

    rng = random.Random(7)
    window = S.Window(window_s=30)
    names = []
    for i in range(200):
        slow = 2 if i < 100 else rng.randrange(5)
        look = {r: (r != slow if rng.random() < 0.9 else rng.random() < 0.5) for r in range(5)}
        named = window.named
        changed = window.add(i * 1.5, look)
        if changed is not None:
            names.append(changed.straggler)
        fresh = S.find(list(window.looks), 30, named)
        if fresh is not None:
            assert window.last == fresh
    assert names == [2, None]  # rank 2 while it was slow, then nobody


def test_a_named_straggler_stays_named_down_to_hold():
    """Last in 9 of 13 waited looks names rank 3 (more than MOST); once named, last in 5 of 13
    (less than MOST, more than HOLD) keeps it named, and in 4 (less than HOLD) does not."""
    other = [W, W, W, W]
    named = S.find(looks(*([SLOW_3] * 9 + [other] * 4)), 120)
    assert named.straggler == 3
    held = looks(*([SLOW_3] * 5 + [other] * 8))
    assert S.find(held, 120).straggler is None
    assert S.find(held, 120, named=3).straggler == 3
    assert S.find(looks(*([SLOW_3] * 4 + [other] * 9)), 120, named=3).straggler is None


def _report(waiting, seq=5, done=False):
    return {"quiet_s": 0.0, "seq": seq, "waiting": "all_reduce" if waiting else None,
            "where": None, "stack": "", "age_s": 0.0, "done": done}


def test_node_0s_watch_takes_a_look_only_of_the_whole_gang_in_its_groups():
    """LeaderWatch._look_for_straggler (runtime/supervisor.py): a look of every rank, each in a
    process group and none done; the changed Finding goes to on_straggler."""
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import (
        Topology)
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.supervisor \
        import LeaderWatch
    from tests.unit.fakes import Clock

    clock, told = Clock(), []
    watch = LeaderWatch([], None, Topology(2, 2), clock=clock,
                        stragglers=S.Window(window_s=20), on_straggler=told.append)
    slow = {r: _report(r != 3) for r in range(4)}
    for skipped in ({r: slow[r] for r in range(3)},                 # rank 3 not heard yet
                    {**slow, 0: _report(True, seq=None)},           # rank 0 has no group yet
                    {**slow, 2: _report(False, done=True)}):        # rank 2's body ended
        for _ in range(12):
            watch._look_for_straggler(skipped)
            clock.sleep(1.0)
    assert watch.stragglers.looks == deque() and told == []
    for _ in range(11):
        watch._look_for_straggler(slow)
        clock.sleep(1.0)
    assert [f.straggler for f in told] == [3]  # once its looks span half the window: 10 s
    assert told[0].shares == {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0}
