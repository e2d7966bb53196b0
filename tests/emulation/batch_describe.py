"""Job records rendered the way AWS Batch's DescribeJobs and ListJobs return them.

A multinode job is described by its main node (status, reason, times, exit code in
`attempts`) and has `nodeProperties` but no `container`; each node is its own job,
"<job id>#<index>", with `nodeDetails` and a `container`.
"""

from __future__ import annotations

from .batch_jobs import Job, Node
from .hosts import host_address


def _compact(fields: dict) -> dict:
    return {key: value for key, value in fields.items() if value is not None}


def log_stream_name(job: Job, node: Node) -> str:
    # AWS: "<job definition name>/default/<ECS task id>" in log group /aws/batch/job.
    return "%s/default/%s" % (job.definition["jobDefinitionName"], node.task_id)


def _task_arn(job: Job, node: Node) -> str:
    _, partition, _, region, account, _ = job.arn.split(":", 5)
    return "arn:%s:ecs:%s:%s:task/%s" % (partition, region, account, node.task_id)


def _runtime(job: Job, node: Node) -> dict:
    """What the container gets once it has been placed on an instance."""
    if node.started_at is None:
        return _compact({"exitCode": node.exit_code, "reason": node.container_reason})
    return _compact(
        {
            "exitCode": node.exit_code,
            "reason": node.container_reason,
            "taskArn": _task_arn(job, node),
            "logStreamName": log_stream_name(job, node),
            # the node's own address (nodes as hosts), else this host's (hosts.py)
            "networkInterfaces": [{"privateIpv4Address": node.address or host_address()}],
        }
    )


def _attempts(job: Job, node: Node) -> list[dict]:
    # AWS lists an attempt once it has ended; a job that never started has none.
    if node.started_at is None or node.stopped_at is None:
        return []
    return [
        _compact(
            {
                "container": _runtime(job, node),
                "startedAt": node.started_at,
                "stoppedAt": node.stopped_at,
                "statusReason": node.status_reason,
            }
        )
    ]


def _common(job: Job) -> dict:
    return {
        "jobName": job.name,
        "jobQueue": job.queue.arn,
        "createdAt": job.created_at,
        "jobDefinition": job.definition["jobDefinitionArn"],
        "parameters": {
            **job.definition.get("parameters", {}),
            **job.submission.get("parameters", {}),
        },
        "dependsOn": [],
        "tags": job.submission.get("tags", {}),
        "propagateTags": job.submission.get("propagateTags", job.definition.get("propagateTags")),
        "platformCapabilities": job.definition.get("platformCapabilities", ["EC2"]),
        "timeout": job.submission.get("timeout") or job.definition.get("timeout"),
        "isCancelled": job.is_cancelled,
        "isTerminated": job.is_terminated,
    }


def describe_job(job: Job) -> dict:
    main = job.main
    detail = {
        **_common(job),
        "jobArn": job.arn,
        "jobId": job.job_id,
        "status": job.status,
        "statusReason": job.status_reason,
        "startedAt": job.started_at,
        "stoppedAt": job.stopped_at,
        "attempts": _attempts(job, main),
    }
    if job.multinode:
        detail["nodeProperties"] = {
            **job.definition["nodeProperties"],
            "numNodes": len(job.nodes),
        }
    else:
        detail["container"] = {**main.launch.container, **_runtime(job, main)}
    return _compact(detail)


def describe_node(job: Job, node: Node) -> dict:
    return _compact(
        {
            **_common(job),
            "jobArn": "%s#%d" % (job.arn, node.index),
            "jobId": "%s#%d" % (job.job_id, node.index),
            "status": node.status,
            "statusReason": node.status_reason,
            "startedAt": node.started_at,
            "stoppedAt": node.stopped_at,
            "attempts": _attempts(job, node),
            "nodeDetails": {"nodeIndex": node.index, "isMainNode": node.launch.is_main},
            "container": {**node.launch.container, **_runtime(job, node)},
        }
    )


def summarize(detail: dict) -> dict:
    """A ListJobs `JobSummary` from a DescribeJobs `JobDetail`."""
    container = detail.get("container", {})
    summary = {
        key: detail.get(key)
        for key in (
            "jobArn",
            "jobId",
            "jobName",
            "createdAt",
            "status",
            "statusReason",
            "startedAt",
            "stoppedAt",
            "jobDefinition",
        )
    }
    summary["container"] = _compact(
        {"exitCode": container.get("exitCode"), "reason": container.get("reason")}
    )
    if "nodeDetails" in detail:
        summary["nodeProperties"] = detail["nodeDetails"]
    elif "nodeProperties" in detail:
        summary["nodeProperties"] = {"numNodes": detail["nodeProperties"]["numNodes"]}
    return _compact(summary)
