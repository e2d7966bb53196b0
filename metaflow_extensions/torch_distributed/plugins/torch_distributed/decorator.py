"""The @torch_distributed step decorator: validation, then a plan handed to the gang runner."""

import dataclasses
import os
import sys
import threading
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

from metaflow.decorators import StepDecorator

from .backends import kubernetes, registry, schedulers, trampoline
from .backends.base import Backend, GangStep
from .core import devices, naming, settings
from .core.errors import (
    TorchDistributedConfigError,
    TorchDistributedEnvironmentError,
    TorchDistributedException,
    presented,
)
from .core.failures import Failure
from .core.gangspec import (
    ORDER_ENV,
    SPEC_ENV,
    AgentOrder,
    Attempt,
    Blueprint,
    GangSpec,
    NodeZero,
    Role,
    TaskIdentity,
    current_task_identity,
)
from .core.topology import Topology, plan_line, plan_topology
from .mf import attempt_secret, card, checkpoints
from .mf import current as current_mod
from .mf import groupcheck, internals, spinstep
from .mf.events import GangRecord
from .mf.usertimer import PausedTimer, WhenAll, disarm
from .mf.versions import check_metaflow_version, check_torch_version, installed_torch
from .preflight import early as preflight_early
from .runtime import interrupt, procs

# Metaflow imports this module before it reads the command line: in a gang member, a spin-step
# of the task, its warnings that the flow's other decorators are skipped go before they start.
spinstep.quiet_if_member(os.environ)
# and the preflight runs where Metaflow has no S3 datastore yet, to say so (preflight/early.py)
preflight_early.install(sys.argv)


def _within_grace_limit(blueprint: Blueprint, place: NodeZero) -> Blueprint:
    """The blueprint node 0 leads the gang with: its preemption grace cut to what the scheduler
    leaves (Slurm's KillWait), said once, so that the gang stops what is left and records the
    attempt as preempted before the scheduler's SIGKILL."""
    limit = place.grace_limit_s
    if limit is None or blueprint.preempt_grace_s <= limit:
        return blueprint
    print("@torch_distributed on step *%s*: preempt_grace is cut from %gs to %gs: %s, and the "
          "gang keeps the rest to stop what is left and record the attempt."
          % (blueprint.step_name, blueprint.preempt_grace_s, limit, place.grace_limit_why),
          file=sys.stderr, flush=True)
    return dataclasses.replace(blueprint, preempt_grace_s=limit)


class TorchDistributedDecorator(StepDecorator):
    """
    Run this step as a gang of torch.distributed processes.

    Every rank runs the step's body with the rendezvous environment set (MASTER_ADDR,
    MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, ...), so `torch.distributed.init_process_group()`,
    Lightning's `Trainer()`, Fabric and Accelerate need no arguments. Rank 0's `self.x` become
    the step's artifacts; the other ranks' are discarded. If any rank fails, every rank is
    stopped and the step fails with that rank's error.

    Parameters
    ----------
    world_size : int, optional
        Total number of processes. Default: nodes x nproc_per_node.
    nodes : int, optional
        Number of nodes. Default: world_size / nproc_per_node, else 1.
    nproc_per_node : int or str, optional
        Processes per node. Default: the GPUs asked for by @resources/@batch/@kubernetes on
        this step, else the GPUs visible to the task; without GPUs, world_size (all on one
        node) unless nodes is given, else 1. torchrun's words work too: "gpu" (one process
        per GPU, counted as the default counts them; an error without GPUs) and "auto" (per
        GPU, else per CPU: the step's cpu= on a remote backend, this machine's CPUs locally).
    rendezvous_timeout : int, optional
        Seconds every node and rank has to join before the step fails naming the missing ones.
        Default: METAFLOW_TORCH_DISTRIBUTED_RENDEZVOUS_TIMEOUT (300).
    finish_timeout : int, optional
        Seconds the other ranks may still run once rank 0 finished its body (and rank 0 once
        every other rank finished) before the stragglers are failed as unfinished.
        Default: METAFLOW_TORCH_DISTRIBUTED_FINISH_TIMEOUT, else the rendezvous timeout.
    start_method : str, optional
        "fork" (ranks and local node agents forked from the loaded task: fastest), "exec" (a
        fresh interpreter per member, rank 0 included: a spin-step of the task) or "auto"
        (fork on Linux while CUDA is untouched, else exec). Either way the task runs no user
        code, and restarts in place work.
        Default: METAFLOW_TORCH_DISTRIBUTED_START_METHOD ("auto").
    hang_timeout : int, optional
        Seconds no rank may complete a collective while some rank waits in one before the
        gang is failed as hung, with every rank's place and the straggler's stack; 0 turns
        hang detection off. Default: METAFLOW_TORCH_DISTRIBUTED_HANG_TIMEOUT (600).
    preempt_grace : int, optional
        Seconds every rank is given to save once the gang is preempted (a SIGTERM to a node:
        every rank gets SIGTERM and current.torch_distributed.preempted is set) before what
        still runs is stopped and the attempt fails as preempted.
        Default: METAFLOW_TORCH_DISTRIBUTED_PREEMPT_GRACE (25).
    max_restarts : int, optional
        How many times a failed gang (a rank's exception, non-zero exit, signal or hang) is
        started again in place, within the same attempt: every rank is stopped and started
        as a fresh process, with a fresh rendezvous and, with @checkpoint, the latest
        checkpoint loaded. The same error from the same rank twice in a row stops early. A
        lost node or a preemption fails the attempt (@retry's business). Needs the start
        method fork. Default: METAFLOW_TORCH_DISTRIBUTED_MAX_RESTARTS (0).
    card : bool, optional
        Give the step the gang's own card (type and id `torch_distributed`): topology, every
        rank's timeline, the outcome with its root cause, each rank's last lines. The step's
        other cards are left as they are. Default: METAFLOW_TORCH_DISTRIBUTED_CARD (True).

    MF Add To Current
    -----------------
    torch_distributed -> metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.current.TorchDistributedInfo
        Where this process sits in the gang: rank, local_rank, world_size, local_world_size,
        node_rank, num_nodes, master_addr, master_port, is_main, device, and gather(obj).

        @@ Returns
        -------
        TorchDistributedInfo
            Rank and topology of this process in the gang.
    """

    name = "torch_distributed"
    defaults = {
        "world_size": None,
        "nodes": None,
        "nproc_per_node": None,
        "rendezvous_timeout": None,
        "finish_timeout": None,
        "start_method": None,
        "hang_timeout": None,
        "preempt_grace": None,
        "card": None,
        "max_restarts": None,
    }

    def step_init(self, flow: Any, graph: Any, step_name: str, decorators: List[Any],
                  environment: Any, flow_datastore: Any, logger: Any) -> None:
        self.step_name = step_name
        self.flow_datastore = flow_datastore
        self.step_decorators = decorators
        self.task_datastore = None  # this attempt's output datastore (task_pre_step)
        self.task_card: Optional[card.TaskCard] = None  # the gang's card, drawn by the task
        current_mod.install(current_mod.UNAVAILABLE)
        # With --with torch_distributed the decorator lands on every step; gang only the
        # steps a gang makes sense for (not start, end, joins, or @parallel's own steps).
        self.active = self.statically_defined or (
            graph[step_name].type == "linear" and not _parallel_step(step_name, graph, decorators))
        if not self.active:
            return
        check_metaflow_version(step_name)
        _reject_parallel(step_name, graph, decorators)
        # @catch keeps the artifacts of the attempt it catches, as on a plain step.
        self.has_catch = any(d.name == "catch" for d in decorators)
        # @batch's task_pre_step reads current.parallel on every node of a multi-node job
        internals.install_current_parallel(os.environ)
        gpus, source = devices.requested_gpus(decorators, step_name)
        if gpus is None:
            visible = len(devices.visible_gpu_ids())
            gpus, source = (visible, "%d visible GPUs" % visible) if visible else (None, None)
        self.on_batch = any(d.name == "batch" for d in decorators)
        self.on_kubernetes = any(d.name == "kubernetes" for d in decorators)
        on_slurm = any(d.name == "torch_slurm" for d in decorators)
        cpus, cpu_source = (devices.node_cpus(decorators, self.on_batch or self.on_kubernetes
                                              or on_slurm,
                                              step_name=step_name)
                            if self.attributes["nproc_per_node"] == "auto" else (None, None))
        try:
            self.topology = plan_topology(
                self.attributes["world_size"], self.attributes["nodes"],
                self.attributes["nproc_per_node"], gpus, source, cpus, cpu_source)
        except ValueError as ex:
            raise TorchDistributedConfigError(step_name, str(ex))
        schedulers.check_single_task_senders(step_name, [d.name for d in decorators],
                                             self.topology)
        self.gpus_requested = source if source and source.startswith("@") else None
        self.settings = settings.resolve(step_name, self.attributes, _configured_settings())
        groupcheck.check_mode(step_name, os.environ)  # a bad value fails before the run
        # The ranks' torch: the launcher's for a local step (checked as the run starts), the
        # image's for a remote one (checked by the task in its container, before any rank).
        command = schedulers.cli_words()[:1]
        remote = self.on_batch or self.on_kubernetes
        if (command in (["run"], ["resume"]) and not remote) or (command == ["step"] and remote):
            check_torch_version(step_name, installed_torch(), "in the image" if remote else "here")
        if card.wanted(self.settings.card, decorators, self.on_batch or self.on_kubernetes,
                       internals.metadata_type()):
            self.task_card = card.add_to_step(step_name, decorators,
                                              (flow, graph, environment, flow_datastore, logger))
        target = schedulers.check_deploy(step_name, self.topology)
        if self.on_kubernetes and self.gpus_requested and schedulers.cli_words()[:1] in (
                ["run"], ["resume"]):
            # Said once, by the run that starts the flow (not again by each task and pod).
            warning = kubernetes.shared_memory_warning(step_name, _attribute(
                decorators, "kubernetes", "shared_memory"))
            if warning:
                print(warning, file=sys.stderr, flush=True)
        self.blueprint = Blueprint(
            step_name=step_name,
            nodes=self.topology.nodes,
            nproc_per_node=self.topology.nproc_per_node,
            rendezvous_timeout_s=self.settings.rendezvous_timeout_s,
            finish_timeout_s=self.settings.finish_timeout_s,
            start_method=self.settings.start_method,
            heartbeat_timeout_s=self.settings.heartbeat_timeout_s,
            hang_timeout_s=self.settings.hang_timeout_s,
            straggler_window_s=self.settings.straggler_window_s,
            preempt_grace_s=self.settings.preempt_grace_s,
            max_restarts=self.settings.max_restarts,
            # a step --with put the decorator on may do no distributed work: warn, not fail
            group_check_default="error" if self.statically_defined else "warn",
        )
        self.gang_step = GangStep(self.blueprint, self.topology, self.name, decorators, graph,
                                  rehearsal=_rehearsal())
        # This process may submit the step's job (`batch step`, `kubernetes step`) or compile
        # the flow (`step-functions create`, `argo-workflows create`): each backend installs
        # what makes that job the gang's.
        registry.install(self.gang_step, os.environ, target)

    def runtime_init(self, flow: Any, graph: Any, package: Any, run_id: str) -> None:
        # In Metaflow's runtime process: a SIGINT to it alone ends the tasks with SIGKILL 5 s
        # later; the gang's note then says so (interrupt.py).
        if self.active and threading.current_thread() is threading.main_thread():
            interrupt.mark_interrupts()

    def runtime_finished(self, exception: Optional[BaseException]) -> None:
        if self.active:
            interrupt.forget_interrupt(os.getpid())

    def runtime_step_cli(self, cli_args: Any, retry_count: int, max_user_code_retries: int,
                         ubf_context: Any) -> None:
        # @batch and @kubernetes send the step away for every attempt but @catch's local
        # fallback: tell the process that submits it (`batch step`, `kubernetes step`) to
        # make its job the gang's.
        if self.active and retry_count <= max_user_code_retries:
            cli_args.env.update(registry.launch_env(self.gang_step))

    def task_pre_step(self, step_name: str, task_datastore: Any, metadata: Any, run_id: str,
                      task_id: str, flow: Any, graph: Any, retry_count: int,
                      max_user_code_retries: int, ubf_context: Any, inputs: Any) -> None:
        # rank 0's process saves its body's artifacts into this attempt's datastore itself
        self.task_datastore = task_datastore
        # where each restart in place is recorded (_record_restart)
        self.task_metadata = (metadata, run_id, step_name, task_id, retry_count)

    def task_decorate(self, step_func: Callable[..., Any], flow: Any, graph: Any,
                      retry_count: int, max_user_code_retries: int,
                      ubf_context: Any) -> Callable[..., Any]:
        if not self.active or internals.is_ubf_control(ubf_context):
            # An unbounded foreach's control task only starts the mapper tasks; each mapper
            # task (ubf_context UBF_TASK) is a gang.
            return step_func
        spec = GangSpec.from_env(os.environ)
        order = AgentOrder.from_env(os.environ) if spec is None else None
        # The member's GangSpec holds the attempt's secret: in memory from here on, so that
        # nothing the body starts (a loader's workers, run_script, a crash reporter) inherits it.
        os.environ.pop(SPEC_ENV, None)
        os.environ.pop(ORDER_ENV, None)
        # torch's import and the gang's start-up are ours, not the body's: @timeout's clock
        # stays paused from here until the gang is assembled (gang_step), unless this attempt
        # runs the step alone (usertimer.py)
        paused = PausedTimer().pause()
        try:
            _require_torch(self.step_name)
        except BaseException:
            paused.resume()
            raise
        if spec is not None or order is not None:  # a member started by a gang
            disarm()  # rank 0's @timeout governs the gang (usertimer.py)
            if retry_count > max_user_code_retries:
                # A deployed job runs every attempt with its agents; @catch's fallback
                # attempt runs on node 0 alone, as on any step.
                print("[node agent] attempt %d is @catch's fallback, which runs on node 0 "
                      "alone: nothing to do here." % retry_count, flush=True)
                os._exit(0)
            if spec is None and order is not None:  # an agent on another machine: its place
                backend = registry.by_name(self.step_name, order.backend)
                try:
                    spec = self._place_remote_agent(backend, order, flow.name)
                except TorchDistributedException as ex:
                    backend.agent_misplaced(ex)
                except Exception as ex:  # the datastore refused, say: said as ours
                    backend.agent_misplaced(presented(self.step_name, ex) or _raise(ex))
            if spec is not None:
                return _member_step(spec, step_func, self.name, flow)
        if retry_count > max_user_code_retries:
            paused.resume()
            return step_func  # @catch's fallback attempt runs alone, as on any step
        procs.freeze_preloaded()  # node 0's task: from here on the body runs in members
        try:
            return self._leader_step(flow, step_func, retry_count, max_user_code_retries,
                                     paused)
        except Exception as ex:
            paused.resume()
            _present(self.step_name, ex)
            raise

    def _leader_step(self, flow: Any, step_func: Callable[..., Any], retry_count: int,
                     max_user_code_retries: int, timer: PausedTimer) -> Callable[..., None]:
        """The gang's step function; `timer` is @timeout's clock, paused: the step resumes it
        once the gang is assembled and rank 0's body has started."""
        from metaflow import current

        from .gang import HandBack, Leader

        identity = current_task_identity(internals.step_kwargs(), retry_count,
                                         max_user_code_retries,
                                         internals.orig_datastore(self.flow_datastore))
        place = registry.node_zero(self.gang_step, os.environ, identity)
        attempt = Attempt(
            gang_id=naming.gang_id(identity.run_id, self.step_name, identity.task_id,
                                   retry_count),
            task=identity, backend=place.backend, master_addr=place.master_addr,
            master_port=place.port, secret=place.secret,
            top_args=tuple(internals.top_level_args()),
            checkpoint=checkpoints.gang_fields(current, os.environ))
        if attempt.local:  # every node on this host
            accelerator, blocks = self._local_devices()
        else:  # node 0 of a multi-node job or JobSet, on its own machine
            accelerator, blocks = self._node_devices(), {}
            # the agents on the other machines read it there
            attempt_secret.publish(self.flow_datastore, identity, self.step_name,
                                   attempt.gang_id, attempt.secret)
        start_method = devices.resolve_start_method(self.settings.start_method)
        leader = Leader(_within_grace_limit(self.blueprint, place), self.topology, attempt,
                        accelerator, start_method,
                        self.settings.abort_grace_s, self.name, blocks)
        leader.checkpoint_policy = checkpoints.load_policy(self.step_decorators)
        leader.on_restart = self._record_restart
        plan = plan_line(self.step_name, self.topology, accelerator,
                         emulated=attempt.local)

        caught = self.has_catch and retry_count >= max_user_code_retries
        # rank 0, a process of its own as every other rank, hands its results back to this one
        handback = HandBack(flow, self.task_datastore, keep_failed=caught)

        def gang_step(*args: Any) -> None:
            print(plan, flush=True)
            before = internals.artifact_names(flow)
            # @timeout counts from the gang's assembly, not its start-up (usertimer.py)
            clock = WhenAll(timer.resume, ("body", "assembled"))
            try:
                try:
                    if self.task_card is not None and self.settings.card_refresh_s:
                        self.task_card.go_live(
                            leader.live_view, self.settings.card_refresh_s,
                            bool(self.settings.hang_timeout_s), identity,
                            "/".join((flow.name, identity.run_id, self.step_name,
                                      identity.task_id)), retry_count)
                    leader.run(step_func, args, on_body_start=lambda: clock.arrive("body"),
                               on_assembled=lambda: clock.arrive("assembled"),
                               handback=handback)
                finally:
                    self._show_gang(flow, leader.record, identity, retry_count)
            except BaseException as ex:
                # Metaflow persists a failed attempt's artifacts; a gang whose failure leaves the
                # task keeps none of what rank 0's body set (inputs from earlier steps stay).
                # An attempt @catch ends successfully keeps them, as on a plain step.
                if not caught:
                    internals.drop_artifacts(flow, internals.artifact_names(flow) - before)
                if ex.__traceback__ is not None and leader.raised_users_own(ex):
                    # its traceback is in its rank's lines: the gang's frames are not the user's
                    raise ex.with_traceback(None)
                if ex is not leader.users_error:
                    _present(self.step_name, ex)
                raise
            # A gang that failed before it was assembled keeps its timer paused: the
            # rendezvous timeout bounded that wait, and the gang's error is the step's.
            timer.resume()

        return gang_step

    def _record_restart(self, restart: int, root: Failure) -> None:
        """Keep a restart in place in the task's metadata: the client shows it
        (Task.metadata_dict["torch_distributed_restart"]: the latest; every one in
        Task.metadata)."""
        import json

        metadata, run_id, step_name, task_id, attempt = self.task_metadata
        try:
            internals.register_task_metadata(
                metadata, run_id, step_name, task_id, attempt, "torch_distributed_restart",
                json.dumps({"restart": restart, "after": root.sentence(), "rank": root.rank,
                            "node": root.node, "kind": str(root.kind)}))
        except Exception as ex:  # noqa: BLE001 - a record of the restart; the gang goes on
            print("@torch_distributed on step *%s*: could not record restart %d in the task's "
                  "metadata: %s" % (self.step_name, restart, ex), file=sys.stderr, flush=True)

    def _show_gang(self, flow: Any, record: Optional[GangRecord], identity: TaskIdentity,
                   retry_count: int) -> None:
        """Keep this attempt's record with the task: the gang's card is drawn from it."""
        from .mf import events

        if self.task_card is not None:
            self.task_card.keep(record, identity)
        if record is None:
            return
        try:
            events.save_record(self.flow_datastore, identity, self.step_name, retry_count,
                               record)
        except Exception as ex:  # noqa: BLE001 - the card's record; the step's result stands
            print("@torch_distributed on step *%s*: could not keep the gang's record: %s"
                  % (self.step_name, ex), file=sys.stderr, flush=True)

    def _place_remote_agent(self, backend: Backend, order: AgentOrder,
                            flow_name: str) -> GangSpec:
        """The GangSpec of a node agent on another machine (an AWS Batch child node, a
        JobSet's worker pod): its place from its scheduler, its task and attempt from its own
        spin-step options (which spin-step keeps in its click context only), the attempt's
        secret from the run's datastore (attempt_secret.py), what node 0's @checkpoint
        loaded from node 0."""
        place = backend.agent_place(order, os.environ)
        identity = trampoline.agent_identity(self.step_name, internals.command_params(),
                                             place.node)
        gang_id = naming.gang_id(identity.run_id, self.step_name, identity.task_id,
                                 identity.retry_count)
        secret = attempt_secret.fetch(flow_name, identity, self.step_name, gang_id,
                                      order.blueprint.rendezvous_timeout_s)
        spec = trampoline.agent_spec(order, place, identity, internals.top_level_args(),
                                     secret, self._node_devices(),
                                     devices.resolve_start_method(order.blueprint.start_method))
        return spec.with_attempt(checkpoint=checkpoints.from_leader(spec))

    def _local_devices(self) -> Tuple[str, Dict[int, Optional[str]]]:
        """(accelerator, CUDA_VISIBLE_DEVICES per node) for a gang whose nodes share this host."""
        return devices.local_devices(self.step_name, self.topology, devices.visible_gpu_ids(),
                                     _rehearsal(), self.gpus_requested)

    def _node_devices(self) -> str:
        """The accelerator of one node of a gang whose nodes are separate machines."""
        accelerator, hide_gpus = devices.node_devices(
            self.step_name, self.topology, devices.visible_gpu_ids(), _rehearsal(),
            self.gpus_requested)
        if hide_gpus:  # a CPU gang on a GPU node: torch would pick NCCL without a backend
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return accelerator


def _member_step(spec: GangSpec, step_func: Callable[..., Any], decorator_name: str,
                 flow: Any) -> Callable[..., NoReturn]:
    """The step function of a process a gang started (a node agent or an exec'd rank)."""
    from .gang import Agent, run_exec_rank

    topology = Topology(spec.blueprint.nodes, spec.blueprint.nproc_per_node)

    def member_step(*args: Any) -> NoReturn:
        try:
            member_spec = checkpoints.install_member(spec)
            if spec.role is Role.AGENT:
                code = Agent(member_spec, topology).run(step_func, args, decorator_name)
            else:
                code = run_exec_rank(member_spec, topology, step_func, args, flow)
        except Exception as ex:  # the gang's machinery in this member, never the body's
            _present(spec.blueprint.step_name, ex)
            raise
        sys.stdout.flush()
        sys.stderr.flush()
        # Leave now: a member never persists artifacts or writes task metadata.
        os._exit(code)

    return member_step


def _attribute(decorators: Sequence[Any], name: str, attribute: str) -> Any:
    """The attribute of the step's decorator `name` (None without that decorator)."""
    for deco in decorators:
        if deco.name == name:
            return deco.attributes.get(attribute)
    return None


def _raise(ex: BaseException) -> NoReturn:
    raise ex


def _present(step_name: str, ex: BaseException) -> None:
    """Raise `ex`, an error of the gang's own machinery, as one of this package's that names
    its cause (errors.presented), so that Metaflow does not print it as `Internal error`."""
    ours = presented(step_name, ex)
    if ours is not None:
        raise ours from ex


def _require_torch(step_name: str) -> None:
    try:
        import torch.distributed  # noqa: F401
    except ImportError as ex:
        raise TorchDistributedEnvironmentError(
            step_name, "torch is not installed where this task runs (%s). Install torch in the "
            "task's environment: the image for @batch, @pypi/@conda packages, or the Python "
            "you run the flow with." % ex)




def _parallel_step(step_name: str, graph: Any, decorators: Sequence[Any]) -> bool:
    """True for a step of Metaflow's own @parallel: decorated with it, or reached through
    num_parallel. --with torch_distributed leaves such steps alone."""
    return (any(d.name == "parallel" or getattr(d, "IS_PARALLEL", False) for d in decorators)
            or bool(internals.num_parallel_parents(graph, step_name)))


def _reject_parallel(step_name: str, graph: Any, decorators: Sequence[Any]) -> None:
    # num_parallel first: a step reached with it has @parallel too (Metaflow's graph check
    # asks for it), and removing @parallel alone would not help
    reached_by = internals.num_parallel_parents(graph, step_name)
    if reached_by:
        raise _num_parallel_error(step_name, *reached_by[0])
    if any(d.name == "parallel" or getattr(d, "IS_PARALLEL", False) for d in decorators):
        raise TorchDistributedConfigError(
            step_name,
            "it cannot be combined with @parallel (or a decorator built on it, such as "
            "@pytorch_parallel): @torch_distributed starts the gang itself. Remove @parallel.")


def _num_parallel_error(step_name: str, parent: str,
                        num_parallel: Any) -> TorchDistributedConfigError:
    return TorchDistributedConfigError(
        step_name,
        "step *%s* reaches it with self.next(..., num_parallel=%s), Metaflow's own way to "
        "start a gang (with @parallel). @torch_distributed starts the gang itself and infers "
        "its size: write self.next(self.%s) without num_parallel, remove @parallel (or "
        "@pytorch_parallel) from step *%s* if it has one, and size the gang on "
        "@torch_distributed instead: num_parallel=%s becomes nodes=%s."
        % (parent, num_parallel, step_name, step_name, num_parallel, num_parallel))


def check_num_parallel(graph: Any) -> None:
    """Metaflow's graph check: a step of the user's own @torch_distributed reached with
    num_parallel fails here, before Metaflow's own check asks for @parallel on it (a step that
    --with put the decorator on is left to @parallel, see _parallel_step)."""
    for node in graph:
        ours = any(d.name == TorchDistributedDecorator.name and d.statically_defined
                   for d in node.decorators)
        reached_by = internals.num_parallel_parents(graph, node.name) if ours else []
        if reached_by:
            raise _num_parallel_error(node.name, *reached_by[0])


internals.check_graph_before_parallel_lint(check_num_parallel)


def _configured_settings() -> Dict[str, Any]:
    """The METAFLOW_TORCH_DISTRIBUTED_* values settings.resolve reads."""
    from metaflow.metaflow_config import (
        TORCH_DISTRIBUTED_ABORT_GRACE, TORCH_DISTRIBUTED_CARD, TORCH_DISTRIBUTED_CARD_REFRESH,
        TORCH_DISTRIBUTED_FINISH_TIMEOUT,
        TORCH_DISTRIBUTED_HANG_TIMEOUT, TORCH_DISTRIBUTED_HEARTBEAT_TIMEOUT,
        TORCH_DISTRIBUTED_MAX_RESTARTS, TORCH_DISTRIBUTED_PREEMPT_GRACE,
        TORCH_DISTRIBUTED_RENDEZVOUS_TIMEOUT, TORCH_DISTRIBUTED_START_METHOD,
        TORCH_DISTRIBUTED_STRAGGLER_WINDOW)

    return {"RENDEZVOUS_TIMEOUT": TORCH_DISTRIBUTED_RENDEZVOUS_TIMEOUT,
            "FINISH_TIMEOUT": TORCH_DISTRIBUTED_FINISH_TIMEOUT,
            "HEARTBEAT_TIMEOUT": TORCH_DISTRIBUTED_HEARTBEAT_TIMEOUT,
            "ABORT_GRACE": TORCH_DISTRIBUTED_ABORT_GRACE,
            "START_METHOD": TORCH_DISTRIBUTED_START_METHOD,
            "HANG_TIMEOUT": TORCH_DISTRIBUTED_HANG_TIMEOUT,
            "PREEMPT_GRACE": TORCH_DISTRIBUTED_PREEMPT_GRACE,
            "CARD": TORCH_DISTRIBUTED_CARD,
            "CARD_REFRESH": TORCH_DISTRIBUTED_CARD_REFRESH,
            "STRAGGLER_WINDOW": TORCH_DISTRIBUTED_STRAGGLER_WINDOW,
            "MAX_RESTARTS": TORCH_DISTRIBUTED_MAX_RESTARTS}


def _rehearsal() -> bool:
    from metaflow.metaflow_config import TORCH_DISTRIBUTED_CPU_REHEARSAL

    return _truthy(TORCH_DISTRIBUTED_CPU_REHEARSAL)


def _truthy(value: object) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")
