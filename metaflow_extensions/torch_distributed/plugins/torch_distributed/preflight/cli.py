"""`python flow.py --with batch torch-distributed preflight` (or `--with kubernetes`): the
preflight of every gang step of the flow (preflight.py), a command of Metaflow's CLI.

Metaflow initialises the step decorators of any command but run and resume (their step_init
runs, the top-level --with included), so each gang step's topology and its @batch or
@kubernetes attributes are those `run` would use. The command only reads the APIs, and exits
non-zero when a check fails.
"""

import os
from types import ModuleType
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type

from ..backends.slurm import run_login, ssh_words
from ..mf import internals
from ..preflight import (
    common as preflight,
    batch as preflight_batch,
    config as preflight_config,
    early,
    kubernetes as preflight_kubernetes,
    slurm as preflight_slurm,
    smoke as preflight_smoke,
)
from ..core.errors import TorchDistributedPreflightFailed
from ..core.topology import Topology

click = internals.cli_click()


# A backend's findings for a gang step: (its needs, the datastore's root) -> findings.
BackendFindings = Callable[[preflight.GangNeeds, str], List[preflight.Finding]]


def gang_steps(steps: Iterable[Tuple[str, Sequence[Any]]]
               ) -> List[Tuple[str, Topology, Sequence[Any]]]:
    """(step name, its topology, its decorators) of every step our decorator gangs."""
    found: List[Tuple[str, Topology, Sequence[Any]]] = []
    for name, decorators in steps:
        ours = [d for d in decorators if d.name == "torch_distributed"]
        if ours and getattr(ours[0], "active", False):
            found.append((name, ours[0].topology, decorators))
    return found


def batch_findings(needs: preflight.GangNeeds, datastore_root: str,
                   clients: Callable[..., Any] = internals.aws_client) -> List[preflight.Finding]:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        facts = preflight_batch.gather(needs, clients, datastore_root, ClientError)
    except BotoCoreError as ex:  # no credentials, no region, no connection: nothing was read
        raise TorchDistributedPreflightFailed([needs.step], "AWS could not be reached (%s: "
                                              "%s). Give this shell the credentials and region "
                                              "`run --with batch` uses (aws configure, "
                                              "AWS_PROFILE, AWS_DEFAULT_REGION)."
                                              % (type(ex).__name__, ex)) from ex
    return preflight_batch.check(needs, facts)


def kubernetes_findings(needs: preflight.GangNeeds, datastore_root: str,
                        client: Optional[ModuleType] = None,
                        api: Optional[object] = None) -> List[preflight.Finding]:
    from urllib3.exceptions import HTTPError

    try:
        client = internals.kubernetes_client() if client is None else client
        facts = preflight_kubernetes.gather(
            needs, client, client.ApiClient() if api is None else api, client.ApiException)
    except (HTTPError, OSError, _config_error()) as ex:  # no kubeconfig, no connection
        raise TorchDistributedPreflightFailed([needs.step], "the Kubernetes API could not be "
                                              "reached (%s: %s). Point KUBECONFIG (or "
                                              "~/.kube/config) at the cluster `run --with "
                                              "kubernetes` uses; `kubectl get ns` must work."
                                              % (type(ex).__name__, ex)) from ex
    return preflight_kubernetes.check(needs, facts)


def slurm_findings(needs: preflight.GangNeeds, datastore_root: str,
                   run: Callable[[List[str]], str] = run_login
                   ) -> List[preflight.Finding]:
    facts = preflight_slurm.gather(run, " ".join(ssh_words(os.environ)))
    return preflight_slurm.check(needs, facts, datastore_root)


def _config_error() -> Type[Exception]:
    from kubernetes.config import ConfigException

    return ConfigException


BACKEND_NAMES = {"batch": "AWS Batch", "kubernetes": "Kubernetes", "torch_slurm": "Slurm"}
BACKENDS: Dict[str, BackendFindings] = {"batch": batch_findings,
                                        "kubernetes": kubernetes_findings,
                                        "torch_slurm": slurm_findings}


# The values a step's checks read, each with its source: (needs, decorators) -> lines.
ValueLines = Callable[[preflight.GangNeeds, Sequence[Any]], List[str]]
# Runs the smoke job of a step: (needs, where its nodes would run) -> findings.
Smoke = Callable[[preflight.GangNeeds, str], List[preflight.Finding]]


def run_preflight(steps: Iterable[Tuple[str, Sequence[Any]]], datastore_root: str,
                  echo: Callable[[str], object],
                  backends: Optional[Mapping[str, BackendFindings]] = None,
                  smoke: Optional[Smoke] = None,
                  first: Sequence[preflight.Finding] = (),
                  values: Optional[ValueLines] = None,
                  offline: Sequence[str] = ()) -> List[preflight.Finding]:
    """Every finding of the flow's gang steps, echoed as a report; raises when one failed.
    `first` (what Metaflow itself lacks) is said before any step; `values` gives the lines
    that say what each step's checks read and where it came from; the steps of a backend in
    `offline` (no credentials) get only the checks that need no API. `smoke(needs,
    placement)`, when given, runs the smoke job of each gang step whose checks all passed
    and returns its findings."""
    backends = BACKENDS if backends is None else backends
    gangs = gang_steps(steps)
    if not gangs:
        raise TorchDistributedPreflightFailed(
            [], "the flow has no step decorated with @torch_distributed, so there is nothing "
            "to check. Decorate the step that trains, or run the preflight of another flow.")
    findings: List[preflight.Finding] = list(first)
    for line in preflight.report_lines(first):
        echo(line)
    said = {f.check for f in first if f.status == preflight.FAILED}
    checked: List[preflight.GangNeeds] = []
    for name, topology, decorators in gangs:
        needs = preflight.step_needs(name, topology, decorators)
        echo("checking step %s: a gang of %s on %s" % (
            name, needs.describe(), BACKEND_NAMES.get(needs.backend, "this machine")))
        for line in values(needs, decorators) if values is not None and needs.backend else ():
            echo("  %s" % line)
        found = preflight.check_backend(needs) + preflight_config.check_node_size(needs)
        if needs.backend in offline:
            found += _offline(needs)
        elif needs.backend:
            try:
                found += backends[needs.backend](needs, datastore_root)
            except TorchDistributedPreflightFailed as ex:  # the API could not be reached
                found.append(preflight.failed(needs.step, "API", ex.message.split(": ", 1)[-1],
                                              "see above"))
            checked.append(needs)
        # what Metaflow's own configuration lacks is said once, above
        found = [f for f in found if not (f.check in said and f.status == preflight.FAILED
                                          and f.message.startswith("no "))]
        for line in preflight.report_lines(found):
            echo(line)
        findings += found
    if smoke is not None:
        for needs in checked:
            mine = [f for f in findings if f.step == needs.step]
            if preflight.failures(mine) or preflight.failures(first):
                echo("smoke: not run for step %s: fix the failed checks first" % needs.step)
                continue
            placement = next((f.message for f in mine if f.check == "placement"), "")
            ran = smoke(needs, placement)
            for line in preflight.report_lines(ran):
                echo(line)
            findings += ran
    failing = preflight.failures(findings)
    if failing:
        names = {name for name, _, _ in gangs}
        raise TorchDistributedPreflightFailed(sorted({f.step for f in failing} & names)
                                              or sorted(names), "%d check%s "
                                              "failed: %s. Each failure above says its fix."
                                              % (len(failing), "" if len(failing) == 1 else "s",
                                                 ", ".join("%s (%s)" % (f.check, f.step)
                                                           for f in failing)))
    return findings


@click.group()
def cli() -> None:
    pass


@cli.group(name="torch-distributed", help="Commands of @torch_distributed.")
def torch_distributed() -> None:
    pass


@torch_distributed.command(name="preflight", help="Check, without changing anything, that the infrastructure "
                                "each gang step runs on (--with batch, --with kubernetes or "
                                "--with torch_slurm) "
                                "can run it: exits non-zero when a check fails.")
@click.option("--smoke", is_flag=True, default=False,
              help="Then RUN one small job per gang step (2 nodes, its queue, namespace or "
                   "partition and image): torch, CUDA, NCCL and /dev/shm on every node, one "
                   "all-reduce.")
@click.option("--smoke-timeout", default=preflight_smoke.DEFAULT_TIMEOUT_S, show_default=True,
              type=int, help="Seconds the smoke job may take, waiting for instances included.")
@click.option("--yes", is_flag=True, default=False,
              help="With --smoke, submit the smoke job without asking first.")
@click.pass_obj
def preflight_command(obj: Any, smoke: bool, smoke_timeout: int, yes: bool) -> None:
    steps, kind, root = internals.cli_flow_steps(obj)

    def echo(line: str) -> None:
        click.echo(line)

    def confirm(question: str) -> bool:
        try:
            return bool(click.confirm(question, default=False))
        except click.exceptions.Abort:  # no terminal to answer on
            click.echo("")
            return False

    gangs = gang_steps(steps)
    on_batch = [d for _, _, decorators in gangs for d in decorators if d.name == "batch"]
    first: List[preflight.Finding] = []
    offline: List[str] = []
    if on_batch:
        credentials, region = aws_session()
        first = preflight_config.metaflow_findings(
            internals.metaflow_setting, kind, early.NOTED,
            {attribute: all(d.attributes.get(attribute) for d in on_batch)
             for attribute in ("queue", "iam_role")}, credentials, region)
        if credentials is None:
            offline.append("batch")

    def values(needs: preflight.GangNeeds, decorators: Sequence[Any]) -> List[str]:
        if needs.backend != "batch":
            return []
        return preflight_config.value_lines(needs, decorators, internals.user_attributes,
                                            internals.metaflow_setting,
                                            root if kind == "s3" else "")

    run_preflight(steps, root, echo, smoke=(
        lambda needs, placement: preflight_smoke.smoke(
            needs, echo, smoke_timeout, environ=smoke_environ(os.environ, kind, root),
            placement=placement, confirm=None if yes else confirm)) if smoke else None,
        first=first, values=values, offline=offline)


def smoke_environ(environ: Mapping[str, str], kind: str, root: str) -> Dict[str, str]:
    """The smoke job's environment: this one, with the preflight's own datastore when it is
    S3 (chosen with --datastore=s3 rather than by configuration, the smoke would otherwise
    run with the local one)."""
    if kind != "s3":
        return dict(environ)
    return {**environ, "METAFLOW_DEFAULT_DATASTORE": "s3", "METAFLOW_DATASTORE_SYSROOT_S3": root}


def aws_session() -> Tuple[Optional[str], Optional[str]]:
    """(how boto3 finds credentials, e.g. "env" or "shared-credentials-file", or None; the
    region, or None), as Metaflow's AWS calls would find them."""
    import boto3  # type: ignore[import-untyped]

    session = boto3.session.Session()
    credentials = session.get_credentials()
    return (getattr(credentials, "method", "found") if credentials is not None else None,
            session.region_name)


def _offline(needs: preflight.GangNeeds) -> List[preflight.Finding]:
    """A step's checks that need no AWS API, when there are no credentials to ask with."""
    return [preflight.unknown(needs.step, "account", "not checked: no AWS credentials (see "
                              "Metaflow's AWS configuration above)",
                              "give this shell credentials, then run the preflight again")] + \
        preflight.check_shared_memory(needs, "batch") + preflight.check_image(needs, "batch")

