from __future__ import annotations

import time
from typing import Callable, Iterator

import psutil
import pytest

from .aws import AwsEmulation, moto_aws
from .batch_emulator import BatchEmulator, EmulatorError


def wait_for(probe: Callable[[], object], timeout_s: float = 10.0, what: str = "condition"):
    """Polls `probe` until it returns something truthy; fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail("timed out after %.1f s waiting for %s" % (timeout_s, what))
        time.sleep(0.05)


def processes_of(emulator_url: str) -> list[psutil.Process]:
    """Live processes started by the emulator at `emulator_url` (marked by their env)."""
    found = []
    for process in psutil.process_iter(["environ", "status"]):
        environ = process.info["environ"] or {}
        alive = process.info["status"] != psutil.STATUS_ZOMBIE
        if alive and environ.get("AWS_ENDPOINT_URL_BATCH") == emulator_url:
            found.append(process)
    return found


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
