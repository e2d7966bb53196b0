from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from .aws import AwsEmulation, Marks, moto_aws
from .batch_emulator import BatchEmulator, EmulatorError
from .k8s_api import EmulatorError as KubernetesEmulatorError, KubernetesEmulator
from .metadata_service import MetadataService
from tests.support import assert_none_left, with_env


@pytest.fixture(scope="module")
def aws() -> Iterator[AwsEmulation]:
    with moto_aws() as emulation:
        yield emulation


@pytest.fixture(scope="module")
def metadata_service(aws) -> Iterator[MetadataService]:
    """Metaflow's metadata service, emulated, where every node and pod reaches it: one per
    module, as the module's moto is one S3 (a deployment's service and bucket go together:
    a service of its own per test would number its runs from 1 again, and @checkpoint would
    find the checkpoints of an earlier test's run of the same number in the bucket)."""
    service = MetadataService()
    yield service
    service.close()


@pytest.fixture
def marks(aws, request) -> Marks:
    """The test's marks in moto's S3 (TD_MARKS for its flow)."""
    return Marks(aws, "%s-%d" % (request.node.name.replace("/", "_")[:80], id(request)))


@pytest.fixture
def start_emulator(aws, tmp_path) -> Iterator[Callable[..., BatchEmulator]]:
    """Starts emulators on the module's moto; closes them and checks nothing is left. Nodes as
    hosts (TD_EMULATION_HOSTS=1) see no folder of the test, as on a cloud (docs/testing.md)."""
    started: list[BatchEmulator] = []

    def start(**options) -> BatchEmulator:
        emulator = BatchEmulator(
            aws.endpoint_url,
            image_env=aws.container_env,
            workdir=tmp_path / ("emulator-%d" % len(started)),
            **options,
        )
        emulator.start()
        started.append(emulator)
        return emulator

    yield start
    urls = [emulator.endpoint_url for emulator in started]
    failures = []
    for emulator in started:
        try:
            emulator.close()
        except EmulatorError as error:
            failures.append(error)
    for url in urls:
        assert_none_left(with_env("AWS_ENDPOINT_URL_BATCH", url),
                         "emulator left processes behind", wait=0)
    assert not failures, failures


@pytest.fixture
def batch(start_emulator) -> BatchEmulator:
    return start_emulator()


@pytest.fixture
def start_kubernetes(aws, tmp_path) -> Iterator[Callable[..., KubernetesEmulator]]:
    """Starts Kubernetes emulators (API + JobSet controller) on the module's moto; closes them
    and checks that no pod process is left. Pods as hosts see no folder of the test."""
    started: list[KubernetesEmulator] = []

    def start(**options) -> KubernetesEmulator:
        emulator = KubernetesEmulator(image_env=aws.container_env,
                                      workdir=tmp_path / ("k8s-%d" % len(started)), **options)
        emulator.start()
        started.append(emulator)
        return emulator

    yield start
    failures = []
    for emulator in started:
        try:
            emulator.close()  # raises on an emulator error or a request it does not emulate
        except KubernetesEmulatorError as error:
            failures.append(error)
    # every process of a pod (ranks included) inherits the pod's DNS records variable
    for emulator in started:
        assert_none_left(with_env("K8S_EMULATOR_DNS_RECORDS", str(emulator.dns_records)),
                         "emulator left processes behind", wait=0)
    assert not failures, failures


@pytest.fixture
def kubernetes(start_kubernetes) -> KubernetesEmulator:
    return start_kubernetes()
