"""The AWS Batch operations the emulator answers itself: JSON bodies in, JSON bodies out.

Job queues and compute environments stay in moto; this module only reads them (through
an injected `lookup_queue`) when a job is submitted.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable

from .batch_describe import describe_job, describe_node, summarize
from .batch_jobs import Job, JobBoard, Node, Queue
from .batch_spec import BatchClientError, plan_nodes, validate_job_definition

FARGATE_PLATFORMS = ("FARGATE", "FARGATE_SPOT")
# AWS DescribeJobs accepts at most 100 job ids per call.
MAX_DESCRIBE = 100


def _reject_unemulated(body: dict, where: str) -> None:
    """Fail loudly on features the emulator does not run, rather than ignore them."""
    attempts = (body.get("retryStrategy") or {}).get("attempts", 1)
    if attempts > 1:
        raise BatchClientError(
            "%s: retryStrategy.attempts=%d is not emulated (only 1 attempt)." % (where, attempts)
        )
    for key in ("dependsOn", "arrayProperties", "eksProperties", "ecsProperties"):
        if body.get(key):
            raise BatchClientError("%s: %s is not emulated." % (where, key))


class BatchApi:
    """Job definitions and jobs. Thread-safe: HTTP handlers and the scheduler share it."""

    def __init__(
        self,
        board: JobBoard,
        lookup_queue: Callable[[str], Queue],
        region: str,
        account_id: str,
    ) -> None:
        self._board = board
        self._lookup_queue = lookup_queue
        self._arn_prefix = "arn:aws:batch:%s:%s" % (region, account_id)
        self._lock = threading.Lock()
        self._definitions: dict[str, list[dict]] = {}
        self.submissions: list[dict] = []
        self.operations: dict[str, Callable[[dict], dict]] = {
            "registerjobdefinition": self.register_job_definition,
            "describejobdefinitions": self.describe_job_definitions,
            "deregisterjobdefinition": self.deregister_job_definition,
            "submitjob": self.submit_job,
            "describejobs": self.describe_jobs,
            "listjobs": self.list_jobs,
            "terminatejob": self.terminate_job,
            "canceljob": self.cancel_job,
        }

    def tick(self) -> None:
        with self._lock:
            self._board.tick()

    def find(self, job_id: str) -> Job:
        with self._lock:
            return self._job(job_id)

    def job_ids(self, job_name: str) -> list[str]:
        """Ids of the jobs submitted under `job_name`, oldest first."""
        with self._lock:
            return [j.job_id for j in self._board.jobs.values() if j.name == job_name]

    # -- job definitions -------------------------------------------------------------

    def register_job_definition(self, body: dict) -> dict:
        validate_job_definition(body)
        _reject_unemulated(body, "job definition %s" % body["jobDefinitionName"])
        name = body["jobDefinitionName"]
        with self._lock:
            revisions = self._definitions.setdefault(name, [])
            revision = len(revisions) + 1
            definition = {
                **copy.deepcopy(body),
                "revision": revision,
                "status": "ACTIVE",
                "jobDefinitionArn": "%s:job-definition/%s:%d" % (self._arn_prefix, name, revision),
            }
            revisions.append(definition)
        return {
            "jobDefinitionName": name,
            "jobDefinitionArn": definition["jobDefinitionArn"],
            "revision": revision,
        }

    def describe_job_definitions(self, body: dict) -> dict:
        with self._lock:
            found = [d for revisions in self._definitions.values() for d in revisions]
        if body.get("jobDefinitions"):
            wanted = set(body["jobDefinitions"])
            found = [
                d
                for d in found
                if {
                    d["jobDefinitionArn"],
                    d["jobDefinitionName"],
                    "%s:%d" % (d["jobDefinitionName"], d["revision"]),
                }
                & wanted
            ]
        if body.get("jobDefinitionName"):
            found = [d for d in found if d["jobDefinitionName"] == body["jobDefinitionName"]]
        if body.get("status"):
            found = [d for d in found if d["status"] == body["status"]]
        return {"jobDefinitions": copy.deepcopy(found)}

    def deregister_job_definition(self, body: dict) -> dict:
        with self._lock:
            self._definition(body["jobDefinition"])["status"] = "INACTIVE"
        return {}

    def _definition(self, ref: str) -> dict:
        """A job definition by ARN, "name:revision", or name (its latest ACTIVE revision)."""
        name, _, revision = ref.split("/")[-1].partition(":")
        revisions = self._definitions.get(name, [])
        if revision:
            matching = [d for d in revisions if str(d["revision"]) == revision]
        else:
            matching = [d for d in revisions if d["status"] == "ACTIVE"][-1:]
        if not matching:
            raise BatchClientError("Job definition %s does not exist." % ref)
        return matching[0]

    # -- jobs ------------------------------------------------------------------------

    def submit_job(self, body: dict) -> dict:
        _reject_unemulated(body, "job %s" % body["jobName"])
        # Reads moto over HTTP, so it happens outside the lock.
        queue = self._lookup_queue(body["jobQueue"])
        with self._lock:
            definition = self._definition(body["jobDefinition"])
            fargate_job = "FARGATE" in definition.get("platformCapabilities", [])
            if fargate_job != (queue.platform in FARGATE_PLATFORMS):
                # Emulator's choice: refuse at once what AWS could never place.
                raise BatchClientError(
                    "Job definition %s (%s) does not match job queue %s (%s)."
                    % (
                        definition["jobDefinitionName"],
                        "FARGATE" if fargate_job else "EC2",
                        queue.name,
                        queue.platform,
                    )
                )
            launches = plan_nodes(definition, body)
            job_id = str(uuid.uuid4())
            job = Job(
                job_id=job_id,
                arn="%s:job/%s" % (self._arn_prefix, job_id),
                name=body["jobName"],
                queue=queue,
                definition=definition,
                submission=copy.deepcopy(body),
                nodes=[Node(launch) for launch in launches],
                multinode=definition["type"] == "multinode",
            )
            self._board.add(job)
            self.submissions.append(copy.deepcopy(body))
        return {"jobArn": job.arn, "jobName": job.name, "jobId": job_id}

    def describe_jobs(self, body: dict) -> dict:
        if len(body["jobs"]) > MAX_DESCRIBE:
            raise BatchClientError("DescribeJobs accepts at most %d job ids." % MAX_DESCRIBE)
        details = []
        with self._lock:
            for ref in body["jobs"]:
                job_id, _, index = ref.partition("#")
                job = self._board.jobs.get(job_id)
                if job is None:
                    # AWS leaves unknown ids out of the answer.
                    continue
                if not index:
                    details.append(describe_job(job))
                elif job.multinode and index.isdigit() and int(index) < len(job.nodes):
                    details.append(describe_node(job, job.nodes[int(index)]))
        return {"jobs": copy.deepcopy(details)}

    def list_jobs(self, body: dict) -> dict:
        if body.get("filters") or body.get("arrayJobId"):
            raise BatchClientError("ListJobs: only jobQueue and multiNodeJobId are emulated.")
        # AWS: without a jobStatus, ListJobs returns RUNNING jobs only.
        status = body.get("jobStatus", "RUNNING")
        with self._lock:
            if body.get("multiNodeJobId"):
                job = self._job(body["multiNodeJobId"])
                details = [describe_node(job, node) for node in job.nodes]
            else:
                ref = body["jobQueue"]
                details = [
                    describe_job(job)
                    for job in self._board.jobs.values()
                    if ref in (job.queue.name, job.queue.arn)
                ]
        return {"jobSummaryList": [summarize(d) for d in details if d["status"] == status]}

    def terminate_job(self, body: dict) -> dict:
        with self._lock:
            self._board.terminate(self._job(body["jobId"]), body["reason"])
        return {}

    def cancel_job(self, body: dict) -> dict:
        with self._lock:
            self._board.cancel(self._job(body["jobId"]), body["reason"])
        return {}

    def _job(self, job_id: str) -> Job:
        job = self._board.jobs.get(job_id)
        if job is None:
            raise BatchClientError("Job %s does not exist." % job_id)
        return job


def upstream_queue_lookup(batch_client) -> Callable[[str], Queue]:
    """Reads job queues and their first compute environment from moto's Batch."""

    def lookup(ref: str) -> Queue:
        queues = batch_client.describe_job_queues(jobQueues=[ref])["jobQueues"]
        if not queues:
            raise BatchClientError("Job queue %s does not exist." % ref)
        queue = queues[0]
        if queue["state"] != "ENABLED" or queue["status"] != "VALID":
            raise BatchClientError(
                "Job queue %s is %s/%s, not ENABLED/VALID." % (ref, queue["state"], queue["status"])
            )
        order = sorted(queue["computeEnvironmentOrder"], key=lambda entry: entry["order"])
        environment = batch_client.describe_compute_environments(
            computeEnvironments=[order[0]["computeEnvironment"]]
        )["computeEnvironments"][0]
        return Queue(
            name=queue["jobQueueName"],
            arn=queue["jobQueueArn"],
            compute_environment=environment["computeEnvironmentName"],
            # Unmanaged environments have no computeResources; they run on EC2.
            platform=environment.get("computeResources", {}).get("type", "EC2"),
        )

    return lookup
