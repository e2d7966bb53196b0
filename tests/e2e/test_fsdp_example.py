"""examples/fsdp_flow.py shards a model with FSDP2 over a CPU gang, and docs/parallelism.md
shows exactly that file."""

import re
import shutil

from tests.support import REPO

EXAMPLE = REPO / "examples" / "fsdp_flow.py"


def test_fsdp_example_trains_a_sharded_model_and_saves_the_full_weights(flow_runner):
    shutil.copy(EXAMPLE, flow_runner.root / "fsdp_flow.py")
    res = flow_runner.run("fsdp_flow.py")
    assert res.returncode == 0, res
    got = flow_runner.client(
        "run = Flow('FSDPExample').latest_run\n"
        "t = run['train'].task\n"
        "sd = t['state_dict'].data\n"
        "result = dict(per_rank=t['params_per_rank'].data, losses=t['first_and_last_loss'].data,\n"
        "              shapes={k: list(v.shape) for k, v in sd.items()},\n"
        "              total=sum(v.numel() for v in sd.values()), ok=run.successful)")
    assert got["ok"]
    # 32*128+128 + 128*128+128 + 128*1+1 parameters, saved whole by rank 0 ...
    assert got["total"] == 20865
    assert got["shapes"]["0.weight"] == [128, 32] and got["shapes"]["4.weight"] == [1, 128]
    # ... while each of the 2 ranks held only its slice during training.
    assert len(got["per_rank"]) == 2 and sum(got["per_rank"]) == got["total"]
    assert all(n < 0.6 * got["total"] for n in got["per_rank"])
    for first, last in got["losses"]:
        assert last < first / 10, got["losses"]
    assert "parameters: 20865 in total" in res.output


def test_the_docs_show_the_example_as_it_is():
    page = (REPO / "docs" / "parallelism.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    code = EXAMPLE.read_text()
    body = code[code.index("from metaflow import"):]
    assert body in blocks, "docs/parallelism.md must show examples/fsdp_flow.py from its imports on"
