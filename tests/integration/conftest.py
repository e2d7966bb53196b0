import psutil
import pytest


def live_descendants():
    """Processes started (directly or not) by this test process that are still running."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    left = live_descendants()
    for proc in left:
        proc.kill()
    assert not left, "processes left running: %s" % [(p.pid, p.cmdline()) for p in left]
