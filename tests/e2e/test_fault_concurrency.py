"""4 gangs at a time on one host, 10 times over: every gang forms, no two live gangs share a
port. (Ctrl-C on `run` mid-gang is tested in test_semantics.py.)

40 gangs cost about 130 s of CPU (each task imports Metaflow and torch), too much for CI on 2
cores: CI runs 3 waves of 4 (12 gangs), TD_FULL_FAULT_MATRIX=1 all 10."""

import os

CONCURRENT = 4
WAVES = 10 if os.environ.get("TD_FULL_FAULT_MATRIX") == "1" else 3


def max_overlap(intervals):
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    live = best = 0
    for _, step in events:
        live += step
        best = max(best, live)
    return best


def test_four_concurrent_gangs_ten_times_no_port_clash(flow_runner):
    res = flow_runner.run("fault_concurrent_flow.py", "--max-workers", str(CONCURRENT),
                          env={"TD_GANGS": CONCURRENT * WAVES}, timeout=600)
    assert res.returncode == 0, res
    gangs = flow_runner.client("result = Flow('ConcurrentGangs').latest_run['join'].task['gangs'].data")
    assert sorted(g["item"] for g in gangs) == list(range(CONCURRENT * WAVES))
    # every gang formed its group: both ranks took part in the all_reduce
    assert all(g["total"] == 2 * (g["item"] + 1) for g in gangs), gangs
    # the gangs really ran side by side, 4 at a time
    assert max_overlap([(g["started"], g["ended"]) for g in gangs]) == CONCURRENT
    # no two gangs alive at the same time used the same port
    for i, a in enumerate(gangs):
        for b in gangs[i + 1:]:
            if a["started"] < b["ended"] and b["started"] < a["ended"]:
                assert a["port"] != b["port"], (a, b)
    print("%d gangs in %.1fs, %d distinct ports" % (len(gangs), res.elapsed,
                                                    len({g["port"] for g in gangs})))
