"""The package's modules can be imported on their own, in a fresh interpreter."""

import re
import subprocess
import sys

from tests.support import REPO

PKG = "metaflow_extensions.torch_distributed.plugins.torch_distributed"


def _import_alone(statement):
    return subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True,
                          timeout=60)


def test_importing_after_metaflow_works():
    proc = _import_alone("import metaflow\nfrom %s.core.errors import TorchDistributedGangFailed"
                         % PKG)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_errors_can_be_imported_before_metaflow():
    # the package imports metaflow first (plugins/torch_distributed/__init__.py)
    proc = _import_alone("from %s.core.errors import TorchDistributedGangFailed" % PKG)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_flows_run_the_installed_package_from_this_working_tree(tmp_path):
    """What .ci/run installs (`pip install -e '.[metaflow]'`, setuptools' default editable mode) is found by
    Metaflow where flows run (outside the repository), and it is this working tree's code."""
    statement = (
        "import importlib.metadata, metaflow\n"
        "from metaflow import torch_distributed\n"
        "import %s.decorator as d\n"
        "print(importlib.metadata.version('metaflow-torch-distributed'))\n"
        "print(d.__file__)" % PKG)
    proc = subprocess.run([sys.executable, "-c", statement], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    version, path = proc.stdout.split()
    assert version == re.search(r'^VERSION = "([^"]+)"', (REPO / "setup.py").read_text(),
                                re.M).group(1)
    assert path == str(REPO / "metaflow_extensions" / "torch_distributed" / "plugins" /
                       "torch_distributed" / "decorator.py")
