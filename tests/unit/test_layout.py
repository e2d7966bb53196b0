"""The package's folders are its architecture, and imports only go down: the pure core imports
nothing of the package but itself; the runtime (one node's processes) the core; the Metaflow
seam (mf) those two; the backends those three; the gang (node 0's leader, the node agents,
each node's ranks) the floors below the backends and those; the preflight anything below it;
the top (the decorator) anything. Read with ast, not imported.
docs/architecture.md draws the same floors."""

import ast

from tests.support import REPO

PLUGIN = REPO / "metaflow_extensions" / "torch_distributed" / "plugins" / "torch_distributed"
FLOORS = {"core": 0, "runtime": 1, "mf": 2, "backends": 3, "gang": 4, "preflight": 5, "": 6}
TOP = {"__init__.py", "decorator.py"}


def floor_of(path):
    """The floor of a module file: its subpackage's, or the top's."""
    parts = path.relative_to(PLUGIN).parts
    return parts[0] if len(parts) > 1 else ""


def imported_floors(path, source=None):
    """(line, floor) of every module of the package that `path` (or `source`, as if it were
    `path`'s) imports: its relative imports."""
    found = []
    depth = len(path.relative_to(PLUGIN).parts) - 1
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        up = node.level - 1 - depth  # how far above plugins/torch_distributed/ it reaches
        if up > 0:
            found.append((node.lineno, "outside"))
            continue
        words = (node.module or "").split(".") if node.module else []
        if node.level - 1 < depth:  # within its own subpackage
            found.append((node.lineno, floor_of(path)))
        elif words and words[0] in FLOORS:
            found.append((node.lineno, words[0]))
        elif words:  # a top module (gang)
            found.append((node.lineno, ""))
        else:  # from .. import x: subpackages or top modules by name
            for alias in node.names:
                found.append((node.lineno, alias.name if alias.name in FLOORS else ""))
    return found


def modules():
    return sorted(PLUGIN.rglob("*.py"))


def test_every_module_lives_on_a_floor():
    flat = {p.name for p in PLUGIN.glob("*.py")}
    assert flat == TOP, "a new module goes into one of %s" % sorted(f for f in FLOORS if f)
    assert {floor_of(p) for p in modules()} == set(FLOORS)


def test_imports_only_go_down():
    wrong = []
    for path in modules():
        mine = FLOORS[floor_of(path)]
        for line, floor in imported_floors(path):
            if floor == "outside" or FLOORS[floor] > mine:
                wrong.append("%s:%d imports from %s" % (path.relative_to(PLUGIN), line,
                                                        floor or "the top"))
    assert not wrong, wrong


def test_the_core_imports_nothing_of_the_package_but_itself():
    for path in (PLUGIN / "core").glob("*.py"):
        assert {f for _, f in imported_floors(path)} <= {"core"}, path


def test_the_check_sees_imports_that_go_up_or_out():
    """The checks above can fail: a core module importing the runtime, the top, or above the
    package is caught."""
    core = PLUGIN / "core" / "naming.py"
    for line, floor in (("from ..runtime import procs", "runtime"),
                        ("from ..runtime.procs import spawn_member", "runtime"),
                        ("from ..gang import Leader", "gang"), ("from .. import gang", "gang"),
                        ("from .. import decorator", ""),
                        ("from ... import cards", "outside")):
        assert floor in {f for _, f in imported_floors(core, core.read_text() + "\n" + line)}
    assert {f for _, f in imported_floors(core, "from .errors import X")} == {"core"}
