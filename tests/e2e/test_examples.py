"""The shipped examples run as documented."""

import os
import shutil
import subprocess
import sys

from metaflow_extensions.torch_distributed.config.username import USER_VARIABLES, user_name
from tests.support import REPO


def test_ddp_example_where_the_environment_names_no_user(flow_runner):
    """As README's first command runs it in a fresh container as root: no USER, USERNAME or
    METAFLOW_USER. The run gets the name this package gives Metaflow there (username.py)."""
    shutil.copy(REPO / "examples" / "ddp_flow.py", flow_runner.root / "ddp_flow.py")
    env = {k: v for k, v in flow_runner.env().items() if k not in USER_VARIABLES + ("LOGNAME",)}
    proc = subprocess.run([sys.executable, "ddp_flow.py", "--no-pylint", "run"],
                          cwd=flow_runner.root, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    expected = user_name(None, {}, uid=os.getuid())
    assert "executing DDPExample for user:%s" % expected in proc.stdout + proc.stderr
    got = flow_runner.client("r = Flow('DDPExample').latest_run\nt = r['train'].task\n"
                             "result = dict(losses=t['final_losses'].data, "
                             "n=t['samples_per_rank'].data, tags=sorted(r.system_tags))")
    assert len(got["losses"]) == 2 and all(l < 0.5 for l in got["losses"])
    assert got["n"] == 256
    assert "user:%s" % expected in got["tags"]
