"""The Metaflow versions the package agrees to run with."""

import re
from pathlib import Path

import metaflow  # noqa: F401 - metaflow must load the extension before its modules are imported
import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed import versions
from metaflow_extensions.torch_distributed.plugins.torch_distributed.errors import (
    TorchDistributedEnvironmentError,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.versions import (
    check_metaflow_version,
    metaflow_version_supported,
)


@pytest.mark.parametrize("version,supported", [
    ("2.19.0", True),
    ("2.19.39", True),
    ("2.19.100", True),
    ("2.19", True),
    ("2.19.39.post1", True),
    ("2.19.39+netflix.7", True),
    ("2.18.9", False),
    ("2.18", False),
    ("2.20.0", False),
    ("2.20.1", False),
    ("2.9.1", False),      # numbers, not strings: 9 < 19
    ("2.100.0", False),
    ("3.0.0", False),
    ("1.22.4", False),
    ("2.20.0.dev0", False),
])
def test_metaflow_version_supported(version, supported):
    assert metaflow_version_supported(version) is supported


def test_range_matches_install_requires():
    setup = (Path(__file__).parents[2] / "setup.py").read_text()
    low, high = re.search(r'"metaflow>=([\d.]+),<([\d.]+)"', setup).groups()
    assert versions.TESTED_METAFLOW[0] == versions._parse(low)
    assert versions.TESTED_METAFLOW[1] == versions._parse(high)


def test_installed_metaflow_passes():
    check_metaflow_version("train")


def test_an_untested_metaflow_is_refused_with_the_fix(monkeypatch):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.21.3")
    with pytest.raises(TorchDistributedEnvironmentError) as info:
        check_metaflow_version("train")
    message = str(info.value)
    assert "step *train*" in message
    assert "metaflow 2.21.3 is installed" in message
    assert "pip install 'metaflow>=2.19.0,<2.20.0'" in message
