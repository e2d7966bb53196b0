from pathlib import Path

import pytest

from tests.support import FlowRunner

TESTS = Path(__file__).parent
# The layers of the suite, by folder, and whether they are slow (they run real flows). Every
# test gets its layer's marker, slow layers also `slow`, so `pytest -m "not slow"` is the
# inner loop (README.md, "Contributing"); tests added to a folder are marked with it.
LAYERS = {"unit": False, "docs": False, "integration": False, "e2e": True, "emulation": True,
          "slurm": True}


def pytest_collection_modifyitems(config, items):
    for item in items:
        layer = item.path.relative_to(TESTS).parts[0]
        if layer in LAYERS:
            item.add_marker(layer)
            if LAYERS[layer]:
                item.add_marker("slow")


@pytest.fixture
def flow_runner(tmp_path):
    runner = FlowRunner(tmp_path)
    yield runner
    runner.assert_no_leftovers()
