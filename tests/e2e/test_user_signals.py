"""A user's SIGUSR1 handler survives a gang, and the gang still stops rank 0 at once when another
rank fails (interrupt.py: the gang interrupts rank 0 with a real-time signal nobody uses)."""

import json

# As in test_failures.py: the target is 5 s; a loaded 2-core runner gets slack.
DETECTION_BOUND = 10.0


def _mark(flow_runner, name):
    path = flow_runner.marks / name
    return json.loads(path.read_text()) if path.exists() else None


def test_the_users_sigusr1_handlers_are_kept_and_work_while_and_after_the_gang_runs(flow_runner):
    result = flow_runner.run("user_signal_flow.py")
    assert result.returncode == 0, result
    got = flow_runner.client(
        "t = Flow('UserSignalFlow').latest_run['train'].task\n"
        "result = {'kept': t['loaded_handler_kept'].data, 'calls': t['calls'].data}")
    # the handler the flow installed when loaded was rank 0's at the body's start, and both of
    # the user's handlers ran for the user's own signals
    assert got == {"kept": True, "calls": ["loaded", "body"]}
    # at the task's exit the handler the body installed is still there (not reset by the gang)
    assert _mark(flow_runner, "after-gang") == {"kept": True,
                                                "calls": ["loaded", "body", "body"]}


def test_rank_0_is_stopped_at_once_without_calling_the_users_handler(flow_runner):
    result = flow_runner.run("user_signal_flow.py", env={"TD_SIGNAL_FAIL": "1"})
    assert result.returncode != 0, result
    assert "rank 1 fails on purpose" in result.output, result
    assert "did not stop within" not in result.output, result  # not the watchdog's last resort
    stopped = _mark(flow_runner, "rank0-stopped")
    assert stopped is not None, "rank 0's finally did not run: %r" % result
    assert stopped["calls"] == ["loaded", "body"]  # the gang never called the user's handler
    assert stopped["at"] - _mark(flow_runner, "rank1-failed") < DETECTION_BOUND
