"""What a gang asks of node 0's open-file limit (core/capacity.py): pure arithmetic."""

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import capacity
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology


def test_the_files_a_gang_needs_grow_with_its_ranks_and_nodes():
    one = capacity.files_needed(Topology(1, 8))
    assert one == capacity.BASE_FILES + 8 + 6 * 8
    big = capacity.files_needed(Topology(128, 8))
    assert big == capacity.BASE_FILES + 1024 + 4 * 127 + 6 * 8
    assert big > 1024  # past the common soft limit


@pytest.mark.parametrize("needed, soft, hard, expected", [
    (500, 1024, 4096, None),  # enough already
    (500, -1, -1, None),  # unlimited
    (1800, 1024, 4096, 4096),  # raised, within the hard limit
    (1800, 1024, 1 << 20, 7200),  # raised with room, not to a huge hard limit
    (1800, 1024, -1, 1800),  # an unlimited hard limit
    (1800, 1024, 1800, 1800),
])
def test_the_soft_limit_is_raised_only_as_far_as_needed(needed, soft, hard, expected):
    assert capacity.soft_limit_for(needed, soft, hard) == expected


def test_a_hard_limit_below_the_gang_is_refused():
    with pytest.raises(ValueError, match="needs 1800 open files and the hard limit is 1024"):
        capacity.soft_limit_for(1800, 512, 1024)
