"""Bounded waiting and process checks shared by the emulation tests."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil
import pytest

from tests.support import live_processes, with_env


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
    return processes_with("AWS_ENDPOINT_URL_BATCH", emulator_url)


def processes_with(name: str, value: str) -> list[psutil.Process]:
    """Live processes whose environment has `name` set to `value`."""
    return live_processes(with_env(name, value))
