"""The contract with Metaflow: one test per Metaflow internal that internals.py reaches.

Each test checks what internals.py relies on (a signature, an attribute, a constant, what a
command accepts, what Metaflow's own code does with a value we set) against the installed
Metaflow, and fails with "Metaflow X.Y.Z changed <symbol>: <what we rely on>". CI runs this file
against the newest metaflow of the supported range (the suite's venv), the oldest, and the
newest ob-metaflow, Outerbounds' distribution of the same module (.ci/packages), so it needs only
metaflow, pytest and psutil (tests/conftest.py): no torch, no AWS. Where ob-metaflow differs in
what we rely on, a test below says so (test_where_ob_metaflow_differs_...).
"""

import copy
import glob
import inspect
import json
import os
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
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.versions import \
    TESTED_METAFLOW, metaflow_version_supported

VERSION = internals.metaflow_version()


def require(ok, symbol, relied_on):
    assert ok, "Metaflow %s changed %s: %s" % (VERSION, symbol, relied_on)


def params_of(function):
    return list(inspect.signature(function).parameters)


def source_of(obj):
    return inspect.getsource(obj)


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


def test_metaflow_current_parallel():
    from metaflow import current
    from metaflow.metaflow_current import Parallel
    from metaflow.plugins.aws.batch import batch_decorator

    require(Parallel._fields == ("main_ip", "num_nodes", "node_index", "control_task_id"),
            "metaflow_current.Parallel", "its fields are main_ip, num_nodes, node_index, "
            "control_task_id")
    require("current.parallel" in source_of(batch_decorator.BatchDecorator.task_pre_step),
            "BatchDecorator.task_pre_step", "it reads current.parallel (which we install)")
    had = "parallel" in vars(type(current))
    internals.install_current_parallel({"MF_PARALLEL_NUM_NODES": "3",
                                        "MF_PARALLEL_NODE_INDEX": "2"})
    try:
        require((current.parallel.num_nodes, current.parallel.node_index) == (3, 2),
                "current.parallel", "a property on current's class is read as current.parallel")
    finally:
        if not had:
            delattr(type(current), "parallel")


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


def test_plugins_deployer_impl_providers():
    commands = internals.deployer_commands()
    require({"step-functions", "argo-workflows"} <= set(commands),
            "plugins.DEPLOYER_IMPL_PROVIDERS", "its providers' TYPE are the deploy commands; "
            "got %r" % commands)


def test_metaflow_config_spin_allowed_decorators():
    from metaflow import metaflow_config

    require(isinstance(internals.spin_allowed_decorators(), list),
            "metaflow_config.SPIN_ALLOWED_DECORATORS", "it is a list of decorator names")
    source = source_of(metaflow_config)
    for name in ("SPIN_ALLOWED_DECORATORS", "DATASTORE_SYSROOT_SPIN"):
        require(("from_conf(\n    \"%s\"" % name in source or 'from_conf("%s"' % name in source)
                and internals.SPIN_ALLOWED_ENV.startswith("METAFLOW_"),
                "metaflow_config.%s" % name, "it is read from METAFLOW_%s" % name)


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


def test_task_datastore_persist_walks_the_flow():
    from metaflow.datastore.task_datastore import TaskDataStore

    require("dir(flow)" in source_of(TaskDataStore.persist), "TaskDataStore.persist",
            "it saves the flow instance's attributes (dir(flow)), so one deleted is not saved")
    flow = types.SimpleNamespace(kept=1)
    before = internals.artifact_names(flow)
    flow.x, flow._private = 1, 2
    internals.drop_artifacts(flow, internals.artifact_names(flow) - before)
    assert vars(flow) == {"kept": 1, "_private": 2}


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
    rank0s = copy.deepcopy(tasks)  # a fork's copy of the task's object

    def blobs():
        return {p for p in glob.glob(os.path.join(root, "GangFlow", "data", "*", "*"))
                if not p.endswith("_meta")}

    keys = internals.persist_artifacts(rank0s, _Flow(big=b"x" * 100000, changed="rank 0's",
                                                       _mine=7))
    written = blobs()
    internals.adopt_artifacts(tasks, {k: keys[k] for k in ("big", "changed", "_mine")})
    tasks.persist(_Flow(changed="stale", _task_ok=True))
    tasks.done()
    new = blobs() - written
    done = store.get_task_datastore(*where, attempt=0, mode="r")
    assert done["big"] == b"x" * 100000 and done["changed"] == "rank 0's" and done["_mine"] == 7
    assert done["_task_ok"] is True  # the task's own, not rank 0's
    # the task wrote only its own attributes ("stale", _task_ok), never `big` again
    assert len(new) == 2 and not any(p.endswith(keys["big"][0]) for p in new), new


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


def test_card_components_reach_another_collector_rendered():
    """A card's components, rendered in rank 0's process (card_state), are what the task's
    collector serializes for @card's final render (restore_card_state)."""
    from metaflow import current
    from metaflow.cards import Markdown
    from metaflow.plugins.cards.component_serializer import CardComponentCollector

    class Creator:  # what refresh() asks to render a runtime card: nothing here
        def create(self, **options):
            pass

    def collector():
        c = CardComponentCollector(card_creator=Creator())
        c._add_card("blank", None, {"type": "blank"}, {}, editable=True, customize=True)
        c._finalize()
        return c

    rank0s, tasks = collector(), collector()
    [uuid] = list(rank0s._card_component_store)
    tasks._card_component_store = {uuid: tasks._card_component_store.popitem()[1]}
    rank0s.append(Markdown("# loss 0.1"))
    rank0s.refresh({"step": 35})
    saved_current = getattr(current, "card", None)
    try:
        internals.set_current("card", rank0s)
        state = internals.card_state()
        internals.set_current("card", tasks)
        internals.restore_card_state(state)
    finally:
        internals.set_current("card", saved_current)
    require(tasks._serialize_components(uuid) == rank0s._serialize_components(uuid),
            "CardComponentCollector._serialize_components", "it renders a card's components")
    assert "loss 0.1" in json.dumps(tasks._serialize_components(uuid))
    assert tasks._get_latest_data(uuid, final=True, mode="render")["user"] == {"step": 35}


# -- @card -------------------------------------------------------------------------------------

def test_card_decorator_private_attributes():
    from metaflow.plugins.cards.card_creator import CardCreator
    from metaflow.plugins.cards.card_decorator import CardDecorator

    deco = CardDecorator()
    for name in ("_card_uuid", "_user_set_card_id", "_logger", "card_creator"):
        require(hasattr(deco, name), "CardDecorator.%s" % name,
                "@card keeps what rendering its cards needs in it")
    for name in ("_is_runtime_card", "card_options"):
        require("self.%s =" % name in source_of(CardDecorator), "CardDecorator.%s" % name,
                "@card keeps what rendering its cards needs in it")
    names = set(params_of(CardCreator.create))
    wanted = {"card_uuid", "user_set_card_id", "runtime_card", "decorator_attributes",
              "card_options", "logger", "mode", "final"}
    require(wanted <= names, "CardCreator.create", "it takes %s" % sorted(wanted))
    require(internals.render_failed_card(deco) is False, "CardDecorator._card_uuid",
            "it is None until @card made a card")


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

def test_batch_create_job():
    from metaflow.plugins.aws.batch.batch import Batch
    from metaflow.plugins.aws.step_functions import step_functions

    names = set(params_of(Batch.create_job))
    wanted = {"step_name", "step_cli", "task_spec", "code_package_metadata", "code_package_url",
              "queue", "env", "num_parallel", "offload_command_to_s3"}
    require(wanted <= names, "Batch.create_job", "it takes %s" % sorted(wanted - names))
    require(".create_job(\n" in source_of(step_functions.StepFunctions._batch),
            "StepFunctions._batch", "it builds each step's job with Batch.create_job")


def test_batch_create_job_is_wrapped_per_step(monkeypatch):
    from metaflow.plugins.aws.batch.batch import Batch

    def create_job(self, step_name, step_cli, task_spec, code_package_metadata,
                   code_package_sha, code_package_url, code_package_ds, image, queue,
                   num_parallel=0, **rest):
        return ("metaflow's", step_name, num_parallel)

    monkeypatch.setattr(Batch, "create_job", create_job)
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


def test_batch_launch_job_and_wait():
    from metaflow.plugins.aws.batch.batch import Batch

    require("step_name" in params_of(Batch.launch_job), "Batch.launch_job",
            "it takes step_name")
    require("self.job = " in source_of(Batch.launch_job), "Batch.launch_job",
            "it keeps the submitted job as self.job")
    require("self.num_parallel > 1" in source_of(Batch.wait), "Batch.wait",
            "it shows the child nodes when self.num_parallel says there are some")


def test_batch_client_fargate_refusal():
    from metaflow.plugins.aws.batch import batch_client

    require('BatchJobException("Fargate does not support multinode jobs.")'
            in source_of(batch_client), "batch_client.BatchJobException",
            "a multi-node job on Fargate is refused with a BatchJobException naming Fargate")
    assert internals.is_fargate_refusal(
        batch_client.BatchJobException("Fargate does not support multinode jobs."))
    assert not internals.is_fargate_refusal(batch_client.BatchJobException("No IAM role"))


def test_batch_command():
    from metaflow.plugins.aws.batch.batch import Batch

    names = params_of(Batch._command)
    require(names == ["self", "environment", "code_package_metadata", "code_package_url",
                      "step_name", "step_cmds", "task_spec", "offload_command_to_s3"],
            "Batch._command", "it takes (environment, code_package_metadata, "
            "code_package_url, step_name, step_cmds, task_spec, offload_command_to_s3); "
            "got %r" % names)


def test_batch_flow_datastore_and_environment():
    from metaflow.plugins.aws.batch.batch import Batch

    source = source_of(Batch.__init__)
    for name in ("flow_datastore", "environment"):
        require("self.%s = %s" % (name, name) in source, "Batch.%s" % name,
                "a Batch object keeps the %s it was made with" % name)


def test_batch_job_payload_and_num_parallel():
    from metaflow.plugins.aws.batch.batch_client import BatchJob

    job = BatchJob(client=None).job_name("j").command(["x"])
    require(isinstance(internals.job_payload(job), dict), "BatchJob.payload",
            "it holds the SubmitJob payload as a dict tree")
    require('getattr(self, "num_parallel", 0) >= 1' in source_of(BatchJob.execute),
            "BatchJob.execute", "it rewrites the node commands only when num_parallel >= 1")
    internals.submit_as_built(job, {"jobName": "g"})
    assert dict(job.payload) == {"jobName": "g"} and job.num_parallel == 0


def test_batch_cli_step_context():
    from metaflow import util
    from metaflow.plugins.aws.batch import batch_cli

    step = batch_cli.batch.commands["step"]
    names = {p.name for p in step.params}
    wanted = {"run_id", "task_id", "split_index", "retry_count", "max_user_code_retries",
              "namespace", "executable", "input_paths"}
    require(wanted <= names, "batch_cli.step", "its options include %s" % sorted(wanted - names))
    source = source_of(step.callback)
    for part in ("ctx.parent.parent.params", "ctx.obj.environment.executable(",
                 "ctx.obj.flow_datastore"):
        require(part in source, "batch_cli.step", "it reads %s as we do" % part)
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


def test_argo_workflows_compile_workflow_template(monkeypatch):
    argo_workflows = _argo()
    ArgoWorkflows = argo_workflows.ArgoWorkflows
    require("self._workflow_template = self._compile_workflow_template()"
            in source_of(ArgoWorkflows.__init__), "ArgoWorkflows.__init__",
            "it compiles the WorkflowTemplate once, with _compile_workflow_template()")
    for method in ("__str__", "deploy"):
        require("self._workflow_template" in source_of(getattr(ArgoWorkflows, method)),
                "ArgoWorkflows.%s" % method, "it prints or deploys the compiled template")
    compiled = argo_workflows.WorkflowTemplate()
    require(compiled.to_json() is compiled.payload, "WorkflowTemplate.to_json",
            "it returns the payload tree that __str__ and deploy serialise")
    monkeypatch.setattr(ArgoWorkflows, "_compile_workflow_template", lambda self: compiled)
    seen = []
    internals.wrap_argo_workflow(lambda argo, workflow: seen.append((argo, workflow)))
    argo = ArgoWorkflows.__new__(ArgoWorkflows)
    assert ArgoWorkflows._compile_workflow_template(argo) is compiled
    assert seen == [(argo, compiled.payload)]


def test_argo_workflows_sanitize():
    require(internals.argo_template_name("train_big") == "train-big", "ArgoWorkflows._sanitize",
            "a step's template is named after the step, underscores as hyphens")


def test_argo_workflows_step_command_words():
    """internals.argo_step_words rebuilds the step command's entrypoint and top-level options
    as _container_templates writes them (tests/emulation/test_deploy.py checks the compiled
    command contains them verbatim)."""
    source = source_of(_argo().ArgoWorkflows._container_templates)
    for piece in ("entrypoint = [executable, script_name]",
                  "not decorator.statically_defined",
                  "and decorator.inserted_by is None",
                  "top_opts_dict.update(deco.get_top_level_options())",
                  "list(dict_to_cli_options(top_opts_dict))",
                  '"--quiet"', '"--metadata=%s" % self.metadata.TYPE',
                  '"--environment=%s" % self.environment.TYPE',
                  '"--datastore=%s" % self.flow_datastore.TYPE',
                  '"--datastore-root=%s" % self.flow_datastore.datastore_root',
                  '"--event-logger=%s" % self.event_logger.TYPE',
                  '"--monitor=%s" % self.monitor.TYPE', '"--no-pylint"',
                  '"--with=argo_workflows_internal:auto-emit-argo-events=%i"'):
        require(piece in source, "ArgoWorkflows._container_templates",
                "the step command's top-level options are built with %s" % piece)


def test_argo_workflows_attributes():
    source = source_of(_argo().ArgoWorkflows.__init__)
    for name in ("flow", "graph", "flow_datastore", "metadata", "environment", "event_logger",
                 "monitor", "namespace", "code_package_url", "code_package_metadata",
                 "auto_emit_argo_events"):
        require("self.%s = %s" % (name, name) in source, "ArgoWorkflows.__init__",
                "it keeps its %r as an attribute" % name)
    Kubernetes, _, _ = _kubernetes()
    require(params_of(Kubernetes.__init__) == ["self", "datastore", "metadata", "environment"],
            "Kubernetes.__init__", "it takes the datastore, metadata and environment")
    argo = types.SimpleNamespace(flow_datastore=types.SimpleNamespace(
        TYPE="s3", datastore_root="s3://b/mf"), namespace="user:ana")
    assert internals.argo_orig_datastore(argo) == "s3@s3://b/mf"
    assert internals.argo_namespace(argo) == "user:ana"
    # argo_pod_command calls Kubernetes._command with the arguments its signature names
    test_kubernetes_command_has_the_signature_we_call()


def test_argo_workflows_task_id_export():
    source = source_of(_argo().ArgoWorkflows._container_templates)
    for piece in ("\"$(echo %s | md5sum | cut -d ' ' -f 1 | tail -c 9)\"",
                  '"(t-%s)" % _task_id_base', '"export METAFLOW_TASK_ID=" "%s" % task_str'):
        require(piece in source, "ArgoWorkflows._container_templates",
                "a step's container computes its task id with %s" % piece)
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
    require(versions._parse(get_version()) == versions._parse(VERSION),
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


def test_the_jobsets_control_command_and_its_pods_stop_grace():
    """jobset_control_command reads the command Metaflow gave the control pod; jobset_stop_grace
    changes the manifest KubernetesJobSet.execute submits, where JobSetSpec.dump writes the
    pods' terminationGracePeriodSeconds (0) inside template.spec.template.spec."""
    _, JobSetSpec, KubernetesJobSet = _kubernetes()
    require('command=self._kwargs["command"]' in source_of(JobSetSpec.dump), "JobSetSpec.dump",
            "the pod's command is the one its command() setter stored")
    require("termination_grace_period_seconds=0" in source_of(JobSetSpec.dump)
            and "client.V1PodTemplateSpec(" in source_of(JobSetSpec.dump)
            and "client.V1JobTemplateSpec(" in source_of(JobSetSpec.dump), "JobSetSpec.dump",
            "it writes the pods' stop grace (0) in the pod spec of its Job template")
    require("body=self.dump()" in source_of(KubernetesJobSet.execute), "KubernetesJobSet.execute",
            "it submits what the JobSet's dump() returns")

    class Control:
        _kwargs = {"command": ["bash", "-c", "task"]}

    class Built:
        control = Control()

        def dump(self):
            job = {"template": {"spec": {"template": {"spec": {
                "terminationGracePeriodSeconds": 0}}}}}
            return {"spec": {"replicatedJobs": [job, json.loads(json.dumps(job))]}}

    jobset = Built()
    assert internals.jobset_control_command(jobset) == ["bash", "-c", "task"]
    internals.jobset_stop_grace(jobset, 40)
    assert [j["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            for j in jobset.dump()["spec"]["replicatedJobs"]] == [40, 40]


# -- the preflight command -----------------------------------------------------------------------

def test_plugin_cli_groups_of_the_vendored_click():
    """Metaflow lazily loads an extension's CLIS_DESC groups and accepts only groups of its
    vendored click; ours is listed under its name."""
    from metaflow import plugins
    from metaflow.cli_components.utils import LazyPluginCommandCollection

    click = internals.cli_click()
    require("isinstance(cmd_object, click.Group)" in source_of(
        LazyPluginCommandCollection._lazy_load) and click.__name__ == "metaflow._vendor.click",
        "cli_components.utils.LazyPluginCommandCollection",
        "it accepts a plugin CLI that is a group of metaflow._vendor.click")
    require("torch-distributed" in plugins.get_plugin_cli_path(), "plugins.get_plugin_cli_path",
            "it lists the CLIS_DESC of extensions by name")


def test_cli_object_graph_and_datastore(tmp_path):
    """cli.py's start keeps the graph and the flow datastore on the context object, and
    initialises the step decorators (step_init) for every command but run, resume and spin."""
    from metaflow import cli
    from metaflow.datastore.flow_datastore import FlowDataStore
    from metaflow.graph import FlowGraph
    from metaflow.plugins.datastores.local_storage import LocalStorage

    start = source_of(cli.start.callback)
    require("ctx.obj.graph = " in start and "ctx.obj.flow_datastore = " in start, "cli.start",
            "it sets ctx.obj.graph and ctx.obj.flow_datastore")
    require('not in ("run", "resume", "spin")' in start and "_init_step_decorators" in start,
            "cli.start", "it runs step_init for commands other than run, resume and spin")
    obj = types.SimpleNamespace(
        graph=FlowGraph(ParallelFlow),
        flow_datastore=FlowDataStore("ContractFlow", storage_impl=LocalStorage,
                                     ds_root=str(tmp_path)))
    steps, kind, root = internals.cli_flow_steps(obj)
    require({name for name, _ in steps} == {"start", "train", "join", "end"} and all(
        isinstance(decos, list) for _, decos in steps) and (kind, root) == ("local",
                                                                            str(tmp_path)),
        "FlowGraph iteration, DAGNode.decorators",
        "iterating a graph gives its nodes, each with its name and decorators")


def test_get_aws_client():
    from metaflow.plugins.aws import aws_client

    require(params_of(aws_client.get_aws_client)[0] == "module" and "client_params" in
            params_of(aws_client.get_aws_client), "aws_client.get_aws_client",
            "it takes the service's name first, and client_params (region_name)")
    require("DEFAULT_AWS_CLIENT_PROVIDER" in source_of(aws_client.get_aws_client),
            "aws_client.get_aws_client", "it uses Metaflow's configured client provider")


def test_kubernetes_client_get():
    from metaflow.plugins.kubernetes.kubernetes_client import KubernetesClient

    require(params_of(KubernetesClient.__init__) == ["self"] and "return self._client"
            in source_of(KubernetesClient.get) and "self._client = client"
            in source_of(KubernetesClient._refresh_client), "KubernetesClient.get",
            "KubernetesClient() loads the configuration and get() returns kubernetes.client")


def test_where_ob_metaflow_differs_kubernetes_and_argo_need_the_outerbounds_platform():
    """Where ob-metaflow (2.19.39.1) differs from metaflow (2.19.39) in what internals.py
    reaches: its Kubernetes.create_jobset and ArgoWorkflows.__init__ stop unless the Metaflow
    configuration has OBP_PERIMETER and OBP_INTEGRATIONS_URL (written by `outerbounds
    configure`), so with ob-metaflow `--with kubernetes` and `argo-workflows create` run on an
    Outerbounds deployment only, and CI's Kubernetes and Argo emulations run against metaflow.
    Its JobSets also name their replicated jobs `c` and `w` (metaflow: `control`, `worker`);
    we reach them through KubernetesJobSet.control and .worker only (jobset_pods), never by
    name. The rest of what we rely on is the same (this file passes against both)."""
    argo_workflows = _argo()
    Kubernetes, _, _ = _kubernetes()
    ob = internals.metaflow_distributions()[0][0] == "ob-metaflow"
    for where, function in (("Kubernetes.create_jobset", Kubernetes.create_jobset),
                            ("ArgoWorkflows.__init__", argo_workflows.ArgoWorkflows.__init__)):
        require(("OBP_PERIMETER" in source_of(function)) is ob, where,
                "it needs the Outerbounds platform's configuration in ob-metaflow only")
    for name in ("worker", "control"):
        require("def %s(self)" % name in source_of(_kubernetes()[2]),
                "KubernetesJobSet.%s" % name, "it is the handle on a replicated job, by role")


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
    "set_current": "test_current_update_env",
    "install_current_parallel": "test_metaflow_current_parallel",
    "num_parallel_parents": "test_graph_node_parallel_foreach_and_num_parallel",
    "check_graph_before_parallel_lint": "test_graph_checks_run_ours_before_parallel_lint",
    "is_ubf_control": "test_unbounded_foreach_ubf_control",
    "step_kwargs": "test_cli_args_step_kwargs",
    "top_level_args": "test_cli_args_options",
    "command_params": "test_click_current_context_params",
    "command_words": "test_root_context_saved_args",
    "deployer_commands": "test_plugins_deployer_impl_providers",
    "spin_allowed_decorators": "test_metaflow_config_spin_allowed_decorators",
    "orig_datastore": "test_flow_datastore_type_and_root",
    "attempt_datastore": "test_flow_datastore_get_task_datastore",
    "flow_datastore_at": "test_an_attempt_file_round_trips_through_a_real_datastore",
    "save_attempt_file": "test_an_attempt_file_round_trips_through_a_real_datastore",
    "load_attempt_file": "test_an_attempt_file_round_trips_through_a_real_datastore",
    "artifact_names": "test_task_datastore_persist_walks_the_flow",
    "drop_artifacts": "test_task_datastore_persist_walks_the_flow",
    "flow_attributes": "test_flowspec_next_sets_only_the_next_state",
    "persist_artifacts": "test_artifacts_persisted_by_one_process_are_adopted_by_the_tasks_own_save",
    "adopt_artifacts": "test_artifacts_persisted_by_one_process_are_adopted_by_the_tasks_own_save",
    "card_state": "test_card_components_reach_another_collector_rendered",
    "restore_card_state": "test_card_components_reach_another_collector_rendered",
    "render_failed_card": "test_card_decorator_private_attributes",
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
    "metaflow_version": "test_metaflow_version_get_version",
    "cli_click": "test_plugin_cli_groups_of_the_vendored_click",
    "cli_flow_steps": "test_cli_object_graph_and_datastore",
    "aws_client": "test_get_aws_client",
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
