"""The gang's records (core/gangspec.py) for tests: each field a plain default, any overridden."""

import dataclasses

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import (
    Attempt,
    Blueprint,
    GangSpec,
    Role,
    TaskIdentity,
)

IDENTITY = TaskIdentity(run_id="1700", task_id="5", input_paths="1700/start/1", split_index=None,
                        retry_count=0, max_user_code_retries=0, namespace=None,
                        orig_datastore="local@/data/.metaflow")


def blueprint(**changes):
    fields = dict(step_name="train", nodes=2, nproc_per_node=2, rendezvous_timeout_s=300.0,
                  finish_timeout_s=300.0, start_method="auto", heartbeat_timeout_s=30.0,
                  hang_timeout_s=None, preempt_grace_s=25.0, max_restarts=0,
                  group_check_default="error")
    fields.update(changes)
    return Blueprint(**fields)


def attempt(**changes):
    fields = dict(gang_id="1700-train-5-0", task=IDENTITY, backend="local",
                  master_addr="127.0.0.1", master_port=29500, secret="s" * 64, top_args=())
    fields.update(changes)
    return Attempt(**fields)


def spec(blueprint_changes=None, attempt_changes=None, **changes):
    fields = dict(role=Role.AGENT, blueprint=blueprint(**(blueprint_changes or {})),
                  attempt=attempt(**(attempt_changes or {})), node=1, work_dir="/tmp/td",
                  accelerator="cpu", start_method="fork")
    fields.update(changes)
    return GangSpec(**fields)


replace = dataclasses.replace


def leader(topology, blueprint_changes=None, **attempt_changes):
    """gang.Leader of a gang of `topology` (nothing started)."""
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import Leader

    return Leader(blueprint(nodes=topology.nodes, nproc_per_node=topology.nproc_per_node,
                            **(blueprint_changes or {})),
                  topology, attempt(**attempt_changes), "cpu", "fork", 1.0, "torch_distributed")


def gang_step(decorators=(), graph=None, rehearsal=False, **blueprint_changes):
    """backends.base.GangStep of a step whose decorators are named `decorators`."""
    from types import SimpleNamespace

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends.base import \
        GangStep
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import \
        Topology

    plan = blueprint(**blueprint_changes)
    return GangStep(plan, Topology(plan.nodes, plan.nproc_per_node), "torch_distributed",
                    [SimpleNamespace(name=n, attributes={}) for n in decorators], graph,
                    rehearsal)
