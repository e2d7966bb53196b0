"""argo.py's pure parts: which steps a gang may be compiled on, the JobSet template built from a
step's compiled container template, the agent's command, the attempt passed in by the DAG, and
how node 0 and the agents of such a JobSet agree on the attempt's port (its secret is not
compiled: node 0 draws it, the agents read it from the run's datastore).
(tests/emulation/test_deploy.py compiles real flows; test_argo_gang.py runs one.)"""

import hashlib
import json
import os
import shlex
import subprocess
from types import SimpleNamespace

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends import (
    argo,
    kubernetes,
    trampoline,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import preempt
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import naming
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import \
    TorchDistributedConfigError
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import (
    AgentOrder,
    TaskIdentity,
)
from tests import records


# -- which steps ----------------------------------------------------------------------------------

class Graph(dict):
    start_step = "start"


def node(type_, in_funcs=(), out_funcs=(), split_parents=()):
    return SimpleNamespace(type=type_, in_funcs=list(in_funcs), out_funcs=list(out_funcs),
                           split_parents=list(split_parents))


def graph(**nodes):
    return Graph(nodes)


LINEAR = graph(start=node("start", out_funcs=["train"]),
               train=node("linear", ["start"], ["end"]), end=node("end", ["train"]))
FOREACH = graph(start=node("foreach", out_funcs=["train"]),
                train=node("linear", ["start"], ["collect"], ["start"]),
                collect=node("linear", ["train"], ["join"], ["start"]),
                join=node("join", ["collect"], ["end"], ["start"]), end=node("end", ["join"]))


def test_a_gang_compiles_on_a_linear_step_and_inside_a_foreach():
    argo.check_step("train", LINEAR, 2)
    argo.check_step("train", FOREACH, 2)


@pytest.mark.parametrize("flow, step, why", [
    (LINEAR, "start", "on the start step"),
    (graph(start=node("start", out_funcs=["fan"]), fan=node("foreach", ["start"], ["a"])),
     "fan", "on a foreach step"),
    (FOREACH, "join", "on a join step"),
    (LINEAR, "end", "on the end step"),
    (FOREACH, "collect", "on the last step of a foreach: its join finds the task ids"),
    (graph(start=node("split-switch", out_funcs=["a"]), a=node("linear", ["start"], ["end"])),
     "a", "conditional branch's first step"),
])
def test_a_gang_is_refused_where_its_template_cannot_be_a_jobset(flow, step, why):
    with pytest.raises(TorchDistributedConfigError) as refused:
        argo.check_step(step, flow, 2)
    reason = str(refused.value)
    assert "a gang of 2 nodes cannot be deployed to Argo Workflows" in reason and why in reason
    assert "nodes=1" in reason
    if step == "collect":
        assert "Add a step between the gang and join" in reason


# -- the JobSet template ------------------------------------------------------------------------

COMMAND = ("mkdir -p $PWD/.logs && export INPUT_PATHS={{inputs.parameters.input-paths}} && "
           "export METAFLOW_TASK_ID=(t-x) && python flow.py step train --run-id "
           "argo-{{workflow.name}} --task-id $METAFLOW_TASK_ID --retry-count {{retries}}")


def container_template(foreach=False, retries=True):
    """A step's container template as Metaflow compiles it (the fields we read)."""
    inputs = [{"name": "input-paths"}] + ([{"name": "split-index"}] if foreach else [])
    template = {
        "name": "train", "activeDeadlineSeconds": 600, "serviceAccountName": None,
        "inputs": {"parameters": inputs},
        "outputs": {"parameters": [{"name": "task-id", "valueFrom": {"path": "/mnt/out/task_id"}}]},
        "failFast": True,
        "metadata": {"annotations": {"metaflow/attempt": "{{retries}}"},
                     "labels": {"kueue.x-k8s.io/queue-name": "gpus"}},
        "volumes": [{"name": "out", "emptyDir": {}}],
        "nodeSelector": {}, "tolerations": None,
        "podSpecPatch": json.dumps({"imagePullSecrets": [{"name": "regcred"}]}),
        "container": {
            "name": "train", "image": "python:3.11", "command": ["bash", "-c", COMMAND],
            "args": None, "volumeMounts": [{"name": "out", "mountPath": "/mnt/out"}],
            "env": [{"name": "METAFLOW_RUN_ID", "value": "argo-{{workflow.name}}"},
                    {"name": "METAFLOW_RETRY_COUNT", "value": "{{retries}}"},
                    {"name": "ARGO_WORKFLOW_NAMESPACE", "value": "ml"},
                    {"name": "METAFLOW_KUBERNETES_POD_NAME",
                     "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
    }
    if retries:
        template["retryStrategy"] = {"retryPolicy": "Always", "limit": 2}
    return template


def workflow(template):
    dag = {"name": "Flow", "dag": {"tasks": [
        {"name": "start", "template": "start"},
        {"name": "train", "template": "train", "depends": "start.Succeeded",
         "arguments": {"parameters": [
             {"name": "input-paths", "value": "argo-{{workflow.name}}/start/x"}]}}]}}
    return {"spec": {"templates": [dag, template],
                     "podMetadata": {"labels": {"app.kubernetes.io/part-of": "metaflow"}}}}


def compiled(foreach=False, retries=True):
    wf = workflow(container_template(foreach, retries))
    argo.compile_gang(wf, "train", 3, lambda command: ["bash", "-c", "control: " + command],
                      ["bash", "-c", "agent"], {"AGENT_SPEC": "{}"}, preempt_grace_s=12.5)
    return wf


def pods(wf):
    manifest = json.loads(wf["spec"]["templates"][1]["resource"]["manifest"])
    jobs = {r["name"]: r for r in manifest["spec"]["replicatedJobs"]}
    return manifest, jobs


def env_of(job):
    return {e["name"]: e.get("value", e.get("valueFrom"))
            for e in job["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_the_step_becomes_one_jobset_of_a_control_pod_and_n_minus_1_workers():
    wf = compiled()
    template = wf["spec"]["templates"][1]
    assert template["name"] == "train" and "container" not in template
    assert template["resource"]["action"] == "create"
    assert template["resource"]["successCondition"] == "status.terminalState == Completed"
    assert template["resource"]["failureCondition"] == "status.terminalState == Failed"
    assert template["retryStrategy"] == {"retryPolicy": "Always", "limit": 2}  # @retry
    assert [p["name"] for p in template["inputs"]["parameters"]] == ["input-paths", "retryCount"]
    # the next step's input: the task id on the JobSet's label
    assert template["outputs"]["parameters"] == [{"name": "task-id", "valueFrom": {
        "jsonPath": "{.metadata.labels.torch_distributed_task_id}"}}]

    manifest, jobs = pods(wf)
    assert manifest["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert manifest["spec"]["startupPolicy"] == {"startupPolicyOrder": "InOrder"}
    assert [(r["name"], r["replicas"]) for r in manifest["spec"]["replicatedJobs"]] == [
        ("control", 1), ("worker", 2)]
    name = manifest["metadata"]["name"]
    task_id = manifest["metadata"]["labels"]["torch_distributed_task_id"]
    assert name == "td-%s-{{inputs.parameters.retryCount}}" % task_id[2:]
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpus"  # Kueue
    for job in jobs.values():
        spec = job["template"]["spec"]
        assert (spec["backoffLimit"], spec["completions"], spec["parallelism"]) == (0, 1, 1)
        pod = spec["template"]["spec"]
        assert pod["subdomain"] == name and pod["restartPolicy"] == "Never"
        # a deleted pod's SIGTERM reaches the gang, which gets preempt_grace and the margin
        assert pod["terminationGracePeriodSeconds"] == 13 + preempt.STOP_MARGIN_S
        assert pod["activeDeadlineSeconds"] == 600  # @timeout, on the pods
        assert pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["volumes"] == [{"name": "out", "emptyDir": {}}]
        assert "serviceAccountName" not in pod and "tolerations" not in pod
        env = env_of(job)
        assert env["MF_MASTER_ADDR"] == "%s-control-0-0.%s.ml.svc.cluster.local" % (name, name)
        assert env["MF_WORLD_SIZE"] == "3" and env[argo.TASK_ID_ENV] == task_id
        assert env["MF_WORKER_REPLICA_INDEX"] == {"fieldRef": {
            "fieldPath": "metadata.annotations['jobset.sigs.k8s.io/job-index']"}}
        assert env["METAFLOW_KUBERNETES_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["METAFLOW_RETRY_COUNT"] == "{{inputs.parameters.retryCount}}"
    control, worker = env_of(jobs["control"]), env_of(jobs["worker"])
    assert json.loads(control[kubernetes.MAIN_NODE_ENV]) == {"step": "train", "nodes": 3}
    assert kubernetes.MAIN_NODE_ENV not in worker and "AGENT_SPEC" not in control
    assert worker["AGENT_SPEC"] == "{}"
    assert worker[argo.INPUT_PATHS_ENV] == "{{inputs.parameters.input-paths}}"
    assert argo.SPLIT_INDEX_ENV not in worker
    commands = {n: j["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
                for n, j in jobs.items()}
    # each pod's command runs under the SIGTERM forwarder, as its main process
    assert commands["worker"] == preempt.forwarding(["bash", "-c", "agent"])
    assert commands["control"][:4] == preempt.forwarding([])
    assert commands["control"][-1] == "control: " + COMMAND.replace(
        "{{retries}}", "{{inputs.parameters.retryCount}}")
    # Argo's {{retries}} is not set in a resource template: nowhere left
    assert "{{retries}}" not in json.dumps(manifest)


def test_the_dag_task_passes_the_attempt_in():
    wf = compiled()
    [train] = [t for t in wf["spec"]["templates"][0]["dag"]["tasks"] if t["name"] == "train"]
    assert train["arguments"]["parameters"][-1] == {"name": "retryCount", "value": "{{retries}}"}
    # without a retry strategy Argo does not set {{retries}} (Metaflow #2632): the first attempt
    wf = compiled(retries=False)
    [train] = [t for t in wf["spec"]["templates"][0]["dag"]["tasks"] if t["name"] == "train"]
    assert train["arguments"]["parameters"][-1] == {"name": "retryCount", "value": "0"}
    assert "retryStrategy" not in wf["spec"]["templates"][1]


def test_a_gang_in_a_foreach_takes_its_split_index():
    wf = compiled(foreach=True)
    manifest, jobs = pods(wf)
    assert env_of(jobs["worker"])[argo.SPLIT_INDEX_ENV] == "{{inputs.parameters.split-index}}"
    assert "inputs.parameters['split-index']" in manifest["metadata"]["labels"][
        "torch_distributed_task_id"]


def test_the_gang_task_waits_for_a_task_that_creates_its_network_policy():
    wf = compiled()
    start, policy, train = wf["spec"]["templates"][0]["dag"]["tasks"]
    # the policy's task: the gang's inputs (not the attempt: one policy for every attempt),
    # after what the gang waited for; a refused policy does not fail the workflow
    assert policy == {"name": "train-gang-policy", "template": "train-gang-policy",
                      "arguments": {"parameters": [
                          {"name": "input-paths", "value": "argo-{{workflow.name}}/start/x"}]},
                      "continueOn": {"failed": True}, "depends": "start.Succeeded"}
    # the gang starts once the policy exists, or once its creation failed
    assert train["depends"] == ("(start.Succeeded) && (train-gang-policy.Succeeded || "
                                "train-gang-policy.Failed)")
    # its template creates the policy, owned by the Workflow (removed with it)
    [template] = [t for t in wf["spec"]["templates"] if t["name"] == "train-gang-policy"]
    assert template["inputs"] == {"parameters": [{"name": "input-paths"}]}
    assert template["resource"]["action"] == "create"
    assert template["resource"]["setOwnerReference"] is True
    assert set(template["resource"]) == {"action", "setOwnerReference", "manifest"}


def _filled(text, parameters, workflow_name="w"):
    from tests.emulation.argo import fill

    return json.loads(fill(text, workflow_name, parameters))


def _pod_labels(jobset):
    return [job["template"]["spec"]["template"]["metadata"]["labels"]
            for job in jobset["spec"]["replicatedJobs"]]


def _selects(selector, labels):
    """Kubernetes' matchLabels: every label of the selector, with its value."""
    return labels.items() >= selector["matchLabels"].items()


@pytest.mark.parametrize("foreach", [False, True])
def test_the_policy_selects_every_pod_of_the_gang_and_admits_only_them(foreach):
    from tests.emulation.k8s_policies import validate_object

    wf = compiled(foreach=foreach)
    gang = wf["spec"]["templates"][1]["resource"]["manifest"]
    [template] = [t for t in wf["spec"]["templates"] if t["name"] == "train-gang-policy"]
    parameters = {"input-paths": "argo-w/start/t-1", "retryCount": "1"}
    if foreach:
        parameters["split-index"] = "0"
    policy = _filled(template["resource"]["manifest"], parameters)
    validate_object(policy, "V1NetworkPolicy")  # the published API, as the API server would
    jobset = _filled(gang, parameters)
    task_id = jobset["metadata"]["labels"]["torch_distributed_task_id"]
    own = {"torch_distributed_task_id": task_id, "torch_distributed_workflow": "w"}
    assert policy["metadata"]["name"] == "td-%s-gang-policy" % task_id[2:]
    assert policy["spec"] == {"podSelector": {"matchLabels": own}, "policyTypes": ["Ingress"],
                              "ingress": [{"from": [{"podSelector": {"matchLabels": own}}]}]}
    assert "namespace" not in policy["metadata"]  # the workflow's, where Argo creates it
    # every pod of the gang carries both labels, beside the user's own
    assert _pod_labels(jobset) == [dict(own, **{"kueue.x-k8s.io/queue-name": "gpus",
                                                "app.kubernetes.io/part-of": "metaflow"})] * 2
    # the policy selects, and admits, the pods of every attempt of the gang's task...
    selector = policy["spec"]["podSelector"]
    assert selector == policy["spec"]["ingress"][0]["from"][0]["podSelector"]
    for attempt in ("0", "1", "2"):
        labels = _pod_labels(_filled(gang, dict(parameters, retryCount=attempt)))
        assert all(_selects(selector, pod) for pod in labels)
    # ...and no pod of another task of the run (another item, another input) or of another
    # run (another workflow)
    other_task = dict(parameters, **({"split-index": "1"} if foreach else
                                     {"input-paths": "argo-w/start/t-2"}))
    other_run = dict(parameters, **{"input-paths": "argo-v/start/t-1"})
    for others, workflow_name in ((other_task, "w"), (other_run, "v"), (parameters, "v")):
        labels = _pod_labels(_filled(gang, others, workflow_name))
        assert not any(_selects(selector, pod) for pod in labels), (others, workflow_name)


def test_a_step_named_like_the_policy_task_is_refused():
    wf = workflow(container_template())
    wf["spec"]["templates"].append({"name": "train-gang-policy", "container": {}})
    with pytest.raises(TorchDistributedConfigError, match="train-gang-policy"):
        argo.compile_gang(wf, "train", 3, lambda command: ["bash", "-c", command],
                          ["bash", "-c", "agent"], {}, preempt_grace_s=12.5)


class _Sprig:
    sha256sum = staticmethod(lambda text: hashlib.sha256(text.encode()).hexdigest())
    trunc = staticmethod(lambda length, text: text[:length])


def _evaluate(task_id, parameters):
    """The expression as Argo's expr-lang evaluates it (its operators mean what Python's do)."""
    prefix, expression = task_id.split("{{=", 1)
    scope = {"sprig": _Sprig, "inputs": SimpleNamespace(parameters=parameters)}
    return prefix + eval(expression[:-2], scope)  # noqa: S307 - our own expression


def test_the_task_id_is_the_same_for_every_attempt_and_another_for_every_other_task():
    expression = argo.task_id_expression("train", foreach=True)
    first = _evaluate(expression, {"input-paths": "argo-w/start/t-1", "split-index": "0"})
    assert first == "t-" + hashlib.sha256(b"train/argo-w/start/t-1/0").hexdigest()[:8]
    assert first != _evaluate(expression, {"input-paths": "argo-w/start/t-1", "split-index": "1"})
    assert first != _evaluate(expression, {"input-paths": "argo-v/start/t-1", "split-index": "0"})
    assert first != _evaluate(argo.task_id_expression("tune", foreach=True),
                              {"input-paths": "argo-w/start/t-1", "split-index": "0"})


def test_a_step_template_of_another_shape_is_refused():
    template = container_template()
    template["inputs"]["parameters"].append({"name": "root-input-path"})
    with pytest.raises(TorchDistributedConfigError, match="does not know"):
        argo.check_template("train", template)
    template = container_template()
    template["container"]["command"][-1] = COMMAND.replace(
        "{{inputs.parameters.input-paths}}", "{{=toBase64(inputs.parameters['input-paths'])}}")
    with pytest.raises(TorchDistributedConfigError, match="does not know"):
        argo.check_template("train", template)


# -- the agent's command ------------------------------------------------------------------------

def test_the_agent_command_is_quoted_words_and_the_pods_values():
    text = argo.agent_shell_command(
        ["printf", "'%s\\n'"], ["--with", "'kubernetes:cpu=1'", "--quiet"], "train",
        "argo-{{workflow.name}}", 2, "s3@s3://b/m f", "user:ana b", foreach=True)
    assert '"' not in text  # it runs inside Metaflow's `bash -c "..."`
    env = dict(os.environ, **{argo.TASK_ID_ENV: "t-0a1b2c3d", argo.INPUT_PATHS_ENV:
                              "argo-w/start/t-1", argo.SPLIT_INDEX_ENV: "4",
                              kubernetes.WORKER_INDEX: "1"})
    # as the pod runs it: Metaflow's shlex.split('bash -c "%s"' % command), then bash
    [bash, c, inner] = shlex.split('bash -c "%s"' % text)
    words = subprocess.run([bash, c, inner], env=env, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert words == [
        "--with", "kubernetes:cpu=1", "--quiet", "spin-step", "train",
        "--run-id", "argo-{{workflow.name}}",  # Argo fills it in before the shell runs
        "--task-id", "t-0a1b2c3d-node-2",
        "--input-paths", "argo-w/start/t-1",
        "--retry-count", "{{inputs.parameters.retryCount}}",
        "--max-user-code-retries", "2",
        "--orig-flow-datastore", "s3@s3://b/m f", "--no-persist",
        "--split-index", "4", "--namespace", "user:ana b"]


# -- node 0 and the agents agree on the attempt -------------------------------------------------

def test_node_0_and_an_agent_derive_the_same_port_and_a_retry_another():
    order = AgentOrder(records.blueprint(nodes=3, rendezvous_timeout_s=5.0), "kubernetes")
    backend = kubernetes.KubernetesBackend(resolve=lambda name: "10.0.0.5")
    env = {kubernetes.WORKER_INDEX: "1", kubernetes.MASTER_ADDR: "c.svc.cluster.local"}
    params = {"run_id": "argo-w", "task_id": "t-0a1b2c3d-node-2", "input_paths": "argo-w/a/t",
              "retry_count": 1, "max_user_code_retries": 2, "split_index": None,
              "opt_namespace": None, "orig_flow_datastore": "s3@s3://b/mf"}
    place = backend.agent_place(order, env)
    assert (place.node, place.master_addr) == (2, "10.0.0.5")
    identity = trampoline.agent_identity("train", params, place.node)
    agent = trampoline.agent_spec(order, place, identity, [], "secret", "cpu", "fork")
    assert agent.attempt.task.task_id == "t-0a1b2c3d" and agent.restart_count == 0  # its round
    assert agent.attempt.gang_id == naming.gang_id("argo-w", "train", "t-0a1b2c3d", 1)
    node_env = dict(trampoline.plan_env(kubernetes.MAIN_NODE_ENV, "train", 3),
                    **{kubernetes.NUM_NODES: "3", kubernetes.MASTER_ADDR: "localhost"})
    node_identity = TaskIdentity(run_id="argo-w", task_id="t-0a1b2c3d", input_paths="",
                                 split_index=None, retry_count=1, max_user_code_retries=2,
                                 namespace=None, orig_datastore="s3@s3://b/mf")
    step = records.gang_step(nodes=3, rendezvous_timeout_s=5.0)
    node_zero = backend.node_zero(step, node_env, node_identity)
    assert node_zero.port == agent.attempt.master_port
    # node 0 draws the attempt's secret: a fresh one each time, never derived from the job
    assert len(node_zero.secret) == 64
    assert node_zero.secret != backend.node_zero(step, node_env, node_identity).secret
    retried = trampoline.agent_identity("train", dict(params, retry_count=2), 2)
    assert trampoline.attempt_port("train", retried) != agent.attempt.master_port


@pytest.mark.parametrize("value", ["o'brien", 'say "hi"', "back\\slash", "$HOME", "a'\"b"])
def test_any_namespace_and_datastore_reach_the_agent_unchanged(value):
    text = argo.agent_shell_command(["printf", "'%s\\n'"], [], "train", "argo-w", 0,
                                    "s3@s3://b/" + value, value, foreach=False)
    env = dict(os.environ, **{argo.TASK_ID_ENV: "t-0a1b2c3d", argo.INPUT_PATHS_ENV: "p",
                              kubernetes.WORKER_INDEX: "0"})
    [bash, c, inner] = shlex.split('bash -c "%s"' % text)  # Metaflow's pod command
    words = subprocess.run([bash, c, inner], env=env, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert words[words.index("--namespace") + 1] == value
    assert words[words.index("--orig-flow-datastore") + 1] == "s3@s3://b/" + value
