"""The shipped examples run as documented."""

import shutil

from tests.support import REPO


def test_ddp_example(flow_runner):
    shutil.copy(REPO / "examples" / "ddp_flow.py", flow_runner.root / "ddp_flow.py")
    res = flow_runner.run("ddp_flow.py")
    assert res.returncode == 0, res
    got = flow_runner.client("t = Flow('DDPExample').latest_run['train'].task\n"
                             "result = dict(losses=t['final_losses'].data, n=t['samples_per_rank'].data)")
    assert len(got["losses"]) == 2 and all(l < 0.5 for l in got["losses"])
    assert got["n"] == 256
