"""Check what `python -m build` made, before anything is installed from it.

    python3 .ci/check_dist.py DIST_DIR

DIST_DIR holds one sdist and one wheel of this working tree. The wheel holds the package's
modules and its metadata only (no tests, no bench, no docs); the sdist holds the package, the
files README's first command needs (examples/) and the documentation README links to (docs/,
mkdocs.yml, CHANGELOG.md, LICENSE), and no tests or bench results. Both carry the version of
setup.py, which CHANGELOG.md's newest entry names, and neither depends on a Metaflow
distribution but through the `metaflow` extra. Standard library only.
"""

import email.parser
import pathlib
import re
import subprocess
import sys
import tarfile
import zipfile

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "metaflow_extensions/torch_distributed/"


def tracked(*paths):
    out = subprocess.run(["git", "ls-files", *paths], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return {line for line in out.splitlines() if line}


def setup_version():
    return re.search(r'^VERSION = "([^"]+)"', (REPO / "setup.py").read_text(), re.M).group(1)


def changelog_version():
    return re.search(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), re.M).group(1)


def metadata_problems(text, version):
    meta = email.parser.Parser().parsestr(text)
    problems = []
    if meta["Version"] != version:
        problems.append("version %s, setup.py says %s" % (meta["Version"], version))
    if meta["License-Expression"] != "Apache-2.0":
        problems.append("License-Expression is %r" % meta["License-Expression"])
    if not meta["Requires-Python"]:
        problems.append("no Requires-Python")
    urls = {value.split(",")[0] for value in meta.get_all("Project-URL") or []}
    if not {"Documentation", "Source", "Changelog", "Issues"} <= urls:
        problems.append("project URLs %s" % sorted(urls))
    for requirement in meta.get_all("Requires-Dist") or []:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
        if name in ("metaflow", "ob-metaflow") and 'extra == "metaflow"' not in requirement:
            problems.append("it depends on %s outside the metaflow extra" % requirement)
    return problems


def check_wheel(path, version):
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        info = "metaflow_torch_distributed-%s.dist-info/" % version
        problems = metadata_problems(wheel.read(info + "METADATA").decode(), version)
    modules = {n for n in tracked(PACKAGE) if n.endswith(".py")}
    problems += ["%s is missing" % n for n in sorted(modules - names)]
    if info + "licenses/LICENSE" not in names:
        problems.append("no LICENSE in %s" % info)
    problems += ["%s should not be in the wheel" % n for n in sorted(names)
                 if not (n.startswith(PACKAGE) or n.startswith(info))]
    return problems


def check_sdist(path, version):
    top = "metaflow_torch_distributed-%s/" % version
    with tarfile.open(path) as sdist:
        names = {m.name[len(top):] for m in sdist.getmembers() if m.isfile()}
        problems = metadata_problems(
            sdist.extractfile(top + "PKG-INFO").read().decode(), version)
    wanted = (tracked(PACKAGE, "examples", "docs")
              | {"README.md", "LICENSE", "CHANGELOG.md", "setup.py", "pyproject.toml",
                 "mkdocs.yml"})
    problems += ["%s is missing" % n for n in sorted(wanted - names)]
    problems += ["%s should not be in the sdist" % n for n in sorted(names)
                 if n.split("/")[0] in ("tests", "bench", ".ci")]
    return problems


def main(dist):
    version = setup_version()
    problems = []
    if changelog_version() != version:
        problems.append("CHANGELOG.md's newest entry is %s, setup.py says %s"
                        % (changelog_version(), version))
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        problems.append("expected one wheel and one sdist in %s, found %s"
                        % (dist, [p.name for p in wheels + sdists]))
    else:
        problems += ["wheel: " + p for p in check_wheel(wheels[0], version)]
        problems += ["sdist: " + p for p in check_sdist(sdists[0], version)]
    for problem in problems:
        print("check_dist: " + problem, file=sys.stderr)
    if not problems:
        print("check_dist: %s and %s hold what they should" % (wheels[0].name, sdists[0].name))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1])))
