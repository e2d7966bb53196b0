"""The preflight on AWS Batch: the job queue, its compute environments, their security groups,
instance types and the job's IAM role, for each gang step (preflight.py).

`gather` reads the APIs through injected boto3 clients (batch, ec2, iam) and never writes;
`check` is a pure function of what they answered (a `BatchFacts`), tested by tables.
"""

import fnmatch
import json
import re
from dataclasses import dataclass, field
from typing import (Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type,
                    TypeVar, Union)
from urllib.parse import unquote

from ..core.naming import REMOTE_PORT_RANGE
from ..preflight.common import (Finding, GangNeeds, check_image, check_shared_memory, failed,
                                passed, unknown, warned)

# What an AWS API answered (boto3 gives JSON as dicts and lists).
Answer = Dict[str, Any]
# A policy document: a dict, or JSON URL-encoded as IAM's query API returns it.
Document = Union[str, Mapping[str, Any]]
_T = TypeVar("_T")
# ask(key, call): what `call()` answered, or None when it was refused (recorded under `key`).
Ask = Callable[[str, Callable[[], _T]], Optional[_T]]

FARGATE = ("FARGATE", "FARGATE_SPOT")
# Where AWS says that multi-node parallel jobs do not run on Spot compute environments.
SPOT_SOURCE = "docs.aws.amazon.com/batch/latest/userguide/mnp-ce.html"
# instanceTypes keywords that let Batch choose: C, M and R families, none with a GPU.
CHOSEN_BY_BATCH = ("optimal", "default_x86_64", "default_arm64")
ECS_TASKS = "ecs-tasks.amazonaws.com"
# An image in Amazon ECR: account, region, repository, tag, digest.
ECR_IMAGE = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
                       r"([^:@]+)(?::([^@]+))?(?:@(sha256:[0-9a-f]{64}))?$")
ECR_MISSING = ("ImageNotFoundException", "RepositoryNotFoundException")
# What a task does with the S3 datastore (Metaflow's datastore reads, writes and lists).
DATASTORE_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:ListBucket")
# The gang's TCP ports on a node: node 0's store (naming.remote_port) and the ports gloo and
# NCCL listen on, which the kernel chooses (Linux's ephemeral range, 32768-60999 by default).
GANG_PORTS = (REMOTE_PORT_RANGE[0], 65535)


@dataclass
class BatchFacts:
    """What the AWS APIs answered for one step; None where a call was refused (`refused`
    says why, by call)."""

    queue: Optional[Answer] = None
    environments: List[Answer] = field(default_factory=list)
    security_groups: List[Answer] = field(default_factory=list)
    # DescribeInstanceTypes entries of the environments' types
    instance_types: Optional[List[Answer]] = None
    image: Optional[Answer] = None  # ECR's DescribeImages imageDetails entry of the step's image
    role: Optional[Answer] = None  # GetRole's Role
    # policy documents (dicts) attached to or inline in the role
    policies: Optional[List[Document]] = None
    datastore_root: str = ""
    refused: Dict[str, str] = field(default_factory=dict)


# -- the checks (pure) ---------------------------------------------------------------------

def check(needs: GangNeeds, facts: BatchFacts) -> List[Finding]:
    """Every finding for a gang step (`needs`, a GangNeeds) from what the APIs said."""
    findings = check_queue(needs, facts)
    if facts.queue is not None and "environments" in facts.refused:
        findings.append(unknown(needs.step, "compute environment", "the compute environments "
                                "of queue %s could not be read (%s)" % (
                                    needs.options.get("queue"), facts.refused["environments"]),
                                "aws batch describe-compute-environments"))
    elif facts.queue is not None:
        findings += check_environments(needs, facts.environments, facts.instance_types)
        findings += check_security_groups(needs, facts)
        findings += check_open_ingress(needs, facts)
        findings += check_instance_types(needs, facts)
        findings += check_placement(needs, facts)
    findings += check_role(needs, facts)
    findings += check_shared_memory(needs, "batch")
    findings += check_ecr_image(needs, facts)
    findings += check_image(needs, "batch")
    return findings


def check_ecr_image(needs: GangNeeds, facts: BatchFacts) -> List[Finding]:
    """An image in Amazon ECR can be looked up without running it: it must exist, or every
    node fails with CannotPullContainerError."""
    place = ECR_IMAGE.match(needs.image or "")
    if place is None:
        return []
    account, region, repository, tag, digest = place.groups()
    wanted = digest or tag or "latest"
    if "image" in facts.refused:
        return [unknown(needs.step, "image in ECR", "image %s could not be looked up (%s)"
                        % (needs.image, facts.refused["image"]),
                        "aws ecr describe-images --registry-id %s --region %s --repository-name "
                        "%s --image-ids %s=%s" % (account, region, repository,
                                                  "imageDigest" if digest else "imageTag",
                                                  wanted))]
    if facts.image is None:
        return [failed(needs.step, "image in ECR", "image %s is not in ECR (repository %s, %s): "
                       "every node would fail with CannotPullContainerError"
                       % (needs.image, repository, wanted),
                       "push it (docker push %s, after `aws ecr get-login-password --region %s "
                       "| docker login --username AWS --password-stdin %s.dkr.ecr.%s."
                       "amazonaws.com`), or name an existing image in @batch(image=...) or "
                       "METAFLOW_BATCH_CONTAINER_IMAGE" % (needs.image, region, account, region))]
    size = facts.image.get("imageSizeInBytes")
    return [passed(needs.step, "image in ECR", "image %s exists in ECR%s" % (
        needs.image, " (%d MiB compressed)" % (size // 2 ** 20) if size else ""))]


def check_queue(needs: GangNeeds, facts: BatchFacts) -> List[Finding]:
    queue_name = needs.options.get("queue")
    if not queue_name:
        return [failed(needs.step, "job queue", "no job queue is configured",
                       "set METAFLOW_BATCH_JOB_QUEUE (metaflow configure aws) or "
                       "@batch(queue=...); `aws batch describe-job-queues` lists yours")]
    if "queue" in facts.refused:
        return [unknown(needs.step, "job queue", "job queue %s could not be read (%s)"
                        % (queue_name, facts.refused["queue"]),
                        "aws batch describe-job-queues --job-queues %s" % queue_name)]
    queue = facts.queue
    if queue is None:
        return [failed(needs.step, "job queue", "job queue %s does not exist in this region"
                       % queue_name,
                       "create it, or name an existing one in METAFLOW_BATCH_JOB_QUEUE or "
                       "@batch(queue=...); `aws batch describe-job-queues` lists yours")]
    if queue.get("state") != "ENABLED" or queue.get("status") != "VALID":
        fix = ("aws batch update-job-queue --job-queue %s --state ENABLED" % queue_name
               if queue.get("state") != "ENABLED" else
               "see statusReason in `aws batch describe-job-queues --job-queues %s`"
               % queue_name)
        return [failed(needs.step, "job queue", "job queue %s is %s/%s, not ENABLED/VALID (%s)"
                       % (queue_name, queue.get("state"), queue.get("status"),
                          queue.get("statusReason", "")), fix)]
    return [passed(needs.step, "job queue", "job queue %s is ENABLED and VALID" % queue_name)]


def _resources(environment: Mapping[str, Any]) -> Answer:
    return environment.get("computeResources") or {}


def check_environments(needs: GangNeeds, environments: Sequence[Mapping[str, Any]],
                       instance_types: Optional[Iterable[Mapping[str, Any]]] = None
                       ) -> List[Finding]:
    """Each compute environment of the queue: usable, EC2 for a multi-node gang, and one of
    them large enough for all the gang's nodes at once. Each node takes a whole instance, so
    where the instance types are known a node counts the vCPUs of the smallest that holds it
    (`instance_types`: DescribeInstanceTypes entries)."""
    findings: List[Finding] = []
    for env in environments:
        name = env["computeEnvironmentName"]
        if env.get("state") != "ENABLED" or env.get("status") != "VALID":
            findings.append(failed(
                needs.step, "compute environment",
                "compute environment %s is %s/%s, not ENABLED/VALID (%s)"
                % (name, env.get("state"), env.get("status"), env.get("statusReason", "")),
                "aws batch update-compute-environment --compute-environment %s --state ENABLED"
                " (if INVALID, see statusReason in `aws batch describe-compute-environments "
                "--compute-environments %s`)" % (name, name)))
    fargate = [e["computeEnvironmentName"] for e in environments
               if _resources(e).get("type") in FARGATE]
    if needs.nodes > 1 and fargate:
        return findings + [failed(
            needs.step, "compute environment",
            "the gang needs %d nodes, and AWS Batch runs multi-node jobs on EC2 only; compute "
            "environment %s of queue %s is Fargate" % (needs.nodes, ", ".join(fargate),
                                                       needs.options.get("queue")),
            "use a job queue on an EC2 (On-Demand) compute environment: @batch(queue=...) or "
            "METAFLOW_BATCH_JOB_QUEUE; `aws batch create-compute-environment "
            "--compute-resources type=EC2,...` makes one")]
    spot = [e["computeEnvironmentName"] for e in environments
            if _resources(e).get("type") == "SPOT"]
    if needs.nodes > 1 and spot:
        said = ("the gang needs %d nodes, and AWS Batch does not run multi-node parallel jobs "
                "on compute environments that use Spot Instances (%s); compute environment%s "
                "%s of queue %s %s SPOT" % (needs.nodes, SPOT_SOURCE, "s" if len(spot) > 1
                                            else "", ", ".join(spot),
                                            needs.options.get("queue"),
                                            "are" if len(spot) > 1 else "is"))
        fix = ("a job queue on an On-Demand EC2 compute environment (type=EC2): "
               "@batch(queue=...) or METAFLOW_BATCH_JOB_QUEUE; or nodes=1, which Spot can run "
               "(docs/aws-batch.md, 'Spot Instances and multi-node jobs')")
        if len(spot) == len([e for e in environments if _resources(e)]):
            return findings + [failed(needs.step, "compute environment",
                                      said + ": the job would not start", fix)]
        findings.append(warned(needs.step, "compute environment",
                               said + ": only its other compute environments can run the gang",
                               fix))
    managed = [e for e in environments if _resources(e)]
    if not managed:
        return findings + [unknown(
            needs.step, "capacity", "the queue's compute environments are unmanaged: their "
            "instances are yours, so their size is not known here",
            "make sure %d instances with %s each can join the cluster"
            % (needs.nodes, needs.per_node()))]
    fitting = sorted((_vcpus(t), t["InstanceType"]) for t in instance_types or []
                     if _holds(t, needs))
    per_node, shape = ((fitting[0][0], "%d nodes x %s of %d vCPUs" % (
        needs.nodes, fitting[0][1], fitting[0][0])) if fitting else (needs.cpu, needs.describe()))
    wanted = needs.nodes * per_node
    biggest = max(managed, key=lambda e: _resources(e).get("maxvCpus", 0))
    most = _resources(biggest).get("maxvCpus", 0)
    if most < wanted:
        return findings + [failed(
            needs.step, "capacity",
            "the gang needs %g vCPUs at once (%s) but the largest compute environment of "
            "queue %s, %s, allows at most %d: the job would stay RUNNABLE"
            % (wanted, shape, needs.options.get("queue"),
               biggest["computeEnvironmentName"], most),
            "aws batch update-compute-environment --compute-environment %s "
            "--compute-resources maxvCpus=%d" % (biggest["computeEnvironmentName"],
                                                 _round_up(wanted)))]
    return findings + [passed(needs.step, "capacity", "compute environment %s allows %d vCPUs, "
                              "the gang needs %g (%s)" % (biggest["computeEnvironmentName"],
                                                          most, wanted, shape))]


def _round_up(value: float) -> int:
    return int(value) if value == int(value) else int(value) + 1


def requested_types(environments: Iterable[Mapping[str, Any]]) -> List[str]:
    """The instanceTypes of the managed compute environments (types, families, keywords)."""
    return sorted({t for e in environments for t in _resources(e).get("instanceTypes", [])})


def check_instance_types(needs: GangNeeds, facts: BatchFacts) -> List[Finding]:
    """Some instance type of the queue holds one node: its vCPUs, memory and GPUs."""
    requested = requested_types(facts.environments)
    if not requested:
        return []
    explicit = [t for t in requested if t not in CHOSEN_BY_BATCH]
    if not explicit:
        if needs.gpu:
            return [failed(
                needs.step, "instance types",
                "the step asks for %d GPUs per node but queue %s lets Batch choose its "
                "instances (%s), which never have GPUs" % (needs.gpu, needs.options.get("queue"),
                                                           ", ".join(requested)),
                "use a queue whose compute environment has GPU instance types: "
                "`aws batch create-compute-environment --compute-resources "
                "type=EC2,instanceTypes=g5,...` (or p4d, p5, g6), then @batch(queue=...)")]
        return [passed(needs.step, "instance types", "Batch chooses the instances (%s)"
                       % ", ".join(requested))]
    if "instance_types" in facts.refused or facts.instance_types is None:
        return [unknown(needs.step, "instance types", "the sizes of %s could not be read (%s)"
                        % (", ".join(explicit), facts.refused.get("instance_types", "")),
                        "aws ec2 describe-instance-types --filters Name=instance-type,"
                        "Values=%s" % ",".join(_pattern(t) for t in explicit))]
    fits = [t for t in facts.instance_types if _holds(t, needs)]
    if fits:
        return [passed(needs.step, "instance types", "%s holds one node (%s)"
                       % (fits[0]["InstanceType"], needs.per_node()))]
    if needs.gpu and not any(_gpus(t) for t in facts.instance_types):
        what = "has GPUs, and the step asks for %d per node" % needs.gpu
    else:
        what = "is large enough for one node (%s)" % needs.per_node()
    return [failed(needs.step, "instance types",
                   "no instance type of queue %s (%s) %s" % (needs.options.get("queue"),
                                                             ", ".join(explicit), what),
                   "give the compute environment instance types that fit "
                   "(`aws batch update-compute-environment --compute-environment %s "
                   "--compute-resources instanceTypes=...`), or lower @batch/@resources"
                   % _environment_with(facts.environments, explicit))]


def check_placement(needs: GangNeeds, facts: BatchFacts) -> List[Finding]:
    """What each node of the gang would run on: the smallest instance type of the queue that
    holds one node, or the instances AWS Batch chooses (the smoke job says it before it
    starts). Said only where the instance types were checked and fit."""
    requested = requested_types(facts.environments)
    explicit = [t for t in requested if t not in CHOSEN_BY_BATCH]
    if requested and not explicit and not needs.gpu:
        return [passed(needs.step, "placement", "each node on an instance AWS Batch chooses "
                       "(%s: C, M or R families) for %s" % (", ".join(requested),
                                                            needs.per_node()))]
    fits = sorted((_vcpus(t), t.get("MemoryInfo", {}).get("SizeInMiB", 0), t["InstanceType"], t)
                  for t in facts.instance_types or [] if _holds(t, needs))
    if not explicit or not fits:
        return []
    vcpus, memory, name, chosen = fits[0]
    return [passed(needs.step, "placement", "each node on a %s (%d vCPUs, %d MiB, %d GPUs), the "
                   "smallest instance type of queue %s that holds %s" % (
                       name, vcpus, memory, _gpus(chosen), needs.options.get("queue"),
                       needs.per_node()))]


def _pattern(instance_type: str) -> str:
    return instance_type if "." in instance_type else instance_type + ".*"


def instance_type_patterns(environments: Iterable[Mapping[str, Any]]) -> List[str]:
    return [_pattern(t) for t in requested_types(environments) if t not in CHOSEN_BY_BATCH]


def _environment_with(environments: Iterable[Mapping[str, Any]], types: Iterable[str]) -> str:
    return next(e["computeEnvironmentName"] for e in environments
                if set(_resources(e).get("instanceTypes", [])) & set(types))


def _gpus(instance_type: Mapping[str, Any]) -> int:
    return sum(g.get("Count", 0) for g in (instance_type.get("GpuInfo") or {}).get("Gpus", []))


def _vcpus(instance_type: Mapping[str, Any]) -> int:
    return instance_type.get("VCpuInfo", {}).get("DefaultVCpus", 0)


def _holds(instance_type: Mapping[str, Any], needs: GangNeeds) -> bool:
    vcpus = _vcpus(instance_type)
    memory = instance_type.get("MemoryInfo", {}).get("SizeInMiB", 0)
    return vcpus >= needs.cpu and memory >= needs.memory and _gpus(instance_type) >= needs.gpu


def check_security_groups(needs: GangNeeds, facts: BatchFacts) -> List[Finding]:
    """Multi-node jobs need the nodes to reach each other on every port: a security group of
    the compute environment that allows all traffic from itself (in and out)."""
    if needs.nodes == 1:
        return []
    groups = sorted({g for e in facts.environments for g in _resources(e).get(
        "securityGroupIds", [])})
    if not groups:
        return [unknown(needs.step, "security group",
                        "the compute environments name no security group (a launch template's "
                        "or the VPC's default one applies)",
                        "make sure that group allows all traffic from itself: "
                        "`aws ec2 describe-security-groups --group-ids <id>`")]
    if "security_groups" in facts.refused:
        return [unknown(needs.step, "security group", "security groups %s could not be read "
                        "(%s)" % (", ".join(groups), facts.refused["security_groups"]),
                        "aws ec2 describe-security-groups --group-ids %s" % " ".join(groups))]
    if any(_self_rule(g) for g in facts.security_groups):
        found = next(g["GroupId"] for g in facts.security_groups if _self_rule(g))
        return [passed(needs.step, "security group", "%s allows all traffic from itself"
                       % found)]
    group = groups[0]
    found = next((g for g in facts.security_groups if g["GroupId"] == group), {"GroupId": group})
    fixes: List[str] = []
    if not _inbound(found):
        fixes.append("aws ec2 authorize-security-group-ingress --group-id %s --protocol all "
                     "--source-group %s" % (group, group))
    if not _outbound(found):
        fixes.append("aws ec2 authorize-security-group-egress --group-id %s --ip-permissions "
                     "'IpProtocol=-1,UserIdGroupPairs=[{GroupId=%s}]'" % (group, group))
    return [failed(needs.step, "security group",
                   "no security group of the compute environments (%s) allows all traffic "
                   "from itself, in and out, so the gang's nodes cannot reach each other and "
                   "the rendezvous would hang" % ", ".join(groups), "; ".join(fixes))]


def check_open_ingress(needs: GangNeeds, facts: BatchFacts) -> List[Finding]:
    """Only the gang's own nodes should reach its ports: a warning for each source outside the
    compute environments' security groups (a CIDR, a prefix list, another group) that an
    inbound rule of theirs admits on the gang's ports."""
    if needs.nodes == 1:
        return []
    own = {g for e in facts.environments for g in _resources(e).get("securityGroupIds", [])}
    findings = []
    for group in facts.security_groups:
        for permission in group.get("IpPermissions", []):
            if not _reaches_gang_ports(permission):
                continue
            for kind, source in _outsiders(permission, own):
                rule = {key: permission[key] for key in ("IpProtocol", "FromPort", "ToPort")
                        if key in permission}
                rule[kind] = [source]
                findings.append(warned(
                    needs.step, "security group ingress",
                    "security group %s admits %s from %s: that reaches the gang's store and "
                    "gloo's and NCCL's ports (%d-%d) on every node, where only the gang's own "
                    "nodes should" % (group["GroupId"], _ports(permission),
                                      next(iter(source.values())), *GANG_PORTS),
                    "aws ec2 revoke-security-group-ingress --group-id %s --ip-permissions '%s' "
                    "(or give the compute environment a group of the gang's own that allows "
                    "all traffic from itself only)"
                    % (group["GroupId"], json.dumps([rule], separators=(",", ":")))))
    return findings


def _reaches_gang_ports(permission: Mapping[str, Any]) -> bool:
    protocol = str(permission.get("IpProtocol"))
    if protocol == "-1":
        return True
    if protocol not in ("tcp", "6"):
        return False
    return (permission.get("FromPort", 0) <= GANG_PORTS[1]
            and permission.get("ToPort", 65535) >= GANG_PORTS[0])


def _ports(permission: Mapping[str, Any]) -> str:
    if str(permission.get("IpProtocol")) == "-1":
        return "all traffic"
    return "TCP %s-%s" % (permission.get("FromPort"), permission.get("ToPort"))


def _outsiders(permission: Mapping[str, Any],
               own: Iterable[str]) -> List[Tuple[str, Dict[str, str]]]:
    """(the rule's key, its entry) of each source of `permission` outside the groups `own`."""
    keys = (("IpRanges", "CidrIp"), ("Ipv6Ranges", "CidrIpv6"),
            ("PrefixListIds", "PrefixListId"), ("UserIdGroupPairs", "GroupId"))
    return [(kind, {field: entry[field]}) for kind, field in keys
            for entry in permission.get(kind, [])
            if field in entry and not (kind == "UserIdGroupPairs" and entry[field] in own)]


def _allows_all(permission: Mapping[str, Any], group_id: str) -> bool:
    return permission.get("IpProtocol") == "-1" and (
        any(p.get("GroupId") == group_id for p in permission.get("UserIdGroupPairs", []))
        or any(r.get("CidrIp") == "0.0.0.0/0" for r in permission.get("IpRanges", [])))


def _inbound(group: Mapping[str, Any]) -> bool:
    """All traffic in from the group itself."""
    return any(p.get("IpProtocol") == "-1" and any(
        pair.get("GroupId") == group["GroupId"] for pair in p.get("UserIdGroupPairs", []))
        for p in group.get("IpPermissions", []))


def _outbound(group: Mapping[str, Any]) -> bool:
    """All traffic out to the group itself, or anywhere."""
    return any(_allows_all(p, group["GroupId"]) for p in group.get("IpPermissionsEgress", []))


def _self_rule(group: Mapping[str, Any]) -> bool:
    return _inbound(group) and _outbound(group)


def check_role(needs: GangNeeds, facts: BatchFacts) -> List[Finding]:
    """The job's IAM role: it exists, ECS tasks may assume it, and it may read and write the
    S3 datastore (by its own policies: a bucket policy, a boundary or an SCP may still deny)."""
    arn = needs.options.get("iam_role")
    if not arn:
        return [failed(needs.step, "IAM role", "no IAM role is set for the job, so it cannot "
                       "reach the S3 datastore",
                       "set METAFLOW_ECS_S3_ACCESS_IAM_ROLE (metaflow configure aws) or "
                       "@batch(iam_role=...) to a role ECS tasks may assume")]
    name = arn.rsplit("/", 1)[-1]
    if "role" in facts.refused:
        return [unknown(needs.step, "IAM role", "role %s could not be read (%s)"
                        % (name, facts.refused["role"]),
                        "aws iam simulate-principal-policy --policy-source-arn %s "
                        "--action-names %s" % (arn, " ".join(DATASTORE_ACTIONS)))]
    if facts.role is None:
        return [failed(needs.step, "IAM role", "role %s does not exist" % arn,
                       "aws iam get-role --role-name %s; set METAFLOW_ECS_S3_ACCESS_IAM_ROLE "
                       "to an existing role" % name)]
    trust = _document(facts.role.get("AssumeRolePolicyDocument") or {})
    if not _trusts_ecs_tasks(trust):
        return [failed(needs.step, "IAM role", "role %s does not let ECS tasks (%s) assume it"
                       % (name, ECS_TASKS),
                       "aws iam update-assume-role-policy --role-name %s --policy-document "
                       "'{\"Version\":\"2012-10-17\",\"Statement\":[{\"Effect\":\"Allow\","
                       "\"Principal\":{\"Service\":\"%s\"},\"Action\":\"sts:AssumeRole\"}]}'"
                       % (name, ECS_TASKS))]
    bucket, prefix = _s3_place(facts.datastore_root)
    if not bucket:
        return [passed(needs.step, "IAM role", "role %s may be assumed by ECS tasks" % name)]
    objects = "arn:aws:s3:::%s/%s*" % (bucket, prefix + "/" if prefix else "")
    wanted = {"s3:GetObject": objects, "s3:PutObject": objects,
              "s3:ListBucket": "arn:aws:s3:::%s" % bucket}
    missing = [a for a, resource in wanted.items()
               if not _allowed(facts.policies or [], a, resource)]
    if missing:
        return [failed(needs.step, "IAM role",
                       "role %s is not allowed %s on the datastore %s by its policies"
                       % (name, ", ".join(missing), facts.datastore_root),
                       "aws iam put-role-policy --role-name %s --policy-name metaflow-datastore "
                       "--policy-document '%s'" % (name, json.dumps(_policy(wanted))))]
    return [passed(needs.step, "IAM role", "role %s may be assumed by ECS tasks and may read "
                   "and write %s" % (name, facts.datastore_root))]


def _policy(wanted: Mapping[str, str]) -> Answer:
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": [a], "Resource": r} for a, r in wanted.items()]}


def _document(doc: Document) -> Mapping[str, Any]:
    """A policy document: IAM returns it URL-encoded (query API) or as JSON (boto3 decodes)."""
    if isinstance(doc, str):
        return json.loads(unquote(doc))
    return doc


def _listed(value: Any) -> List[Any]:
    return value if isinstance(value, list) else [value]


def _statements(doc: Document) -> List[Any]:
    return _listed(_document(doc).get("Statement", []))


def _trusts_ecs_tasks(doc: Document) -> bool:
    return any(s.get("Effect") == "Allow" and "sts:AssumeRole" in _listed(s.get("Action", []))
               and ECS_TASKS in _listed((s.get("Principal") or {}).get("Service", []))
               for s in _statements(doc))


def _matches(patterns: Union[str, List[str]], value: str) -> bool:
    return any(fnmatch.fnmatchcase(value.lower(), p.lower()) for p in _listed(patterns))


def _allowed(policies: Iterable[Document], action: str, resource: str) -> bool:
    """Whether the role's own policies allow `action` on `resource`: some Allow matches and no
    Deny does (conditions are not evaluated)."""
    def matching(effect: str) -> bool:
        return any(s.get("Effect") == effect and _matches(s.get("Action", []), action)
                   and _matches(s.get("Resource", []), resource)
                   for doc in policies for s in _statements(doc))

    return matching("Allow") and not matching("Deny")


def _s3_place(root: str) -> Tuple[str, str]:
    if not root.startswith("s3://"):
        return "", ""
    bucket, _, prefix = root[len("s3://"):].partition("/")
    return bucket, prefix.strip("/")


# -- what the APIs answer (read only) -----------------------------------------------------------

def _refusal(error: Exception) -> str:
    """The code and message of a boto3 ClientError (no permission, throttled, ...)."""
    info = getattr(error, "response", {}).get("Error", {})
    return "%s: %s" % (info.get("Code", type(error).__name__), info.get("Message", error))


def gather(needs: GangNeeds, clients: Callable[..., Any], datastore_root: str,
           client_error: Type[Exception]) -> BatchFacts:
    """The BatchFacts of a step from the AWS APIs. `clients(service)` gives a boto3 client
    (Metaflow's own credentials); `client_error` is botocore's ClientError class: a refused
    call is recorded in `refused`, never raised."""
    facts = BatchFacts(datastore_root=datastore_root)

    def ask(key: str, call: Callable[[], _T]) -> Optional[_T]:
        try:
            return call()
        except client_error as error:
            facts.refused[key] = _refusal(error)
            return None

    queue_name = needs.options.get("queue")
    if queue_name:
        queues = ask("queue", lambda: clients("batch").describe_job_queues(
            jobQueues=[queue_name])["jobQueues"])
        facts.queue = queues[0] if queues else None
    if facts.queue is not None:
        arns = [e["computeEnvironment"] for e in sorted(
            facts.queue.get("computeEnvironmentOrder", []), key=lambda e: e["order"])]
        facts.environments = ask("environments", lambda: clients(
            "batch").describe_compute_environments(
                computeEnvironments=arns)["computeEnvironments"]) or []
        groups = sorted({g for e in facts.environments
                         for g in _resources(e).get("securityGroupIds", [])})
        if groups and needs.nodes > 1:
            facts.security_groups = ask("security_groups", lambda: clients(
                "ec2").describe_security_groups(GroupIds=groups)["SecurityGroups"]) or []
        patterns = instance_type_patterns(facts.environments)
        if patterns:
            facts.instance_types = ask("instance_types", lambda: _instance_types(
                clients("ec2"), patterns))
    place = ECR_IMAGE.match(needs.image or "")
    if place is not None:
        facts.image = _ecr_image(clients, place.groups(), client_error, facts)
    role_arn = needs.options.get("iam_role")
    if role_arn:
        _gather_role(facts, clients("iam"), role_arn.rsplit("/", 1)[-1], client_error, ask)
    return facts


def _ecr_image(clients: Callable[..., Any], place: Sequence[Optional[str]],
               client_error: Type[Exception], facts: BatchFacts) -> Optional[Answer]:
    account, region, repository, tag, digest = place
    image = {"imageDigest": digest} if digest else {"imageTag": tag or "latest"}
    try:
        found = clients("ecr", region).describe_images(
            registryId=account, repositoryName=repository, imageIds=[image])["imageDetails"]
    except client_error as error:
        if getattr(error, "response", {}).get("Error", {}).get("Code") not in ECR_MISSING:
            facts.refused["image"] = _refusal(error)
        return None
    return found[0] if found else None


def _instance_types(ec2: Any, patterns: List[str]) -> List[Answer]:
    pages = ec2.get_paginator("describe_instance_types").paginate(
        Filters=[{"Name": "instance-type", "Values": patterns}])
    return [t for page in pages for t in page["InstanceTypes"]]


def _gather_role(facts: BatchFacts, iam: Any, name: str, client_error: Type[Exception],
                 ask: Ask[List[Document]]) -> None:
    try:
        facts.role = iam.get_role(RoleName=name)["Role"]
    except client_error as error:
        if getattr(error, "response", {}).get("Error", {}).get("Code") != "NoSuchEntity":
            facts.refused["role"] = _refusal(error)
        return

    def documents() -> List[Document]:
        found: List[Document] = []
        for page in iam.get_paginator("list_attached_role_policies").paginate(RoleName=name):
            for attached in page["AttachedPolicies"]:
                policy = iam.get_policy(PolicyArn=attached["PolicyArn"])["Policy"]
                found.append(iam.get_policy_version(
                    PolicyArn=attached["PolicyArn"],
                    VersionId=policy["DefaultVersionId"])["PolicyVersion"]["Document"])
        for page in iam.get_paginator("list_role_policies").paginate(RoleName=name):
            for policy_name in page["PolicyNames"]:
                found.append(iam.get_role_policy(RoleName=name, PolicyName=policy_name)[
                    "PolicyDocument"])
        return found

    facts.policies = ask("role", documents)
