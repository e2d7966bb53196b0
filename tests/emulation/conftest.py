from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from .aws import AwsEmulation, moto_aws
from .batch_emulator import BatchEmulator, EmulatorError
from .probes import processes_of


@pytest.fixture(scope="module")
def aws() -> Iterator[AwsEmulation]:
    with moto_aws() as emulation:
        yield emulation


@pytest.fixture
def start_emulator(aws, tmp_path) -> Iterator[Callable[..., BatchEmulator]]:
    """Starts emulators on the module's moto; closes them and checks nothing is left."""
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
    leftovers = [process for url in urls for process in processes_of(url)]
    assert not leftovers, "emulator left processes behind: %s" % leftovers
    assert not failures, failures


@pytest.fixture
def batch(start_emulator) -> BatchEmulator:
    return start_emulator()
