"""What Metaflow's own code talks to, stood in for, so that the contract tests
(test_internals_contract.py) call Metaflow's real classes without a cloud: the AWS Batch API
(the boto3 client Metaflow's BatchClient wraps), the Kubernetes client library where it is not
installed, and the environment, metadata and monitor objects Metaflow's CLI would pass. Each
stand-in keeps what Metaflow asked of it, for the test to read. Only the standard library and
pytest here: CI runs the contract tests in venvs with nothing else (.ci/packages)."""

import contextlib
import re
from types import ModuleType, SimpleNamespace


class Environment:
    """A MetaflowEnvironment: the executable, and the commands of a task's container."""

    TYPE = "local"

    def executable(self, step_name, default=None):
        return default or "python3"

    def get_package_commands(self, code_package_url, datastore_type, code_package_metadata=None):
        return ["echo fetch %s" % code_package_url]

    def bootstrap_commands(self, step_name, datastore_type):
        return ["echo bootstrap"]

    def get_environment_info(self, include_ext_info=False):
        return {"metaflow_version": "contract"}


class Provider:
    """A metadata provider, event logger or monitor, as the compilers read them: its TYPE, the
    metadata registered through it, and what a monitor measures."""

    def __init__(self, type_):
        self.TYPE = type_
        self.registered = []

    def get_runtime_environment(self, runtime):
        return {}

    def register_metadata(self, run_id, step_name, task_id, metadata):
        self.registered.append((run_id, step_name, task_id, metadata))

    def measure(self, name):
        return contextlib.nullcontext()


class AwsClientError(Exception):
    pass


class BatchApi:
    """The AWS Batch API of a boto3 client, for Metaflow's BatchClient and BatchJob: one job
    queue whose compute environment is of `platform` (EC2 or FARGATE); job definitions are
    registered (`definitions`), jobs submitted (`submitted`), each job found SUBMITTED."""

    exceptions = SimpleNamespace(ClientError=AwsClientError)

    def __init__(self, platform="EC2", region="eu-west-1"):
        self.platform = platform
        self._client_config = SimpleNamespace(region_name=region)
        self.definitions = []
        self.submitted = []

    def describe_job_queues(self, jobQueues, **_):
        return {"jobQueues": [{"jobQueueName": q, "state": "ENABLED", "status": "VALID",
                               "computeEnvironmentOrder": [{"computeEnvironment": "ce"}]}
                              for q in jobQueues]}

    def describe_compute_environments(self, computeEnvironments):
        return {"computeEnvironments": [{"computeResources": {"type": self.platform}}
                                        for _ in computeEnvironments]}

    def describe_job_definitions(self, **_):
        return {"jobDefinitions": []}

    def register_job_definition(self, **definition):
        self.definitions.append(definition)
        return {"jobDefinitionArn": "arn:aws:batch:jd/%s" % definition["jobDefinitionName"]}

    def submit_job(self, **payload):
        self.submitted.append(payload)
        return {"jobId": "job-%d" % len(self.submitted)}

    def describe_jobs(self, jobs):
        return {"jobs": [{"jobId": job, "status": "SUBMITTED"} for job in jobs]}


def batch_client(api):
    """Metaflow's BatchClient on `api` (its own constructor builds a boto3 client)."""
    from metaflow.plugins.aws.batch.batch_client import BatchClient

    client = BatchClient.__new__(BatchClient)
    client._client = api
    return client


# -- the Kubernetes client library ---------------------------------------------------------------

def _camel(name):
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


class _Model:
    """A V1 model of the library: it keeps what it was given."""

    def __init__(self, kind, *args, **kwargs):
        self.kind = kind
        self.fields = dict(kwargs, **({"name": args[0]} if args else {}))

    def to_dict(self):
        return {k: _plain(v, str) for k, v in self.fields.items()}


def _plain(value, key):
    if isinstance(value, _Model):
        return {key(k): _plain(v, key) for k, v in value.fields.items() if v is not None}
    if isinstance(value, dict):
        return {k: _plain(v, key) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v, key) for v in value]
    return value


class KubernetesSdk:
    """`kubernetes.client` where the library is not installed (CI's venv of the oldest
    Metaflow): any V1 model keeps its arguments, and ApiClient serialises models as the
    library does (its JSON names, camelCase; None left out)."""

    class ApiClient:
        def sanitize_for_serialization(self, obj):
            return _plain(obj, _camel)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    api_client = SimpleNamespace(ApiClient=ApiClient)

    def __getattr__(self, name):
        if re.match(r"V\d", name):
            return lambda *args, **kwargs: _Model(name, *args, **kwargs)
        raise AttributeError(name)


def kubernetes_installed():
    try:
        import kubernetes.client  # noqa: F401 - whether it imports is the question
    except ImportError:
        return False
    return True


def kubernetes_sdk():
    """The Kubernetes client library (`kubernetes.client`), or its stand-in where it is not
    installed."""
    if not kubernetes_installed():
        return KubernetesSdk()
    from kubernetes import client

    return client


def kubernetes_package(client, config):
    """A `kubernetes` package with these `client` and `config` modules, for sys.modules."""
    package = ModuleType("kubernetes")
    package.client, package.config = client, config
    return package


class KubeConfig:
    """`kubernetes.config`: which of its loaders Metaflow called."""

    def __init__(self):
        self.loaded = []

    def load_kube_config(self, *args, **kwargs):
        self.loaded.append("kube_config")

    def load_incluster_config(self, *args, **kwargs):
        self.loaded.append("incluster_config")


class SubmittingSdk:
    """`sdk` (the library or its stand-in) whose API server keeps the custom objects submitted
    (`submitted`: their bodies) and answers with an error, so nothing goes further."""

    def __init__(self, sdk):
        self._sdk = sdk
        self.submitted = []

    def __getattr__(self, name):
        return getattr(self._sdk, name)

    def ApiClient(self):
        return contextlib.nullcontext(None)

    def CoreV1Api(self, *args):
        return None

    def CustomObjectsApi(self, *args):
        def create_namespaced_custom_object(**kwargs):
            self.submitted.append(kwargs["body"])
            raise RuntimeError("the stand-in API server keeps what it is given")

        return SimpleNamespace(create_namespaced_custom_object=create_namespaced_custom_object)


class SubmittedJob:
    """Metaflow's RunningJob (batch_client.py), which polls the API for a submitted job: here the
    job is RUNNABLE when its status is first read, then SUCCEEDED (exit code 0)."""

    def __init__(self, id, client=None):
        self._id = id
        self._reads = 0

    def update(self):
        return self

    def kill(self):
        return self

    @property
    def id(self):
        return self._id

    @property
    def status(self):
        self._reads += 1
        return "RUNNABLE" if self._reads == 1 else "SUCCEEDED"

    @property
    def is_running(self):
        return self.status == "RUNNING"

    @property
    def is_done(self):
        return self.status == "SUCCEEDED"

    @property
    def is_crashed(self):
        return self.status == "FAILED"

    @property
    def status_code(self):
        return 0
