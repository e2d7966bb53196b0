"""Node 0 raises its open-file limit to what the gang's connections need before its store
listens (runtime/control.py, ensure_file_limit), so no rank's or agent's connection is refused
at a soft limit lower than the gang (issue 25: at a soft limit of 64, 47 of 100 clients
connected); a hard limit too low is a clear error. Real store, real connections, in a process
of its own whose limits the test sets."""

import json
import subprocess
import sys

from tests.support import REPO

SCRIPT = r"""
import json, resource, sys
from datetime import timedelta
import torch.distributed as dist
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import control

soft, hard, raise_it, clients = (int(a) for a in sys.argv[1:5])
wait = float(sys.argv[5])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
out = {}
if raise_it:
    try:
        out["raised"] = control.ensure_file_limit("train", Topology(16, 8))
    except Exception as ex:
        out["error"] = "%s: %s" % (type(ex).__name__, ex)
        print("@@" + json.dumps(out)); sys.exit(0)
listener = control.bind_listener("127.0.0.1", 0)
port = listener.getsockname()[1]
server = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=5),
                       wait_for_workers=False, master_listen_fd=listener.fileno())
connected, held = 0, []
for _ in range(clients):
    try:
        held.append(dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=wait)))
        connected += 1
    except Exception:
        pass
out["connected"] = connected
print("@@" + json.dumps(out))
"""


def run(soft, hard, raise_it, clients=40, wait=20):
    """What node 0's process saw: the soft limit it set, or its error; how many of `clients`
    connected (each waiting up to `wait` s, as a rank's store client does)."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(soft), str(hard), str(int(raise_it)),
                           str(clients), str(wait)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.rsplit("@@", 1)[1])


def test_node_0_raises_its_soft_limit_and_every_connection_is_served():
    raised = run(64, 4096, True)
    assert raised["raised"] >= 1000 and raised["connected"] == 40
    # without it, the same soft limit leaves connections unserved (what the gang would meet)
    assert run(64, 4096, False, wait=0.3)["connected"] < 40


def test_a_hard_limit_too_low_for_the_gang_is_a_clear_error():
    said = run(64, 256, True)["error"]
    assert said.startswith("TorchDistributedEnvironmentError")
    assert "needs up to" in said and "at most 256" in said and "ulimit -Hn" in said
