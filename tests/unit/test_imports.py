"""The package's modules can be imported on their own, in a fresh interpreter."""

import subprocess
import sys

PKG = "metaflow_extensions.torch_distributed.plugins.torch_distributed"


def _import_alone(statement):
    return subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True,
                          timeout=60)


def test_importing_after_metaflow_works():
    proc = _import_alone("import metaflow\nfrom %s.errors import TorchDistributedGangFailed"
                         % PKG)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_errors_can_be_imported_before_metaflow():
    # the package imports metaflow first (plugins/torch_distributed/__init__.py)
    proc = _import_alone("from %s.errors import TorchDistributedGangFailed" % PKG)
    assert proc.returncode == 0, proc.stderr[-2000:]
