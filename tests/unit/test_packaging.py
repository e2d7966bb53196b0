"""The package as published: its metadata, its version in one place, and .ci/check_dist.py,
which checks what `python -m build` made (CI builds and installs both archives: .ci/packages)."""

import importlib.util
import io
import re
import sys
import tarfile
import zipfile

import pytest

from tests.support import REPO

SETUP = (REPO / "setup.py").read_text()


def load_check_dist():
    spec = importlib.util.spec_from_file_location("check_dist", REPO / ".ci" / "check_dist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_dist = load_check_dist()
VERSION = check_dist.setup_version()


def test_the_version_is_set_in_setup_py_and_named_by_the_changelog():
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)
    assert SETUP.count(VERSION) == 1
    assert check_dist.changelog_version() == VERSION


def test_python_requires_is_what_ci_runs_and_the_classifiers_name_it():
    """CI runs the suite with the machine's python3 and the real flows' core on the other
    Pythons of the range (.ci/torch_range); python_requires spans exactly those, and the
    classifiers name each."""
    low, high = re.search(r'python_requires=">=3\.(\d+),<3\.(\d+)"', SETUP).groups()
    assert int(low) <= sys.version_info[1] < int(high)
    ci = (REPO / ".ci" / "torch_range").read_text()
    for minor in range(int(low), int(high)):
        assert '"Programming Language :: Python :: 3.%d"' % minor in SETUP
        assert minor == sys.version_info[1] or "3.%d" % minor in re.findall(
            r"^run_core_on \S+ (3\.\d+)", ci, re.M), "Python 3.%d: no CI run" % minor


def test_the_license_is_apache_2():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert 'license_expression="Apache-2.0"' in SETUP


METADATA = """Metadata-Version: 2.4
Name: metaflow-torch-distributed
Version: %s
License-Expression: Apache-2.0
Requires-Python: <3.14,>=3.10
Project-URL: Documentation, https://example.invalid/docs
Project-URL: Source, https://example.invalid
Project-URL: Changelog, https://example.invalid/CHANGELOG.md
Project-URL: Issues, https://example.invalid/issues
Provides-Extra: metaflow
Requires-Dist: metaflow<2.20,>=2.19.0; extra == "metaflow"
""" % VERSION


def write_wheel(path, extra_files=(), metadata=METADATA):
    info = "metaflow_torch_distributed-%s.dist-info/" % VERSION
    with zipfile.ZipFile(path, "w") as wheel:
        for name in check_dist.tracked(check_dist.PACKAGE):
            wheel.writestr(name, "")
        wheel.writestr(info + "METADATA", metadata)
        wheel.writestr(info + "licenses/LICENSE", "")
        for name in extra_files:
            wheel.writestr(name, "")


def write_sdist(path, extra_files=(), leave_out=()):
    top = "metaflow_torch_distributed-%s/" % VERSION
    names = (check_dist.tracked(check_dist.PACKAGE, "examples", "docs")
             | {"README.md", "LICENSE", "CHANGELOG.md", "setup.py", "pyproject.toml",
                "mkdocs.yml"} | set(extra_files)) - set(leave_out)
    with tarfile.open(path, "w:gz") as sdist:
        for name, data in [("PKG-INFO", METADATA)] + [(n, "") for n in sorted(names)]:
            blob = data.encode()
            member = tarfile.TarInfo(top + name)
            member.size = len(blob)
            sdist.addfile(member, io.BytesIO(blob))


@pytest.fixture
def dist(tmp_path):
    return tmp_path


def test_check_dist_accepts_archives_that_hold_what_they_should(dist, capsys):
    write_wheel(dist / "p.whl")
    write_sdist(dist / "p.tar.gz")
    assert check_dist.main(dist) == 0, capsys.readouterr().err


@pytest.mark.parametrize("wheel_files,sdist_files,leave_out,metadata,problem", [
    (["tests/unit/test_topology.py"], [], [], METADATA,
     "wheel: tests/unit/test_topology.py should not be in the wheel"),
    ([], ["bench/results/run.json"], [], METADATA,
     "sdist: bench/results/run.json should not be in the sdist"),
    ([], [], ["examples/ddp_flow.py"], METADATA, "sdist: examples/ddp_flow.py is missing"),
    ([], [], [], METADATA + "Requires-Dist: metaflow>=2.19.0\n",
     "wheel: it depends on metaflow>=2.19.0 outside the metaflow extra"),
    ([], [], [], METADATA.replace("Apache-2.0", "MIT"), "wheel: License-Expression is 'MIT'"),
])
def test_check_dist_names_what_is_wrong(dist, capsys, wheel_files, sdist_files, leave_out,
                                         metadata, problem):
    write_wheel(dist / "p.whl", wheel_files, metadata)
    write_sdist(dist / "p.tar.gz", sdist_files, leave_out)
    assert check_dist.main(dist) == 1
    assert "check_dist: " + problem in capsys.readouterr().err
