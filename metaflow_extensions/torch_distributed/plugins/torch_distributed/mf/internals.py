"""Every Metaflow internal this package relies on, and the only module that reaches one.

Metaflow's public API (FlowSpec, StepDecorator and its hooks, current's public attributes,
MetaflowException, card components, our own settings in metaflow_config) is used where it is
needed. Everything else (private names, CLI plumbing, classes we wrap, undocumented fields) is
reached through the small functions below, each with the reason we need it. Each one has a
contract test in tests/unit/test_internals_contract.py that names what a Metaflow release broke;
CI runs those tests against the oldest and the newest Metaflow of the supported range
(core/supported.py), and tests/unit/test_internals_seam.py fails if another module reaches a
private Metaflow name.
"""

import inspect
import os
import re
import sys
from types import ModuleType
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from ..core.supported import compile_error

# Metaflow ships no type information: its objects (flows, datastores, decorators, graphs, the
# click context, the compilers and their jobs) are Any here.

# Metaflow's settings of the hidden spin-step command, read from these variables
# (metaflow_config.py: from_conf("SPIN_ALLOWED_DECORATORS"), DATASTORE_SYSROOT_SPIN).
SPIN_ALLOWED_ENV = "METAFLOW_SPIN_ALLOWED_DECORATORS"
SPIN_SYSROOT_ENV = "METAFLOW_DATASTORE_SYSROOT_SPIN"


# -- current -------------------------------------------------------------------------------------

def set_current(name: str, value: object) -> None:
    """current.<name> = value. Why: Metaflow has no public way for a decorator to add to
    `current`; its own decorators (@card, @parallel, @checkpoint) call current._update_env."""
    from metaflow import current

    current._update_env({name: value})


def install_current_parallel(environ: Mapping[str, str]) -> None:
    """current.parallel, as @parallel defines it, read from `environ` when used. Why: @batch's
    task_pre_step reads current.parallel on every node of a multi-node job (and sets the
    MF_PARALLEL_* variables), and only @parallel's step_init defines it."""
    from metaflow import current
    from metaflow.metaflow_current import Parallel

    if isinstance(getattr(type(current), "parallel", None), property):
        return  # @parallel elsewhere in the flow, or an earlier step, installed it
    setattr(type(current), "parallel", property(lambda _: Parallel(
        main_ip=environ.get("MF_PARALLEL_MAIN_IP", "127.0.0.1"),
        num_nodes=int(environ.get("MF_PARALLEL_NUM_NODES", "1")),
        node_index=int(environ.get("MF_PARALLEL_NODE_INDEX", "0")),
        control_task_id=environ.get("MF_PARALLEL_CONTROL_TASK_ID"),
    )))


# -- the flow's graph and the task's role ----------------------------------------------------

def num_parallel_parents(graph: Any, step_name: str) -> List[Tuple[str, Any]]:
    """[(parent, N)] for the parents of `step_name` that reach it with
    self.next(..., num_parallel=N). Why: the graph records that only in the undocumented node
    fields parallel_foreach and num_parallel, and @torch_distributed must refuse such a step."""
    return [(parent, getattr(graph[parent], "num_parallel", "N"))
            for parent in graph[step_name].in_funcs
            if getattr(graph[parent], "parallel_foreach", False)]


def check_graph_before_parallel_lint(check: Callable[[Any], None]) -> None:
    """Run `check(graph)` in Metaflow's graph validation, just before its own check that a step
    reached with num_parallel has @parallel. Why: that check (lint.py,
    check_parallel_step_after_next) runs before any decorator's step_init and asks for
    @parallel, the opposite of what @torch_distributed needs; the linter has no public way to
    add a check, nor to order one (FlowLinter._checks)."""
    from metaflow import lint

    checks = lint.linter._checks
    if check in checks:
        return
    # the linter's settings a check needs, read from the function's `attrs`: one that
    # FlowLinter.run_checks always has on
    setattr(check, "attrs", ["require_static_graph"])
    names = [getattr(c, "__name__", "") for c in checks]
    at = names.index("check_parallel_step_after_next") \
        if "check_parallel_step_after_next" in names else 0
    checks.insert(at, check)


def is_ubf_control(ubf_context: Any) -> bool:
    """True in an unbounded foreach's control task. Why: task_decorate is told the task's role
    by this undocumented constant (metaflow/unbounded_foreach.py)."""
    from metaflow.unbounded_foreach import UBF_CONTROL

    return ubf_context == UBF_CONTROL


# -- the command line of the running process -----------------------------------------------------

def step_kwargs() -> Dict[str, Any]:
    """The options of this process's `step` command (run_id, task_id, input_paths, split_index,
    ...). Why: a decorator is not given its task's inputs and split, which gang members need."""
    from metaflow.cli_args import cli_args

    return dict(cli_args.step_kwargs)


def top_level_args() -> List[str]:
    """This task's own top-level options as argv words (--with, --datastore, --metadata, configs).
    Why: a member's spin-step must load the flow exactly as the task did; cli_args._options is
    how Metaflow itself turns them back into words."""
    from metaflow.cli_args import cli_args

    return list(cli_args._options(cli_args.top_kwargs))


def runtime_top_level_words(cli_args: Any) -> List[str]:
    """The top-level options of a task's command as Metaflow's runtime builds it (a CLIArgs,
    in runtime_step_cli), as argv words. Why: CLIArgs writes them only inside get_args(), with
    the command and its options; a copy without the command gives the options alone."""
    import copy

    top = copy.copy(cli_args)
    top.commands, top.command_args, top.command_options = [], [], {}
    return list(top.get_args())[len(top.entrypoint):]


def command_params() -> Dict[str, Any]:
    """The options of the command this process runs, from its click context. Why: spin-step
    keeps its options (run_id, task_id, input_paths, ...) there only, not in cli_args."""
    from metaflow._vendor import click

    return dict(click.get_current_context().params)


def command_words() -> List[str]:
    """The words after the flow's top-level options (`step-functions create --only-json`), or []
    outside Metaflow's CLI. Why: step_init is not told which command runs; Metaflow's top-level
    click group keeps them as `saved_args` on its context (cli.py::start)."""
    from metaflow._vendor import click

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return []
    return list(getattr(ctx.find_root(), "saved_args", None) or [])


def deployer_commands() -> List[str]:
    """The commands of the installed deployers (`argo-workflows`, `step-functions`, and any an
    extension adds). Why: the Deployer API runs `<command> create`, which must refuse a gang it
    cannot run, and the list of deployers is only in plugins.DEPLOYER_IMPL_PROVIDERS."""
    from metaflow.plugins import DEPLOYER_IMPL_PROVIDERS

    return [provider.TYPE for provider in DEPLOYER_IMPL_PROVIDERS if provider.TYPE]


def spin_allowed_decorators() -> List[str]:
    """The decorators spin-step runs (Metaflow's configuration, its config file included). Why:
    spin-step skips every decorator not listed, ours too, so members extend the list."""
    from metaflow.metaflow_config import SPIN_ALLOWED_DECORATORS

    return list(SPIN_ALLOWED_DECORATORS)


def quiet_spin_skips() -> None:
    """In this process, spin-step skips the decorators its allow-list lacks without saying so.
    Why: every exec'd rank and node agent is a spin-step of the gang's task, and Metaflow warns,
    twice for every such decorator of every step of the flow, that it ignores it
    (decorators._should_skip_decorator_for_spin, which the decorator hooks' loops call by its
    module name): a line per rank, step and decorator, every round, each telling the user that
    their @retry or @kubernetes is ignored while the task runs it. The skip itself stays."""
    from metaflow import decorators

    def make(skip: Callable[..., bool]) -> Callable[..., bool]:
        signature = inspect.signature(skip)

        def without_warning(*args: Any, **kwargs: Any) -> bool:
            bound = signature.bind(*args, **kwargs)
            bound.arguments["logger"] = _say_nothing
            return skip(*bound.args, **bound.kwargs)
        return without_warning

    _wrap_once(decorators, "_should_skip_decorator_for_spin", make)


def _say_nothing(*args: Any, **kwargs: Any) -> None:
    """A Metaflow logger that drops what it is given."""


# -- datastore and artifacts ---------------------------------------------------------------------

def orig_datastore(flow_datastore: Any) -> str:
    """"<type>@<root>" of a flow datastore, as spin-step's --orig-flow-datastore takes it. Why:
    the FlowDataStore's TYPE and datastore_root are undocumented attributes."""
    return "%s@%s" % (flow_datastore.TYPE, flow_datastore.datastore_root)


def attempt_datastore(flow_datastore: Any, run_id: str, step_name: str, task_id: str,
                      attempt: int) -> Any:
    """The datastore of one attempt of a task, readable even if the attempt failed. Why: the
    client shows only a task's latest attempt; the gang's card shows the earlier ones too."""
    return flow_datastore.get_task_datastore(run_id, step_name, task_id, attempt=attempt,
                                             mode="r", allow_not_done=True)


def flow_datastore_at(flow_name: str, orig_datastore: str) -> Any:
    """The FlowDataStore of flow `flow_name` at `orig_datastore` ("<type>@<root>", as
    orig_datastore gives it), built as spin-step builds its --orig-flow-datastore. Why: a node
    agent is a spin-step, whose own datastore is not the run's."""
    from metaflow.datastore import FlowDataStore
    from metaflow.plugins import DATASTORES

    ds_type, ds_root = orig_datastore.split("@", 1)
    [impl] = [d for d in DATASTORES if d.TYPE == ds_type]
    return FlowDataStore(flow_name, environment=None, storage_impl=impl, ds_root=ds_root)


def task_output_datastore(flow_name: str, orig_datastore: str, run_id: str, step_name: str,
                          task_id: str, attempt: int) -> Any:
    """The datastore a task's attempt writes its artifacts to, opened in another process of
    the task (an exec'd rank 0, a spin-step under a hidden id): what it persists is stored as
    the task's, content-addressed, and it writes nothing of the attempt's own (its done
    marker, its list of artifacts: the task's). Why: as flow_datastore_at."""
    return flow_datastore_at(flow_name, orig_datastore).get_task_datastore(
        run_id, step_name, task_id, attempt=attempt, mode="w")


def save_attempt_file(flow_datastore: Any, run_id: str, step_name: str, task_id: str,
                      attempt: int, name: str, value: object) -> None:
    """Write the JSON-able `value` as the file `<attempt>.<name>` in the task's datastore
    directory, beside Metaflow's own files of the attempt. Why: TaskDataStore.save_metadata
    is the one writer of a task's per-attempt files; the client reads only the names it
    knows."""
    ds = flow_datastore.get_task_datastore(run_id, step_name, task_id, attempt=attempt,
                                           mode="w")
    ds.save_metadata({name: value})


def load_attempt_file(flow_datastore: Any, run_id: str, step_name: str, task_id: str,
                      attempt: int, name: str) -> Any:
    """The value save_attempt_file wrote, or None while there is none. Why: the same
    TaskDataStore files, read for an attempt that is still running (allow_not_done)."""
    ds = attempt_datastore(flow_datastore, run_id, step_name, task_id, attempt)
    if not ds.has_metadata(name):
        return None
    return ds.load_metadata([name])[name]


def artifact_names(flow: Any) -> Set[str]:
    """Names the flow instance holds now. Why: Metaflow persists every non-ephemeral
    attribute of the flow (TaskDataStore.persist walks dir(flow)), a failed attempt's too."""
    return set(vars(flow))


def flow_attributes(flow: Any) -> Dict[str, Any]:
    """{name: value} of what the flow instance holds now (a copy). Why: as artifact_names;
    rank 0's hand-back tells what its body set from these (mf/handback.py)."""
    return dict(vars(flow))


def drop_artifacts(flow: Any, names: Iterable[str]) -> None:
    """Remove `names` (those not private) from the flow instance. Why: Metaflow persists a failed
    attempt's attributes too (TaskDataStore.persist), and a failed gang keeps none of its body's."""
    for name in names:
        if not name.startswith("_"):
            delattr(flow, name)


# -- rank 0's results, handed from its process to the task (mf/handback.py) ----------------------

# What FlowSpec.next() sets on the flow: the transition and the foreach state. Why: Metaflow's
# task and its decorators read them from the flow object after the step function returned
# (Argo's and Step Functions' task_finished read _foreach_num_splits, Argo's _transition), so
# they reach the task's flow as values, not only as stored artifacts.
NEXT_STATE = ("_transition", "_foreach_var", "_foreach_num_splits", "_foreach_values",
              "_parallel_ubf_iter", "_unbounded_foreach")
# What Metaflow's task sets on the flow after the step function returned (task.py: run_step),
# and @catch in its task_exception: the task's own values are the ones to keep.
AFTER_STEP = ("_task_ok", "_success", "_exception", "_transition")


def persist_artifacts(task_datastore: Any,
                      values: Mapping[str, object]) -> Dict[str, Tuple[str, Any]]:
    """Save `values` ({name: value}) as artifacts into the task's datastore and return
    {name: (key, info)} of each. Why: TaskDataStore.save_artifacts is how Metaflow writes a
    task's artifacts (their blobs, once, content-addressed), and it keeps their keys only in
    its private _objects and _info, which the task's done() writes as the attempt's artifact
    list. Not TaskDataStore.persist, which saves every attribute of the flow and, in a
    spin-step, copies every unchanged input artifact again (its transfer_artifacts)."""
    task_datastore.save_artifacts(iter(values.items()), len_hint=len(values))
    return {name: (task_datastore._objects[name], task_datastore._info.get(name))
            for name in values}


def is_artifact(flow: Any, name: str, value: object) -> bool:
    """Whether Metaflow stores the flow's attribute `name` (holding `value`) as an artifact.
    Why: TaskDataStore.persist's own rule, which no public function says: not a dunder, not
    one of the flow's _EPHEMERAL names, not a property of its class, not a function, method
    or Parameter."""
    from types import FunctionType, MethodType

    from metaflow.parameters import Parameter

    if name.startswith("__") or name in getattr(flow, "_EPHEMERAL", ()):
        return False
    if isinstance(getattr(type(flow), name, None), property):
        return False
    return not isinstance(value, (MethodType, FunctionType, Parameter))


def adopt_artifacts(task_datastore: Any, keys: Mapping[str, Tuple[str, Any]]) -> None:
    """Make the task's own persist end with `keys` ({name: (key, info)}, as persist_artifacts
    returned them in rank 0's process) as the attempt's artifacts of those names: their blobs
    are stored already and are not written again. Why: Metaflow's task calls persist(flow) on
    this datastore after the step (task.py: run_step), and persist first copies the input's
    keys, then the flow's own attributes, into _objects and _info; the keys adopted must come
    after both."""
    persist = task_datastore.persist

    def persist_then_adopt(flow: Any) -> None:
        persist(flow)
        for name, (key, info) in keys.items():
            task_datastore._objects[name] = key
            if info is not None:
                task_datastore._info[name] = info

    task_datastore.persist = persist_then_adopt


def card_state() -> Dict[str, Tuple[List[Any], Any]]:
    """{card key: (its components rendered, the data of its last refresh)} of this process's
    `current.card`, or {} without @card. A card's key names it the same way in every process
    of the task (card_keys), not by its uuid, which each process draws at random. Why: @card
    renders a task's cards in task_finished from current.card's private store of components
    (CardComponentCollector: _card_component_store, _cards_meta, _serialize_components;
    CardComponentManager._latest_user_data)."""
    from metaflow import current

    collector: Any = getattr(current, "card", None)
    store = getattr(collector, "_card_component_store", None)
    if not store:
        return {}
    keys = card_keys(collector)
    return {keys[uuid]: (collector._serialize_components(uuid),
                         getattr(manager, "_latest_user_data", None))
            for uuid, manager in store.items() if uuid in keys}


def card_keys(collector: Any) -> Dict[str, str]:
    """{uuid: key} of a collector's cards: a key is the card's type, its id and its place
    among the cards of that type and id ("blank/None/0"), the same in a forked or exec'd rank
    0 as in the task, whose @card decorators are the same, in the same order. Why: a card's
    uuid (CardComponentCollector.create_uuid, kept in its private _cards_meta) is drawn at
    random in each process."""
    seen: Dict[str, int] = {}
    keys = {}
    for uuid, meta in getattr(collector, "_cards_meta", {}).items():
        base = "%s/%s" % (meta.get("type"), meta.get("card_id"))
        keys[uuid] = "%s/%d" % (base, seen.get(base, 0))
        seen[base] = seen.get(base, 0) + 1
    return keys


def restore_card_state(state: Mapping[str, Tuple[Sequence[Any], Any]]) -> None:
    """Give this process's `current.card` the cards `state` (from card_state, in rank 0's
    process) describes, so that @card's task_finished renders them. Why: see card_state; the
    components travel rendered (their render() output, what @card's renderer is given), not as
    objects, which need not pickle."""
    from metaflow import current

    collector: Any = getattr(current, "card", None)
    store = getattr(collector, "_card_component_store", None)
    if not state or store is None:
        return
    handed = {uuid: state[key] for uuid, key in card_keys(collector).items() if key in state}
    serialize = collector._serialize_components

    def serialize_handed_back(uuid: str) -> List[Any]:
        return list(handed[uuid][0]) if uuid in handed else serialize(uuid)

    collector._serialize_components = serialize_handed_back
    for uuid, (_, user_data) in handed.items():
        if uuid in store:
            store[uuid]._latest_user_data = user_data


# -- @card -------------------------------------------------------------------------------------

def metadata_type() -> str:
    """The metadata provider this process uses ("local", "service", ...). Why: a step
    decorator's step_init is not given the metadata provider; Metaflow's top-level --metadata
    option is in cli_args.top_kwargs, else METAFLOW_DEFAULT_METADATA."""
    from metaflow.cli_args import cli_args
    from metaflow.metaflow_config import DEFAULT_METADATA

    return (getattr(cli_args, "top_kwargs", None) or {}).get("metadata") or DEFAULT_METADATA


def card_base() -> Any:
    """Metaflow's MetaflowCard, for the gang's card type (plugins/cards). Why: Metaflow loads
    an extension's card types while it imports `metaflow.cards` (card_modules/__init__.py:
    _load_external_cards), so `from metaflow.cards import MetaflowCard` there is a circular
    import; the class is already loaded in its own module by then."""
    from metaflow.plugins.cards.card_modules.card import MetaflowCard

    return MetaflowCard


def add_card(step_name: str, decorators: List[Any], attributes: Dict[str, Any],
             step_init_args: Sequence[Any]) -> Any:
    """Put a @card with `attributes` on step `step_name`, from a step decorator's step_init
    (`decorators`: the step's list; `step_init_args`: what step_init was given after the step
    name), and return it. Why: Metaflow has no public way for a decorator to add a decorator
    to a step outside a mutator. @card counts a step's cards once, in the first @card's
    step_init (card_decorator.py: _set_card_counts_per_step), and sets `current.card` up when
    the last one's task_pre_step has run: the count must include the card added here,
    whichever of the step's cards ran step_init first."""
    from metaflow.plugins.cards.card_decorator import CardDecorator

    deco = CardDecorator(attributes=attributes, statically_defined=False,
                         inserted_by=["torch_distributed"])
    deco.external_init()
    decorators.append(deco)
    deco.step_init(*step_init_args[:2], step_name, decorators, *step_init_args[2:])
    CardDecorator._set_card_counts_per_step(
        step_name, sum(isinstance(d, CardDecorator) for d in decorators))
    CardDecorator._register_event("step-init-%s" % step_name)
    return deco


def render_failed_card(deco: Any) -> bool:
    """Render the cards of one @card decorator of this failed attempt. Why: @card renders only
    in task_finished of an attempt that succeeded, and keeps what rendering needs in private
    attributes (plugins/cards/card_decorator.py); False when that @card made no card."""
    if deco.name != "card" or getattr(deco, "_card_uuid", None) is None:
        return False
    deco.card_creator.create(
        mode="render", final=True, card_uuid=deco._card_uuid,
        user_set_card_id=deco._user_set_card_id, runtime_card=deco._is_runtime_card,
        decorator_attributes=deco.attributes, card_options=deco.card_options,
        logger=deco._logger)
    return True


def finish_card_in_task(deco: Any, finish: Callable[[bool, str, int], bool]) -> None:
    """At the end of the task, @card `deco` first calls `finish(is_task_ok, pathspec,
    attempt)`, which draws the card in the task's own process and saves it (save_card); only
    where that returns False does @card's own task_finished run. Why: @card's task_finished
    renders with `card create` and waits for it (card_creator.py: a final render waits), a
    process that loads Metaflow and the flow again and finds the task through the client:
    about 0.5 s at the end of every task on a 2-core machine. The method is replaced on this
    one decorator, not in a subclass: @card keeps class-wide counts of a step's decorators
    (`cls.step_counter += 1` would count a subclass apart), and its _cleanup counts the
    decorators that finished, which the last one needs to remove the flow's config file."""
    original = deco.task_finished

    def task_finished(step_name: str, flow: Any, graph: Any, is_task_ok: bool,
                      retry_count: int, max_user_code_retries: int) -> None:
        from metaflow import current

        pathspec = "/".join((flow.name, current.run_id, step_name, current.task_id))
        if deco._card_uuid is not None and finish(is_task_ok, pathspec, retry_count):
            deco._cleanup(step_name)
        else:
            original(step_name, flow, graph, is_task_ok, retry_count, max_user_code_retries)

    deco.task_finished = task_finished


def card_page(components: Sequence[Any], pathspec: str, token: str = "final") -> str:
    """The HTML of a blank card of `components` on task `pathspec`, as `card create` saves a
    render of a card, with reload token `token`. Why: a card type's render is given a client
    Task, of which BlankCard.render reads only the pathspec (card_modules/basic.py); `card
    create` then puts the reload token in the page (card_cli.py: update_card,
    _extract_reload_token: "final" for the final render at the end of a task, another for
    each render while it runs)."""
    from metaflow.cards import BlankCard
    from metaflow.plugins.cards.card_modules.card import MetaflowCard

    class TaskPath:
        def __init__(self, path: str) -> None:
            self.pathspec = path

    html: str = BlankCard(components=list(components)).render(TaskPath(pathspec))
    return html.replace(MetaflowCard.RELOAD_POLICY_TOKEN, token)


def save_card(deco: Any, html: str, pathspec: str, attempt: int) -> None:
    """Save `html` as the card of @card `deco` on attempt `attempt` of task `pathspec`, where
    `card create` saves it and with the metadata it registers. Why: card_cli.py create saves
    through CardDatastore.save_card under the card's uuid, type and id (what `card get`, `card
    list` and the UI read), into the flow datastore's storage moved to the card root
    (card_cli.py `card`: CardDatastore.get_storage_root, else the datastore's own root; here a
    storage of its own, as the task still uses its own), then registers the card's `card-info`
    metadata once per card (plugins/cards/metadata.py: _save_metadata, asked of @card's
    MetadataStateManager)."""
    from metaflow.plugins.cards.metadata import _save_metadata

    _card_store(deco, pathspec).save_card(
        deco._card_uuid, deco.attributes["type"], html, card_id=deco._user_set_card_id)
    save, info = deco._metadata_state_manager.register_metadata(deco._card_uuid)
    if save:
        _, run_id, step_name, task_id = pathspec.split("/")
        _save_metadata(deco._metadata, run_id, step_name, task_id, attempt, deco._card_uuid,
                       info)


def save_card_data(deco: Any, pathspec: str, token: str, data: Dict[str, Any]) -> None:
    """Save a data update of @card `deco`'s card on task `pathspec` saying that its page now
    has reload token `token`, as `card create --mode refresh` saves one. Why: `card server`'s
    viewer (plugins/cards/card_viewer/viewer.html) polls the card's data update
    (card_server.py: get_data, CardDatastore.save_data under the card's runtime path) and
    reloads the page when the update's `reload_token` differs from the page's, stopping once
    it reads "final"; the update's `data` must not be empty (it is handed to the page's
    metaflow_card_update, which ignores entries that name none of its components)."""
    import time

    _card_store(deco, pathspec).save_data(
        deco._card_uuid, deco.attributes["type"],
        {"reload_token": token, "data": data, "created_on": time.time()},
        card_id=deco._user_set_card_id)


def _card_store(deco: Any, pathspec: str) -> Any:
    """The CardDatastore of @card `deco`'s cards on task `pathspec`: the flow datastore's
    storage moved to the card root, as card_cli.py's `card` group makes it."""
    from metaflow.datastore import FlowDataStore
    from metaflow.plugins.cards.card_datastore import CardDatastore

    storage = deco._flow_datastore._storage_impl
    root = CardDatastore.get_storage_root(storage.TYPE) or storage.datastore_root
    cards = FlowDataStore(deco._flow_datastore.flow_name, environment=None,
                          storage_impl=type(storage), ds_root=root)
    return CardDatastore(cards, pathspec=pathspec)


# -- AWS Batch: the `batch step` trampoline and the Step Functions compiler ------------------------

# How a step's Batch job is built (wrap_batch_create_job): build(create, batch, arguments).
BatchJobBuild = Callable[[Callable[..., Any], Any, Dict[str, Any]], Any]
# What each step's wrap asked for, by step name: a process that compiles a flow
# (`step-functions create`) wraps once per gang step, and each step's job is its own.
_BATCH_JOB_BUILDS: Dict[str, BatchJobBuild] = {}
_CHILD_NODES: Dict[str, int] = {}
_WRAPPED = "_torch_distributed_wrap"  # marks a method replaced by this module


def _wrap_once(owner: Any, name: str,
               make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace `owner.name` by `make(original)` unless this module replaced it already (a
    second gang step of the same flow registers its own part, which the one wrapper finds)."""
    original = getattr(owner, name)
    if getattr(original, _WRAPPED, False):
        return
    wrapper = make(original)
    setattr(wrapper, _WRAPPED, True)
    setattr(owner, name, wrapper)


def wrap_batch_create_job(step_name: str, build: BatchJobBuild) -> None:
    """In this process, Batch.create_job for `step_name` returns `build(create, batch, args)`:
    `create(**overrides)` is Metaflow's own create_job with `args` (its arguments by name)
    changed by `overrides`; every step has its own `build`. Why: only Metaflow's create_job
    builds the task's job (queue, image, resources, code package), and no hook lets a
    decorator give the job N nodes and commands."""
    from metaflow.plugins.aws.batch.batch import Batch

    _BATCH_JOB_BUILDS[step_name] = build

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def create_job(self: Any, *args: Any, **kwargs: Any) -> Any:
            call = signature.bind(self, *args, **kwargs)
            call.apply_defaults()
            arguments = {k: v for k, v in call.arguments.items() if k != "self"}
            step_build = _BATCH_JOB_BUILDS.get(arguments["step_name"])
            if step_build is None:
                return original(self, *args, **kwargs)
            return step_build(lambda **overrides: original(self, **dict(arguments, **overrides)),
                              self, arguments)
        return create_job

    _wrap_once(Batch, "create_job", make)


def show_child_nodes(step_name: str, nodes: int) -> None:
    """Make Batch.wait of `step_name`'s job print the state of its `nodes` - 1 child nodes.
    Why: wait() does that only when the Batch object's num_parallel says so, and launch_job sets
    it from the CLI's --num-parallel, which our job has no use for."""
    from metaflow.plugins.aws.batch.batch import Batch

    _CHILD_NODES[step_name] = nodes

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)

        def launch_job(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(self, *args, **kwargs)
            call = signature.bind(self, *args, **kwargs)
            step_nodes = _CHILD_NODES.get(call.arguments["step_name"])
            if step_nodes is not None and self.job is not None:
                self.num_parallel = step_nodes
            return result
        return launch_job

    _wrap_once(Batch, "launch_job", make)


def is_fargate_refusal(ex: BaseException) -> bool:
    """True for Metaflow's refusal of a multi-node job on a Fargate queue ("Fargate does not
    support multinode jobs."), not for its other Fargate errors (a missing task execution role).
    Why: it is a plain BatchJobException told apart by its text only (batch_client.py)."""
    from metaflow.plugins.aws.batch.batch_client import BatchJobException

    text = str(ex).lower()
    return isinstance(ex, BatchJobException) and "fargate" in text and "multinode" in text


def batch_command(batch: Any, create_args: Mapping[str, Any], step_name: str, shell_command: str,
                  task_spec: Mapping[str, Any]) -> List[str]:
    """The container command (argv) that runs `shell_command` for `step_name` the way
    Metaflow's Batch jobs run a step: code package download, mflog capture and log upload.
    Why: only the private Batch._command builds it."""
    return batch._command(batch.environment, create_args["code_package_metadata"],
                          create_args["code_package_url"], step_name, [shell_command],
                          task_spec, create_args.get("offload_command_to_s3", False))


def batch_orig_datastore(batch: Any) -> str:
    """"<type>@<root>" of the flow datastore a Batch object submits for. Why: its
    `flow_datastore` is an undocumented attribute of Batch, given by whoever made the object
    (batch_cli, or the Step Functions compiler)."""
    return orig_datastore(batch.flow_datastore)


def job_payload(job: Any) -> Dict[str, Any]:
    """A BatchJob's SubmitJob payload, the defaultdict tree where its builder methods write (a
    missing key read from it is created). Why: BatchJob has no accessor for it."""
    return job.payload


def submit_as_built(job: Any, payload: Mapping[str, Any]) -> None:
    """Make BatchJob.execute submit `payload` as it is. Why: execute() rewrites the commands of
    a job whose num_parallel is set (for @parallel's nodes), which would undo ours."""
    job.payload.clear()
    job.payload.update(payload)
    job.num_parallel = 0


class TrampolineCli:
    """What the `batch step` or `kubernetes step` trampoline was asked to run, from Metaflow's
    CLI. Why: Metaflow passes it to its own batch_cli.step and kubernetes_cli.step only,
    through click's context."""

    def __init__(self, step_name: str) -> None:
        from metaflow import util
        from metaflow._vendor import click

        ctx = click.get_current_context()
        self.params = dict(ctx.params)  # batch step's options: run_id, task_id, split_index...
        self.orig_datastore = orig_datastore(ctx.obj.flow_datastore)
        self.executable = ctx.obj.environment.executable(step_name, ctx.params.get("executable"))
        # the flow's file, as Metaflow's step command in the container names it
        self.script = os.path.basename(sys.argv[0])
        # the flow's top-level options, as batch_cli.step passes them on to the task
        self.top_args = list(util.dict_to_cli_options(ctx.parent.parent.params))


# -- Kubernetes: the JobSet of a gang --------------------------------------------------------------

def wrap_kubernetes_jobset(step_name: str, nodes: int,
                           build: Callable[[Any, Any, Dict[str, Any]], None]) -> None:
    """In this process (`kubernetes step`), Metaflow builds the task of `step_name` as the
    JobSet of its @parallel with `nodes` pods (replicated jobs control x 1, worker x N-1), and
    `build(kube, jobset, create_args)` makes it the gang's before it is submitted. Why:
    Kubernetes.launch_job builds a JobSet only when given num_parallel, which `kubernetes step`
    passes for @parallel alone, and Kubernetes.create_jobset returns the KubernetesJobSet
    unsubmitted: the one place to give the worker pods another command."""
    from metaflow.plugins.kubernetes.kubernetes import Kubernetes

    launch_job = Kubernetes.launch_job
    create_jobset = Kubernetes.create_jobset

    def gang_launch_job(self: Any, **kwargs: Any) -> Any:
        if kwargs.get("step_name") == step_name:
            kwargs["num_parallel"] = nodes
        return launch_job(self, **kwargs)

    def gang_create_jobset(self: Any, **kwargs: Any) -> Any:
        jobset = create_jobset(self, **kwargs)
        if kwargs.get("step_name") == step_name:
            build(self, jobset, kwargs)
        return jobset

    Kubernetes.launch_job = gang_launch_job
    Kubernetes.create_jobset = gang_create_jobset


def kubernetes_command(kube: Any, create_args: Mapping[str, Any], task_id: str,
                       step_cmds: Sequence[str]) -> List[str]:
    """Metaflow's pod command (code package download, log capture) around `step_cmds`, for
    the task `task_id` of the task `create_args` (Kubernetes.create_jobset's) describe. Why:
    Kubernetes._command is private; it is how every Metaflow pod starts."""
    return kube._command(
        flow_name=create_args["flow_name"], run_id=create_args["run_id"],
        step_name=create_args["step_name"], task_id=task_id, attempt=create_args["attempt"],
        code_package_metadata=create_args["code_package_metadata"],
        code_package_url=create_args["code_package_url"], step_cmds=step_cmds)


def jobset_pods(jobset: Any, worker_command: Sequence[str], worker_env: Mapping[str, str],
                control_env: Mapping[str, str]) -> None:
    """Give the JobSet's worker pods `worker_command` and `worker_env`, and its control pod
    `control_env`. Why: KubernetesJobSet.worker and .control (JobSetSpec) are the only handles
    on the replicated jobs' pod specs before the JobSet is submitted."""
    jobset.worker.command(worker_command)
    for name, value in worker_env.items():
        jobset.worker.environment_variable(name, value)
    for name, value in control_env.items():
        jobset.control.environment_variable(name, value)


def jobset_control_command(jobset: Any) -> List[str]:
    """The command Metaflow gave the JobSet's control pod: the task's own. Why: JobSetSpec has
    a setter for it (command) and no getter."""
    return list(jobset.control._kwargs["command"])


def jobset_stop_grace(jobset: Any, seconds: int) -> None:
    """Make every pod of the JobSet get `seconds` between its SIGTERM and its SIGKILL
    (terminationGracePeriodSeconds). Why: JobSetSpec.dump writes 0 there as a literal, with
    no setter, and KubernetesJobSet.execute submits what its dump() returns."""
    dump = jobset.dump

    def dump_with_grace() -> Any:
        manifest = dump()
        for replicated in manifest["spec"]["replicatedJobs"]:
            pod = replicated["template"]["spec"]["template"]["spec"]
            pod["terminationGracePeriodSeconds"] = seconds
        return manifest

    jobset.dump = dump_with_grace


def after_jobset_created(jobset: Any, then: Callable[[str, str], None]) -> None:
    """Call `then(name, namespace)` of the JobSet once KubernetesJobSet.execute has created it
    (not when the API refused it). Why: execute returns a RunningJobSet that keeps the name and
    namespace in private attributes, and the unsubmitted KubernetesJobSet its namespace in one."""
    execute = jobset.execute

    def execute_then() -> Any:
        running = execute()
        then(jobset.name, jobset._namespace)
        return running

    jobset.execute = execute_then


def wrap_state_machine_job(
        node_overrides: Callable[[Dict[str, Any]], Optional[Dict[str, Any]]]) -> None:
    """In this process (`step-functions create`), a Batch job's state submits
    `node_overrides(job payload)` (in PascalCase) instead of its ContainerOverrides whenever that
    returns a value (once per process: it is the same for every gang step). Why: State.batch
    turns a BatchJob into the state's Parameters with no hook, and knows nothing of multi-node
    overrides."""
    from metaflow.plugins.aws.step_functions.step_functions import State
    from metaflow.util import to_pascalcase

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def batch(self: Any, job: Any) -> Any:
            state = original(self, job)
            overrides = node_overrides(job.payload)
            if overrides is not None:
                parameters = self.payload["Parameters"]
                parameters.pop("ContainerOverrides")
                parameters["NodeOverrides"] = to_pascalcase(overrides)
            return state
        return batch

    _wrap_once(State, "batch", make)


# -- Argo Workflows: the `argo-workflows create` compiler ----------------------------------------

def wrap_argo_workflow(build: Callable[[Any, Dict[str, Any]], None]) -> None:
    """In this process (`argo-workflows create`), every WorkflowTemplate Metaflow compiles is
    passed to `build(argo, workflow)` before it is printed or deployed: `argo` is the compiler
    (ArgoWorkflows), `workflow` the template's JSON tree, which `build` may change. Why:
    ArgoWorkflows compiles a plain step into one container template with no hook, and builds
    JobSets only for @parallel; the compiled template is the one place to make a step a gang."""
    from metaflow.plugins.argo.argo_workflows import ArgoWorkflows

    original = ArgoWorkflows._compile_workflow_template

    def compile_workflow_template(self: Any) -> Any:
        compiled = original(self)
        build(self, compiled.payload)
        return compiled

    ArgoWorkflows._compile_workflow_template = compile_workflow_template


def argo_template_name(step_name: str) -> str:
    """The name of a step's template in the compiled workflow. Why: ArgoWorkflows._sanitize is
    private."""
    from metaflow.plugins.argo.argo_workflows import ArgoWorkflows

    return ArgoWorkflows._sanitize(step_name)


def argo_step_words(argo: Any, step_name: str) -> Tuple[List[str], List[str]]:
    """(entrypoint, top-level options) of the step command in the step's container, as words,
    exactly as the compiler `argo` writes them (`<python> <flow file>`, `--with ...`, `--quiet`,
    `--datastore=...`). Why: ArgoWorkflows builds them inside _container_templates and keeps
    only the finished command; a node agent must load the flow as the task does."""
    import sys

    from metaflow.decorators import flow_decorators
    from metaflow.util import dict_to_cli_options

    node = argo.graph[step_name]
    entrypoint = [argo.environment.executable(step_name), os.path.basename(sys.argv[0])]
    options = {"with": [deco.make_decorator_spec() for deco in node.decorators
                        if not deco.statically_defined and deco.inserted_by is None]}
    for deco in flow_decorators(argo.flow):
        options.update(deco.get_top_level_options())
    top_level = list(dict_to_cli_options(options)) + [
        "--quiet",
        "--metadata=%s" % argo.metadata.TYPE,
        "--environment=%s" % argo.environment.TYPE,
        "--datastore=%s" % argo.flow_datastore.TYPE,
        "--datastore-root=%s" % argo.flow_datastore.datastore_root,
        "--event-logger=%s" % argo.event_logger.TYPE,
        "--monitor=%s" % argo.monitor.TYPE,
        "--no-pylint",
        "--with=argo_workflows_internal:auto-emit-argo-events=%i" % argo.auto_emit_argo_events,
    ]
    return entrypoint, top_level


def argo_orig_datastore(argo: Any) -> str:
    """"<type>@<root>" of the flow datastore the compiler `argo` compiles for. Why: an
    undocumented attribute of ArgoWorkflows."""
    return orig_datastore(argo.flow_datastore)


def argo_namespace(argo: Any) -> Optional[str]:
    """The Metaflow namespace the compiled steps run in (`--namespace`), or None. Why: an
    undocumented attribute of ArgoWorkflows."""
    return argo.namespace


def argo_pod_command(argo: Any, step_name: str, run_id: str, task_id: str, attempt: str,
                     step_cmds: Sequence[str]) -> List[str]:
    """Metaflow's pod command (code package download, log capture) around `step_cmds`, for
    the code package the compiler `argo` uploaded. Why: Kubernetes._command is private, and it
    is how every Metaflow pod starts; ArgoWorkflows builds its own inline."""
    from metaflow.plugins.kubernetes.kubernetes import Kubernetes

    kube = Kubernetes(argo.flow_datastore, argo.metadata, argo.environment)
    return kube._command(flow_name=argo.flow.name, run_id=run_id, step_name=step_name,
                         task_id=task_id, attempt=attempt,
                         code_package_metadata=argo.code_package_metadata,
                         code_package_url=argo.code_package_url, step_cmds=step_cmds)


# ArgoWorkflows._container_templates: the task id a step's container computes (md5 of the
# step's name, the workflow's creation time, its input paths and split index).
_ARGO_TASK_ID_EXPORT = re.compile(
    r"export METAFLOW_TASK_ID=\(t-\$\(echo [^|]* \| md5sum \| cut -d ' ' -f 1 \| tail -c 9\)\)")


def argo_with_task_id(command: str, task_id: str, step_name: str) -> str:
    """A step container's shell command (the text `bash -c` runs) with its task id set to
    `task_id` (shell text) instead of the one it computes. Why: the container derives its
    task id in the shell (an md5 Argo cannot compute), and tells the next step through a file
    only a container template's outputs can read; a JobSet's task id must be one Argo knows."""
    found = _ARGO_TASK_ID_EXPORT.findall(command)
    if len(found) != 1:
        raise compile_error(step_name, "Argo's container command of the step exports its task "
                            "id %d times, not once" % len(found))
    return _ARGO_TASK_ID_EXPORT.sub(lambda _: "export METAFLOW_TASK_ID=%s" % task_id, command)


# -- the preflight command (preflight_cli.py) ------------------------------------------------------

def cli_click() -> ModuleType:
    """The click module of Metaflow's CLI. Why: Metaflow merges the command groups of an
    extension's CLIS_DESC into its own CLI only if they are built with its vendored click."""
    from metaflow._vendor import click

    return click


def cli_flow_steps(obj: Any) -> Tuple[List[Tuple[str, List[Any]]], str, str]:
    """[(step name, its decorators)] of the flow a command of Metaflow's CLI runs for, and the
    root of its datastore. `obj` is the CLI's click context object. Why: the CLI keeps the
    flow's graph (decorators initialised by step_init, --with included) and its datastore only
    on that object's undocumented attributes, and a graph node's decorators in `decorators`."""
    steps = [(node.name, list(node.decorators)) for node in obj.graph]
    return steps, obj.flow_datastore.TYPE, obj.flow_datastore.datastore_root


def aws_client(service: str, region: Optional[str] = None) -> Any:
    """A boto3 client for `service` (in `region`, else the configured one) with the
    credentials Metaflow's own AWS calls use. Why: get_aws_client (plugins/aws/aws_client.py)
    applies METAFLOW_DEFAULT_AWS_CLIENT_PROVIDER and Metaflow's client settings, which a plain
    boto3.client would not."""
    from metaflow.plugins.aws.aws_client import get_aws_client

    return get_aws_client(service, client_params={"region_name": region} if region else None)


def metaflow_setting(name: str) -> Tuple[Any, str]:
    """(value, where it came from) of Metaflow's setting `name` (METAFLOW_<name>) as
    metaflow_config read it: an environment variable, the project's local config, Metaflow's
    config file (`metaflow configure aws` writes it), or Metaflow's default. Why: from_conf
    keeps the config files it read only in the module globals of metaflow_config_funcs
    (METAFLOW_CONFIG, METAFLOW_LOCAL_CONFIG)."""
    from metaflow import metaflow_config
    from metaflow import metaflow_config_funcs as funcs

    env_name = "METAFLOW_" + name
    value = getattr(metaflow_config, name, None)
    if env_name in os.environ:
        return value, "the environment variable %s" % env_name
    if env_name in (funcs.METAFLOW_LOCAL_CONFIG or {}):
        return value, "the project's Metaflow config (.metaflow), %s" % env_name
    if env_name in (funcs.METAFLOW_CONFIG or {}):
        home = os.environ.get("METAFLOW_HOME", "~/.metaflowconfig")
        profile = os.environ.get("METAFLOW_PROFILE")
        path = os.path.join(home, "config_%s.json" % profile if profile else "config.json")
        return value, "Metaflow's config %s, %s" % (path, env_name)
    if value is None:
        return value, "%s is not set" % env_name
    return value, "Metaflow's default, as %s is not set" % env_name


def user_attributes(deco: Any) -> Set[str]:
    """The attributes given to a step decorator in the flow or with --with, not its defaults
    nor what step_init merged in (@batch takes @resources' cpu, and its image from the
    config). Why: only StepDecorator._user_defined_attributes keeps that."""
    return set(getattr(deco, "_user_defined_attributes", None) or ())


class _SaysS3:
    """A flow datastore that says it is S3 (the preflight's, see preflight_without_s3)."""

    TYPE = "s3"

    def __init__(self, datastore: Any) -> None:
        self._datastore = datastore

    def __getattr__(self, name: str) -> Any:
        return getattr(self._datastore, name)


def preflight_without_s3(noted: Callable[[str], None]) -> None:
    """In this process, let the preflight run where Metaflow has no S3 datastore: @batch's
    step_init, which refuses any other datastore, is given one that says it is S3, and the CLI,
    which refuses an S3 datastore without a root, gets an empty root; `noted(what)` is told
    each ("datastore TYPE", "no S3 root"). Why: both refusals are Metaflow's, in its CLI
    before any command of ours runs (BatchDecorator.step_init; cli.py start, from
    S3Storage.get_datastore_root_from_config), and the preflight is run to say what is
    missing."""
    from metaflow.plugins.aws.batch.batch_decorator import BatchDecorator
    from metaflow.plugins.datastores.s3_storage import S3Storage

    def step_init(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, flow: Any, graph: Any, step: str, decos: Any,
                    environment: Any, flow_datastore: Any, logger: Any) -> Any:
            if flow_datastore.TYPE != "s3":
                noted("datastore %s" % flow_datastore.TYPE)
                flow_datastore = _SaysS3(flow_datastore)
            return original(self, flow, graph, step, decos, environment, flow_datastore,
                            logger)
        return wrapper

    def root(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(cls: Any, echo: Any, create_on_absent: bool = True) -> Any:
            found = original(echo, create_on_absent)
            if found is None:
                noted("no S3 root")
            return "" if found is None else found
        setattr(wrapper, _WRAPPED, True)  # what getattr finds through the classmethod
        return classmethod(wrapper)  # type: ignore[return-value]

    _wrap_once(BatchDecorator, "step_init", step_init)
    _wrap_once(S3Storage, "get_datastore_root_from_config", root)


def kubernetes_client() -> Any:
    """The `kubernetes.client` module, configured the way Metaflow's own Kubernetes calls are
    (KUBECONFIG, in-cluster, or ~/.kube/config). Why: only Metaflow's KubernetesClient
    (plugins/kubernetes/kubernetes_client.py) chooses that configuration."""
    from metaflow.plugins.kubernetes.kubernetes_client import KubernetesClient

    return KubernetesClient().get()


# -- task metadata ---------------------------------------------------------------------------------

def register_task_metadata(metadata: Any, run_id: str, step_name: str, task_id: str,
                           attempt: int, field: str, value: str) -> None:
    """Record `field` = `value` (a string) in the metadata of attempt `attempt` of the task, as
    Metaflow's own decorators do (the client's Task.metadata_dict then shows it). Why:
    MetaDatum lives in metaflow.metadata_provider, which is not the documented API."""
    from metaflow.metadata_provider import MetaDatum

    metadata.register_metadata(run_id, step_name, task_id, [MetaDatum(
        field=field, value=value, type=field, tags=["attempt_id:%d" % attempt])])


# -- metaflow-checkpoint ---------------------------------------------------------------------------

def reload_task_checkpoint(checkpointer: Any, load_policy: str) -> Any:
    """Load the latest checkpoint again into a fresh `checkpointer.directory`, as @checkpoint's
    task_pre_step did when the task started (load policy "fresh" or "eager"); return what it
    loaded (its CheckpointArtifact) or None. `checkpointer` is @checkpoint's
    current.checkpoint in the task. Why: a restart in place starts a new round within the
    same attempt, whose ranks must start from the latest checkpoint, a save of the failed
    round included; only CurrentCheckpointer._setup_task_first_load reads the task's
    "latest" pointer with @checkpoint's own policy, and sets what is_loaded and info show."""
    checkpointer.refresh_directory()
    checkpointer._loaded_checkpoint = None
    return checkpointer._setup_task_first_load(load_policy, checkpointer._flow)


def number_saves_from(writer: Any, version: int) -> None:
    """Number the next save of `writer` `version` (metaflow-checkpoint's version_id, the last
    part of a checkpoint's key <task>.<attempt>.<name>.<version_id>), its later ones on from
    there. `writer`: @checkpoint's current.checkpoint in the task, or a metaflow-checkpoint
    `Checkpoint` (which then resolves the task it writes for from METAFLOW_CHECKPOINT_UID, as
    its first save would). Why: each writer numbers its saves from 0
    (Checkpointer._current_version), and no public API sets it; the ranks of a round
    restarted in place are new writers within the same attempt, whose saves would take the
    keys of the first round's and replace them."""
    api = getattr(writer, "_default_checkpointer", writer)
    if api._checkpointer is None:
        api._init_checkpoint_for_writes(api)
    api._checkpointer._set_current_version(version)


# -- the installed release -----------------------------------------------------------------------

def metaflow_version() -> str:
    """The installed Metaflow's version. Why: without package metadata (a code package on a
    remote node) only metaflow_version.get_version knows it."""
    installed = metaflow_distributions()
    if installed:
        return installed[0][1]
    from metaflow.metaflow_version import get_version

    return get_version()


# The distributions that install the `metaflow` package: Metaflow's own, and Outerbounds'.
METAFLOW_DISTRIBUTIONS = ("metaflow", "ob-metaflow")


def metaflow_distributions() -> List[Tuple[str, str]]:
    """[(distribution, version)] of what installed the imported `metaflow` package: one of
    ("metaflow", "2.19.39") or ("ob-metaflow", "2.19.39.1"), both where both wrote the same
    files (pip installed metaflow over ob-metaflow), none where the package has no metadata (a
    code package on a remote node). Why: Outerbounds' ob-metaflow is the same module under
    another distribution name, so version("metaflow") does not find it; and where a code
    package's metaflow is imported, version("metaflow") names the image's, not that one."""
    from importlib.metadata import PackageNotFoundError, distribution

    import metaflow

    here = os.path.realpath(metaflow.__file__)
    found = []
    for name in METAFLOW_DISTRIBUTIONS:
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        if os.path.realpath(str(dist.locate_file("metaflow/__init__.py"))) == here:
            found.append((name, dist.version))
    return found
