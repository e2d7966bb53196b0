"""What AWS Batch would run: job definitions and submissions turned into per-node launches.

Pure functions of the JSON that boto3 sends, so the rules are testable by tables. The
emulator validates requests here and raises `BatchClientError` where AWS Batch answers
HTTP 400 `ClientException`.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

# AWS Batch reserves this prefix for the variables it injects into containers.
RESERVED_ENV_PREFIX = "AWS_BATCH"

_TARGET_NODES = re.compile(r"^(\d*):(\d*)$")


class BatchClientError(Exception):
    """A request that AWS Batch rejects with HTTP 400 `ClientException`."""


@dataclass(frozen=True)
class NodeRange:
    """`targetNodes` such as "0:0", "1:3", "1:" or ":3"; `last` None means open-ended."""

    first: int
    last: int | None

    @property
    def is_open(self) -> bool:
        return self.last is None

    def indices(self, num_nodes: int) -> range:
        last = num_nodes - 1 if self.last is None else self.last
        return range(self.first, last + 1)


@dataclass(frozen=True)
class NodeLaunch:
    """One container to run: a single-node job has one, a multinode job one per node."""

    index: int
    is_main: bool
    container: dict

    @property
    def command(self) -> list[str]:
        return list(self.container.get("command", []))

    @property
    def environment(self) -> dict[str, str]:
        return environment_dict(self.container.get("environment", []))


def parse_target_nodes(spec: str) -> NodeRange:
    """AWS: an omitted start means 0, an omitted end means the highest node index."""
    match = _TARGET_NODES.match(spec)
    if match is None:
        raise BatchClientError(
            "targetNodes %r is not a node range such as '0:3', '1:' or ':3'." % spec
        )
    first = int(match.group(1)) if match.group(1) else 0
    last = int(match.group(2)) if match.group(2) else None
    if last is not None and last < first:
        raise BatchClientError("targetNodes %r ends before it starts." % spec)
    return NodeRange(first, last)


def environment_dict(entries: list[dict]) -> dict[str, str]:
    return {entry["name"]: entry["value"] for entry in entries}


def merge_container(container: dict, overrides: dict | None) -> dict:
    """Apply `containerOverrides`: command replaces, environment merges by name."""
    merged = copy.deepcopy(container)
    if not overrides:
        return merged
    if overrides.get("command"):
        merged["command"] = list(overrides["command"])
    if "environment" in overrides:
        env = environment_dict(merged.get("environment", []))
        env.update(environment_dict(overrides["environment"]))
        merged["environment"] = [{"name": k, "value": v} for k, v in env.items()]
    if "resourceRequirements" in overrides:
        kinds = {r["type"]: r for r in merged.get("resourceRequirements", [])}
        kinds.update({r["type"]: r for r in overrides["resourceRequirements"]})
        merged["resourceRequirements"] = list(kinds.values())
    for key in ("instanceType", "vcpus", "memory"):
        if key in overrides:
            merged[key] = overrides[key]
    return merged


def _check_environment(container: dict, where: str) -> None:
    for name in environment_dict(container.get("environment", [])):
        if name.startswith(RESERVED_ENV_PREFIX):
            raise BatchClientError(
                "%s: environment variable %s uses the reserved prefix %s."
                % (where, name, RESERVED_ENV_PREFIX)
            )


def _check_bounds(node_range: NodeRange, num_nodes: int, where: str) -> None:
    if node_range.first >= num_nodes or node_range.indices(num_nodes).stop > num_nodes:
        raise BatchClientError(
            "%s: targetNodes %s:%s is outside 0:%d."
            % (
                where,
                node_range.first,
                "" if node_range.is_open else node_range.last,
                num_nodes - 1,
            )
        )


def _check_node_ranges(ranges: list[NodeRange], num_nodes: int, where: str) -> None:
    covered = set()
    for node_range in ranges:
        _check_bounds(node_range, num_nodes, where)
        covered.update(node_range.indices(num_nodes))
    missing = sorted(set(range(num_nodes)) - covered)
    if missing:
        raise BatchClientError(
            "%s: node ranges must cover every node; nodes %s are not covered." % (where, missing)
        )


def validate_job_definition(body: dict) -> None:
    """The RegisterJobDefinition checks AWS Batch makes that matter to the emulator."""
    kind = body.get("type")
    where = "job definition %s" % body.get("jobDefinitionName")
    if kind == "container":
        if "containerProperties" not in body:
            raise BatchClientError("%s: containerProperties is required." % where)
        _check_environment(body["containerProperties"], where)
        return
    if kind != "multinode":
        raise BatchClientError(
            "%s: the emulator supports type 'container' or 'multinode', not %r." % (where, kind)
        )
    if "FARGATE" in body.get("platformCapabilities", []):
        raise BatchClientError("%s: multi-node parallel jobs are not supported on Fargate." % where)
    properties = body.get("nodeProperties")
    if not properties:
        raise BatchClientError("%s: nodeProperties is required." % where)
    num_nodes = properties["numNodes"]
    if not 0 <= properties["mainNode"] < num_nodes:
        raise BatchClientError(
            "%s: mainNode %d is not below numNodes %d." % (where, properties["mainNode"], num_nodes)
        )
    ranges = properties["nodeRangeProperties"]
    _check_node_ranges([parse_target_nodes(r["targetNodes"]) for r in ranges], num_nodes, where)
    for node_range in ranges:
        _check_environment(node_range.get("container", {}), where)


def submitted_num_nodes(definition: dict, node_overrides: dict | None) -> int:
    """AWS: an override of numNodes needs an open-ended range (":" or "n:") to grow into."""
    properties = definition["nodeProperties"]
    if not node_overrides or "numNodes" not in node_overrides:
        return properties["numNodes"]
    ranges = [parse_target_nodes(r["targetNodes"]) for r in properties["nodeRangeProperties"]]
    if not any(r.is_open for r in ranges):
        raise BatchClientError(
            "nodeOverrides.numNodes needs a node range with an open upper bound "
            "(such as '1:') in job definition %s." % definition["jobDefinitionName"]
        )
    return node_overrides["numNodes"]


def _container_for_node(ranges: list[dict], index: int, num_nodes: int) -> dict:
    """AWS: nested ranges are allowed and the narrower range wins (4:5 inside 0:10)."""
    spans = [parse_target_nodes(r["targetNodes"]).indices(num_nodes) for r in ranges]
    narrowest = min(
        (position for position, span in enumerate(spans) if index in span),
        key=lambda position: len(spans[position]),
    )
    return ranges[narrowest]["container"]


def plan_nodes(definition: dict, submission: dict) -> list[NodeLaunch]:
    """The containers a SubmitJob request runs, with its overrides applied."""
    name = definition["jobDefinitionName"]
    if definition["type"] == "container":
        if submission.get("nodeOverrides"):
            raise BatchClientError(
                "nodeOverrides apply to multinode jobs only; %s is a container job." % name
            )
        container = merge_container(
            definition["containerProperties"], submission.get("containerOverrides")
        )
        _check_environment(container, "containerOverrides")
        return [NodeLaunch(index=0, is_main=True, container=container)]

    if submission.get("containerOverrides"):
        raise BatchClientError(
            "containerOverrides cannot be used with multinode job definition %s; "
            "use nodeOverrides.nodePropertyOverrides." % name
        )
    node_overrides = submission.get("nodeOverrides") or {}
    num_nodes = submitted_num_nodes(definition, node_overrides)
    ranges = definition["nodeProperties"]["nodeRangeProperties"]
    _check_node_ranges([parse_target_nodes(r["targetNodes"]) for r in ranges], num_nodes, name)
    overrides = node_overrides.get("nodePropertyOverrides", [])
    override_ranges = [parse_target_nodes(o["targetNodes"]) for o in overrides]
    for override_range in override_ranges:
        _check_bounds(override_range, num_nodes, "nodeOverrides")

    main_node = definition["nodeProperties"]["mainNode"]
    launches = []
    for index in range(num_nodes):
        container = copy.deepcopy(_container_for_node(ranges, index, num_nodes))
        # Overrides whose range holds this node apply in request order.
        for override, override_range in zip(overrides, override_ranges, strict=True):
            if index in override_range.indices(num_nodes):
                container = merge_container(container, override.get("containerOverrides"))
        _check_environment(container, "nodeOverrides")
        launches.append(NodeLaunch(index=index, is_main=index == main_node, container=container))
    return launches


@dataclass(frozen=True)
class Placement:
    """Where a job runs: AWS Batch tells the container through AWS_BATCH_* variables."""

    job_id: str
    queue_name: str
    compute_environment: str
    attempt: int
    num_nodes: int | None
    main_node: int | None
    main_node_address: str


def injected_environment(placement: Placement, launch: NodeLaunch) -> dict[str, str]:
    """The variables AWS Batch adds to every container (and, for nodes, the node layout)."""
    env = {
        "AWS_BATCH_JOB_ID": placement.job_id,
        "AWS_BATCH_JQ_NAME": placement.queue_name,
        "AWS_BATCH_CE_NAME": placement.compute_environment,
        "AWS_BATCH_JOB_ATTEMPT": str(placement.attempt),
        # ECS on EC2 sets this; Metaflow's @batch task_pre_step reads it unconditionally.
        "AWS_EXECUTION_ENV": "AWS_ECS_EC2",
    }
    if placement.num_nodes is None:
        return env
    # On nodes the job id is "<job id>#<node index>".
    env["AWS_BATCH_JOB_ID"] = "%s#%d" % (placement.job_id, launch.index)
    env["AWS_BATCH_JOB_NODE_INDEX"] = str(launch.index)
    env["AWS_BATCH_JOB_NUM_NODES"] = str(placement.num_nodes)
    env["AWS_BATCH_JOB_MAIN_NODE_INDEX"] = str(placement.main_node)
    if not launch.is_main:
        # AWS sets the main node's address on child nodes only.
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = placement.main_node_address
    return env
