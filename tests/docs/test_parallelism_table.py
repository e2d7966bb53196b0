"""The table of docs/parallelism.md is what the planner does: every row is re-planned here."""

import ast
import re

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import plan_topology
from tests.support import REPO

HEADER = "| you write | GPUs per node | nodes | processes per node | world size | notes |"


def table_rows():
    lines = (REPO / "docs" / "parallelism.md").read_text().splitlines()
    start = lines.index(HEADER) + 2  # skip the header and the |---| line
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append(pytest.param(cells, id=cells[0].strip("`") + " + " + cells[1].strip("`")))
    return rows


def decorator_kwargs(cell):
    call = ast.parse(cell.strip("`").lstrip("@")).body[0].value
    if isinstance(call, ast.Name):
        return {}
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


def gpus_of(cell):
    """(gpus, source) as the decorator passes them to plan_topology."""
    if cell == "none":
        return None, None
    requested = re.fullmatch(r"`(@\w+)\(gpu=(\d+)\)`", cell)
    if requested:
        return int(requested.group(2)), "%s(gpu=%s)" % requested.groups()
    visible = re.fullmatch(r"(\d+) visible GPUs", cell)
    assert visible, "unknown GPU cell %r" % cell
    return int(visible.group(1)), cell


@pytest.mark.parametrize("cells", table_rows())
def test_row_is_what_the_planner_plans(cells):
    you_write, gpu_cell, nodes, nproc, world, notes = cells
    gpus, source = gpus_of(gpu_cell)
    kwargs = decorator_kwargs(you_write)
    if nodes == "error":
        fragment = re.fullmatch(r"`(.+)`", notes).group(1)
        with pytest.raises(ValueError) as raised:
            plan_topology(**kwargs, gpus=gpus, gpu_source=source)
        assert fragment in str(raised.value)
    else:
        plan = plan_topology(**kwargs, gpus=gpus, gpu_source=source)
        assert (plan.nodes, plan.nproc_per_node, plan.world_size) == \
            (int(nodes), int(nproc), int(world))


def test_the_table_covers_defaults_inference_and_errors():
    rows = [p.values[0] for p in table_rows()]
    assert len(rows) >= 10
    assert any(r[2] == "error" for r in rows) and any(r[2] != "error" for r in rows)
    assert any(r[0] == "`@torch_distributed`" for r in rows)
