import pytest

from tests.support import FlowRunner


@pytest.fixture
def flow_runner(tmp_path):
    runner = FlowRunner(tmp_path)
    yield runner
    runner.assert_no_leftovers()
