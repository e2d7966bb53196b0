import pytest

from tests.support import assert_none_left, descendants


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    assert_none_left(descendants(), "processes left running", wait=0)
