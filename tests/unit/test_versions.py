"""The Metaflow versions the package agrees to run with."""

import re
from pathlib import Path

import metaflow  # noqa: F401 - metaflow must load the extension before its modules are imported
import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import versions
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedEnvironmentError,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import supported
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.supported import (
    metaflow_version_supported,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.versions import (
    check_metaflow_version,
)


@pytest.mark.parametrize("version,supported", [
    ("2.19.0", True),
    ("2.19.39", True),
    ("2.19.100", True),
    ("2.19", True),
    ("2.19.39.post1", True),
    ("2.19.39+netflix.7", True),
    ("2.19.39+obcheckpoint(0.2.14)", True),  # get_version() with an extension installed
    ("2.19.39.1", True),   # ob-metaflow: Metaflow 2.19.39 with Outerbounds' changes
    ("2.18.13.1", False),
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


def test_range_matches_the_metaflow_extra():
    setup = (Path(__file__).parents[2] / "setup.py").read_text()
    low, high = re.search(r'"metaflow": \["metaflow>=([\d.]+),<([\d.]+)"\]', setup).groups()
    assert supported.TESTED_METAFLOW[0] == supported.parse_version(low)
    assert supported.TESTED_METAFLOW[1] == supported.parse_version(high)


def test_installed_metaflow_passes():
    check_metaflow_version("train")


def test_setup_py_does_not_install_a_metaflow():
    """ob-metaflow provides the same module: a dependency on metaflow would install it over
    ob-metaflow's files. Only the `metaflow` extra asks for it."""
    setup = (Path(__file__).parents[2] / "setup.py").read_text()
    assert "install_requires" not in setup
    assert setup.count('"metaflow>=') == 1


@pytest.mark.parametrize("installed,fix", [
    ([("metaflow", "2.21.3")], "pip install 'metaflow>=2.19.0,<2.20'"),
    ([("ob-metaflow", "2.18.13.1")], "pip install 'ob-metaflow>=2.19.0,<2.20'"),
])
def test_an_untested_metaflow_is_refused_naming_its_distribution(monkeypatch, installed, fix):
    monkeypatch.setattr(versions.internals, "metaflow_distributions", lambda: installed)
    with pytest.raises(TorchDistributedEnvironmentError) as info:
        check_metaflow_version("train")
    message = str(info.value)
    assert "step *train*" in message
    assert "%s %s is installed" % installed[0] in message
    assert "tested with Metaflow >=2.19.0,<2.20, as metaflow or ob-metaflow" in message
    assert fix in message


def test_a_metaflow_without_metadata_is_checked_by_its_own_version(monkeypatch):
    """A code package on a remote node has no distribution metadata."""
    monkeypatch.setattr(versions.internals, "metaflow_distributions", lambda: [])
    monkeypatch.setattr(versions.internals, "metaflow_version", lambda: "2.18.2")
    with pytest.raises(TorchDistributedEnvironmentError, match="metaflow 2.18.2 is installed"):
        check_metaflow_version("train")


def test_metaflow_installed_over_ob_metaflow_is_refused_with_the_fix(monkeypatch):
    both = [("metaflow", "2.19.39"), ("ob-metaflow", "2.19.39.1")]
    monkeypatch.setattr(versions.internals, "metaflow_distributions", lambda: both)
    with pytest.raises(TorchDistributedEnvironmentError) as info:
        check_metaflow_version("train")
    message = str(info.value)
    assert "metaflow 2.19.39 and ob-metaflow 2.19.39.1 both installed the metaflow package" in message
    assert "pip uninstall -y metaflow ob-metaflow" in message


def test_the_docs_and_ci_name_the_tested_range():
    """docs, core/supported.py, setup.py's extra and CI's other venvs (.ci/packages) agree."""
    repo = Path(__file__).parents[2]
    tested = supported.tested_range()
    assert tested == ">=2.19.0,<2.20"
    for page in ("README.md", "docs/index.md", "docs/scope.md", "docs/troubleshooting.md"):
        assert "`%s`" % tested in (repo / page).read_text() or \
            "Metaflow %s" % tested in (repo / page).read_text(), page
    ci = (repo / ".ci" / "packages").read_text()
    ob = re.search(r'OB_METAFLOW="ob-metaflow==([\d.]+)"', ci).group(1)
    assert metaflow_version_supported(ob)
    assert "oldest=" in ci and "metaflow>=" in ci  # the oldest is read from setup.py's extra


@pytest.mark.parametrize("version,verdict", [
    ("2.4.1", "older"),
    ("2.4.1+cu124", "older"),
    ("1.13.1", "older"),
    ("2.5.0", "tested"),
    ("2.5.1+cu124", "tested"),
    ("2.9.1", "tested"),
    ("2.13.0+cpu", "tested"),
    ("2.15.0", "tested"),
    ("2.15.2", "tested"),
    ("2.16.0", "newer"),
    ("2.16.0.dev20261101+cpu", "newer"),
    ("3.0.0", "newer"),
])
def test_torch_version_verdict(version, verdict):
    assert supported.torch_version_verdict(version) == verdict


def test_an_older_torch_is_refused_naming_it_and_the_range():
    with pytest.raises(TorchDistributedEnvironmentError) as info:
        versions.check_torch_version("train", "2.4.1+cu124", "in the image")
    message = str(info.value)
    assert "step *train*" in message
    assert "torch 2.4.1+cu124 is installed in the image" in message
    assert "pip install 'torch>=2.5.0,<2.16'" in message


def test_a_newer_torch_runs_with_one_warning(capsys):
    versions.check_torch_version("train", "2.16.0", "here")
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("@torch_distributed on step *train*: WARNING: torch 2.16.0 (installed "
                          "here) is newer than")
    assert "(torch >=2.5.0,<2.16)" in err


@pytest.mark.parametrize("version", ["2.5.0", "2.13.0+cpu", None])
def test_a_tested_or_absent_torch_passes_silently(capsys, version):
    versions.check_torch_version("train", version, "here")
    assert capsys.readouterr().err == ""


def test_the_torch_range_is_the_same_in_setup_py_the_docs_and_ci():
    """setup.py's torch extra, docs/index.md and the releases .ci/torch_range runs (the ends of
    the range, read from core/supported.py) say one range."""
    repo = Path(__file__).parents[2]
    low, high = re.search(r'"torch": \["torch>=([\d.]+),<([\d.]+)"\]',
                          (repo / "setup.py").read_text()).groups()
    assert supported.TESTED_TORCH == (supported.parse_version(low),
                                      supported.parse_version(high))
    oldest, newest = supported.TESTED_TORCH_RELEASES
    assert supported.parse_version(oldest) == supported.TESTED_TORCH[0]
    assert supported.torch_version_verdict(newest) == "tested"
    major, minor, _ = supported.parse_version(high)
    assert supported.parse_version(newest)[:2] == (major, minor - 1)  # the range ends with it
    assert "torch `%s`" % supported.tested_range(supported.TESTED_TORCH) in (
        repo / "docs" / "index.md").read_text()
    assert "TESTED_TORCH_RELEASES" in (repo / ".ci" / "torch_range").read_text()


def test_the_installed_torch_is_read_without_importing_it():
    import importlib.metadata

    assert versions.installed_torch() == importlib.metadata.version("torch")
