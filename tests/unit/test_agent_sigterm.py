"""A node agent told to stop before its watch runs (gang/agent.py, _kill_ranks_and_leave) takes
its ranks' process groups with it and ends by the same SIGTERM, as its supervisor expects."""

import os
import signal
import subprocess
import sys
import time
import types

from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import agent
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import Member


def test_a_sigterm_kills_the_ranks_groups_and_ends_the_agent_by_that_signal():
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    pid = os.fork()
    if pid == 0:  # the agent
        try:
            member = Member("[rank 1]", rank.pid, None, None)
            runner = types.SimpleNamespace(slots=[types.SimpleNamespace(member=member)])
            agent._kill_ranks_and_leave(runner, signal.SIGTERM, None)
            time.sleep(5)
        finally:
            os._exit(7)  # only reached if the handler did not end this process
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
    assert rank.wait(timeout=10) == -signal.SIGKILL
