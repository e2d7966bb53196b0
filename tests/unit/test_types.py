"""Type hints are checked (issue 20): every function of the package is annotated and mypy
finds nothing, with mypy.ini's settings (strict for the pure core). The second test shows the
check can fail: the same settings refuse an unannotated function and a wrong attribute."""

import subprocess
import sys

from tests.support import REPO


def mypy(*args):
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "mypy.ini"),
                           *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_the_package_type_checks():
    res = mypy()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Success: no issues found" in res.stdout


def test_the_check_refuses_an_unannotated_function_and_a_wrong_attribute(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec "
        "import GangSpec\n\n\n"
        "def untyped(spec):\n    return spec\n\n\n"
        "def wrong(spec: GangSpec) -> str:\n    return spec.step_name\n")
    res = mypy(str(bad))
    assert res.returncode == 1, res.stdout
    assert "Function is missing a type annotation" in res.stdout
    assert '"GangSpec" has no attribute "step_name"' in res.stdout
