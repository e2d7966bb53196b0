"""README.md opens with exactly two set-up commands: the first runs the main example from a
fresh clone (.ci/run runs it verbatim, in a clean environment), the second runs the tests."""

import subprocess
import sys

from tests.support import REPO


def readme_commands(*args):
    proc = subprocess.run([sys.executable, str(REPO / ".ci" / "readme_commands.py"), *args],
                          capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.splitlines()


def test_two_commands_open_the_readme():
    first, second = readme_commands()
    assert "pip install" in first and " -e " not in first  # installed as users install it
    # no --no-pylint: Metaflow lints only where pylint is installed, and the example passes
    assert first.endswith("examples/ddp_flow.py run")
    assert second == "bash .ci/run"


def test_ci_runs_the_first_command_as_written_in_the_readme():
    assert readme_commands("1") == readme_commands()[:1]
    ci = (REPO / ".ci" / "run").read_text()
    assert 'command="$(python3 .ci/readme_commands.py 1)"' in ci
    assert 'env -i "${keep[@]}" bash -c "$command"' in ci
