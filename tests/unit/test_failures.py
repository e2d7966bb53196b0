"""Failures as plain data: their description, symptoms vs causes, torch's error files."""

import json

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import (
    Failure,
    FailureKind,
    GangOutcome,
    communication_error,
    from_exit,
    gang_outcome,
    load_exception,
    raised,
    read_error_file,
    root_cause,
    save_exception,
)


def test_describe_exception_with_traceback():
    tb = "Traceback (most recent call last):\n  File \"flow.py\", line 9\nValueError: bad lr\n\n"
    # a rank prints its own exception's traceback in its lines: the gang's error points there
    failure = Failure(5, 1, "exception", 10.0, 1, "ValueError: bad lr", tb, local_rank=1)
    assert failure.describe() == ("rank 5 (node 1, local rank 1) raised ValueError: bad lr. "
                                  "Its traceback is in its [rank 5] lines above.")
    # a communication error is printed in one line there: the gang's error shows its traceback
    message = "DistNetworkError: Broken pipe"
    failure = Failure(5, 1, "exception", 10.0, 1, message, tb, local_rank=1, symptom=True)
    assert failure.describe() == (
        "rank 5 (node 1, local rank 1) raised DistNetworkError: Broken pipe.\n\n"
        "rank 5 (node 1, local rank 1) traceback:\n"
        "Traceback (most recent call last):\n  File \"flow.py\", line 9\nValueError: bad lr")


def test_a_failure_of_our_own_error_names_the_step_once_and_ends_in_one_period():
    # TorchDistributedFrameworkError's text already starts with the step's prefix and ends in
    # a period: the rank's failure, which the step's error wraps, says neither twice
    message = ("TorchDistributedFrameworkError: @torch_distributed on step *train*: Remove "
               "num_nodes=2 from Trainer(...). Pass devices=current.torch_distributed."
               "local_world_size.")
    failure = Failure(1, 0, "exception", 1.0, message=message, local_rank=1)
    assert failure.describe() == (
        "rank 1 (node 0, local rank 1) raised TorchDistributedFrameworkError: Remove "
        "num_nodes=2 from Trainer(...). Pass devices=current.torch_distributed."
        "local_world_size.")


def test_the_note_about_the_other_ranks_names_their_errors_in_a_line_each():
    long = "TorchDistributedFrameworkError: @torch_distributed on step *train*: " + \
        "Lightning's Trainer was given num_nodes=2. " * 5 + "\nsecond line"
    outcome = gang_outcome([_raised(1, 1.0, long)], range(4),
                           exited=[_raised(2, 1.1, long), _raised(3, 1.2, long)])
    note = outcome.others_note()
    assert note.startswith("Also failed on their own, after it: rank 2 (node 0, local rank 2) "
                           "raised TorchDistributedFrameworkError: Lightning's Trainer was "
                           "given num_nodes=2. Lightning's Trainer was ...; "
                           "rank 3 (node 0, local rank 3) raised"), note
    assert "second line" not in note and "step *train*" not in note
    assert note.endswith("The other ranks still running (0) were stopped."), note


def test_describe_exit():
    assert Failure(2, 0, "exit", 1.0, 3, local_rank=2).describe() == \
        "rank 2 (node 0, local rank 2) exited with code 3."


def test_describe_exit_with_its_last_error():
    text = Failure(2, 0, "exit", 1.0, 3, "CUDA out of memory", local_rank=2).describe()
    assert text == ("rank 2 (node 0, local rank 2) exited with code 3. "
                    "Its last error: CUDA out of memory")


@pytest.mark.parametrize("code,name", [(-9, "SIGKILL"), (-15, "SIGTERM"), (-11, "SIGSEGV"),
                                       (-77, "signal 77")])
def test_describe_signal(code, name):
    assert Failure(3, 1, "signal", 1.0, code, local_rank=1).describe() == \
        "rank 3 (node 1, local rank 1) was killed by %s." % name


def test_describe_missing_node():
    failure = Failure(None, 2, "missing", 1.0,
                      message="did not join the gang within the rendezvous timeout of 5s")
    assert failure.describe() == \
        "node 2 did not join the gang within the rendezvous timeout of 5s."


def test_describe_missing_rank():
    failure = Failure(3, 0, "missing", 1.0, message="did not join", local_rank=3)
    assert failure.describe() == "rank 3 (node 0, local rank 3) did not join."


@pytest.mark.parametrize("message", [
    "DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
    "by peer [127.0.0.1]:2233",
    "DistNetworkError: failed to recv, got 0 bytes",
    "DistStoreError: Socket Timeout",
    "TorchDistributedAborted: another rank of the gang failed; stopping rank 0",
    "DistBackendError: NCCL communicator was aborted on rank 3",
])
def test_communication_errors_known_by_message_only_are_symptoms_by_their_type(message):
    assert Failure(0, 0, "exception", 1.0, message=message, local_rank=0).is_symptom()


@pytest.mark.parametrize("message", [
    "ValueError: NCCL not built",
    "RuntimeError: Connection reset by peer",  # the words alone do not make a symptom
    "KeyError: 'gloo'",
])
def test_words_of_a_message_never_make_a_symptom(message):
    assert not Failure(0, 0, "exception", 1.0, message=message, local_rank=0).is_symptom()


def test_what_the_raised_exception_decided_wins_over_its_message():
    said = "RuntimeError: [/gloo/transport/tcp/pair.cc:598] Connection closed by peer"
    assert Failure(0, 0, "exception", 1.0, message=said, symptom=True).is_symptom()
    assert not Failure(0, 0, "exception", 1.0, message="DistBackendError: x",
                       symptom=False).is_symptom()


def _raise(ex):
    try:
        raise ex
    except BaseException as caught:  # noqa: BLE001 - the test hands it back
        return caught


def test_a_users_own_exception_is_a_cause_whatever_it_says():
    for ex in (ValueError("NCCL not built"), RuntimeError("gloo: Connection closed by peer"),
               KeyError("Broken pipe")):
        assert not communication_error(_raise(ex))


def test_torch_distributed_errors_and_the_gang_abort_are_symptoms():
    from datetime import timedelta

    import torch.distributed as dist

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.control import (
        bind_listener,
    )
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
        TorchDistributedAborted,
    )

    free = bind_listener("127.0.0.1", 0)
    port = free.getsockname()[1]
    free.close()
    try:  # a peer's store that is gone: what torch itself raises
        dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=1))
    except RuntimeError as ex:
        gone = ex
    assert isinstance(gone, dist.DistError) and communication_error(gone)
    assert communication_error(_raise(TorchDistributedAborted("stopping rank 0")))


def test_a_plain_runtime_error_counts_as_a_symptom_only_when_raised_inside_torch_distributed():
    import torch.distributed as dist

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import failures

    inside = dist.__file__  # a frame of torch.distributed's own code, as gloo's errors have
    code = compile("raise RuntimeError('Connection closed by peer')", inside, "exec")
    raised = _raise_from(code)
    assert communication_error(raised)
    assert not communication_error(_raise(RuntimeError("Connection closed by peer")))
    # a RuntimeError subclass from there reports misuse, a cause
    assert not communication_error(_raise_from(compile("raise NotImplementedError('x')", inside,
                                                       "exec")))
    assert failures._raised_in(raised, __import__("os").path.dirname(inside))


def test_a_collectives_native_error_raised_through_torch_is_a_symptom():
    # DDP's reducer runs its all-reduce inside autograd: gloo's error surfaces in torch's
    # autograd frames, not torch.distributed's; its native origin says it is gloo's
    import os

    import torch

    autograd = os.path.join(os.path.dirname(torch.__file__), "autograd", "graph.py")
    gloo = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
            "closed by peer [127.0.0.1]:24283")
    assert communication_error(_raise_from(compile("raise RuntimeError(%r)" % gloo, autograd,
                                                   "exec")))
    # the same native words from a user's own frame, or another native origin, are causes
    assert not communication_error(_raise(RuntimeError(gloo)))
    shapes = "[/__w/pytorch/pytorch/aten/src/ATen/native/Linear.cpp:12] mat1 and mat2 shapes"
    assert not communication_error(_raise_from(compile("raise RuntimeError(%r)" % shapes,
                                                       autograd, "exec")))


def _raise_from(code):
    try:
        exec(code, {})
    except BaseException as caught:  # noqa: BLE001 - the test hands it back
        return caught


def test_the_symptom_decided_where_it_was_raised_travels_with_the_error_file(tmp_path,
                                                                             monkeypatch):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
        run_member_body,
    )

    def body():
        raise ValueError("NCCL not built")  # the user's own check, in the user's words

    path = str(tmp_path / "error.json")
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    assert run_member_body(body, path) != 0
    failure = from_exit(1, 0, 1, 1, 99.0, path)
    assert failure.message == "ValueError: NCCL not built"
    assert failure.symptom is False and not failure.is_symptom()
    peer = Failure(0, 0, "exception", 0.5, message="DistBackendError: gone", symptom=True)
    assert root_cause([peer, failure]) is failure


def test_failure_kinds_are_an_enum_with_a_stable_wire_form():
    failure = Failure(None, 2, "lost", 1.0, message="stopped sending heartbeats")
    assert failure.kind is FailureKind.LOST
    assert json.loads(failure.to_json())["kind"] == "lost"
    assert Failure.from_json(failure.to_json()).kind is FailureKind.LOST
    assert {k.value for k in FailureKind} == {"exception", "exit", "signal", "missing", "agent",
                                              "lost", "hung", "unfinished", "aborted", "control",
                                              "preempted", "tampered", "differs"}
    with pytest.raises(ValueError):
        Failure(0, 0, "exploded", 1.0)


@pytest.mark.parametrize("kind,code,message", [
    ("exception", 1, "ValueError: bad lr"),
    ("exception", 1, "ZeroDivisionError: division by zero"),
    ("signal", -9, ""),
    ("exit", 3, ""),
    ("exit", 1, "Connection closed by peer"),  # an exit is a cause whatever it last said
    ("missing", None, "did not join"),
])
def test_causes_are_not_symptoms(kind, code, message):
    assert not Failure(1, 0, kind, 1.0, code, message, local_rank=1).is_symptom()


def test_root_cause_prefers_a_later_cause_over_an_earlier_symptom():
    symptom = Failure(0, 0, "exception", 100.0, 1,
                      "RuntimeError: [gloo/transport/tcp/pair.cc] Connection closed by peer",
                      local_rank=0, symptom=True)
    killed = Failure(3, 1, "signal", 100.4, -9, local_rank=1)
    assert root_cause([symptom, killed]) is killed
    assert root_cause([killed, symptom]) is killed


def test_root_cause_is_the_earliest_cause():
    late = Failure(1, 0, "exit", 20.0, 2, local_rank=1)
    early = Failure(2, 0, "exception", 10.0, 1, "ValueError: x", local_rank=2)
    symptom = Failure(0, 0, "exception", 5.0, 1, "DistBackendError: gloo", local_rank=0)
    assert root_cause([late, symptom, early]) is early


def test_root_cause_of_only_symptoms_is_the_earliest():
    a = Failure(0, 0, "exception", 7.0, 1, "DistBackendError: boom", local_rank=0)
    b = Failure(1, 0, "exception", 3.0, 1, "RuntimeError: Broken pipe", local_rank=1,
                symptom=True)
    assert root_cause([a, b]) is b


def test_root_cause_of_nothing():
    assert root_cause([]) is None


def _torch_error_file(path, monkeypatch, exc):
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    try:
        raise exc
    except type(exc) as ex:
        ErrorHandler().record_exception(ex)
    return path


def test_read_error_file_in_torchs_format(tmp_path, monkeypatch):
    path = _torch_error_file(tmp_path / "error.json", monkeypatch, ValueError("lr too big: 7"))
    message, tb = read_error_file(str(path))
    assert message == "ValueError: lr too big: 7"
    assert tb.startswith("Traceback (most recent call last):")
    assert "_torch_error_file" in tb and tb.rstrip().endswith("ValueError: lr too big: 7")


def test_read_error_file_with_a_string_message(tmp_path):
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": "RuntimeError: new format"}))
    assert read_error_file(str(path)) == ("RuntimeError: new format", "")


def test_read_error_file_missing(tmp_path):
    assert read_error_file(str(tmp_path / "absent.json")) is None


@pytest.mark.parametrize("content", [b"", b"{not json", b"\xff\xfe\x00garbage", b'{"message": '])
def test_read_error_file_garbage(tmp_path, content):
    path = tmp_path / "error.json"
    path.write_bytes(content)
    assert read_error_file(str(path)) is None


@pytest.mark.parametrize("content", ["null", "[1, 2]", "42"])
def test_read_error_file_json_that_is_not_an_object(tmp_path, content):
    path = tmp_path / "error.json"
    path.write_text(content)
    assert read_error_file(str(path)) is None


def test_from_exit_reads_the_error_file(tmp_path, monkeypatch):
    path = _torch_error_file(tmp_path / "e.json", monkeypatch, KeyError("batch"))
    failure = from_exit(6, 1, 2, 1, 42.0, str(path))
    assert (failure.rank, failure.node, failure.local_rank) == (6, 1, 2)
    assert (failure.kind, failure.exitcode, failure.detected_at) == ("exception", 1, 42.0)
    assert failure.message == "KeyError: 'batch'"
    assert "Traceback" in failure.traceback
    assert failure.describe().startswith("rank 6 (node 1, local rank 2) raised KeyError: 'batch'.")


@pytest.mark.parametrize("code,kind", [(3, "exit"), (-9, "signal"), (-15, "signal")])
def test_from_exit_without_an_error_file(tmp_path, code, kind):
    failure = from_exit(1, 0, 1, code, 5.0, str(tmp_path / "never-written.json"))
    assert (failure.kind, failure.exitcode, failure.message, failure.traceback) == \
        (kind, code, "", "")
    assert from_exit(1, 0, 1, code, 5.0).kind == kind


def test_json_round_trip():
    failure = Failure(6, 1, "exception", 1712.25, 1, "ValueError: x", "Traceback\n  ...\n", 2)
    text = failure.to_json()
    assert json.loads(text)["rank"] == 6
    assert Failure.from_json(text) == failure
    node = Failure(None, 3, "agent", 3.5, 2, "node agent exited")
    assert Failure.from_json(node.to_json()) == node


def _raised(rank, at, message="ValueError: boom"):
    return Failure(rank, 0, "exception", at, message=message, local_rank=rank)


def test_outcome_names_every_rank_that_failed_on_its_own_earliest_first():
    peer_gone = _raised(3, 1.0, "DistBackendError: Connection closed by peer")
    outcome = gang_outcome([_raised(0, 5.0), peer_gone], range(4),
                           exited=[_raised(1, 2.0, "KeyError: 'x'")], finished=[2])
    assert [f.rank for f in outcome.failed] == [1, 0]
    assert outcome.root_cause.message == "KeyError: 'x'"
    assert outcome.stopped == [3] and outcome.finished == [2]
    assert outcome.others_note() == (
        "Also failed on their own, after it: rank 0 (node 0, local rank 0) raised ValueError: "
        "boom. The other ranks still running (3) were stopped. Ranks that had already finished "
        "their step: 2.")


def test_a_peer_gone_error_after_the_others_finished_says_they_left_and_the_fix():
    """Rank 1 finished its body (init, no collective, destroy) while rank 0 was still in
    init_process_group, which then failed with gloo's "Connection closed by peer": the report
    says the finished ranks left first and what to add (seen on the Batch emulation's retry)."""
    gone = _raised(0, 1.0, "RuntimeError: Gloo connectFullMesh failed with [pair.cc:553] "
                           "Connection closed by peer [127.0.0.1]:59077")
    gone = Failure(0, 0, "exception", 1.0, message=gone.message, local_rank=0, symptom=True)
    outcome = gang_outcome([gone], range(2), finished=[1])
    assert outcome.others_note() == (
        "No other rank was running. Ranks that had already finished their step: 1. The error "
        "only says a peer went away, and no rank failed on its own: the ranks that finished "
        "left the process group while this one still used it (in init_process_group or a "
        "collective). End the step body with a collective every rank calls, such as "
        "dist.barrier(), before destroy_process_group().")
    # an error of the rank's own says nothing of the kind
    assert "barrier" not in gang_outcome([_raised(0, 1.0)], range(2), finished=[1]).others_note()


def test_outcome_of_one_failure_names_who_was_stopped_and_who_had_finished():
    outcome = gang_outcome([_raised(1, 1.0)], range(3), finished=[0])
    assert [f.rank for f in outcome.failed] == [1]
    assert outcome.others_note() == ("The other ranks still running (2) were stopped. Ranks "
                                     "that had already finished their step: 0.")


def test_outcome_counts_a_rank_once_and_a_failed_rank_never_as_finished():
    outcome = gang_outcome([_raised(1, 2.0)], range(2), exited=[_raised(1, 1.0)],
                           finished=[1])
    assert len(outcome.failed) == 1 and outcome.failed[0].detected_at == 1.0
    assert outcome.stopped == [0] and outcome.finished == []
    assert outcome.others_note() == "The other ranks still running (0) were stopped."


def test_outcome_of_only_symptoms_reports_the_earliest():
    first = _raised(1, 1.0, "DistNetworkError: Broken pipe")
    outcome = gang_outcome([_raised(0, 2.0, "DistNetworkError: Broken pipe"), first], range(2))
    assert outcome.failed == [first] and outcome.stopped == [0]


class _Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("no")


def test_saved_exception_comes_back_with_its_type_and_time(tmp_path, monkeypatch):
    path = _torch_error_file(tmp_path / "error.json", monkeypatch, KeyError("shard 3"))
    save_exception(KeyError("shard 3"), 12.5, str(path))
    ex = load_exception(str(path))
    assert type(ex) is KeyError and str(ex) == "'shard 3'"
    # the time it was raised, not when its exit was seen, orders it among the failures
    assert from_exit(1, 0, 1, 1, 99.0, str(path)).detected_at == 12.5


def test_an_unpicklable_exception_keeps_its_time_only(tmp_path, monkeypatch):
    path = _torch_error_file(tmp_path / "error.json", monkeypatch, ValueError("x"))
    save_exception(_Unpicklable("x"), 3.0, str(path))
    assert load_exception(str(path)) is None
    assert from_exit(1, 0, 1, 1, 99.0, str(path)).detected_at == 3.0
    assert load_exception(str(tmp_path / "missing.json")) is None


def test_a_raise_counts_once_its_exception_is_saved(tmp_path, monkeypatch):
    path = str(tmp_path / "error.json")
    assert raised(2, 1, 0, path) is None  # nothing raised yet
    _torch_error_file(tmp_path / "error.json", monkeypatch, ValueError("lr"))
    assert raised(2, 1, 0, path) is None  # the error file alone: the record is not complete
    save_exception(ValueError("lr"), 7.5, path)
    failure = raised(2, 1, 0, path)
    # the process may still be running: no exit code yet, the time is when it was raised
    assert (failure.rank, failure.node, failure.local_rank) == (2, 1, 0)
    assert (failure.kind, failure.exitcode, failure.detected_at) == ("exception", None, 7.5)
    assert failure.message == "ValueError: lr" and "Traceback" in failure.traceback
    assert not failure.is_symptom()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error.json", "error.json.pickle"]
    assert raised(2, 1, 0, None) is None


def _leader_raising(outcome, member_exception):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import Leader

    from types import SimpleNamespace

    leader = Leader.__new__(Leader)  # only _raise_failure's fields: nothing is started
    leader.step_name = "train"
    attempt = SimpleNamespace(outcome=outcome, rank0_exception=None,
                              member_exception=member_exception, rounds=[], no_restart="")
    with pytest.raises(BaseException) as raised:
        leader._raise_failure(attempt, outcome)
    return raised.value


def test_a_members_own_exception_is_raised_when_it_is_the_cause():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import (
        Failure, GangOutcome)

    own = KeyError("missing column")
    cause = Failure(1, 0, "exception", 1.0, message="KeyError: 'missing column'", local_rank=1)
    assert _leader_raising(GangOutcome([cause], stopped=[0]), own) is own


def test_a_members_communication_error_is_reported_by_the_gang_not_reraised():
    # A peer's timeout is no user error: re-raising it would hide the gang's report (found by
    # CI under load: a hung rank's peers timed out and the raw gloo error became the step's).
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
        TorchDistributedGangFailed)
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import (
        Failure, GangOutcome)

    message = ("RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
               "10000ms for recv operation to complete")
    symptom = Failure(1, 0, "exception", 1.0, message=message, local_rank=1,
                      symptom=True)  # as the rank decided from where gloo raised it
    raised = _leader_raising(GangOutcome([symptom], stopped=[0, 2, 3]), RuntimeError(message))
    assert isinstance(raised, TorchDistributedGangFailed)
    assert "rank 1 (node 0, local rank 1)" in str(raised)


# --- what a failed rank prints: the user's frames, once ------------------------------------

PKG = "/site/metaflow_extensions/torch_distributed/plugins/torch_distributed"
FULL_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "%s/runtime/procs.py", line 105, in run_member_body\n'
    "    body()\n"
    '  File "%s/gang.py", line 180, in <lambda>\n'
    "    events.run_recorded(rank, lambda: groupcheck.run_body(\n"
    "                                      ^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/home/me/flow.py", line 15, in train\n'
    "    raise ValueError(\"bad lr\")\n"
    "ValueError: bad lr\n" % (PKG, PKG))


def test_a_ranks_traceback_starts_at_the_users_code():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import (
        user_traceback)

    assert user_traceback(FULL_TRACEBACK, PKG) == (
        "Traceback (most recent call last):\n"
        '  File "/home/me/flow.py", line 15, in train\n'
        "    raise ValueError(\"bad lr\")\n"
        "ValueError: bad lr\n")
    # a traceback without the package's frames (or of another package) is left as it is
    assert user_traceback(FULL_TRACEBACK, "/elsewhere") == FULL_TRACEBACK


def test_the_package_whose_frames_a_traceback_leaves_out_holds_every_module_of_ours():
    """PACKAGE_DIR is the package's root, not the folder of the module that defines it: a frame
    of any subpackage (the runtime's procs.py, the gang's leader.py) is left out of what a rank
    prints (it pointed at core/ after the layout moved the modules, and kept the runtime's)."""
    import pathlib

    from metaflow_extensions.torch_distributed.plugins.torch_distributed import decorator
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import (
        PACKAGE_DIR, user_traceback)
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import leader
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import procs

    root = pathlib.Path(decorator.__file__).parent
    assert pathlib.Path(PACKAGE_DIR) == root
    ours = FULL_TRACEBACK.replace(PKG, str(root))
    assert procs.__file__ == str(root / "runtime" / "procs.py")
    assert leader.__file__ == str(root / "gang" / "leader.py")
    assert user_traceback(ours).startswith(
        'Traceback (most recent call last):\n  File "/home/me/flow.py", line 15, in train\n')


def _raise_from_here(ex):
    raise ex


@pytest.mark.parametrize("debug", [None, "1"])
def test_a_ranks_own_exception_is_printed_from_the_users_code_unless_debugging(debug,
                                                                               monkeypatch):
    import io

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import failures

    monkeypatch.setattr(failures, "PACKAGE_DIR", __import__("os").path.dirname(__file__))
    if debug:
        monkeypatch.setenv(failures.DEBUG_ENV, debug)
    else:
        monkeypatch.delenv(failures.DEBUG_ENV, raising=False)
    try:
        _raise_from_here(ValueError("bad lr"))
    except ValueError as ex:
        out = io.StringIO()
        # the frames of this test module stand for the package's
        failures.report_exception(ex, symptom=False, file=out)
    text = out.getvalue()
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.endswith("ValueError: bad lr\n")
    assert ("test_failures.py" in text) == bool(debug), text


LONG_FIX = ("Lightning's Trainer was given devices=4, which contradicts the gang's 1 node x 2 "
            "processes per node = world size 2. Remove devices=4 from Trainer(...).")


@pytest.mark.parametrize("message,last_line", [
    (LONG_FIX, "TorchDistributedFrameworkError: Lightning's Trainer was given devices=4, which "
     "contradicts the ... (the step's error, below, says it in "
     "full, with its fix)\n"),
    ("short", "TorchDistributedFrameworkError (the step's error, below, says it, with its "
     "fix)\n"),
])
def test_the_packages_own_error_in_a_rank_is_said_in_full_by_the_step_alone(message, last_line,
                                                                            monkeypatch):
    import io

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import failures
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
        TorchDistributedFrameworkError,
    )

    monkeypatch.delenv(failures.DEBUG_ENV, raising=False)
    out = io.StringIO()
    try:
        try:
            raise ValueError("You set `devices=4` and `num_nodes=2` in Lightning")
        except ValueError as cause:
            raise TorchDistributedFrameworkError("train", message) from cause
    except TorchDistributedFrameworkError as ex:
        failures.report_exception(ex, symptom=False, file=out)
    text = out.getvalue()
    assert "ValueError: You set `devices=4`" in text  # the framework's own error, in full
    assert text.endswith(last_line), text
    assert "Remove devices=4" not in text


def test_the_note_names_another_ranks_different_package_error_in_full():
    ours = "TorchDistributedFrameworkError: @torch_distributed on step *train*: "
    root = Failure(1, 0, FailureKind.EXCEPTION, 1.0, message=ours + LONG_FIX, local_rank=1)
    same = Failure(0, 0, FailureKind.EXCEPTION, 2.0, message=ours + LONG_FIX, local_rank=0)
    other = Failure(2, 1, FailureKind.EXCEPTION, 3.0, local_rank=0,
                    message=ours + "another message of the package's, long enough to be cut "
                    "in a brief note about the other ranks. Its fix: do this.")
    note = GangOutcome([root, same, other], [], []).others_note()
    assert note.count("Remove devices=4") == 0, note  # the root cause's says it
    assert "Its fix: do this" in note, note
    # the same error of another rank differs in its numbers only: said in brief
    ranked = Failure(3, 1, FailureKind.EXCEPTION, 4.0, local_rank=1, message=ours + "rank 3 "
                     "finished the step without joining the gang's process group. How to fix "
                     "it: call init_process_group() in the step, before the first collective.")
    first = Failure(2, 1, FailureKind.EXCEPTION, 1.0, local_rank=0,
                    message=ranked.message.replace("rank 3", "rank 2"))
    note = GangOutcome([first, ranked], [], []).others_note()
    assert "before the first collective" not in note and " ..." in note, note


def test_a_ranks_communication_error_is_one_line_unless_debugging(monkeypatch):
    import io

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import failures

    monkeypatch.delenv(failures.DEBUG_ENV, raising=False)
    out = io.StringIO()
    failures.report_exception(RuntimeError("[pair.cc:553] Connection closed by peer\nmore"),
                              symptom=True, file=out)
    assert out.getvalue() == (
        "RuntimeError: [pair.cc:553] Connection closed by peer (most likely because another "
        "rank failed first: the step's error names the root cause; "
        "METAFLOW_TORCH_DISTRIBUTED_DEBUG=1 prints this traceback)\n")


def test_the_users_exception_carries_the_gangs_summary_not_its_traceback_again(monkeypatch):
    import sys

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import failures
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import users_own

    monkeypatch.delenv(failures.DEBUG_ENV, raising=False)
    try:
        _raise_from_here(KeyError("x"))
    except KeyError as ex:
        own = users_own(ex, "rank 1 raised this error")
    assert own.__traceback__ is None
    if sys.version_info >= (3, 11):
        assert own.__notes__ == ["rank 1 raised this error"]
        assert users_own(own, "rank 1 raised this error").__notes__ == own.__notes__


def test_a_sys_exit_of_rank_0_has_its_summary_printed(monkeypatch, capsys):
    # Metaflow reports no SystemExit: the summary cannot ride on it as a note
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import failures
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import users_own

    monkeypatch.delenv(failures.DEBUG_ENV, raising=False)
    own = users_own(SystemExit(3), "rank 0 raised this error")
    assert "rank 0 raised this error" in capsys.readouterr().err
    assert not getattr(own, "__notes__", None)


def test_ranks_that_ended_in_a_preemptions_grace_are_not_said_to_have_failed_on_their_own():
    """Lightning raises SIGTERMException (no message) in every rank it stops on SIGTERM: after a
    preemption that is what the ranks did in their grace, not failures of their own."""
    preempted = Failure(None, 1, FailureKind.PREEMPTED, 1.0, message="SIGTERM to node 1")
    outcome = gang_outcome([preempted], range(4),
                           exited=[_raised(0, 1.5, "SIGTERMException: ")])
    note = outcome.others_note()
    assert note.startswith("While the ranks had their grace to save: rank 0 (node 0, local "
                           "rank 0) raised SIGTERMException. "), note
    assert "on their own" not in note


def test_a_failure_read_back_without_its_local_rank_still_says_where_it_is():
    # the card rebuilds failures from a record's rows, which carry no local rank
    failure = Failure(3, 1, "exception", 0.0, message="ValueError: x")
    assert failure.where() == "rank 3 (node 1)"
    assert failure.sentence() == "rank 3 (node 1) raised ValueError: x."
