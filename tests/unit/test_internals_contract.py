"""The contract with Metaflow: one test per Metaflow internal that internals.py reaches.

Each test checks what internals.py relies on (a signature, an attribute, a constant, what a
command accepts, what Metaflow's own code does with a value we set) against the installed
Metaflow, and fails with "Metaflow X.Y.Z changed <symbol>: <what we rely on>". Each observes
Metaflow's behaviour, never its source text: it calls Metaflow's real code (its compilers, its
CLI, its Batch and Kubernetes job builders, its decorators' hooks) with stand-ins for what lies
outside this process (the AWS Batch API, a Kubernetes API server, the Kubernetes client
library where it is not installed: tests/unit/metaflow_stand_ins.py) and reads what it did.
CI runs this file against the newest metaflow of the supported range (the suite's venv), the
oldest, and the newest ob-metaflow, Outerbounds' distribution of the same module
(.ci/packages), so it needs only metaflow, pytest and psutil (tests/conftest.py): no torch, no
AWS, no kubernetes. Where ob-metaflow differs in what we rely on, a test below says so
(test_where_ob_metaflow_differs_...).
"""

import contextlib
import glob
import inspect
import io
import json
import os
import re
import subprocess
import sys
import time
import types

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedCompileError,
)

import metaflow
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import (
    internals,
    spinstep,
    versions,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import gangspec
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.supported import \
    TESTED_METAFLOW, metaflow_version_supported, parse_version
from tests.unit.metaflow_stand_ins import (
    BatchApi,
    Environment,
    KubeConfig,
    KubernetesSdk,
    Provider,
    SubmittedJob,
    SubmittingSdk,
    batch_client,
    kubernetes_installed,
    kubernetes_package,
    kubernetes_sdk,
)

VERSION = internals.metaflow_version()


def require(ok, symbol, relied_on):
    assert ok, "Metaflow %s changed %s: %s" % (VERSION, symbol, relied_on)


def params_of(function):
    return list(inspect.signature(function).parameters)


def fresh_card_state(monkeypatch):
    """@card's class-wide state of the task (its cards, events and creator) as a new task's,
    and no current.card."""
    from metaflow import current
    from metaflow.plugins.cards.card_decorator import CardDecorator

    for name, value in (("total_decos_on_step", {}), ("_called_once", {}), ("step_counter", 0),
                        ("task_finished_decos", 0), ("card_creator", None),
                        ("_GLOBAL_CARD_INFO", {}), ("_config_values", None),
                        ("_config_file_name", None)):
        monkeypatch.setattr(CardDecorator, name, value, raising=False)
    without_class_attribute(monkeypatch, type(current), "card")


def without_class_attribute(monkeypatch, cls, name):
    """Remove cls.<name> for the test: what was there before (or nothing) is there after it,
    whatever the test set meanwhile."""
    monkeypatch.setattr(cls, name, None, raising=False)
    monkeypatch.delattr(cls, name)


def s3_datastore():
    """The flow datastore the compilers and @batch/@kubernetes are given (--datastore=s3):
    only its TYPE and root are read while a flow is compiled."""
    return types.SimpleNamespace(TYPE="s3", datastore_root="s3://bucket/metaflow")


def outerbounds_home(tmp_path, platform=True):
    """A METAFLOW_HOME whose configuration has (or, with platform=False, has not) what
    `outerbounds configure` writes: ob-metaflow's Kubernetes.create_jobset and
    ArgoWorkflows.__init__ stop without it; metaflow ignores it."""
    home = tmp_path / ("obp-home" if platform else "empty-home")
    home.mkdir(exist_ok=True)
    (home / "config.json").write_text(json.dumps(
        {"OBP_PERIMETER": "contract", "OBP_INTEGRATIONS_URL": "https://obp.invalid"}
        if platform else {}))
    return str(home)


def test_the_installed_metaflow_is_in_the_supported_range():
    require(metaflow_version_supported(VERSION), "its version",
            "the contract tests run against a release of the supported range %s" %
            (TESTED_METAFLOW,))


# -- current ------------------------------------------------------------------------------------

def test_current_update_env():
    from metaflow import current
    from metaflow.metaflow_current import Current

    require(params_of(Current._update_env) == ["self", "env"], "Current._update_env",
            "it takes one dict of names to values")
    internals.set_current("torch_distributed_contract_probe", 42)
    try:
        require(current.torch_distributed_contract_probe == 42, "Current._update_env",
                "a value it sets is read back as current.<name>")
    finally:
        delattr(Current, "torch_distributed_contract_probe")


def test_metaflow_current_parallel(monkeypatch):
    """@batch's task_pre_step on a node of a multi-node job (AWS_BATCH_JOB_NUM_NODES) sets the
    MF_PARALLEL_* variables from AWS Batch's, then reads current.parallel, which only
    @parallel's step_init defines: install_current_parallel defines it, read from them."""
    from metaflow import current
    from metaflow.metaflow_current import Parallel
    from metaflow.plugins.aws.batch.batch_decorator import BatchDecorator

    require(Parallel._fields == ("main_ip", "num_nodes", "node_index", "control_task_id"),
            "metaflow_current.Parallel", "its fields are main_ip, num_nodes, node_index, "
            "control_task_id")
    for name, value in (("AWS_BATCH_JOB_NUM_NODES", "3"), ("AWS_BATCH_JOB_NODE_INDEX", "2"),
                        ("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS", "10.0.0.1"),
                        # what task_pre_step sets, restored after the test
                        ("MF_PARALLEL_MAIN_IP", ""), ("MF_PARALLEL_NUM_NODES", ""),
                        ("MF_PARALLEL_NODE_INDEX", "")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_BATCH_JOB_ID", raising=False)  # no sidecars, no ECS metadata
    without_class_attribute(monkeypatch, type(current), "parallel")

    def node_index_registered():
        metadata = Provider("local")
        BatchDecorator().task_pre_step("train", None, metadata, "5", "7", None, None, 0, 0, None,
                                       [])
        return {datum.field: datum.value for *_, data in metadata.registered
                for datum in data}.get("parallel-node-index")

    try:
        node_index_registered()
        reads_it = False
    except AttributeError as missing:
        reads_it = "parallel" in str(missing)
    require(reads_it, "BatchDecorator.task_pre_step", "on a node of a multi-node job it reads "
            "current.parallel, which nothing but @parallel (and install_current_parallel) "
            "defines")
    internals.install_current_parallel(os.environ)
    index = node_index_registered()
    require(index == 2, "BatchDecorator.task_pre_step", "it sets MF_PARALLEL_NODE_INDEX from "
            "AWS_BATCH_JOB_NODE_INDEX before it reads current.parallel.node_index (registered "
            "as the task's parallel-node-index); got %r" % (index,))
    require((current.parallel.num_nodes, current.parallel.main_ip) == (3, "10.0.0.1"),
            "current.parallel", "a property on current's class is read as current.parallel")


# -- the flow's graph and the task's role ----------------------------------------------------

class ParallelFlow(metaflow.FlowSpec):
    @metaflow.step
    def start(self):
        self.next(self.train, num_parallel=3)

    @metaflow.step
    def train(self):
        self.next(self.join)

    @metaflow.step
    def join(self, inputs):
        self.next(self.end)

    @metaflow.step
    def end(self):
        pass


def test_graph_node_parallel_foreach_and_num_parallel():
    from metaflow.graph import FlowGraph

    graph = FlowGraph(ParallelFlow)
    require(getattr(graph["start"], "parallel_foreach", None) is True, "DAGNode.parallel_foreach",
            "a step calling self.next(..., num_parallel=N) has parallel_foreach True")
    require(getattr(graph["train"], "parallel_foreach", None) is False,
            "DAGNode.parallel_foreach", "other steps have it False")
    require(internals.num_parallel_parents(graph, "train") == [("start", 3)],
            "DAGNode.num_parallel", "it holds N of self.next(..., num_parallel=N)")


def test_graph_checks_run_ours_before_parallel_lint():
    from metaflow import lint

    names = [c.__name__ for c in lint.linter._checks]
    require("check_parallel_step_after_next" in names, "lint.check_parallel_step_after_next",
            "Metaflow's graph check that a num_parallel step has @parallel")
    require(lint.linter.require_static_graph is True, "FlowLinter.require_static_graph",
            "run_checks runs a check whose attrs name a setting that is on")
    seen = []

    def ours(graph):
        seen.append(graph)

    try:
        internals.check_graph_before_parallel_lint(ours)
        internals.check_graph_before_parallel_lint(ours)  # once, however often it is asked
        names = [c.__name__ for c in lint.linter._checks]
        require(names.count("ours") == 1 and names.index("ours") + 1 ==
                names.index("check_parallel_step_after_next"), "FlowLinter._checks",
                "a list of checks run in order")
        from metaflow.graph import FlowGraph

        with pytest.raises(lint.LintWarn):  # ours ran, then Metaflow's asked for @parallel
            lint.linter.run_checks(FlowGraph(ParallelFlow))
        require(len(seen) == 1, "FlowLinter.run_checks", "it runs every check in _checks")
    finally:
        lint.linter._checks.remove(ours)


def test_unbounded_foreach_ubf_control():
    from metaflow.unbounded_foreach import UBF_CONTROL, UBF_TASK

    require(internals.is_ubf_control(UBF_CONTROL) and not internals.is_ubf_control(UBF_TASK)
            and not internals.is_ubf_control(None), "unbounded_foreach.UBF_CONTROL",
            "task_decorate's ubf_context equals it in an unbounded foreach's control task")


# -- the command line of the running process -----------------------------------------------------

def test_cli_args_step_kwargs():
    from metaflow.cli_args import CLIArgs

    require(isinstance(getattr(CLIArgs, "step_kwargs", None), property), "CLIArgs.step_kwargs",
            "it holds the running step command's options (run_id, task_id, input_paths, ...)")
    require(isinstance(internals.step_kwargs(), dict), "cli_args.step_kwargs", "it is a dict")


def test_cli_args_options():
    from metaflow.cli_args import cli_args

    require(isinstance(getattr(type(cli_args), "top_kwargs", None), property),
            "CLIArgs.top_kwargs", "it holds the flow's top-level options")
    words = list(cli_args._options({"with": ["card", "retry"], "datastore": "local",
                                    "quiet": True, "no_pylint": False, "metadata": None}))
    require(words == ["--with", "card", "--with", "retry", "--datastore", "local", "--quiet"],
            "CLIArgs._options", "it turns option values back into argv words (lists repeat, "
            "True flags appear, False and None are left out); got %r" % words)


def _spin_step():
    from metaflow.cli_components import step_cmd

    return step_cmd.spin_step


def test_spin_step_command():
    command = _spin_step()
    require(command.name == "spin-step", "the spin-step command", "its name is spin-step")
    opts = {opt: p.name for p in command.params for opt in [*p.opts, *p.secondary_opts]}
    identity = gangspec.TaskIdentity(run_id="5", task_id="7", input_paths="5/start/1",
                                   split_index=2, retry_count=1, max_user_code_retries=2,
                                   namespace="user:me", orig_datastore="local@/tmp/mf")
    words = spinstep.SpinOptions.of_task(identity, "7-node-1").words("train")
    for word in words:
        if word.startswith("--"):
            require(word in opts, "the spin-step command",
                    "it accepts %s (spinstep.SpinOptions passes it)" % word)
    # what trampoline.agent_identity reads from an agent's spin-step options
    for name in ("run_id", "task_id", "input_paths", "split_index", "retry_count",
                 "max_user_code_retries", "orig_flow_datastore"):
        require(name in opts.values(), "the spin-step command",
                "its option %s keeps that name in its click context" % name)
    require(opts.get("--namespace") == "opt_namespace", "the spin-step command",
            "its --namespace option is opt_namespace in its click context")


def test_click_current_context_params():
    from metaflow._vendor import click

    @click.command()
    @click.option("--run-id")
    def command(run_id):
        seen.append(internals.command_params())

    seen = []
    command.main(["--run-id", "5"], standalone_mode=False)
    require(seen == [{"run_id": "5"}], "metaflow._vendor.click",
            "get_current_context().params holds the running command's options")


def test_root_context_saved_args():
    """Metaflow's top-level group (the class of cli.py::start) keeps the words after the
    top-level options as `saved_args` on its context before its callback runs step_init."""
    from metaflow._vendor import click
    from metaflow.cli_components.utils import LazyPluginCommandCollection

    @click.group()
    def deployer():
        pass

    @deployer.command()
    def create():
        pass

    @click.group(invoke_without_command=True)
    def plugins():
        pass

    plugins.add_command(deployer, "my-scheduler")

    @click.command(cls=LazyPluginCommandCollection, sources=[plugins],
                   invoke_without_command=True)
    def start():
        seen.append(internals.command_words())

    seen = []
    start.main(["my-scheduler", "create"], standalone_mode=False)
    require(seen == [["my-scheduler", "create"]], "cli_components.utils (saved_args)",
            "the root click context keeps the command's words as saved_args")
    require(internals.command_words() == [], "click.get_current_context(silent=True)",
            "outside a CLI there is no context")


def test_spin_step_skips_a_decorator_quietly_once_told(monkeypatch):
    """decorators._should_skip_decorator_for_spin decides, for each decorator of each step, if
    a spin-step skips it, and warns through the logger it is given; quiet_spin_skips keeps the
    decision and drops the warning (a gang member's own spin-step)."""
    from metaflow import decorators

    name = "_should_skip_decorator_for_spin"
    require(callable(getattr(decorators, name, None)), "decorators." + name, "it exists")
    monkeypatch.setattr(decorators, name, getattr(decorators, name))  # undone after the test
    monkeypatch.setattr(decorators, "SPIN_ALLOWED_DECORATORS", ["card", "torch_distributed"],
                        raising=False)

    def decide(deco_name):
        said = []
        deco = types.SimpleNamespace(name=deco_name)
        skip = getattr(decorators, name)(deco, True, False,
                                         lambda *a, **k: said.append(a[0] if a else k), "Step "
                                         "decorator")
        return skip, said

    skip, said = decide("retry")
    require(skip is True and len(said) == 1 and "'retry'" in str(said[0]), "decorators." + name,
            "a spin-step skips a decorator off its allow-list and tells the logger it was given; "
            "got %r, %r" % (skip, said))
    internals.quiet_spin_skips()
    internals.quiet_spin_skips()  # a second call wraps nothing again
    require(decide("retry") == (True, []), "decorators." + name,
            "quieted, it still skips the decorator and says nothing; got %r" % (decide("retry"),))
    require(decide("torch_distributed") == (False, []), "decorators." + name,
            "an allowed decorator runs; got %r" % (decide("torch_distributed"),))
    require(getattr(decorators, name)(types.SimpleNamespace(name="retry"), False, False,
                                      None) is False, "decorators." + name,
            "outside a spin-step nothing is skipped")


def test_plugins_deployer_impl_providers():
    commands = internals.deployer_commands()
    require({"step-functions", "argo-workflows"} <= set(commands),
            "plugins.DEPLOYER_IMPL_PROVIDERS", "its providers' TYPE are the deploy commands; "
            "got %r" % commands)


def test_metaflow_config_spin_allowed_decorators(tmp_path):
    """A member's spin-step is told which decorators to run, and where its own datastore is, by
    the variables spinstep.py sets: Metaflow's configuration reads them when it is imported
    (in a fresh process, as a member's is)."""
    require(isinstance(internals.spin_allowed_decorators(), list),
            "metaflow_config.SPIN_ALLOWED_DECORATORS", "it is a list of decorator names")
    allowed, sysroot = ["card", "torch_distributed"], str(tmp_path / "spin")
    env = dict(os.environ, METAFLOW_HOME=str(tmp_path), **{
        internals.SPIN_ALLOWED_ENV: json.dumps(allowed), internals.SPIN_SYSROOT_ENV: sysroot})
    probe = ("import json; from metaflow import metaflow_config as c; "
             "print(json.dumps([c.SPIN_ALLOWED_DECORATORS, c.DATASTORE_SYSROOT_SPIN]))")
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout.splitlines()[-1])
    require(read[0] == allowed, "metaflow_config.SPIN_ALLOWED_DECORATORS",
            "it is read from %s, a JSON list; got %r" % (internals.SPIN_ALLOWED_ENV, read[0]))
    require(read[1] == sysroot, "metaflow_config.DATASTORE_SYSROOT_SPIN",
            "it is read from %s; got %r" % (internals.SPIN_SYSROOT_ENV, read[1]))


# -- datastore and artifacts ---------------------------------------------------------------------

def test_flow_datastore_type_and_root(tmp_path):
    from metaflow.datastore.flow_datastore import FlowDataStore
    from metaflow.plugins.datastores.local_storage import LocalStorage

    flow_datastore = FlowDataStore("ContractFlow", storage_impl=LocalStorage,
                                   ds_root=str(tmp_path))
    require(internals.orig_datastore(flow_datastore) == "local@%s" % tmp_path,
            "FlowDataStore.TYPE and datastore_root", "they are the storage's type and root")


def test_flow_datastore_get_task_datastore():
    from metaflow.datastore.flow_datastore import FlowDataStore

    names = params_of(FlowDataStore.get_task_datastore)
    require(names[:4] == ["self", "run_id", "step_name", "task_id"]
            and {"attempt", "mode", "allow_not_done"} <= set(names),
            "FlowDataStore.get_task_datastore", "it takes (run_id, step_name, task_id, "
            "attempt=, mode=, allow_not_done=); got %r" % names)


def test_an_attempt_file_round_trips_through_a_real_datastore(tmp_path):
    """What node 0 writes beside its attempt's files, an agent reads through a FlowDataStore
    it builds from "<type>@<root>" (attempt_secret.py), on Metaflow's own local datastore."""
    root = str(tmp_path / ".metaflow")
    writer = internals.flow_datastore_at("GangFlow", "local@" + root)
    reader = internals.flow_datastore_at("GangFlow", "local@" + root)
    where = ("5", "train", "7")
    assert internals.load_attempt_file(reader, *where, 1, "torch_distributed_gang") is None
    internals.save_attempt_file(writer, *where, 1, "torch_distributed_gang", {"secret": "s"})
    assert internals.load_attempt_file(reader, *where, 1, "torch_distributed_gang") == {
        "secret": "s"}
    # one attempt's file is not another's, and it lies beside Metaflow's files of the attempt
    assert internals.load_attempt_file(reader, *where, 0, "torch_distributed_gang") is None
    assert os.path.isfile(os.path.join(root, "GangFlow", "5", "train", "7",
                                       "1.torch_distributed_gang"))


def test_task_datastore_persist_walks_the_flow(tmp_path):
    """Metaflow's TaskDataStore.persist saves the attributes the flow instance holds when it
    runs, private ones too: what drop_artifacts deleted from it is not saved."""
    store = internals.flow_datastore_at("GangFlow", "local@" + str(tmp_path))

    def saved(attempt, drop):
        flow = _Flow(kept=1)
        before = internals.artifact_names(flow)
        flow.body_set, flow._private = 1, 2
        if drop:
            internals.drop_artifacts(flow, internals.artifact_names(flow) - before)
        task = store.get_task_datastore("5", "train", "7", attempt=attempt, mode="w")
        task.init_task()
        task.persist(flow)
        task.done()
        done = store.get_task_datastore("5", "train", "7", attempt=attempt, mode="r")
        return {name for name in ("kept", "body_set", "_private") if name in done}

    require(saved(0, drop=False) == {"kept", "body_set", "_private"}, "TaskDataStore.persist",
            "it saves every attribute of the flow instance (it walks dir(flow))")
    require(saved(1, drop=True) == {"kept", "_private"}, "TaskDataStore.persist",
            "an attribute deleted from the flow instance (drop_artifacts) is not saved")


# -- rank 0's hand-back (mf/handback.py) -------------------------------------------------------

def _next_flow():
    from metaflow import FlowSpec, step

    class NextFlow(FlowSpec):
        @step
        def start(self):
            self.items = [1, 2, 3]
            self.next(self.each, foreach="items")

        @step
        def each(self):
            self.next(self.join)

        @step
        def join(self, inputs):
            self.next(self.end)

        @step
        def end(self):
            pass

    return NextFlow(use_cli=False)


@pytest.mark.parametrize("foreach", [False, True], ids=["linear", "foreach"])
def test_flowspec_next_sets_only_the_next_state(foreach):
    """What self.next() leaves on the flow, read by Metaflow after the step, is all in
    NEXT_STATE (rank 0's process hands those back by value)."""
    flow = _next_flow()
    flow._current_step = "start" if foreach else "each"
    if foreach:
        flow.items = [1, 2, 3]
    before = internals.flow_attributes(flow)
    if foreach:
        flow.next(flow.each, foreach="items")
    else:
        flow.next(flow.join)
    now = internals.flow_attributes(flow)
    changed = {k for k, v in now.items() if k not in before or before[k] is not v}
    require(changed <= set(internals.NEXT_STATE) and "_transition" in changed,
            "FlowSpec.next", "it sets only %s; it set %s" % (internals.NEXT_STATE,
                                                            sorted(changed)))
    if foreach:
        assert now["_foreach_num_splits"] == 3 and now["_foreach_var"] == "items"


def test_is_artifact_follows_the_persist_rule(tmp_path):
    """is_artifact says which attributes TaskDataStore.persist stores: the same names, for a
    flow with a property, a Parameter, a method, a function, a dunder and an _EPHEMERAL name."""
    from metaflow.parameters import Parameter

    class Flow(_Flow):
        _EPHEMERAL = {"_EPHEMERAL", "scratch"}
        alpha = Parameter("alpha", default=1)

        @property
        def shown(self):
            return 1

        def method(self):
            return 2

    flow = Flow(kept=1, _private=2, scratch=3, fn=lambda: 4, name="n")
    flow.__dunder__ = 5
    store = internals.flow_datastore_at("GangFlow", "local@" + str(tmp_path))
    ds = store.get_task_datastore("5", "train", "7", attempt=0, mode="w")
    ds.init_task()
    names = [n for n in dir(flow) if internals.is_artifact(flow, n, getattr(flow, n))]
    ds.persist(flow)
    require(sorted(ds._objects) == sorted(names), "TaskDataStore.persist's rule",
            "rank 0 hands back what persist stores; persist stored %s, is_artifact says %s"
            % (sorted(ds._objects), sorted(names)))
    assert {"kept", "_private", "name"} <= set(names) and not {
        "scratch", "fn", "shown", "method", "alpha", "__dunder__"} & set(names), names


class _Flow:
    """What TaskDataStore.persist reads of a flow: its attributes, _datastore, _EPHEMERAL."""
    _EPHEMERAL = set()

    def __init__(self, **attributes):
        self._datastore = None
        vars(self).update(attributes)


def test_artifacts_persisted_by_one_process_are_adopted_by_the_tasks_own_save(tmp_path):
    """Rank 0's process saves the body's artifacts into its copy of the task's datastore; the
    task's own persist (another object of the same attempt) ends with their keys, without
    writing their blobs again, and the attempt's artifacts read back are the body's."""
    root = str(tmp_path / ".metaflow")
    store = internals.flow_datastore_at("GangFlow", "local@" + root)
    where = ("5", "train", "7")
    tasks = store.get_task_datastore(*where, attempt=0, mode="w")
    tasks.init_task()
    # rank 0's process opens the attempt's datastore itself (a fork's copy would do the same)
    rank0s = internals.task_output_datastore("GangFlow", "local@" + root, *where, 0)

    def blobs():
        return {p for p in glob.glob(os.path.join(root, "GangFlow", "data", "*", "*"))
                if not p.endswith("_meta")}

    keys = internals.persist_artifacts(rank0s, dict(big=b"x" * 100000, changed="rank 0's",
                                                    _mine=7))
    written = blobs()
    internals.adopt_artifacts(tasks, {k: keys[k] for k in ("big", "changed", "_mine")})
    tasks.persist(_Flow(changed="stale", _task_ok=True))
    tasks.done()
    new = blobs() - written
    done = store.get_task_datastore(*where, attempt=0, mode="r")
    assert done["big"] == b"x" * 100000 and done["changed"] == "rank 0's" and done["_mine"] == 7
    assert done["_task_ok"] is True  # the task's own, not rank 0's
    # rank 0's process stored the three values it was given, nothing else of the flow's
    assert sorted(keys) == ["_mine", "big", "changed"] and len(written) == 3, written
    # the task wrote only its own attributes ("stale", _task_ok, _datastore, _EPHEMERAL),
    # never `big` again
    assert len(new) == 4 and not any(p.endswith(keys["big"][0]) for p in new), new


def test_task_metadata_is_registered_as_metaflows_decorators_do():
    """A restart in place is kept in the task's metadata: a MetaDatum of the attempt, given to
    the provider's register_metadata (tests/e2e/test_restarts.py reads it with the client)."""
    from metaflow.metadata_provider import MetadataProvider

    got = []

    class Provider:
        def register_metadata(self, run_id, step_name, task_id, metadata):
            got.append((run_id, step_name, task_id, metadata))

    internals.register_task_metadata(Provider(), "5", "train", "7", 1, "torch_distributed_x",
                                     "{}")
    (run_id, step_name, task_id, (datum,)), = got
    require((run_id, step_name, task_id) == ("5", "train", "7"), "register_metadata's ids", "a restart in place")
    require((datum.field, datum.value, datum.type, datum.tags)
            == ("torch_distributed_x", "{}", "torch_distributed_x", ["attempt_id:1"]),
            "MetaDatum(field, value, type, tags)", "a restart in place")
    require(list(inspect.signature(MetadataProvider.register_metadata).parameters)[1:]
            == ["run_id", "step_name", "task_id", "metadata"],
            "MetadataProvider.register_metadata(run_id, step_name, task_id, metadata)", "a restart in place")


def test_checkpoints_current_checkpointer_loads_the_latest_again(tmp_path):
    """metaflow-checkpoint's current.checkpoint in the task: a fresh directory, then its
    first-load with the decorator's policy, which sets what is_loaded and info show
    (tests/e2e/test_restarts.py: round 1 starts from round 0's save)."""
    from metaflow_extensions.obcheckpoint.plugins.machine_learning_utilities.checkpoints \
        .decorator import CurrentCheckpointer

    require(list(inspect.signature(CurrentCheckpointer._setup_task_first_load).parameters)
            == ["self", "load_policy", "flow"], "CurrentCheckpointer._setup_task_first_load", "a restart in place")
    calls = []
    checkpointer = CurrentCheckpointer.__new__(CurrentCheckpointer)
    checkpointer._temp_dir_root = str(tmp_path)
    checkpointer._temp_chckpt_dir = None
    checkpointer._flow = "the flow"
    checkpointer._loaded_checkpoint = "round 0's"
    checkpointer.cleanup = lambda: calls.append("cleanup")
    checkpointer._setup_task_first_load = lambda policy, flow: calls.append((policy, flow)) \
        or "latest"
    old_directory = None
    require(internals.reload_task_checkpoint(checkpointer, "fresh") == "latest", "its answer", "a restart in place")
    require(calls == ["cleanup", ("fresh", "the flow")], "cleanup, then the first load: %s"
            % calls, "a restart in place")
    require(checkpointer._loaded_checkpoint is None and not checkpointer.is_loaded,
            "_loaded_checkpoint is what is_loaded reads", "a restart in place")
    require(os.path.isdir(checkpointer.directory) and checkpointer.directory != old_directory
            and checkpointer.directory.startswith(str(tmp_path)),
            "refresh_directory makes a new directory under temp_dir_root", "a restart in place")


# A writer numbered with number_saves_from saves twice, then a second writer of the same task
# numbered after both; run in a fresh interpreter (the datastore's root is read once).
NUMBERED_SAVES = r"""
import json, os, sys, types
from metaflow import Checkpoint
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import internals

folder = sys.argv[1]
with open(os.path.join(folder, "model.pt"), "w") as f:
    f.write("weights")
writer = Checkpoint()
internals.number_saves_from(writer, 3)
first, second = writer.save(path=folder), writer.save(path=folder, name="other")
task = types.SimpleNamespace(_default_checkpointer=Checkpoint())  # @checkpoint's object
internals.number_saves_from(task, 5)
third = task._default_checkpointer.save(path=folder)
print("@@" + json.dumps([[c["version_id"], c["name"], c["key"]] for c in (first, second, third)]))
"""


def test_checkpoints_a_writer_numbers_its_saves_from_the_version_we_set(tmp_path):
    """metaflow-checkpoint numbers the saves of each writer (a `Checkpoint`, or the one inside
    @checkpoint's current.checkpoint) from its Checkpointer's current version, the last part of
    the key, one more per save of any name (tests/e2e/test_restarts.py: round 1's saves do
    not replace round 0's)."""
    from metaflow_extensions.obcheckpoint.plugins.machine_learning_utilities.checkpoints \
        .core import Checkpointer

    require(params_of(Checkpointer._set_current_version) == ["self", "version_id"],
            "Checkpointer._set_current_version", "a restart in place")
    folder = tmp_path / "folder"
    folder.mkdir()
    env = dict(os.environ, METAFLOW_DEFAULT_DATASTORE="local",
               METAFLOW_DATASTORE_SYSROOT_LOCAL=str(tmp_path),
               METAFLOW_CHECKPOINT_UID="SeamFlow/1/train/2/abcdef123456/default/0",
               METAFLOW_CHECKPOINT_TASK_IDENTIFIER="abcdef123456")
    proc = subprocess.run([sys.executable, "-c", NUMBERED_SAVES, str(folder)], env=env,
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    require(proc.returncode == 0, "Checkpoint.save after number_saves_from",
            "a restart in place: %s" % proc.stderr[-2000:])
    saves = json.loads(proc.stdout.rsplit("@@", 1)[1])
    require([(v, name) for v, name, _ in saves] == [(3, "mfchckpt"), (4, "other"),
                                                   (5, "mfchckpt")],
            "Checkpointer._current_version", "a writer's saves are numbered on from it: %s"
            % saves)
    require(all(key.endswith(".0.%s.%d" % (name, v)) for v, name, key in saves),
            "the checkpoint key <task>.<attempt>.<name>.<version_id>", "%s" % saves)


def test_card_components_reach_another_collector_rendered():
    """A card's components, rendered in rank 0's process (card_state), are what the task's
    collector serializes for @card's final render (restore_card_state). Each process draws its
    own uuid per card (an exec'd rank 0's differ from the task's): cards are matched by type,
    id and place."""
    from metaflow import current
    from metaflow.cards import Markdown
    from metaflow.plugins.cards.component_serializer import CardComponentCollector

    class Creator:  # what refresh() asks to render a runtime card: nothing here
        def create(self, **options):
            pass

    def collector():
        c = CardComponentCollector(card_creator=Creator())
        c._add_card("blank", None, {"type": "blank"}, {}, editable=True, customize=True)
        c._add_card("blank", "other", {"type": "blank", "id": "other"}, {}, editable=True)
        c._finalize()
        return c

    rank0s, tasks = collector(), collector()
    require(set(rank0s._card_component_store).isdisjoint(tasks._card_component_store),
            "CardComponentCollector.create_uuid", "each collector draws its own uuids")
    rank0s.append(Markdown("# loss 0.1"))
    rank0s["other"].append(Markdown("# other card"))
    rank0s.refresh({"step": 35})
    saved_current = getattr(current, "card", None)
    try:
        internals.set_current("card", rank0s)
        state = internals.card_state()
        internals.set_current("card", tasks)
        internals.restore_card_state(state)
    finally:
        internals.set_current("card", saved_current)
    for theirs, ours in zip(rank0s._cards_meta, tasks._cards_meta):
        require(tasks._serialize_components(ours) == rank0s._serialize_components(theirs),
                "CardComponentCollector._serialize_components", "it renders a card's components")
    default, other = list(tasks._cards_meta)
    assert "loss 0.1" in json.dumps(tasks._serialize_components(default))
    assert "other card" in json.dumps(tasks._serialize_components(other))
    assert "loss 0.1" not in json.dumps(tasks._serialize_components(other))
    assert tasks._get_latest_data(default, final=True, mode="render")["user"] == {"step": 35}


# -- @card -------------------------------------------------------------------------------------

def test_card_decorator_private_attributes(monkeypatch):
    """render_failed_card asks @card's creator for the render @card's own task_finished asks
    for after a successful attempt, from what @card kept of its card (step_init,
    task_pre_step)."""
    from metaflow import current
    from metaflow.plugins.cards.card_creator import CardCreator
    from metaflow.plugins.cards.card_decorator import CardDecorator

    names = set(params_of(CardCreator.create))
    wanted = {"card_uuid", "user_set_card_id", "runtime_card", "decorator_attributes",
              "card_options", "logger", "mode", "final"}
    require(wanted <= names, "CardCreator.create", "it takes %s" % sorted(wanted))
    fresh_card_state(monkeypatch)
    deco = CardDecorator(attributes={"type": "blank", "id": "loss", "options": {"x": 1}})
    deco.external_init()
    require(internals.render_failed_card(deco) is False, "CardDecorator._card_uuid",
            "it is None until @card made a card")
    deco.step_init(_FLOW, None, "train", [deco], Environment(), s3_datastore(),
                   lambda *a, **k: None)
    deco.task_pre_step("train", None, Provider("local"), "5", "7", _FLOW, None, 0, 0, None, [])
    for name in ("_card_uuid", "_user_set_card_id", "_is_runtime_card", "card_options",
                 "_logger", "card_creator"):
        require(hasattr(deco, name), "CardDecorator.%s" % name,
                "@card keeps what rendering its card needs in it (step_init, task_pre_step)")

    asked = []

    class Creator:
        def create(self, **options):
            asked.append(options)

    monkeypatch.setattr(CardDecorator, "card_creator", Creator())
    rendered = internals.render_failed_card(deco)
    deco.task_finished("train", _FLOW, None, True, 0, 0)
    require(rendered and len(asked) >= 2 and asked[0] == asked[1], "CardDecorator.task_finished",
            "a successful attempt's cards are rendered with CardCreator.create(mode='render', "
            "final=True, ...) from @card's _card_uuid, _user_set_card_id, _is_runtime_card, "
            "attributes, card_options and _logger, as render_failed_card does; ours %r, "
            "@card's %r" % (asked[:1], asked[1:2]))
    require(asked[0]["mode"] == "render" and asked[0]["card_uuid"] is not None
            and asked[0]["user_set_card_id"] == "loss" and asked[0]["card_options"] == {"x": 1},
            "CardDecorator.task_pre_step", "it keeps the card's uuid, id and options; got %r"
            % asked[0])


def _card_on_a_task(monkeypatch, tmp_path, attributes):
    """A @card set up as in task 7 of run 5 (step_init, task_pre_step), with a local flow
    datastore in `tmp_path` (the working directory: the card root is found from it), its
    class-wide state fresh, and a recorder for `card create` (CardCreator.create)."""
    from metaflow import current
    from metaflow.datastore import FlowDataStore
    from metaflow.plugins.cards.card_decorator import CardDecorator
    from metaflow.plugins.datastores.local_storage import LocalStorage

    fresh_card_state(monkeypatch)
    for name, value in (("run_id", "5"), ("task_id", "7")):
        monkeypatch.setattr(type(current), name, property(lambda _, v=value: v))
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".metaflow").mkdir()
    datastore = FlowDataStore("GangFlow", storage_impl=LocalStorage,
                              ds_root=str(tmp_path / ".metaflow"))
    deco = CardDecorator(attributes=attributes)
    deco.external_init()
    provider = Provider("local")
    deco.step_init(_FLOW, None, "train", [deco], Environment(), datastore,
                   lambda *a, **k: None)
    deco.task_pre_step("train", None, provider, "5", "7", _FLOW, None, 0, 0, None, [])
    asked = []

    class Creator:
        def create(self, **options):
            asked.append(options)

    monkeypatch.setattr(CardDecorator, "card_creator", Creator())
    return deco, provider, asked


@pytest.mark.parametrize("drawn", [True, False])
def test_a_card_drawn_by_the_task_is_the_one_card_create_saves(monkeypatch, tmp_path, drawn):
    """finish_card_in_task: @card's task_finished asks the task first; where it drew and saved
    the card (card_page, save_card), `card create` is not asked, @card counts the decorator as
    finished, and the card is where `card get` reads it, with the card-info metadata `card
    create` registers. Where the task did not, @card renders as before."""
    from metaflow.cards import Markdown
    from metaflow.datastore import FlowDataStore
    from metaflow.plugins.cards.card_datastore import CardDatastore
    from metaflow.plugins.cards.card_decorator import CardDecorator
    from metaflow.plugins.datastores.local_storage import LocalStorage
    from tests.support import card_json

    deco, provider, asked = _card_on_a_task(monkeypatch, tmp_path,
                                            {"type": "blank", "id": "gang"})
    told = []

    def finish(is_task_ok, pathspec, attempt):
        told.append((is_task_ok, pathspec, attempt))
        if drawn:
            html = internals.card_page([Markdown("drawn by the task")], pathspec)
            internals.save_card(deco, html, pathspec, attempt)
        return drawn

    internals.finish_card_in_task(deco, finish)
    deco.task_finished("train", types.SimpleNamespace(name="GangFlow"), None, True, 0, 0)
    require(told == [(True, "GangFlow/5/train/7", 0)], "current.run_id, current.task_id",
            "the pathspec of the task's card")
    require(CardDecorator.task_finished_decos == 1, "CardDecorator._cleanup",
            "it counts the @card decorators of the step that finished")
    require(bool(asked) != drawn, "CardDecorator.task_finished",
            "it renders with CardCreator.create unless the task drew the card")
    if not drawn:
        return
    root = CardDatastore.get_storage_root("local")
    require(root == str(tmp_path / ".metaflow" / "mf.cards"), "CardDatastore.get_storage_root",
            "the local card root is found from the working directory: %s" % root)
    cards = CardDatastore(FlowDataStore("GangFlow", storage_impl=LocalStorage, ds_root=root),
                          pathspec="GangFlow/5/train/7")
    [path] = cards.extract_card_paths(card_type="blank", card_id="gang")
    html = cards.get_card_html(path)
    require("drawn by the task" in card_json(html), "BlankCard.render",
            "it renders its components into the page; it reads only the task's pathspec")
    require('METAFLOW_RELOAD_TOKEN = "final"' in html, "MetaflowCard.RELOAD_POLICY_TOKEN",
            "card create puts the final render's reload token in its place")
    [(run_id, step_name, task_id, [datum])] = provider.registered
    require((run_id, step_name, task_id, datum.type, datum.field, datum.tags)
            == ("5", "train", "7", "card-info", deco._card_uuid, ["attempt_id:0"])
            and json.loads(datum.value)["type"] == "blank", "plugins.cards.metadata."
            "_save_metadata", "card create registers a card's card-info metadata once")
    # a card drawn again while the task runs (the gang's live card): `card server` serves the
    # newest page and the data update whose reload token tells its viewer to reload it
    from metaflow.plugins.cards.card_server import cards_for_task

    live = internals.card_page([Markdown("drawn again")], "GangFlow/5/train/7", "live-2")
    internals.save_card(deco, live, "GangFlow/5/train/7", 0)
    internals.save_card_data(deco, "GangFlow/5/train/7", "live-2", {"torch_distributed": 2})
    [served] = list(cards_for_task(FlowDataStore("GangFlow", storage_impl=LocalStorage,
                                                 ds_root=root), "GangFlow/5/train/7"))
    require('METAFLOW_RELOAD_TOKEN = "live-2"' in served.get()
            and "drawn again" in card_json(served.get()), "CardDatastore.save_card",
            "a card saved again under its uuid replaces the page `card server` serves")
    update = served.get_data()
    require(update is not None and update["reload_token"] == "live-2"
            and update["data"] == {"torch_distributed": 2}, "CardDatastore.save_data, "
            "card_server.get_data", "the viewer reads the card's data update (%r) and reloads "
            "the page when its reload_token differs from the page's" % (update,))


@pytest.mark.parametrize("is_task_ok", [True, False])
def test_a_gang_card_the_task_could_not_draw_is_left_to_card_create(monkeypatch, tmp_path,
                                                                    capsys, is_task_ok):
    """card.TaskCard, the gang's card drawn by the task: when saving it fails (here the card
    store refuses the write), the step says so and Metaflow's `card create` renders the card,
    a failed attempt's too (render_failed_card), from the record kept with the task."""
    from metaflow.plugins.datastores.local_storage import LocalStorage

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import card

    deco, _, asked = _card_on_a_task(monkeypatch, tmp_path, dict(card.GANG_CARD))

    def refused(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(LocalStorage, "save_bytes", refused)
    task_card = card.TaskCard("train", deco, None)
    internals.finish_card_in_task(deco, task_card)
    task_card.keep(None, None)
    deco.task_finished("train", types.SimpleNamespace(name="GangFlow"), None, is_task_ok, 0, 0)
    said = capsys.readouterr().err
    assert ("@torch_distributed on step *train*: could not draw the gang's card in the task "
            "(OSError: No space left on device); Metaflow's `card create` draws it") in said
    # a successful attempt's card is asked for as @card asks for it: render, then refresh
    assert [a["mode"] for a in asked] == (["render", "refresh"] if is_task_ok else ["render"])
    assert asked[0]["card_uuid"] == deco._card_uuid and asked[0]["final"] is True


def test_card_types_of_extensions_and_their_base():
    from metaflow.plugins import CARDS
    from metaflow.plugins.cards.card_modules.card import MetaflowCard

    require(internals.card_base() is MetaflowCard, "card_modules.card.MetaflowCard",
            "every card type subclasses it")
    ours = [c for c in CARDS if c.type == "torch_distributed"]
    require(len(ours) == 1 and issubclass(ours[0], MetaflowCard), "metaflow.plugins.CARDS",
            "it lists the card types of extensions' plugins/cards packages (card_modules/"
            "__init__.py: _load_external_cards); got %r" % [c.type for c in CARDS])
    require(ours[0].ALLOW_USER_COMPONENTS is False, "MetaflowCard.ALLOW_USER_COMPONENTS",
            "a card type that takes no components is not editable, so current.card.append "
            "goes to the user's own card")


def _card_step_init(deco, step_name, decorators):
    deco.step_init(_FLOW, None, step_name, decorators, None, None, lambda *a, **k: None)


class _FLOW:
    @staticmethod
    def _get_parameters():
        return []


@pytest.mark.parametrize("users_card_first", [True, False])
def test_card_decorator_counts_the_cards_of_a_step_once(monkeypatch, users_card_first):
    """@card counts a step's cards in the first @card's step_init; add_card's card is counted
    whether the user's @card ran step_init before or after it."""
    from metaflow.plugins.cards.card_decorator import CardDecorator

    require(isinstance(getattr(CardDecorator, "total_decos_on_step", None), dict)
            and isinstance(getattr(CardDecorator, "_called_once", None), dict),
            "CardDecorator.total_decos_on_step/_called_once",
            "@card keeps a step's card count and its registered events on the class")
    monkeypatch.setattr(CardDecorator, "total_decos_on_step", {})
    monkeypatch.setattr(CardDecorator, "_called_once", {})
    users = CardDecorator(attributes={"type": "blank"})
    users.external_init()
    decorators = [users]
    if users_card_first:
        _card_step_init(users, "train", decorators)
    ours = internals.add_card("train", decorators, {"type": "torch_distributed",
                                                    "id": "torch_distributed"},
                              (_FLOW, None, None, None, lambda *a, **k: None))
    if not users_card_first:
        _card_step_init(users, "train", decorators)
    _card_step_init(ours, "train", decorators)  # Metaflow's own loop reaches it too
    require(decorators == [users, ours] and ours.attributes["id"] == "torch_distributed"
            and ours.attributes["timeout"] == 45, "CardDecorator(attributes=...)",
            "it fills the attributes not given from its defaults")
    require(CardDecorator.total_decos_on_step == {"train": 2},
            "CardDecorator._set_card_counts_per_step",
            "the step's count is set once, in the first @card's step_init; got %r"
            % CardDecorator.total_decos_on_step)


def test_the_metadata_type_of_this_process(monkeypatch):
    from metaflow.cli_args import cli_args
    from metaflow.metaflow_config import DEFAULT_METADATA

    monkeypatch.setattr(cli_args, "_top_kwargs", {"metadata": "service"})
    require(internals.metadata_type() == "service", "CLIArgs.top_kwargs['metadata']",
            "it holds the top-level --metadata option")
    monkeypatch.setattr(cli_args, "_top_kwargs", {})
    require(internals.metadata_type() == DEFAULT_METADATA, "metaflow_config.DEFAULT_METADATA",
            "it is the metadata provider without --metadata")


# -- AWS Batch and Step Functions ------------------------------------------------------------------

# What `batch step` gives Batch.launch_job for a task (batch_cli.step)
TASK_SPEC = {"flow_name": "GangFlow", "step_name": "train", "run_id": "5", "task_id": "7",
             "retry_count": "0"}


def _job_args(**changed):
    attrs = dict({"metaflow.%s" % k: v for k, v in TASK_SPEC.items()}, **{"metaflow.user": "me"})
    return dict(dict(step_name="train", step_cli="python flow.py step train", task_spec=TASK_SPEC,
                     code_package_metadata="{}", code_package_sha="sha",
                     code_package_url="s3://bucket/pkg", code_package_ds="s3",
                     image="python:3.11", queue="q", iam_role="arn:aws:iam::1:role/task",
                     cpu="1", gpu="0", memory="4096", attrs=attrs), **changed)


def _aws_batch(monkeypatch, api):
    """Metaflow's batch modules on the AWS Batch API `api`, submitted jobs starting at once."""
    from metaflow.plugins.aws.batch import batch as batch_module, batch_client as client_module

    monkeypatch.setattr(batch_module, "BatchClient", lambda: batch_client(api))
    monkeypatch.setattr(client_module, "RunningJob", SubmittedJob)
    return batch_module


def _batch(monkeypatch, api, flow_datastore=None):
    return _aws_batch(monkeypatch, api).Batch(Provider("local"), Environment(), flow_datastore)


def test_batch_create_job(monkeypatch):
    """`step-functions create` builds each step's job with Batch.create_job
    (StepFunctions._batch), on a Batch that keeps the flow's datastore: wrap_batch_create_job's
    build is given the gang step's, and its create(num_parallel=N) registers an N-node job
    definition."""
    from metaflow import FlowSpec, batch, step
    from metaflow.plugins.aws.batch.batch import Batch
    from metaflow.plugins.aws.step_functions import step_functions

    names = set(params_of(Batch.create_job))
    wanted = {"step_name", "step_cli", "task_spec", "code_package_metadata", "code_package_url",
              "queue", "env", "num_parallel", "offload_command_to_s3"}
    require(wanted <= names, "Batch.create_job", "it takes %s" % sorted(wanted - names))

    class SfnFlow(FlowSpec):
        @batch(queue="q", image="python:3.11")
        @step
        def start(self):
            self.next(self.train)

        @batch(queue="q", image="python:3.11")
        @step
        def train(self):
            self.next(self.end)

        @batch(queue="q", image="python:3.11")
        @step
        def end(self):
            pass

    api = BatchApi()
    _aws_batch(monkeypatch, api)
    monkeypatch.setattr(step_functions, "StepFunctionsClient", lambda: None)
    monkeypatch.setattr(step_functions, "SFN_IAM_ROLE", "arn:aws:iam::1:role/sfn")
    monkeypatch.setattr(Batch, "create_job", Batch.create_job)  # restored after the test
    monkeypatch.setattr(internals, "_BATCH_JOB_BUILDS", {})
    built = []

    def build(create, batch_obj, args):
        job = create(num_parallel=3)
        built.append((batch_obj, args, job))
        return job

    internals.wrap_batch_create_job("train", build)
    flow, datastore, environment = SfnFlow(use_cli=False), s3_datastore(), Environment()
    graph = flow._graph
    for node in graph:  # what the CLI does for `step-functions create` (step_init of each step)
        for deco in node.decorators:
            deco.external_init()
            deco.step_init(flow, graph, node.name, node.decorators, environment, datastore,
                           lambda *a, **k: None)
    step_functions.StepFunctions("sfnflow", graph, flow, "{}", "sha", "s3://bucket/pkg", "token",
                                 Provider("local"), datastore, environment,
                                 Provider("nullSidecarLogger"), Provider("nullSidecarMonitor"))
    require([args["step_name"] for _, args, _ in built] == ["train"], "StepFunctions._batch",
            "it builds each step's job with Batch.create_job (so wrap_batch_create_job's build "
            "is called for the gang step, once); it was called for %r"
            % [args["step_name"] for _, args, _ in built])
    batch_obj, args, job = built[0]
    require(args["queue"] == "q" and args["task_spec"]["step_name"] == "train",
            "StepFunctions._batch", "it gives create_job the step's queue and task_spec; got "
            "queue %r, task_spec %r" % (args["queue"], args["task_spec"]))
    require(internals.batch_orig_datastore(batch_obj) == "s3@s3://bucket/metaflow",
            "StepFunctions._batch", "its Batch keeps the flow datastore it compiles for "
            "(Batch.flow_datastore)")
    multinode = [d for d in api.definitions if d.get("type") == "multinode"]
    require([d["nodeProperties"]["numNodes"] for d in multinode] == [3]
            and internals.job_payload(job)["jobDefinition"].endswith(
                multinode[0]["jobDefinitionName"]) and len(api.definitions) == 3,
            "Batch.create_job(num_parallel=N)", "it registers an N-node (multinode) job "
            "definition for the job it builds, a one-node one without num_parallel; registered "
            "%r" % api.definitions)


def test_batch_create_job_is_wrapped_per_step(monkeypatch):
    from metaflow.plugins.aws.batch.batch import Batch

    def create_job(self, step_name, step_cli, task_spec, code_package_metadata,
                   code_package_sha, code_package_url, code_package_ds, image, queue,
                   num_parallel=0, **rest):
        return ("metaflow's", step_name, num_parallel)

    monkeypatch.setattr(Batch, "create_job", create_job)
    monkeypatch.setattr(internals, "_BATCH_JOB_BUILDS", {})  # this test's steps only
    internals.wrap_batch_create_job(
        "train", lambda create, batch, args: ("ours", create(num_parallel=3), args["queue"]))
    batch = object.__new__(Batch)
    common = dict(step_cli="", task_spec={}, code_package_metadata=None, code_package_sha="",
                  code_package_url="", code_package_ds="", image="i", queue="q")
    assert Batch.create_job(batch, "other", **common) == ("metaflow's", "other", 0)
    assert Batch.create_job(batch, "train", **common) == (
        "ours", ("metaflow's", "train", 3), "q")
    # a second gang step of the flow (step-functions create compiles every step in one
    # process): each step's job is built by its own build, the first's as before
    internals.wrap_batch_create_job(
        "finetune", lambda create, batch, args: ("ours too", create(num_parallel=2)))
    assert Batch.create_job(batch, "finetune", **common) == (
        "ours too", ("metaflow's", "finetune", 2))
    assert Batch.create_job(batch, "train", **common) == (
        "ours", ("metaflow's", "train", 3), "q")
    assert Batch.create_job(batch, "other", **common) == ("metaflow's", "other", 0)


def test_batch_launch_job_and_wait(monkeypatch):
    """show_child_nodes: Batch.launch_job submits the job create_job built and keeps it as
    self.job, its num_parallel argument as self.num_parallel (which show_child_nodes changes
    after it); Batch.wait prints the state of the child nodes when self.num_parallel > 1."""
    api = BatchApi()
    batch_module = _aws_batch(monkeypatch, api)
    Batch = batch_module.Batch
    require("step_name" in params_of(Batch.launch_job), "Batch.launch_job",
            "it takes step_name")
    monkeypatch.setattr(Batch, "launch_job", Batch.launch_job)  # restored after the test
    monkeypatch.setattr(internals, "_CHILD_NODES", {})
    batch = _batch(monkeypatch, api)
    batch.launch_job(**_job_args())
    require(len(api.submitted) == 1 and getattr(getattr(batch, "job", None), "id", None)
            == "job-1" and batch.num_parallel == 0, "Batch.launch_job",
            "it keeps the job it submitted as self.job, and its num_parallel argument as "
            "self.num_parallel")
    internals.show_child_nodes("train", 3)
    batch.launch_job(**_job_args())
    assert batch.job.id == "job-2" and batch.num_parallel == 3
    # its wait, for a job that starts at once, its logs not tailed
    monkeypatch.setattr(batch_module, "S3Tail", lambda location: None)
    monkeypatch.setattr(batch_module, "tail_logs", lambda *args, **kwargs: None)
    said = []
    batch.wait("s3://bucket/out", "s3://bucket/err",
               echo=lambda msg, stream="stderr", batch_id=None, **kw: said.append(msg))
    require(any(re.search(r"parallel node status: \[\w+:2\]", m) for m in said), "Batch.wait",
            "it prints the state of the job's self.num_parallel - 1 child nodes when "
            "self.num_parallel > 1; it printed %r" % said)


def test_batch_client_fargate_refusal(monkeypatch):
    """What create_gang_job tells apart: Batch.create_job of a multi-node job on a queue of a
    Fargate compute environment raises a BatchJobException naming Fargate."""
    from metaflow.plugins.aws.batch import batch_client

    try:
        _batch(monkeypatch, BatchApi(platform="FARGATE")).create_job(**_job_args(num_parallel=2))
        refusal = None
    except Exception as ex:  # noqa: BLE001 - what Metaflow raised is the point
        refusal = ex
    require(internals.is_fargate_refusal(refusal), "Batch.create_job",
            "a multi-node job (num_parallel > 1) on a Fargate queue is refused with a "
            "BatchJobException naming Fargate; got %s %s" % (type(refusal).__name__, refusal))
    _batch(monkeypatch, BatchApi(platform="EC2")).create_job(**_job_args(num_parallel=2))
    assert not internals.is_fargate_refusal(batch_client.BatchJobException("No IAM role"))
    # Metaflow's other Fargate error is not a refusal of multi-node jobs
    assert not internals.is_fargate_refusal(batch_client.BatchJobException(
        "No AWS Fargate task execution IAM role found. Please see https://docs.aws.amazon.com/"))


def test_batch_command(monkeypatch):
    """batch_command: Batch._command wraps a shell command in what every Batch job runs (the
    code package's download, log capture) as the container's argv."""
    from metaflow.plugins.aws.batch.batch import Batch

    names = params_of(Batch._command)
    require(names == ["self", "environment", "code_package_metadata", "code_package_url",
                      "step_name", "step_cmds", "task_spec", "offload_command_to_s3"],
            "Batch._command", "it takes (environment, code_package_metadata, "
            "code_package_url, step_name, step_cmds, task_spec, offload_command_to_s3); "
            "got %r" % names)
    command = internals.batch_command(_batch(monkeypatch, BatchApi()), _job_args(), "train",
                                      "echo agent", TASK_SPEC)
    require(command[:2] == ["bash", "-c"] and "echo agent" in command[-1]
            and "echo fetch s3://bucket/pkg" in command[-1], "Batch._command",
            "it returns bash -c <the code package's download && the command>; got %r"
            % command)


def test_batch_flow_datastore_and_environment(monkeypatch, tmp_path):
    datastore = internals.flow_datastore_at("GangFlow", "local@" + str(tmp_path))
    batch = _batch(monkeypatch, BatchApi(), datastore)
    for name, given in (("flow_datastore", datastore), ("environment", batch.environment)):
        require(getattr(batch, name, None) is given, "Batch.%s" % name,
                "a Batch object keeps the %s it was made with" % name)
    require(isinstance(batch.environment, Environment)
            and internals.batch_orig_datastore(batch) == "local@%s" % tmp_path,
            "Batch.flow_datastore", "a Batch object keeps the flow datastore it was made with")


def test_batch_job_payload_and_num_parallel(monkeypatch):
    """submit_as_built: BatchJob.execute submits the payload as it is once num_parallel is 0,
    where it would rewrite a multi-node job's (num_parallel >= 1) into node overrides."""
    api = BatchApi()
    batch = _batch(monkeypatch, api)
    job = batch.create_job(**_job_args(num_parallel=2))
    require(isinstance(internals.job_payload(job), dict), "BatchJob.payload",
            "it holds the SubmitJob payload as a dict tree")
    job.execute()
    require("nodeOverrides" in api.submitted[0] and "containerOverrides" not in api.submitted[0],
            "BatchJob.execute", "it rewrites a multi-node job's container overrides into node "
            "overrides (what submit_as_built prevents); it submitted %r" % api.submitted[0])
    job = batch.create_job(**_job_args(num_parallel=2))
    built = json.loads(json.dumps(internals.job_payload(job)))
    built["nodeOverrides"] = {"nodePropertyOverrides": [{"targetNodes": "0:", "containerOverrides":
                                                         {"command": ["gang"]}}]}
    internals.submit_as_built(job, built)
    job.execute()
    require(api.submitted[1] == built, "BatchJob.execute", "it submits the payload as it is "
            "when num_parallel is 0; it submitted %r" % api.submitted[1])


@pytest.mark.parametrize("trampoline", ["batch", "kubernetes"])
def test_batch_cli_step_context(monkeypatch, tmp_path, trampoline):
    """TrampolineCli, made where `batch step` (`kubernetes step`) launches the task, reads the
    options, entrypoint and top-level options batch_cli.step (kubernetes_cli.step) gives the
    task's command."""
    import importlib

    from metaflow import util
    from metaflow._vendor import click
    from metaflow.graph import FlowGraph

    module, launcher = {"batch": ("metaflow.plugins.aws.batch.batch_cli", "Batch"),
                        "kubernetes": ("metaflow.plugins.kubernetes.kubernetes_cli",
                                       "Kubernetes")}[trampoline]
    trampoline_cli = importlib.import_module(module)
    where = "%s.step" % module.rsplit(".", 1)[1]
    seen = {}

    class Launcher:
        """What the command launches the task with (Batch, Kubernetes): the command it is
        given, and TrampolineCli made in its launch_job."""

        def __init__(self, *args, **kwargs):
            pass

        def launch_job(self, *args, **kwargs):
            seen["step_cli"] = kwargs.get("step_cli") or args[1]
            try:
                seen["cli"] = internals.TrampolineCli(kwargs.get("step_name") or args[0])
            except Exception as ex:  # noqa: BLE001 - reported below
                seen["error"] = ex

        def wait(self, *args, **kwargs):
            pass

    group = getattr(trampoline_cli, trampoline)
    names = {p.name for p in group.commands["step"].params}
    wanted = {"run_id", "task_id", "split_index", "retry_count", "max_user_code_retries",
              "namespace", "executable", "input_paths"}
    require(wanted <= names, where, "its options include %s" % sorted(wanted - names))
    monkeypatch.setattr(trampoline_cli, launcher, Launcher)

    @click.group()
    @click.option("--quiet", is_flag=True)
    @click.option("--datastore")
    @click.option("--with", "decospecs", multiple=True)
    def start(quiet, datastore, decospecs):
        """Metaflow's top-level group (cli.py: start), as the step command reads it."""

    start.add_command(group, trampoline)
    datastore = internals.flow_datastore_at("ParallelFlow", "local@" + str(tmp_path))
    obj = types.SimpleNamespace(
        environment=Environment(), flow_datastore=datastore, graph=FlowGraph(ParallelFlow),
        flow=types.SimpleNamespace(name="ParallelFlow"), metadata=Provider("service"),
        monitor=Provider("nullSidecarMonitor"), echo_always=lambda *a, **k: None)
    start.main(["--quiet", "--datastore", "local", "--with", "retry", trampoline, "step", "train",
                "{}", "sha", "s3://bucket/pkg", "--executable", "/opt/python", "--run-id", "5",
                "--task-id", "7", "--input-paths", "5/start/1", "--split-index", "2",
                "--retry-count", "0", "--max-user-code-retries", "3", "--namespace", "user:me"],
               obj=obj, standalone_mode=False)
    require("error" not in seen, where, "the click context of its launch_job has "
            "what TrampolineCli reads (ctx.params, ctx.obj.environment, ctx.obj.flow_datastore, "
            "ctx.parent.parent.params); %r" % seen.get("error"))
    cli = seen["cli"]
    given = {"run_id": "5", "task_id": "7", "input_paths": "5/start/1", "split_index": "2",
             "retry_count": 0, "max_user_code_retries": 3, "namespace": "user:me",
             "executable": "/opt/python"}
    got = {name: cli.params.get(name) for name in given}
    require(got == given, where, "its options keep these names and values in its "
            "click context: %r; got %r" % (given, got))
    loader = "%s -u %s %s step train " % (cli.executable, cli.script, " ".join(cli.top_args))
    require(seen["step_cli"].startswith(loader), where,
            "its task's command starts with the step's executable, the flow's file and the "
            "top-level options, as TrampolineCli rebuilds them (%r); it is %r"
            % (loader, seen["step_cli"]))
    require(cli.orig_datastore == "local@%s" % tmp_path, where,
            "its click context's obj.flow_datastore is the run's")
    require(list(util.dict_to_cli_options({"quiet": True, "datastore": "s3"})) ==
            ["--quiet", "--datastore", "s3"], "util.dict_to_cli_options",
            "it turns the top-level options back into argv words")


def test_step_functions_state_batch(monkeypatch):
    from metaflow.plugins.aws.batch.batch_client import BatchJob
    from metaflow.plugins.aws.step_functions import step_functions
    from metaflow.util import to_pascalcase

    State = step_functions.State
    monkeypatch.setattr(step_functions, "SFN_IAM_ROLE", "arn:aws:iam::1:role/sfn")
    monkeypatch.setattr(State, "batch", State.batch)  # restored after the test
    require(params_of(State.batch) == ["self", "job"], "State.batch", "it takes the BatchJob")

    def job():
        built = BatchJob(client=None).job_name("j").job_queue("q").command(["x"]).attempts(1)
        built.payload["jobDefinition"] = "d"
        return built

    parameters = State("train").batch(job()).payload["Parameters"]
    require(parameters.get("ContainerOverrides") == {"Command": ["x"]}, "State.batch",
            "it writes the job's containerOverrides into the state's Parameters")
    internals.wrap_state_machine_job(lambda payload: {"nodePropertyOverrides": []})
    parameters = State("train").batch(job()).payload["Parameters"]
    assert "ContainerOverrides" not in parameters
    assert parameters["NodeOverrides"] == {"NodePropertyOverrides": []}
    require(to_pascalcase({"targetNodes": "0:0", "containerOverrides": {"command": ["x"]}})
            == {"TargetNodes": "0:0", "ContainerOverrides": {"Command": ["x"]}},
            "util.to_pascalcase", "it turns the payload's keys into the state's PascalCase")


# -- Argo Workflows ---------------------------------------------------------------------------------

def _argo():
    from metaflow.plugins.argo import argo_workflows

    return argo_workflows


def _compile_argo(monkeypatch, home, build=None):
    """`argo-workflows create` of a flow (start, train_big, end), in this process: the compiler
    made as the CLI makes it (argo_workflows_cli.make_flow), after step_init of each step's
    decorators (@kubernetes, and @environment as --with gives it), with
    wrap_argo_workflow(build) when `build` is given. Returns the compiler and what it was
    given. METAFLOW_HOME is `home` (ob-metaflow reads the Outerbounds platform's configuration
    there). Compiling needs the Kubernetes client library: its stand-in where it is not
    installed."""
    from metaflow import FlowSpec, kubernetes, step
    from metaflow.plugins.environment_decorator import EnvironmentDecorator

    ArgoWorkflows = _argo().ArgoWorkflows
    monkeypatch.setattr(ArgoWorkflows, "_compile_workflow_template",
                        ArgoWorkflows._compile_workflow_template)  # restored after the test
    monkeypatch.setenv("METAFLOW_HOME", home)
    if not kubernetes_installed():
        monkeypatch.setitem(sys.modules, "kubernetes", kubernetes_package(KubernetesSdk(),
                                                                          KubeConfig()))
    if build is not None:
        internals.wrap_argo_workflow(build)

    class ArgoFlow(FlowSpec):
        @kubernetes
        @step
        def start(self):
            self.next(self.train_big)

        @kubernetes
        @step
        def train_big(self):
            self.next(self.end)

        @kubernetes
        @step
        def end(self):
            pass

    flow = ArgoFlow(use_cli=False)
    graph = flow._graph
    for node in graph:  # the CLI adds @environment to every step, as --with does
        node.decorators.append(EnvironmentDecorator(attributes={"vars": {
            "GREETING": "hello world"} if node.name == "train_big" else {}},
            statically_defined=False))
    given = dict(flow=flow, graph=graph, flow_datastore=s3_datastore(),
                 metadata=Provider("local"), environment=Environment(),
                 event_logger=Provider("nullSidecarLogger"),
                 monitor=Provider("nullSidecarMonitor"), namespace="user:contract",
                 code_package_url="s3://bucket/pkg", code_package_metadata="{}",
                 auto_emit_argo_events=False)
    for node in graph:
        for deco in node.decorators:
            deco.external_init()
            deco.step_init(flow, graph, node.name, node.decorators, given["environment"],
                           given["flow_datastore"], lambda *a, **k: None)
    argo = ArgoWorkflows(
        "argoflow", graph, flow, given["code_package_metadata"], "sha",
        given["code_package_url"], "token", given["metadata"], given["flow_datastore"],
        given["environment"], given["event_logger"], given["monitor"],
        namespace=given["namespace"], username="me", max_workers=10,
        auto_emit_argo_events=given["auto_emit_argo_events"])
    return argo, given


@pytest.fixture(scope="module")
def argo_compiled(tmp_path_factory):
    """One _compile_argo whose build marks the template it is given, then printed as
    `argo-workflows create --only-json` prints it, and deployed (to a stand-in ArgoClient)."""
    built, deployed = [], []

    def build(argo, workflow):
        built.append(argo)
        workflow["torchDistributedContract"] = "built"

    class ArgoClient:
        def __init__(self, *args, **kwargs):
            pass

        def get_workflow_template(self, name):
            return None

        def register_workflow_template(self, name, body):
            deployed.append(json.loads(json.dumps(body)))

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(_argo(), "ArgoClient", ArgoClient)
        argo, given = _compile_argo(monkeypatch, outerbounds_home(tmp_path_factory.mktemp("argo")),
                                    build)
        printed = json.loads(str(argo))
        argo.deploy()
    return types.SimpleNamespace(argo=argo, given=given, built=built, printed=printed,
                                 deployed=deployed)


def _argo_container(workflow, step_name):
    return [t["container"] for t in workflow["spec"]["templates"]
            if t.get("name") == internals.argo_template_name(step_name) and "container" in t]


def test_argo_workflows_compile_workflow_template(argo_compiled):
    compiled = argo_compiled
    require(compiled.built == [compiled.argo], "ArgoWorkflows.__init__",
            "it compiles the WorkflowTemplate once, with _compile_workflow_template() (which "
            "wrap_argo_workflow wraps); it was compiled %d times" % len(compiled.built))
    require(compiled.printed.get("torchDistributedContract") == "built", "ArgoWorkflows.__str__",
            "it prints (--only-json) the payload of the template _compile_workflow_template "
            "returned, as the build changed it")
    require([d.get("torchDistributedContract") for d in compiled.deployed] == ["built"],
            "ArgoWorkflows.deploy", "it deploys the payload of that template")


def test_argo_workflows_sanitize(argo_compiled):
    names = [t.get("name") for t in argo_compiled.printed["spec"]["templates"]]
    require(internals.argo_template_name("train_big") == "train-big"
            and len(_argo_container(argo_compiled.printed, "train_big")) == 1,
            "ArgoWorkflows._sanitize", "a step's container template is named after the step, "
            "underscores as hyphens; the templates: %r" % names)


def test_argo_workflows_step_command_words(argo_compiled):
    """internals.argo_step_words rebuilds the step command's entrypoint and top-level options
    as _container_templates writes them in the step's container: through a pod command's
    quoting (argo_pod_command, as the node agent's go), they are the words before `step`."""
    entrypoint, top_level = internals.argo_step_words(argo_compiled.argo, "train_big")
    assert any("environment:vars=" in word for word in top_level)  # the --with decorator
    pod = internals.argo_pod_command(argo_compiled.argo, "train_big", "argo-w", "t-1", "0",
                                     [" ".join([*entrypoint, *top_level]) + " step train_big"])
    loader = pod[-1].split("echo bootstrap && ", 1)[1].split(" step train_big", 1)[0]
    [container] = _argo_container(argo_compiled.printed, "train_big")
    command = container["command"][-1]
    require(loader + " step train_big " in command, "ArgoWorkflows._container_templates",
            "the step's container runs <executable> <flow file> <--with of the step's "
            "decorators not in the flow's code> <flow decorators' options> --quiet "
            "--metadata= --environment= --datastore= --datastore-root= --event-logger= "
            "--monitor= --no-pylint --with=argo_workflows_internal:auto-emit-argo-events= "
            "step <step>, as argo_step_words rebuilds it (%r); its command: %r"
            % (loader, command))


def test_argo_workflows_attributes(argo_compiled):
    argo = argo_compiled.argo
    for name, value in argo_compiled.given.items():
        require(getattr(argo, name, None) == value, "ArgoWorkflows.%s" % name,
                "the compiler keeps the %s it was made with" % name)
    Kubernetes, _, _ = _kubernetes()
    require(params_of(Kubernetes.__init__) == ["self", "datastore", "metadata", "environment"],
            "Kubernetes.__init__", "it takes the datastore, metadata and environment")
    assert internals.argo_orig_datastore(argo) == "s3@s3://bucket/metaflow"
    assert internals.argo_namespace(argo) == "user:contract"
    command = internals.argo_pod_command(argo, "train_big", "argo-w", "t-1", "0", ["echo agent"])
    require(command[:2] == ["bash", "-c"] and "echo agent" in command[-1]
            and "echo fetch s3://bucket/pkg" in command[-1], "Kubernetes._command",
            "it returns bash -c <the code package's download && the step commands>; got %r"
            % command)
    # argo_pod_command calls Kubernetes._command with the arguments its signature names
    test_kubernetes_command_has_the_signature_we_call()


def test_argo_workflows_task_id_export(argo_compiled):
    """argo_with_task_id replaces the task id a step's container computes (export
    METAFLOW_TASK_ID=(t-<md5 of the step, the workflow's creation time and the input paths>)),
    exactly once, by another."""
    [container] = _argo_container(argo_compiled.printed, "train_big")
    try:
        replaced = internals.argo_with_task_id(container["command"][-1], "${GANG_TASK_ID}",
                                               "train_big")
    except TorchDistributedCompileError as ex:
        replaced = str(ex)
    require("export METAFLOW_TASK_ID=${GANG_TASK_ID} && " in replaced
            and "METAFLOW_TASK_ID=(t-" not in replaced, "ArgoWorkflows._container_templates",
            "a step's container computes its task id with export METAFLOW_TASK_ID=(t-$(echo "
            "<step>-{{workflow.creationTimestamp}}-... | md5sum | cut -d ' ' -f 1 | tail -c 9)); "
            "got %r" % replaced)
    command = ("mkdir -p $PWD/.logs && export INPUT_PATHS=x && export METAFLOW_TASK_ID="
               "(t-$(echo train-{{workflow.creationTimestamp}}-$(echo $INPUT_PATHS)- | md5sum | "
               "cut -d ' ' -f 1 | tail -c 9)) && export MF_PATHSPEC=F/r/train/$METAFLOW_TASK_ID")
    assert internals.argo_with_task_id(command, "${ID}", "train") == (
        "mkdir -p $PWD/.logs && export INPUT_PATHS=x && export METAFLOW_TASK_ID=${ID} && "
        "export MF_PATHSPEC=F/r/train/$METAFLOW_TASK_ID")
    with pytest.raises(TorchDistributedCompileError, match=r"step \*train\*: .* exports its task id 0 "
                       "times, not once"):
        internals.argo_with_task_id("export METAFLOW_TASK_ID=t-1", "${ID}", "train")


# -- the installed release -----------------------------------------------------------------------

def test_metaflow_version_get_version():
    from metaflow.metaflow_version import get_version

    require(callable(get_version) and VERSION, "metaflow_version.get_version",
            "it names the installed release")
    require(parse_version(get_version()) == parse_version(VERSION),
            "metaflow_version.get_version", "on a node without package metadata it names the "
            "release the metadata names here; got %r, metadata %r" % (get_version(), VERSION))


def test_metaflow_distributions_name_what_installed_the_module():
    """The suite's venv has metaflow, CI's other venvs metaflow 2.19.0 and ob-metaflow: each
    has exactly one distribution whose files are the imported `metaflow` package."""
    installed = internals.metaflow_distributions()
    require(len(installed) == 1 and installed[0][0] in internals.METAFLOW_DISTRIBUTIONS,
            "its distribution", "one of %s installed the imported metaflow package; got %r"
            % (internals.METAFLOW_DISTRIBUTIONS, installed))
    require(installed[0][1] == VERSION, "its distribution", "its version is the release's")


def _kubernetes():
    from metaflow.plugins.kubernetes.kubernetes import Kubernetes
    from metaflow.plugins.kubernetes.kubernetes_jobsets import JobSetSpec, KubernetesJobSet

    return Kubernetes, JobSetSpec, KubernetesJobSet


# -- Kubernetes ------------------------------------------------------------------------------------

def test_kubernetes_launch_job_builds_a_jobset_when_num_parallel_is_given():
    """internals.wrap_kubernetes_jobset passes num_parallel to Kubernetes.launch_job, which must
    then create (and execute) a JobSet through Kubernetes.create_jobset."""
    Kubernetes, _, _ = _kubernetes()
    seen = {}

    class Probe(Kubernetes):
        def create_jobset(self, **kwargs):
            seen.update(kwargs)
            return types.SimpleNamespace(execute=lambda: "running")

    kube = Probe(None, None, None)
    kube.launch_job(step_name="train", num_parallel=2)
    assert seen == {"step_name": "train", "num_parallel": 2}, (
        "Metaflow's Kubernetes.launch_job no longer routes num_parallel to create_jobset")


def test_kubernetes_create_jobset_takes_what_we_read():
    Kubernetes, _, _ = _kubernetes()
    params = inspect.signature(Kubernetes.create_jobset).parameters
    for name in ("flow_name", "run_id", "step_name", "task_id", "attempt",
                 "code_package_metadata", "code_package_url", "step_cli", "env",
                 "num_parallel", "labels"):
        assert name in params, "Kubernetes.create_jobset lost its %r parameter" % name


def test_kubernetes_command_has_the_signature_we_call():
    Kubernetes, _, _ = _kubernetes()
    params = list(inspect.signature(Kubernetes._command).parameters)
    assert params == ["self", "flow_name", "run_id", "step_name", "task_id", "attempt",
                      "code_package_metadata", "code_package_url", "step_cmds"], (
        "Metaflow's Kubernetes._command changed: %s" % params)


def test_the_jobset_exposes_control_and_worker_specs():
    _, JobSetSpec, KubernetesJobSet = _kubernetes()
    assert isinstance(KubernetesJobSet.worker, property)
    assert isinstance(KubernetesJobSet.control, property)
    spec = JobSetSpec(None, "worker")
    assert spec.command(["bash", "-c", "x"]) is spec
    spec.environment_variable("A", "1")
    assert spec._kwargs["command"] == ["bash", "-c", "x"]
    assert spec._kwargs["environment_variables"] == {"A": "1"}


# What `kubernetes step` gives Kubernetes.create_jobset (kubernetes_cli.step), for 3 pods
JOBSET_ARGS = dict(
    flow_name="GangFlow", run_id="5", step_name="train", task_id="7", attempt="0", user="me",
    code_package_metadata="{}", code_package_sha="sha", code_package_url="s3://bucket/pkg",
    code_package_ds="s3", step_cli="python flow.py step train --run-id 5 --task-id 7",
    docker_image="python:3.11", docker_image_pull_policy=None, image_pull_secrets=None,
    service_account=None, secrets=None, node_selector=None, namespace="default", cpu="1",
    gpu=None, gpu_vendor="nvidia", disk="10240", memory="4096", use_tmpfs=False,
    tmpfs_tempdir=False, tmpfs_size=None, tmpfs_path=None, run_time_limit=3600, env={},
    persistent_volume_claims=None, tolerations=None, labels=None, annotations=None,
    shared_memory=None, port=3339, num_parallel=3, qos="burstable", extended_resources=None,
    security_context=None)


def _jobset_of(monkeypatch, home):
    """Kubernetes.create_jobset's JobSet of a task of JOBSET_ARGS (unsubmitted), made through
    Metaflow's KubernetesClient on the Kubernetes client library (its stand-in where it is not
    installed) whose API server keeps what is submitted; and that library. METAFLOW_HOME is
    `home` (see outerbounds_home)."""
    from metaflow.plugins.kubernetes import kubernetes as kubernetes_module
    from metaflow.plugins.kubernetes.kubernetes_client import KubernetesClient

    sdk = SubmittingSdk(kubernetes_sdk())

    class Client(KubernetesClient):
        """Metaflow's KubernetesClient on `sdk`, with no cluster's configuration to load."""

        def __init__(self):
            self._client, self._client_refresh_timestamp, self._namespace = \
                sdk, time.time(), "default"

    monkeypatch.setattr(kubernetes_module, "KubernetesClient", Client)
    monkeypatch.setenv("METAFLOW_HOME", home)
    kube = kubernetes_module.Kubernetes(s3_datastore(), Provider("local"), Environment())
    accepted = params_of(kubernetes_module.Kubernetes.create_jobset)
    return kube.create_jobset(**{k: v for k, v in JOBSET_ARGS.items() if k in accepted}), sdk


def test_the_jobsets_control_command_and_its_pods_stop_grace(monkeypatch, tmp_path):
    """jobset_control_command reads the command Metaflow gave the control pod, jobset_pods
    gives the pods of the JobSet's replicated jobs theirs (KubernetesJobSet.control, .worker),
    jobset_stop_grace changes what KubernetesJobSet.execute submits (JobSetSpec.dump writes
    the pods' terminationGracePeriodSeconds, 0, with no setter)."""
    from metaflow.plugins.kubernetes.kubernetes_jobsets import KubernetesJobsetException

    jobset, sdk = _jobset_of(monkeypatch, outerbounds_home(tmp_path))
    control_command = internals.jobset_control_command(jobset)
    internals.jobset_pods(jobset, ["bash", "-c", "agent"], {"AGENT": "1"}, {"NODE_ZERO": "1"})
    internals.jobset_stop_grace(jobset, 40)
    with pytest.raises(KubernetesJobsetException):  # what the stand-in API server answers
        jobset.execute()
    require(len(sdk.submitted) == 1, "KubernetesJobSet.execute",
            "it submits the JobSet (CustomObjectsApi.create_namespaced_custom_object)")
    pods = {job["replicas"]: job["template"]["spec"]["template"]["spec"]
            for job in sdk.submitted[0]["spec"]["replicatedJobs"]}
    require(sorted(pods) == [1, 2], "KubernetesJobSet.dump", "its replicated jobs are the "
            "control pod (1 replica) and the workers (num_parallel - 1); got replicas %r"
            % sorted(pods))
    control, worker = pods[1]["containers"][0], pods[2]["containers"][0]
    require(control["command"] == control_command and "step train" in control_command[-1],
            "JobSetSpec.dump", "the control pod runs the command its command() setter stored, "
            "the task's own (which jobset_control_command reads); it runs %r, the setter's %r"
            % (control["command"], control_command))
    require(worker["command"] == ["bash", "-c", "agent"]
            and {"name": "AGENT", "value": "1"} in worker["env"]
            and {"name": "NODE_ZERO", "value": "1"} in control["env"]
            and {"name": "AGENT", "value": "1"} not in control["env"],
            "KubernetesJobSet.worker and .control", "each is the JobSetSpec of its replicated "
            "job's pods, whose command and environment it sets")
    graces = [pods[1].get("terminationGracePeriodSeconds"),
              pods[2].get("terminationGracePeriodSeconds")]
    require(graces == [40, 40], "JobSetSpec.dump and KubernetesJobSet.execute", "dump() writes "
            "the pods' stop grace at template.spec.template.spec.terminationGracePeriodSeconds "
            "of each replicated job, and execute submits what the JobSet's dump() returns; the "
            "pods' were %r" % graces)


# -- the preflight command -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def metaflow_cli(tmp_path_factory):
    """Metaflow's CLI (cli.main), in this process, on a two-step flow:
    `--datastore=local --datastore-root=<dir> --with retry torch-distributed --help`. Its exit
    code, what it printed, the datastore's root, and the click context object of each
    step_init Metaflow ran (of the @retry that --with gave each step)."""
    from metaflow import FlowSpec, cli, current, step
    from metaflow._vendor import click
    from metaflow.plugins.retry_decorator import RetryDecorator

    class CliFlow(FlowSpec):
        @step
        def start(self):
            self.next(self.end)

        @step
        def end(self):
            pass

    inits, root, printed = [], str(tmp_path_factory.mktemp("cli")), io.StringIO()
    step_init = RetryDecorator.step_init

    def recorded_step_init(self, *args, **kwargs):
        inits.append(click.get_current_context().obj)
        return step_init(self, *args, **kwargs)

    saved = dict(vars(current))  # cli.start sets the flow's name and graph on `current`
    with pytest.MonkeyPatch.context() as monkeypatch, contextlib.redirect_stdout(printed):
        monkeypatch.setattr(RetryDecorator, "step_init", recorded_step_init)
        without_class_attribute(monkeypatch, type(current), "graph")
        try:
            code = cli.main(CliFlow(use_cli=False), handle_exceptions=False, args=[
                "--no-pylint", "--quiet", "--datastore=local", "--datastore-root=" + root,
                "--with", "retry", "torch-distributed", "--help"])
        finally:
            vars(current).clear()
            vars(current).update(saved)
    return types.SimpleNamespace(code=code, printed=printed.getvalue(), root=root, inits=inits)


def test_plugin_cli_groups_of_the_vendored_click(metaflow_cli):
    """Metaflow's CLI lazily loads an extension's CLIS_DESC group, built with its vendored
    click (cli_click), as one of its commands: ours is listed under its name."""
    from metaflow import plugins

    require("torch-distributed" in plugins.get_plugin_cli_path(), "plugins.get_plugin_cli_path",
            "it lists the CLIS_DESC of extensions by name")
    require(metaflow_cli.code == 0 and "preflight" in metaflow_cli.printed,
            "cli_components.utils.LazyPluginCommandCollection", "Metaflow's CLI runs the group "
            "of an extension's CLIS_DESC built with %s (`torch-distributed --help` lists "
            "preflight); exit %r, printed %r" % (internals.cli_click().__name__,
                                                   metaflow_cli.code, metaflow_cli.printed))


def test_cli_object_graph_and_datastore(metaflow_cli):
    """cli.py's start keeps the graph and the flow datastore on the click context's object,
    and runs step_init of the step decorators (--with included) for every command but run,
    resume and spin, before the command: what preflight reads (cli_flow_steps)."""
    inits = metaflow_cli.inits
    require(len(inits) == 2 and inits[0] is inits[1], "cli.start",
            "it runs step_init of each step's decorators (--with included) for a command of an "
            "extension's group, with the CLI's context object; it ran %d" % len(inits))
    steps, kind, root = internals.cli_flow_steps(inits[0])
    require({name for name, _ in steps} == {"start", "end"}
            and all([d.name for d in decos] == ["retry"] for _, decos in steps),
            "cli.start (ctx.obj.graph)", "iterating the graph on the context object gives its "
            "steps, each with its name and its decorators; got %r"
            % [(name, [d.name for d in decos]) for name, decos in steps])
    require((kind, root) == ("local", metaflow_cli.root), "cli.start (ctx.obj.flow_datastore)",
            "the context object keeps the flow datastore of --datastore and --datastore-root; "
            "got %r" % ((kind, root),))


def test_get_aws_client(monkeypatch):
    """aws_client: get_aws_client makes the client of a service with the provider
    METAFLOW_DEFAULT_AWS_CLIENT_PROVIDER names, given client_params (region_name)."""
    from metaflow import metaflow_config, plugins
    from metaflow.plugins.aws import aws_client

    require(params_of(aws_client.get_aws_client)[0] == "module" and "client_params" in
            params_of(aws_client.get_aws_client), "aws_client.get_aws_client",
            "it takes the service's name first, and client_params (region_name)")
    asked = []

    class AwsClientProvider:
        name = "torch-distributed-contract"

        @staticmethod
        def get_client(module, with_error=False, role_arn=None, session_vars=None,
                       client_params=None):
            asked.append((module, client_params))
            return "the provider's client"

    monkeypatch.setattr(aws_client, "cached_provider_class", None)  # as in a new process
    monkeypatch.setattr(metaflow_config, "DEFAULT_AWS_CLIENT_PROVIDER", AwsClientProvider.name)
    monkeypatch.setattr(plugins, "AWS_CLIENT_PROVIDERS",
                        [*plugins.AWS_CLIENT_PROVIDERS, AwsClientProvider])
    client = internals.aws_client("batch", "eu-west-1")
    require(client == "the provider's client" and asked == [("batch", {"region_name":
                                                                      "eu-west-1"})],
            "aws_client.get_aws_client", "it makes the client with the provider (of "
            "plugins.AWS_CLIENT_PROVIDERS) that metaflow_config.DEFAULT_AWS_CLIENT_PROVIDER "
            "names, given the service and client_params; the provider was asked %r" % asked)


def test_kubernetes_client_get(monkeypatch):
    """kubernetes_client: KubernetesClient() loads the configuration as Metaflow's own
    Kubernetes calls do (KUBECONFIG, else in a pod its service account, else ~/.kube/config)
    and get() returns the `kubernetes.client` it configured. The library is stood in, its
    loaders recording which Metaflow called."""
    from metaflow.plugins.kubernetes.kubernetes_client import KubernetesClient

    require(params_of(KubernetesClient.__init__) == ["self"], "KubernetesClient.__init__",
            "it takes no argument")
    client = types.ModuleType("kubernetes.client")
    for environ, loader in (({"KUBECONFIG": "/etc/kubeconfig"}, "kube_config"),
                            ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "incluster_config"),
                            ({}, "kube_config")):
        config = KubeConfig()
        monkeypatch.setitem(sys.modules, "kubernetes", kubernetes_package(client, config))
        for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
            monkeypatch.delenv(name, raising=False)
        for name, value in environ.items():
            monkeypatch.setenv(name, value)
        got = internals.kubernetes_client()
        require(got is client and config.loaded == [loader], "KubernetesClient",
                "with %s set it loads the configuration with kubernetes.config.load_%s, and "
                "get() returns kubernetes.client; it loaded %r" % (
                    " ".join(environ) or "neither KUBECONFIG nor KUBERNETES_SERVICE_HOST",
                    loader, config.loaded))


def test_where_ob_metaflow_differs_kubernetes_and_argo_need_the_outerbounds_platform(
        monkeypatch, tmp_path):
    """Where ob-metaflow (2.19.39.1) differs from metaflow (2.19.39) in what internals.py
    reaches: its Kubernetes.create_jobset and ArgoWorkflows.__init__ stop unless the Metaflow
    configuration has OBP_PERIMETER and OBP_INTEGRATIONS_URL (written by `outerbounds
    configure`), so with ob-metaflow `--with kubernetes` and `argo-workflows create` run on an
    Outerbounds deployment only, and CI's Kubernetes and Argo emulations run against metaflow.
    Its JobSets also name their replicated jobs `c` and `w` (metaflow: `control`, `worker`);
    we reach them through KubernetesJobSet.control and .worker only (jobset_pods), never by
    name (test_the_jobsets_control_command_and_its_pods_stop_grace tells them apart by their
    replicas). The rest of what we rely on is the same (this file passes against both)."""
    ob = internals.metaflow_distributions()[0][0] == "ob-metaflow"
    home = outerbounds_home(tmp_path, platform=False)
    for where, make in (("Kubernetes.create_jobset", lambda: _jobset_of(monkeypatch, home)),
                        ("ArgoWorkflows.__init__", lambda: _compile_argo(monkeypatch, home))):
        try:
            make()
            refusal = None
        except Exception as ex:  # noqa: BLE001 - what it raised is the point
            refusal = ex
        if ob:
            require("OBP_PERIMETER" in str(refusal), where, "in ob-metaflow it stops without "
                    "the Outerbounds platform's configuration; got %r" % (refusal,))
        else:
            require(refusal is None, where, "in metaflow it needs no Outerbounds platform's "
                    "configuration; got %s %s" % (type(refusal).__name__, refusal))


def test_metaflow_config_sources(monkeypatch):
    """metaflow_setting: from_conf reads a setting from the environment, else from the config
    files it keeps in metaflow_config_funcs.METAFLOW_LOCAL_CONFIG and METAFLOW_CONFIG."""
    from metaflow import metaflow_config, metaflow_config_funcs

    for name in ("METAFLOW_CONFIG", "METAFLOW_LOCAL_CONFIG"):
        require(hasattr(metaflow_config_funcs, name), "metaflow_config_funcs.%s" % name,
                "the config file from_conf read, as a dict")
    require(hasattr(metaflow_config, "BATCH_JOB_QUEUE"), "metaflow_config.BATCH_JOB_QUEUE",
            "the job queue setting")
    monkeypatch.setattr(metaflow_config_funcs, "METAFLOW_CONFIG",
                        {"METAFLOW_BATCH_JOB_QUEUE": "from-file"})
    monkeypatch.setattr(metaflow_config_funcs, "METAFLOW_LOCAL_CONFIG", {})
    monkeypatch.delenv("METAFLOW_BATCH_JOB_QUEUE", raising=False)
    require(metaflow_config_funcs.from_conf("BATCH_JOB_QUEUE") == "from-file",
            "metaflow_config_funcs.from_conf", "it reads METAFLOW_CONFIG when the environment "
            "has no value")
    assert internals.metaflow_setting("BATCH_JOB_QUEUE")[1].startswith("Metaflow's config ")
    monkeypatch.setenv("METAFLOW_BATCH_JOB_QUEUE", "from-env")
    require(metaflow_config_funcs.from_conf("BATCH_JOB_QUEUE") == "from-env",
            "metaflow_config_funcs.from_conf", "the environment comes first")
    assert internals.metaflow_setting("BATCH_JOB_QUEUE")[1] == \
        "the environment variable METAFLOW_BATCH_JOB_QUEUE"


def test_step_decorator_user_defined_attributes():
    """user_attributes: a step decorator keeps the attributes it was given, apart from its
    defaults, in _user_defined_attributes."""
    from metaflow.plugins.aws.batch.batch_decorator import BatchDecorator

    deco = BatchDecorator(attributes={"queue": "q"}, statically_defined=True)
    require(internals.user_attributes(deco) == {"queue"},
            "StepDecorator._user_defined_attributes", "the names of the attributes given, "
            "not the defaults (got %r)" % internals.user_attributes(deco))


def test_batch_step_init_and_the_s3_root_refusals_the_preflight_lets_through(monkeypatch):
    """preflight_without_s3: @batch's step_init refuses a datastore whose TYPE is not s3, and
    the S3 storage's root comes from get_datastore_root_from_config (None when unset), which
    cli.py's start refuses; the preflight's wrappers let both through and note them."""
    from metaflow.plugins.aws.batch.batch_decorator import BatchDecorator, BatchException
    from metaflow.plugins.datastores import s3_storage
    from metaflow.plugins.datastores.s3_storage import S3Storage

    monkeypatch.setattr(BatchDecorator, "step_init", BatchDecorator.step_init)
    monkeypatch.setattr(S3Storage, "get_datastore_root_from_config",
                        S3Storage.__dict__["get_datastore_root_from_config"])
    monkeypatch.setattr(s3_storage, "DATASTORE_SYSROOT_S3", None)
    local = types.SimpleNamespace(TYPE="local")
    deco = BatchDecorator(attributes={}, statically_defined=True)
    with pytest.raises(BatchException, match="requires --datastore=s3"):
        deco.step_init(None, None, "train", [deco], None, local, None)
    require(S3Storage.get_datastore_root_from_config(print) is None,
            "S3Storage.get_datastore_root_from_config", "None without DATASTORE_SYSROOT_S3")
    noted = []
    internals.preflight_without_s3(noted.append)
    deco.step_init(None, None, "train", [deco], None, local, None)
    require(deco.flow_datastore.TYPE == "s3", "BatchDecorator.step_init",
            "it keeps the datastore it was given as flow_datastore")
    assert S3Storage.get_datastore_root_from_config(print) == ""
    assert noted == ["datastore local", "no S3 root"]


def test_runtime_cli_args_top_level_words():
    """The runtime's CLIArgs writes the entrypoint, the top-level options, then the command
    (`step train --run-id ...`): @torch_slurm's node agents take the top-level words alone."""
    from metaflow.runtime import CLIArgs

    args = object.__new__(CLIArgs)  # its __init__ needs a whole runtime task
    args.entrypoint = ["/py", "flow.py"]
    args.top_level_options = {"quiet": True, "metadata": "local", "pylint": False,
                              "with": ["torch_slurm", "retry:times=2"]}
    args.commands, args.command_args = ["step"], ["train"]
    args.command_options = {"run-id": "5", "split-index": None}
    words = internals.runtime_top_level_words(args)
    assert words == ["--quiet", "--metadata", "local", "--with", "torch_slurm", "--with",
                     "retry:times=2"]
    assert args.get_args() == ["/py", "flow.py", *words, "step", "train", "--run-id", "5"]


def test_every_internal_has_a_contract_test():
    """A function added to internals.py comes with its test here (named in CONTRACTS)."""
    functions = {name for name, f in vars(internals).items()
                 if inspect.isfunction(f) and f.__module__ == internals.__name__
                 and not name.startswith("_")} | {"TrampolineCli"}
    tests = {name for name in globals() if name.startswith("test_")}
    missing = {f for f in functions if CONTRACTS.get(f) not in tests}
    assert not missing, "internals.py functions without a contract test: %s" % sorted(missing)
    for name in functions:
        assert "Why:" in (getattr(internals, name).__doc__ or ""), \
            "internals.%s does not say why we need it (\"Why: ...\")" % name


# internals.py function -> its contract test
CONTRACTS = {
    "register_task_metadata": "test_task_metadata_is_registered_as_metaflows_decorators_do",
    "reload_task_checkpoint": "test_checkpoints_current_checkpointer_loads_the_latest_again",
    "number_saves_from": "test_checkpoints_a_writer_numbers_its_saves_from_the_version_we_set",
    "set_current": "test_current_update_env",
    "install_current_parallel": "test_metaflow_current_parallel",
    "num_parallel_parents": "test_graph_node_parallel_foreach_and_num_parallel",
    "check_graph_before_parallel_lint": "test_graph_checks_run_ours_before_parallel_lint",
    "is_ubf_control": "test_unbounded_foreach_ubf_control",
    "step_kwargs": "test_cli_args_step_kwargs",
    "top_level_args": "test_cli_args_options",
    "runtime_top_level_words": "test_runtime_cli_args_top_level_words",
    "command_params": "test_click_current_context_params",
    "command_words": "test_root_context_saved_args",
    "deployer_commands": "test_plugins_deployer_impl_providers",
    "spin_allowed_decorators": "test_metaflow_config_spin_allowed_decorators",
    "quiet_spin_skips": "test_spin_step_skips_a_decorator_quietly_once_told",
    "orig_datastore": "test_flow_datastore_type_and_root",
    "attempt_datastore": "test_flow_datastore_get_task_datastore",
    "flow_datastore_at": "test_an_attempt_file_round_trips_through_a_real_datastore",
    "save_attempt_file": "test_an_attempt_file_round_trips_through_a_real_datastore",
    "load_attempt_file": "test_an_attempt_file_round_trips_through_a_real_datastore",
    "artifact_names": "test_task_datastore_persist_walks_the_flow",
    "drop_artifacts": "test_task_datastore_persist_walks_the_flow",
    "flow_attributes": "test_flowspec_next_sets_only_the_next_state",
    "persist_artifacts": "test_artifacts_persisted_by_one_process_are_adopted_by_the_tasks_own_save",
    "task_output_datastore":
        "test_artifacts_persisted_by_one_process_are_adopted_by_the_tasks_own_save",
    "is_artifact": "test_is_artifact_follows_the_persist_rule",
    "adopt_artifacts": "test_artifacts_persisted_by_one_process_are_adopted_by_the_tasks_own_save",
    "card_state": "test_card_components_reach_another_collector_rendered",
    "restore_card_state": "test_card_components_reach_another_collector_rendered",
    "card_keys": "test_card_components_reach_another_collector_rendered",
    "render_failed_card": "test_card_decorator_private_attributes",
    "finish_card_in_task": "test_a_card_drawn_by_the_task_is_the_one_card_create_saves",
    "card_page": "test_a_card_drawn_by_the_task_is_the_one_card_create_saves",
    "save_card": "test_a_card_drawn_by_the_task_is_the_one_card_create_saves",
    "save_card_data": "test_a_card_drawn_by_the_task_is_the_one_card_create_saves",
    "card_base": "test_card_types_of_extensions_and_their_base",
    "add_card": "test_card_decorator_counts_the_cards_of_a_step_once",
    "metadata_type": "test_the_metadata_type_of_this_process",
    "wrap_batch_create_job": "test_batch_create_job_is_wrapped_per_step",
    "show_child_nodes": "test_batch_launch_job_and_wait",
    "is_fargate_refusal": "test_batch_client_fargate_refusal",
    "batch_command": "test_batch_command",
    "batch_orig_datastore": "test_batch_flow_datastore_and_environment",
    "job_payload": "test_batch_job_payload_and_num_parallel",
    "submit_as_built": "test_batch_job_payload_and_num_parallel",
    "TrampolineCli": "test_batch_cli_step_context",
    "wrap_state_machine_job": "test_step_functions_state_batch",
    "wrap_kubernetes_jobset": "test_kubernetes_launch_job_builds_a_jobset_when_num_parallel_is_given",
    "kubernetes_command": "test_kubernetes_command_has_the_signature_we_call",
    "jobset_pods": "test_the_jobset_exposes_control_and_worker_specs",
    "jobset_control_command": "test_the_jobsets_control_command_and_its_pods_stop_grace",
    "jobset_stop_grace": "test_the_jobsets_control_command_and_its_pods_stop_grace",
    "after_jobset_created": "test_the_jobset_created_is_named_by_its_name_and_namespace",
    "metaflow_version": "test_metaflow_version_get_version",
    "cli_click": "test_plugin_cli_groups_of_the_vendored_click",
    "cli_flow_steps": "test_cli_object_graph_and_datastore",
    "aws_client": "test_get_aws_client",
    "metaflow_setting": "test_metaflow_config_sources",
    "user_attributes": "test_step_decorator_user_defined_attributes",
    "preflight_without_s3":
        "test_batch_step_init_and_the_s3_root_refusals_the_preflight_lets_through",
    "kubernetes_client": "test_kubernetes_client_get",
    "metaflow_distributions": "test_metaflow_distributions_name_what_installed_the_module",
    "wrap_argo_workflow": "test_argo_workflows_compile_workflow_template",
    "argo_template_name": "test_argo_workflows_sanitize",
    "argo_step_words": "test_argo_workflows_step_command_words",
    "argo_orig_datastore": "test_argo_workflows_attributes",
    "argo_namespace": "test_argo_workflows_attributes",
    "argo_pod_command": "test_argo_workflows_attributes",
    "argo_with_task_id": "test_argo_workflows_task_id_export",
}


@pytest.fixture(autouse=True)
def _no_stray_environment(monkeypatch):
    """The probes above must not depend on a user's METAFLOW_* settings."""
    for name in list(os.environ):
        if name.startswith("METAFLOW_SPIN"):
            monkeypatch.delenv(name)


def test_the_jobset_created_is_named_by_its_name_and_namespace(monkeypatch, tmp_path):
    """after_jobset_created reads KubernetesJobSet.name and ._namespace, which must be the
    JobSet's as execute submits it (its dump's metadata), and calls back only once execute
    created it."""
    from metaflow.plugins.kubernetes.kubernetes_jobsets import KubernetesJobsetException

    jobset, sdk = _jobset_of(monkeypatch, outerbounds_home(tmp_path))
    called = []
    internals.after_jobset_created(jobset, lambda *named: called.append(named))
    with pytest.raises(KubernetesJobsetException):  # what the stand-in API server answers
        jobset.execute()
    require(called == [], "KubernetesJobSet.execute", "it raises when the API refuses the "
            "JobSet, so nothing is called back")
    submitted = (sdk.submitted[0]["metadata"]["name"], JOBSET_ARGS["namespace"])
    require((jobset.name, jobset._namespace) == submitted,
            "KubernetesJobSet.name and ._namespace", "they are the name of the JobSet execute "
            "submits and the namespace create_jobset was given; got %r, expected %r"
            % ((jobset.name, jobset._namespace), submitted))
