"""Argo Workflows: a gang of N > 1 nodes is one JobSet in the workflow (`argo-workflows create`).

Metaflow's compiler builds the gang's step as it builds every step: one container template
(image, resources, environment, code package, log capture, retries). In the `argo-workflows
create` process we turn that template, for the gang's step only, into a resource template that
creates one JobSet (internals.wrap_argo_workflow):

* replicated job `control` (1 pod) runs the container Metaflow compiled, its command the step's
  own (the Metaflow task: rank 0, node 0's ranks, the control plane) with one difference: its
  task id is one Argo computes (a hash of the step's name, input paths and split index), because
  the next step learns it from the JobSet's label (a resource template's only output);
* replicated job `worker` (N-1 pods) runs the node agent: a hidden spin-step of the same task
  under `<task id>-node-<job index + 1>`, its command built from data (quoted words, the run's
  values in the pod's environment), in Metaflow's own pod command (code package, logs);
* the JobSet succeeds when all its Jobs do (the agents exit 0 once node 0 says the gang is
  done) and fails when one fails; Argo waits for `status.terminalState`, as for @parallel;
* Metaflow's retries stay the template's retryStrategy; the step's DAG task passes Argo's
  `{{retries}}` in, where the JobSet's name, the task's `--retry-count` and the agents' read it,
  so each attempt is a new JobSet and a new gang (its port derived from the task and attempt
  on every node; its store's secret drawn by node 0 and read by the workers from the run's
  datastore, never compiled into the template: attempt_secret.py);
* the gang's pods carry its task id and the workflow's name as labels, and a DAG task of its
  own, which the gang's waits for, creates a NetworkPolicy owned by the Workflow that admits
  traffic to them only from pods with the same two labels (isolation.own_pods_only): every
  attempt of the gang is isolated, and Kubernetes' garbage collector removes the policy with
  the Workflow. A refused policy (the workflow's service account may not create
  NetworkPolicies) fails that task only (continueOn), and the gang runs unisolated.

What a template cannot know before the run (workflow name, input paths, split index, attempt)
is left to Argo's substitution; the pure parts below build the template from plain data, and
tests/unit/test_argo.py, tests/emulation/test_argo_gang.py pin them.
"""

import copy
import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ..core import naming
from ..core.errors import TorchDistributedConfigError
from ..core.gangspec import AgentOrder
from ..mf import internals
from ..mf.spinstep import Shell, SpinOptions, spin_env_additions
from ..core.supported import compile_error
from ..runtime import preempt
from . import isolation, kubernetes, trampoline
from .base import Backend, GangStep

# The JobSet's label that carries the gang's task id: the template's `task-id` output. Its
# pods carry it too, with the workflow's name: the gang's NetworkPolicy selects them by both.
TASK_ID_LABEL = "torch_distributed_task_id"
WORKFLOW_LABEL = "torch_distributed_workflow"
# The template and DAG task that create the gang's NetworkPolicy: the step's name and this.
POLICY_SUFFIX = "-gang-policy"
# In every pod's environment: the gang's task id; in the workers': the task's input paths and
# split index (Argo fills them in; the agent's command reads them, quoted by the shell).
TASK_ID_ENV = "METAFLOW_TORCH_DISTRIBUTED_ARGO_TASK_ID"
INPUT_PATHS_ENV = "METAFLOW_TORCH_DISTRIBUTED_ARGO_INPUT_PATHS"
SPLIT_INDEX_ENV = "METAFLOW_TORCH_DISTRIBUTED_ARGO_SPLIT_INDEX"
# The attempt, passed in by the step's DAG task: Argo's {{retries}} is not set inside a
# resource template (Metaflow's @parallel does the same).
RETRY_PARAM = "retryCount"
RETRIES = "{{retries}}"
ATTEMPT = "{{inputs.parameters.%s}}" % RETRY_PARAM
# The agent's hidden task id: the pod's shell computes its node index from its Job's index.
AGENT_TASK_ID = naming.hidden_task_id("${%s}" % TASK_ID_ENV, kubernetes.NODE_INDEX_WORD)
# What a JobSet is (the version Metaflow's @parallel creates; JobSet >= 0.6 for terminalState).
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
SUCCESS = "status.terminalState == Completed"
FAILURE = "status.terminalState == Failed"
# Downward API values of every pod (set by the JobSet controller).
_POD_FIELDS = {
    kubernetes.WORKER_INDEX: "metadata.annotations['jobset.sigs.k8s.io/job-index']",
    "METAFLOW_KUBERNETES_JOBSET_NAME": "metadata.annotations['jobset.sigs.k8s.io/jobset-name']",
    "JOBSET_RESTART_ATTEMPT": "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']",
}
# The inputs a step's container template may take for its gang to be compiled.
_INPUTS = {"input-paths", "split-index"}


# -- pure parts -----------------------------------------------------------------------------

def check_step(step_name: str, graph: Any, nodes: int) -> None:
    """Refuse a gang on the steps whose Argo template does more than run the task with its
    input paths, or whose next step finds its task id by Metaflow's own formula."""
    node = graph[step_name]
    why = None
    if step_name == graph.start_step:
        why = ("the start step: its container sets up the run's parameters before the step "
               "runs, where the gang's other nodes would not see them")
    elif node.type == "end":
        why = "the end step: its template has no output a JobSet could give"
    elif node.type != "linear":
        why = "a %s step: its template passes on what only its container writes" % node.type
    elif any(graph[parent].type == "split-switch" for parent in node.in_funcs):
        why = "a conditional branch's first step: its input paths are chosen at run time"
    else:
        after = graph[node.out_funcs[0]]
        if after.type == "join" and graph[after.split_parents[-1]].type == "foreach":
            why = ("the last step of a foreach: its join finds the task ids of that step by "
                   "Metaflow's own formula, which a JobSet's task cannot follow. Add a step "
                   "between the gang and %s" % node.out_funcs[0])
    if why:
        raise TorchDistributedConfigError(
            step_name, "a gang of %d nodes cannot be deployed to Argo Workflows on %s. Give "
            "the gang a linear step of its own, or use nodes=1." % (nodes, why))


def check_template(step_name: str, template: Mapping[str, Any]) -> None:
    """Refuse a compiled container template this module does not know how to make a gang of."""
    inputs = {p["name"] for p in (template.get("inputs") or {}).get("parameters") or []}
    outputs = [p["name"] for p in (template.get("outputs") or {}).get("parameters") or []]
    command = ((template.get("container") or {}).get("command") or [None])[-1] or ""
    if (inputs - _INPUTS or "input-paths" not in inputs or outputs != ["task-id"]
            or "export INPUT_PATHS={{inputs.parameters.input-paths}} " not in command):
        raise TorchDistributedConfigError(
            step_name, "Metaflow compiled this step for Argo Workflows in a way @torch_distributed "
            "does not know (inputs %s, outputs %s); its gang of several nodes cannot be "
            "deployed there. Use nodes=1 or `python flow.py run --with kubernetes`."
            % (sorted(inputs), outputs))


def task_id_expression(step_name: str, foreach: bool) -> str:
    """The gang's task id as Argo computes it: the first 8 hex digits of a SHA-256 of the step's
    name, input paths (which hold the run and the parent task) and split index: the same across
    the attempts of one task, different for every other task of the run. Non-numeric (`t-`),
    as Metaflow's task ids on Argo are."""
    key = "'%s/' + inputs.parameters['input-paths']" % step_name
    if foreach:
        key += " + '/' + inputs.parameters['split-index']"
    return "t-{{=sprig.trunc(8, sprig.sha256sum(%s))}}" % key


def jobset_name(task_id: str) -> str:
    """The JobSet of one attempt of the gang's task: unique per task and attempt (a retry
    creates a new JobSet), short enough for its pods' host names."""
    return "td-%s-%s" % (task_id[len("t-"):], ATTEMPT)


def gang_labels(task_id: str) -> Dict[str, str]:
    """The labels of every pod of the gang's task (each attempt's): what its NetworkPolicy
    selects and admits."""
    return {TASK_ID_LABEL: task_id, WORKFLOW_LABEL: "{{workflow.name}}"}


def policy_manifest(step_name: str, foreach: bool) -> Dict[str, Any]:
    """The gang's NetworkPolicy, as the template that creates it writes it (Argo fills in the
    task id and the workflow's name; the policy lands in the workflow's namespace)."""
    task_id = task_id_expression(step_name, foreach)
    return isolation.own_pods_only("td-%s%s" % (task_id[len("t-"):], POLICY_SUFFIX),
                                   gang_labels(task_id))


def policy_template(template: Mapping[str, Any], name: str, step_name: str,
                    foreach: bool) -> Dict[str, Any]:
    """The resource template `name` that creates the gang's NetworkPolicy, owned by the
    Workflow: it takes the inputs the task id is computed from, as the gang's template."""
    inputs = [{"name": p["name"]} for p in template["inputs"]["parameters"]]
    return {"name": name, "inputs": {"parameters": inputs},
            "resource": {"action": "create", "setOwnerReference": True,
                         "manifest": json.dumps(policy_manifest(step_name, foreach), indent=1,
                                                sort_keys=True)}}


def isolate_tasks(templates: Sequence[Dict[str, Any]], template_name: str,
                  policy_name: str) -> None:
    """Beside every DAG task that runs `template_name`, a task that runs `policy_name` with the
    same inputs and dependencies, which the gang's task then waits for, whether it succeeded
    or failed (continueOn: a refused policy leaves the gang unisolated, not undone)."""
    for template in templates:
        tasks = (template.get("dag") or {}).get("tasks") or []
        for task in list(tasks):
            if task.get("template") != template_name:
                continue
            name = task["name"] + POLICY_SUFFIX
            arguments = [p for p in (task.get("arguments") or {}).get("parameters") or []
                         if p["name"] != RETRY_PARAM]
            policy = {"name": name, "template": policy_name,
                      "arguments": {"parameters": copy.deepcopy(arguments)},
                      "continueOn": {"failed": True}}
            after = "(%s.Succeeded || %s.Failed)" % (name, name)
            if task.get("depends"):
                policy["depends"] = task["depends"]
                after = "(%s) && %s" % (task["depends"], after)
            task["depends"] = after
            tasks.insert(tasks.index(task), policy)


def control_address(name: str, namespace: str) -> str:
    """The control pod's DNS name under the JobSet's headless service."""
    return "%s-control-0-0.%s.%s.svc.cluster.local" % (name, name, namespace)


def agent_shell_command(entrypoint: Sequence[str], top_level: Sequence[str], step_name: str,
                        run_id: str, max_user_code_retries: int, orig_datastore: str,
                        namespace: Optional[str], foreach: bool) -> str:
    """The shell text of the node agent: a hidden spin-step of the gang's task. `entrypoint`
    and `top_level` are the step command's shell words as Metaflow writes them (its options
    quoted by Metaflow); every other word is quoted here, but the values the pod's shell expands
    from its environment (task id, input paths, split index), which Argo filled in."""
    options = SpinOptions(
        run_id=run_id, task_id=Shell(AGENT_TASK_ID), input_paths=Shell("${%s}" % INPUT_PATHS_ENV),
        retry_count=ATTEMPT, max_user_code_retries=str(int(max_user_code_retries)),
        orig_datastore=orig_datastore,
        split_index=Shell("${%s}" % SPLIT_INDEX_ENV) if foreach else None, namespace=namespace)
    return trampoline.agent_shell_command(" ".join([*entrypoint, *top_level]), [], step_name,
                                          options)


def pruned(tree: Any) -> Any:
    """`tree` without null fields (the API server prunes them; the JobSet CRD's schema has no
    nullable field)."""
    if isinstance(tree, dict):
        return {k: pruned(v) for k, v in tree.items() if v is not None}
    if isinstance(tree, list):
        return [pruned(v) for v in tree]
    return tree


def with_attempt(tree: Any) -> Any:
    """`tree` with Argo's {{retries}} (set in container templates only) read from the
    template's input instead."""
    if isinstance(tree, dict):
        return {k: with_attempt(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [with_attempt(v) for v in tree]
    if isinstance(tree, str):
        return tree.replace(RETRIES, ATTEMPT)
    return tree


def _env(entries: Sequence[Dict[str, Any]], values: Optional[Mapping[str, Any]] = None,
         fields: Optional[Mapping[str, str]] = None) -> List[Dict[str, Any]]:
    names = set(values or {}) | set(fields or {})
    kept = [e for e in entries if e["name"] not in names]
    return (kept + [{"name": k, "value": str(v)} for k, v in (values or {}).items()]
            + [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}}
               for k, v in (fields or {}).items()])


def jobset_manifest(template: Mapping[str, Any], nodes: int, step_name: str,
                    control_command: List[str], agent_command: List[str],
                    agent_env: Mapping[str, str], plan_env: Mapping[str, str], namespace: str,
                    foreach: bool, pod_metadata: Optional[Mapping[str, Any]],
                    preempt_grace_s: float) -> Dict[str, Any]:
    """The JobSet of the gang's step, from the step's compiled container `template`: the
    control pod runs `control_command`, the N-1 worker pods `agent_command` (argv lists), each
    under preempt.FORWARDING, with a stop grace that covers `preempt_grace_s`."""
    task_id = task_id_expression(step_name, foreach)
    name = jobset_name(task_id)
    meta = template.get("metadata") or {}
    extra = pod_metadata or {}
    labels = dict(extra.get("labels") or {}, **(meta.get("labels") or {}))
    annotations = dict(extra.get("annotations") or {}, **(meta.get("annotations") or {}))
    annotations.update({"metaflow/step_name": step_name, "metaflow/attempt": ATTEMPT})
    common = {
        kubernetes.MASTER_ADDR: control_address(name, namespace),
        kubernetes.NUM_NODES: nodes,
        TASK_ID_ENV: task_id,
    }
    container = pruned(template["container"])
    control = dict(container, command=preempt.forwarding(control_command),
                   env=_env(container.get("env", []), dict(common, **plan_env), _POD_FIELDS))
    worker_values = dict(common, **agent_env)
    worker_values[INPUT_PATHS_ENV] = "{{inputs.parameters.input-paths}}"
    if foreach:
        worker_values[SPLIT_INDEX_ENV] = "{{inputs.parameters.split-index}}"
    worker = dict(container, command=preempt.forwarding(agent_command),
                  env=_env(container.get("env", []), worker_values, _POD_FIELDS))
    pod_labels = dict(labels, **gang_labels(task_id))
    patch = json.loads(template["podSpecPatch"]) if template.get("podSpecPatch") else {}

    def job(replicated: str, replicas: int, pod_container: Dict[str, Any]) -> Dict[str, Any]:
        pod = pruned({
            "restartPolicy": "Never",
            # a deleted pod's SIGTERM reaches the gang (FORWARDING), which needs the time
            "terminationGracePeriodSeconds": preempt.scheduler_grace(preempt_grace_s),
            "subdomain": name,
            "setHostnameAsFQDN": True,
            "activeDeadlineSeconds": template.get("activeDeadlineSeconds"),
            "serviceAccountName": template.get("serviceAccountName"),
            "nodeSelector": template.get("nodeSelector") or None,
            "tolerations": template.get("tolerations"),
            "imagePullSecrets": patch.get("imagePullSecrets"),
            "volumes": template.get("volumes"),
            "containers": [pod_container],
        })
        return {"name": replicated, "replicas": replicas, "template": {"spec": {
            # Metaflow's retries are Argo's; a failed pod fails its Job and the JobSet
            "backoffLimit": 0, "completions": 1, "parallelism": 1,
            "template": {"metadata": {"labels": pod_labels, "annotations": annotations},
                         "spec": pod}}}}

    return with_attempt({
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {"name": name,
                     "labels": dict(labels, **{TASK_ID_LABEL: task_id,
                                               "workflows.argoproj.io/workflow":
                                                   "{{workflow.name}}"}),
                     "annotations": annotations},
        "spec": {
            # node 0's pod first: the workers resolve its name, which exists once it runs
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "replicatedJobs": [job("control", 1, control), job("worker", nodes - 1, worker)],
        },
    })


def gang_template(template: Mapping[str, Any], manifest: Mapping[str, Any]) -> Dict[str, Any]:
    """The resource template that replaces the step's container template: same name, inputs
    (and the attempt), retries; creates the JobSet `manifest` and outputs its task id."""
    inputs = [p for p in template["inputs"]["parameters"]] + [{"name": RETRY_PARAM}]
    gang = {
        "name": template["name"],
        "inputs": {"parameters": inputs},
        "outputs": {"parameters": [{"name": "task-id", "valueFrom": {
            "jsonPath": "{.metadata.labels.%s}" % TASK_ID_LABEL}}]},
        "resource": {"action": "create", "setOwnerReference": True,
                     "successCondition": SUCCESS, "failureCondition": FAILURE,
                     "manifest": json.dumps(manifest, indent=1, sort_keys=True)},
    }
    if template.get("retryStrategy"):
        gang["retryStrategy"] = copy.deepcopy(template["retryStrategy"])
    return gang


def pass_attempt(templates: Sequence[Dict[str, Any]], template_name: str,
                 retried: bool) -> int:
    """Make every DAG task that runs `template_name` pass the attempt in: Argo's {{retries}}
    where the template has a retry strategy, else 0 (#2632: {{retries}} is not set without)."""
    found = 0
    for template in templates:
        for task in (template.get("dag") or {}).get("tasks") or []:
            if task.get("template") != template_name:
                continue
            parameters = task.setdefault("arguments", {}).setdefault("parameters", [])
            parameters.append({"name": RETRY_PARAM, "value": RETRIES if retried else "0"})
            found += 1
    return found


def compile_gang(workflow: Dict[str, Any], step_name: str, nodes: int,
                 control_command_of: Callable[[str], List[str]], agent_command: List[str],
                 agent_env: Mapping[str, str], preempt_grace_s: float) -> None:
    """Turn the step's container template in the compiled `workflow` (JSON tree) into the
    gang's JobSet template. `control_command_of(command text) -> argv` gives node 0's command;
    `agent_command` is the workers' argv."""
    templates = workflow["spec"]["templates"]
    name = internals.argo_template_name(step_name)
    policy = name + POLICY_SUFFIX
    taken = {t.get("name") for t in templates} | {
        task["name"] for t in templates for task in (t.get("dag") or {}).get("tasks") or []}
    if policy in taken:
        raise TorchDistributedConfigError(
            step_name, "the workflow already has a template or task named %r, the name of "
            "the gang's NetworkPolicy step; rename the step that compiles to it." % policy)
    [at] = [i for i, t in enumerate(templates) if t.get("name") == name and "container" in t]
    template = templates[at]
    check_template(step_name, template)
    container = template["container"]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    foreach = "split-index" in {p["name"] for p in template["inputs"]["parameters"]}
    control_command = control_command_of(container["command"][-1])
    plan = trampoline.plan_env(kubernetes.MAIN_NODE_ENV, step_name, nodes)
    manifest = jobset_manifest(
        template, nodes, step_name, control_command, agent_command, agent_env, plan,
        env.get("ARGO_WORKFLOW_NAMESPACE") or "default", foreach,
        workflow["spec"].get("podMetadata"), preempt_grace_s)
    templates[at] = gang_template(template, manifest)
    if not pass_attempt(templates, name, bool(template.get("retryStrategy"))):
        raise compile_error(step_name, "no task of the workflow's DAG runs the step's "
                            "template %r" % name)
    templates.append(policy_template(template, policy, step_name, foreach))
    isolate_tasks(templates, name, policy)


# -- the compiler (through internals.py) -------------------------------------------------------

class ArgoBackend(Backend):
    """`argo-workflows create`: a gang of N > 1 nodes is one JobSet of the workflow; at run
    time its pods are placed as Kubernetes' (kubernetes.KubernetesBackend)."""

    name = "argo-workflows"

    def install(self, step: GangStep, environ: Mapping[str, str],
                deploy_target: Optional[str]) -> None:
        if deploy_target == self.name and step.topology.nodes > 1:
            install(step)


BACKEND = ArgoBackend()


def install(step: GangStep) -> None:
    """In the `argo-workflows create` process: compile this step into one JobSet of N pods."""
    step_name, nodes = step.step_name, step.topology.nodes
    check_step(step_name, step.graph, nodes)
    user_retries = max([d.step_task_retry_count()[0]
                        for d in step.graph[step_name].decorators] or [0])

    def build(argo: Any, workflow: Dict[str, Any]) -> None:
        name = internals.argo_template_name(step_name)
        [container] = [t for t in workflow["spec"]["templates"]
                       if t.get("name") == name and "container" in t]
        run_id = {e["name"]: e.get("value")
                  for e in container["container"]["env"]}["METAFLOW_RUN_ID"]
        foreach = "split-index" in {p["name"] for p in container["inputs"]["parameters"]}
        entrypoint, top_level = internals.argo_step_words(argo, step_name)
        agent_cli = agent_shell_command(entrypoint, top_level, step_name, run_id, user_retries,
                                        internals.argo_orig_datastore(argo),
                                        internals.argo_namespace(argo), foreach)
        agent_command = internals.argo_pod_command(argo, step_name, run_id, AGENT_TASK_ID,
                                                   ATTEMPT, [agent_cli])
        agent_env = spin_env_additions({}, AgentOrder(step.blueprint, kubernetes.BACKEND.name),
                                       step.decorator_name)

        def control_command_of(command: str) -> List[str]:
            return ["bash", "-c", internals.argo_with_task_id(command, "${%s}" % TASK_ID_ENV,
                                                                   step_name)]

        compile_gang(workflow, step_name, nodes, control_command_of, agent_command, agent_env,
                     step.blueprint.preempt_grace_s)

    internals.wrap_argo_workflow(build)
