"""What Metaflow itself needs before any gang runs on AWS Batch (its own AWS configuration),
and where each value the preflight checks came from.

The preflight is run first on a machine where `metaflow configure aws` may never have run: it
says what Metaflow lacks and how to get it before the checks of each gang step. Pure: the
settings come from `setting(name) -> (value, source)` (internals.metaflow_setting) and the
attributes a user gave a decorator from `given(deco)` (internals.user_attributes).
"""

import platform
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from ..preflight.common import Finding, GangNeeds, failed, passed, warned

Setting = Callable[[str], Tuple[Any, str]]
Given = Callable[[Any], Any]

# The section of the report that is Metaflow's, not a step's.
METAFLOW = "Metaflow's AWS configuration"
CONFIGURE = "metaflow configure aws (it asks for each and writes ~/.metaflowconfig/config.json)"
# @batch attributes whose default is a Metaflow setting.
BATCH_SETTINGS = {"queue": "BATCH_JOB_QUEUE", "iam_role": "ECS_S3_ACCESS_IAM_ROLE",
                  "image": "BATCH_CONTAINER_IMAGE"}


def metaflow_findings(setting: Setting, datastore_type: str, noted: Sequence[str],
                      steps_give: Mapping[str, bool],
                      credentials: Optional[str], region: Optional[str]) -> List[Finding]:
    """What Metaflow needs to run `--with batch` at all: the S3 datastore and its root, a job
    queue and a job role (unless every gang step names its own: `steps_give`), AWS credentials
    (`credentials`: how boto3 found them, None without) and a region."""
    findings: List[Finding] = []
    kind, kind_source = setting("DEFAULT_DATASTORE")
    if datastore_type == "s3" and not any(n.startswith("datastore") for n in noted):
        findings.append(passed(METAFLOW, "datastore", "S3 (%s)" % (
            kind_source if kind == "s3" else "--datastore=s3 on the command line")))
    else:
        findings.append(failed(
            METAFLOW, "datastore", "Metaflow's datastore here is %s (%s), and @batch needs the "
            "S3 datastore: `run --with batch` would stop with `The @batch decorator requires "
            "--datastore=s3.`" % (datastore_type, kind_source),
            "%s, or export METAFLOW_DEFAULT_DATASTORE=s3 with the root below" % CONFIGURE))
    root, root_source = setting("DATASTORE_SYSROOT_S3")
    if root:
        findings.append(passed(METAFLOW, "datastore root", "%s (%s)" % (root, root_source)))
    else:
        findings.append(failed(
            METAFLOW, "datastore root", "no S3 datastore root (%s): Metaflow keeps every run's "
            "code package, artifacts and logs there, and the nodes read them from it"
            % root_source,
            "%s, or export METAFLOW_DATASTORE_SYSROOT_S3=s3://<bucket>/metaflow" % CONFIGURE))
    for check, name, attribute, what in (
            ("job queue", "BATCH_JOB_QUEUE", "queue", "the AWS Batch job queue the gang's "
             "job goes to"),
            ("IAM role", "ECS_S3_ACCESS_IAM_ROLE", "iam_role", "the role the job's "
             "containers run as, to reach the S3 datastore")):
        value, source = setting(name)
        if value:
            findings.append(passed(METAFLOW, check, "%s (%s)" % (value, source)))
        elif steps_give.get(attribute):
            findings.append(passed(METAFLOW, check, "none (%s); every gang step names its own "
                                   "with @batch(%s=...)" % (source, attribute)))
        else:
            findings.append(failed(
                METAFLOW, check, "none: %s (%s)" % (what, source),
                "%s, or export METAFLOW_%s=..." % (CONFIGURE, name)))
    if credentials is None:
        findings.append(failed(
            METAFLOW, "AWS credentials", "boto3 found none, so nothing of the account can be "
            "read and the account's checks below are skipped",
            "aws configure (or AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), "
            "the credentials `run --with batch` will use"))
    else:
        findings.append(passed(METAFLOW, "AWS credentials", "found (%s)" % credentials))
    if region:
        findings.append(passed(METAFLOW, "AWS region", region))
    else:
        findings.append(failed(METAFLOW, "AWS region", "none configured",
                               "aws configure, or export AWS_DEFAULT_REGION=<region>"))
    return findings


def _decorator(decorators: Sequence[Any], name: str) -> Optional[Any]:
    return next((d for d in decorators if d.name == name), None)


def source_of(attribute: str, decorators: Sequence[Any], given: Given,
              setting: Setting) -> str:
    """Where the @batch `attribute` of a step came from."""
    batch = _decorator(decorators, "batch")
    value = batch.attributes.get(attribute) if batch is not None else None
    if batch is not None and attribute in given(batch):
        return "@batch(%s=%r)" % (attribute, value)
    resources = _decorator(decorators, "resources")
    if resources is not None and attribute in given(resources):
        return "@resources(%s=%r)" % (attribute, resources.attributes.get(attribute))
    name = BATCH_SETTINGS.get(attribute)
    if name is not None:
        found, source = setting(name)
        if found:
            return source
    if attribute in ("queue", "iam_role"):
        return "not set: neither @batch(%s=...) nor METAFLOW_%s names one" % (attribute, name)
    if attribute == "image":
        version = platform.python_version_tuple()
        return ("Metaflow's default for @batch: python:%s.%s, the version of the Python that "
                "launches the flow; neither @batch(image=...) nor METAFLOW_BATCH_CONTAINER_IMAGE"
                " names one" % (version[0], version[1]))
    return "Metaflow's default for @batch(%s=...)" % attribute


def value_lines(needs: GangNeeds, decorators: Sequence[Any], given: Given, setting: Setting,
                datastore_root: str) -> List[str]:
    """Every value the checks of a step read, each with where it came from."""
    options = needs.options
    ours = _decorator(decorators, "torch_distributed")
    nproc = ours.attributes.get("nproc_per_node") if ours is not None else None
    lines = ["job queue: %s (%s)" % (options.get("queue") or "none",
                                      source_of("queue", decorators, given, setting)),
             "IAM role: %s (%s)" % (options.get("iam_role") or "none",
                                    source_of("iam_role", decorators, given, setting)),
             "image: %s (%s)" % (needs.image or "none",
                                 source_of("image", decorators, given, setting)),
             "datastore root: %s" % (datastore_root or "none (see Metaflow's AWS "
                                                        "configuration above)")]
    for attribute, shown in (("cpu", "%g vCPUs" % needs.cpu),
                             ("memory", "%d MiB" % needs.memory),
                             ("gpu", "%d GPUs" % needs.gpu)):
        lines.append("per node %s: %s (%s)" % (attribute, shown, source_of(
            attribute, decorators, given, setting)))
    lines.append("processes per node: %d (%s)" % (
        needs.nproc_per_node, "@torch_distributed(nproc_per_node=%r)" % (nproc,)
        if nproc is not None else "planned by @torch_distributed from its GPUs, world_size or "
        "nodes"))
    return lines


def check_node_size(needs: GangNeeds) -> List[Finding]:
    """A CPU gang that runs more processes on a node than the vCPUs it asks for: they share
    them (a warning: it runs, slower)."""
    if not needs.backend or needs.gpu or needs.nproc_per_node <= needs.cpu:
        return []
    return [warned(needs.step, "node size", "each node runs %d processes on the %g vCPUs it asks "
                   "for, so they share them" % (needs.nproc_per_node, needs.cpu),
                   ("@torch_slurm(cpu=%d), or fewer processes per node" % needs.nproc_per_node
                    if needs.backend == "torch_slurm" else
                    "@%s(cpu=%d) or @resources(cpu=%d), or fewer processes per node"
                    % (needs.backend, needs.nproc_per_node, needs.nproc_per_node)))]
