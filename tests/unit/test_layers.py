"""Every folder of tests is a layer that tests/conftest.py marks, so `pytest -m "not slow"`
(README.md, "Contributing") leaves out exactly the folders that run real flows."""

from tests.conftest import LAYERS, TESTS


def test_every_folder_with_tests_is_a_marked_layer():
    folders = {path.relative_to(TESTS).parts[0] for path in TESTS.rglob("test_*.py")}
    assert folders == set(LAYERS), "classify the new folder in tests/conftest.py LAYERS"


def test_the_slow_layers_are_the_ones_that_run_flows():
    with_flows = {path.relative_to(TESTS).parts[0] for path in TESTS.rglob("flows/*.py")}
    assert {layer for layer, slow in LAYERS.items() if slow} == with_flows
