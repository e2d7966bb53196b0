"""No module but internals.py reaches a Metaflow internal.

The package's modules are read (ast), not imported. A module other than internals.py may use
Metaflow's public API only: the names of the PUBLIC table below. It may not
* import from another Metaflow module, or import a name starting with `_` from any;
* read a private attribute (`x._name`, or getattr(x, "_name")) of anything but itself
  (`self`, `cls`, `super()`) or a module it imported from outside Metaflow (`os._exit`, torch's);
* patch Metaflow: assign to an attribute of a Metaflow name (`Batch.create_job = ...`), set an
  attribute on a class (`setattr(type(current), ...)`), or walk or delete an object's attributes
  (`vars(flow)`, `delattr(flow, ...)`).
What a static read cannot see: an assignment to a public attribute of a Metaflow object passed
in (`job.num_parallel = 0` on a BatchJob); review keeps those in internals.py.
Anything else it needs goes into internals.py, with its reason and a contract test
(test_internals_contract.py).
"""

import ast

import pytest

from tests.support import REPO

PACKAGE = REPO / "metaflow_extensions" / "torch_distributed"
SEAM = PACKAGE / "plugins" / "torch_distributed" / "mf" / "internals.py"

# Metaflow's public API: module -> the names a module of ours may import from it (a callable
# deciding by name). Our own settings live in metaflow_config by Metaflow's extension mechanism.
PUBLIC = {
    # the documented top-level API (docs.metaflow.org/api), not its modules (metaflow.util)
    "metaflow": lambda name: name in ("current", "FlowSpec", "step", "Parameter", "Config",
                                      "Flow", "Run", "Step", "Task", "namespace", "Checkpoint"),
    "metaflow.cards": lambda name: not name.startswith("_"),  # Markdown, Table, VegaChart
    "metaflow.decorators": lambda name: name == "StepDecorator",
    "metaflow.exception": lambda name: name == "MetaflowException",
    "metaflow.metaflow_config": lambda name: name.startswith("TORCH_DISTRIBUTED_"),
    "metaflow.metaflow_config_funcs": lambda name: name == "from_conf",  # extension settings
}
OWN = ("self", "cls")
# Private names of other libraries that a module reads on purpose (each a known seam of its own,
# not Metaflow's): (file name, attribute) -> whose it is.
NOT_METAFLOW = {
    ("groupcheck.py", "_rendezvous_handlers"): "torch.distributed.rendezvous (GroupWatch)",
    ("groupcheck.py", "_shared_state"): "accelerate.state.PartialState",
    # a probe's collective count (pinned by tests/unit/test_stacks.py on a real gloo group)
    ("stacks.py", "_world"): "torch.distributed.distributed_c10d (every process group)",
    ("stacks.py", "_get_default_group"): "torch.distributed.distributed_c10d",
    ("stacks.py", "_get_sequence_number_for_group"): "torch's ProcessGroup",
    # a rank's last collectives in a hang report (pinned by tests/unit/test_stacks.py on a
    # real gloo group, and by .ci/torch_range's hang test on torch 2.5.0, 2.9.1 and 2.15.0)
    ("stacks.py", "_dump_fr_trace"): "torch._C._distributed_c10d (Flight Recorder)",
    ("stacks.py", "_dump_nccl_trace"): "torch._C._distributed_c10d (NCCL's Flight Recorder)",
}


def _is_metaflow(module):
    return module == "metaflow" or module.startswith("metaflow.")


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def violations(source, filename="<module>"):
    """Every place in `source` that reaches a Metaflow internal, as "file:line: what"."""
    tree = ast.parse(source, filename)
    metaflow_names, other_modules = set(), set()
    found = []

    def flag(node, what):
        found.append("%s:%d: %s" % (filename, node.lineno, what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                if _is_metaflow(alias.name):
                    metaflow_names.add(bound)
                    if alias.name not in PUBLIC:
                        flag(node, "imports Metaflow module %s" % alias.name)
                else:
                    other_modules.add(bound)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            for alias in node.names:
                bound = alias.asname or alias.name
                if node.level == 0 and _is_metaflow(module):
                    metaflow_names.add(bound)
                    allowed = PUBLIC.get(module)
                    if allowed is None or not allowed(alias.name) or _private(alias.name):
                        flag(node, "imports %s from Metaflow module %s" % (alias.name, module))
                else:
                    other_modules.add(bound)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            receiver = node.value
            own = (isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name)
                   and receiver.func.id == "super")  # its own class's, as with self
            if not own and not (isinstance(receiver, ast.Name)
                                and (receiver.id in OWN or receiver.id in other_modules)):
                flag(node, "reads private attribute %s of %s" % (node.attr, ast.unparse(receiver)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            func, args = node.func.id, node.args
            if func in ("getattr", "setattr", "hasattr", "delattr") and len(args) >= 2 \
                    and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str) \
                    and _private(args[1].value) \
                    and not (isinstance(args[0], ast.Name) and args[0].id in OWN):
                flag(node, "%s of private attribute %s" % (func, args[1].value))
            if func in ("vars", "delattr"):
                flag(node, "%s(%s): an object's attributes are Metaflow's artifacts"
                     % (func, ", ".join(ast.unparse(a) for a in args)))
            if func == "setattr" and args and (
                    (isinstance(args[0], ast.Call) and isinstance(args[0].func, ast.Name)
                     and args[0].func.id == "type")
                    or (isinstance(args[0], ast.Name) and args[0].id in metaflow_names)):
                flag(node, "patches a class: setattr(%s, ...)" % ast.unparse(args[0]))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id in metaflow_names:
                    flag(node, "patches Metaflow: %s = ..." % ast.unparse(target))
    return found


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if p != SEAM)


def _known_elsewhere(path, violation):
    return any(path.name == name and (" %s " % attribute in violation
                                      or violation.endswith(" " + attribute))
               for name, attribute in NOT_METAFLOW)


def test_no_module_but_internals_reaches_a_metaflow_internal():
    found = [v for path in _modules()
             for v in violations(path.read_text(), str(path.relative_to(REPO)))
             if not _known_elsewhere(path, v)]
    assert not found, (
        "These reach Metaflow internals outside internals.py. Move each use into a function "
        "of internals.py (with its reason and a contract test in "
        "tests/unit/test_internals_contract.py) and call that:\n" + "\n".join(found))


def test_the_scan_reads_every_module_and_the_seam_exists():
    names = {p.name for p in _modules()}
    assert {"decorator.py", "batch.py", "leader.py", "mfextinit_torch_distributed.py"} <= names
    assert SEAM.exists()
    # the seam itself does what the others may not: the scan would see it
    assert violations(SEAM.read_text(), "internals.py")


@pytest.mark.parametrize("source", [
    "from metaflow._vendor import click",
    "from metaflow.cli_args import cli_args",
    "from metaflow import _private_thing",
    "import metaflow.plugins.aws.batch.batch",
    "from metaflow.metaflow_config import SPIN_ALLOWED_DECORATORS",
    "from metaflow import current\ncurrent._update_env({})",
    "def f(deco):\n    return deco._card_uuid",
    "def f(deco):\n    return getattr(deco, '_card_uuid', None)",
    "def f(job):\n    return job.payload._x",
    "from metaflow import util",
    "from metaflow.plugins.aws.batch.batch import Batch\nBatch.create_job = None",
    "from metaflow import current\nsetattr(type(current), 'parallel', property())",
    "def f(flow):\n    return set(vars(flow))",
    "def f(flow):\n    delattr(flow, 'x')",
    "import metaflow\nmetaflow.current = None",
])
def test_the_scan_catches(source):
    assert violations(source), "the scan missed: %s" % source


@pytest.mark.parametrize("source", [
    "from metaflow import current, FlowSpec\ncurrent.step_name",
    "from metaflow.decorators import StepDecorator",
    "from metaflow.exception import MetaflowException",
    "from metaflow.cards import Markdown, Table, VegaChart",
    "from metaflow.metaflow_config import TORCH_DISTRIBUTED_START_METHOD",
    "import os\nos._exit(0)",
    "from torch.distributed import rendezvous\nrendezvous._rendezvous_handlers",
    "from . import batch\nbatch._plain({})",
    "class A:\n    def f(self):\n        self._x = 1\n        return getattr(self, '_x')",
    "class B(A):\n    def f(self):\n        return super()._f()",
])
def test_the_scan_allows(source):
    assert violations(source) == []
