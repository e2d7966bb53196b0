"""No failure a user can reach ends in Metaflow's `Internal error` (issue 42).

Metaflow prints `Internal error` and a traceback for any exception that is not a
MetaflowException (metaflow/cli.py, print_unknown_exception): for the package's own failures,
a traceback whose last frame is the package's, whether the cause was the user's machine or a
bug. Each case below injects one failure of docs/troubleshooting.md's kinds (a configuration
error, a machine that cannot run the gang, a full disk, a limit, a gang that failed, a script
that failed, current.torch_distributed outside its step, the preflight, a bug of the package)
into a real run through Metaflow's CLI, and checks that the package's own message, with its
headline, says it instead."""

import re
import sys
import textwrap

import pytest
from metaflow.exception import MetaflowException

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import errors
from tests.support import REPO, run_bounded

# Imported by every process of a run whose PYTHONPATH starts with the folder it is in:
# TD_INJECT picks the failure the gang's machinery meets when it makes its work folder.
SITECUSTOMIZE = '''
import errno, os, tempfile

_mkdtemp = tempfile.mkdtemp


def mkdtemp(*args, **kwargs):
    if str(kwargs.get("prefix", args[1] if len(args) > 1 else "")).startswith(
            "torch-distributed-"):
        inject = os.environ.get("TD_INJECT")
        if inject == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device",
                          os.path.join(tempfile.gettempdir(), "torch-distributed-x"))
        if inject == "bug":
            raise RuntimeError("injected bug in the gang's machinery")
    return _mkdtemp(*args, **kwargs)


tempfile.mkdtemp = mkdtemp
'''

# A torch that cannot be imported, first on the path: a task environment without torch.
NO_TORCH = "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"

OUTSIDE_FLOW = textwrap.dedent('''
    from metaflow import FlowSpec, current, step, torch_distributed


    class OutsideFlow(FlowSpec):
        @step
        def start(self):
            self.next(self.train)

        @torch_distributed(nproc_per_node=1)
        @step
        def train(self):
            self.next(self.end)

        @step
        def end(self):
            print(current.torch_distributed.rank)


    if __name__ == "__main__":
        OutsideFlow()
''')


PLUGIN = REPO / "metaflow_extensions" / "torch_distributed" / "plugins" / "torch_distributed"
# Error classes of the page that never reach the step's code: where each is defined.
OUTSIDE_THE_STEP = {"GangMismatch": PLUGIN / "runtime" / "control.py",
                    "GangAborted": PLUGIN / "runtime" / "supervisor.py",
                    "ScontrolFailed": PLUGIN / "backends" / "slurm_submit.py",
                    "SlurmWatchInterrupted": PLUGIN / "backends" / "slurm_submit.py"}


def error_classes_of_the_troubleshooting_page():
    """(class name, headline) of every row of the page's 'Error classes' table."""
    text = (REPO / "docs" / "troubleshooting.md").read_text()
    table = text.split("## Error classes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (`[^`]*`)? *\|", table, re.M)
    assert len(rows) >= 10, rows
    return [(name, headline.strip("`")) for name, headline in rows]


@pytest.mark.parametrize("name,headline", error_classes_of_the_troubleshooting_page())
def test_every_error_with_a_headline_is_a_metaflow_exception(name, headline):
    cls = getattr(errors, name, None)
    if cls is None:  # the node agents' and the Slurm watcher's own, never shown to the step
        assert name in OUTSIDE_THE_STEP, name
        assert re.search(r"^class %s\(" % name, OUTSIDE_THE_STEP[name].read_text(), re.M), name
        return
    if not headline:  # raised inside a rank's body to unwind it (TorchDistributedAborted)
        assert not issubclass(cls, MetaflowException) and name == "TorchDistributedAborted"
        return
    assert issubclass(cls, MetaflowException), name
    assert cls.headline == headline, name


def test_every_error_class_of_the_package_is_on_the_page():
    listed = {name for name, _ in error_classes_of_the_troubleshooting_page()}
    ours = {name for name, value in vars(errors).items()
            if isinstance(value, type) and issubclass(value, BaseException)
            and value.__module__ == errors.__name__}
    assert ours <= listed, ours - listed


def _inject_folder(tmp_path, torch_missing=False):
    folder = tmp_path / "inject"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    if torch_missing:
        (folder / "torch").mkdir()
        (folder / "torch" / "__init__.py").write_text(NO_TORCH)
    return str(folder)


# (id, flow, extra CLI args, env, the package's words that must say it)
CASES = [
    ("configuration", "config_flow.py", [], {"TD_ARGS": '{"nodes": 0}'},
     ["Invalid @torch_distributed configuration", "nodes=0 must be at least 1"]),
    ("a resources value that is no number", "config_flow.py",
     ["--with", "resources:gpu=many"], {},
     ["Invalid @torch_distributed configuration", "@resources(gpu='many') is not a number"]),
    ("gang failed", "gang_flow.py", [],
     {"TD_FAIL_RANK": 1, "TD_FAIL_WHEN": "after_init", "TD_FAIL_HOW": "exit"},
     ["@torch_distributed gang failed", "rank 1 (node 0, local rank 1) exited with code 3"]),
    ("script failed", "script_flow.py", [], {"TD_SCRIPT_FAIL_RANK": 1},
     ["@torch_distributed gang failed", "raised TorchDistributedScriptFailed",
      "exited with code 3"]),
    ("full disk", "gang_flow.py", [], {"TD_INJECT": "enospc"},
     ["@torch_distributed cannot run here", "No space left on device",
      "This is the machine's doing, not your step's code"]),
    ("a bug of the package", "gang_flow.py", [], {"TD_INJECT": "bug"},
     ["@torch_distributed stopped on an unexpected error",
      "RuntimeError: injected bug in the gang's machinery", "Please report it"]),
    ("torch missing", "gang_flow.py", [], {"TD_TORCH_MISSING": 1},
     ["@torch_distributed cannot run here", "torch is not installed where this task runs"]),
    ("outside its step", "outside_flow.py", [], {},
     ["current.torch_distributed is not available", "exists only inside a step decorated"]),
]


@pytest.mark.parametrize("flow,args,env,words", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_failure_is_said_by_the_package_never_as_internal_error(flow_runner, tmp_path, flow,
                                                                  args, env, words):
    env = dict(env)
    if flow == "outside_flow.py":
        (flow_runner.root / flow).write_text(OUTSIDE_FLOW)
    if flow == "script_flow.py":
        flow_runner.flow_path("torchrun_script.py")  # the script it runs, beside it
    inject = _inject_folder(tmp_path, torch_missing=bool(env.pop("TD_TORCH_MISSING", None)))
    env["PYTHONPATH"] = inject + ":" + str(REPO)
    res = flow_runner.run(flow, *args, env=env)
    assert res.returncode != 0, res
    said = " ".join(res.output.split())
    missing = [w for w in words if w not in said]
    assert not missing, (missing, res)
    assert "Internal error" not in res.output, res


def test_a_hard_open_file_limit_too_low_is_said_by_the_package(flow_runner, tmp_path):
    path = flow_runner.flow_path("gang_flow.py")
    done, _ = run_bounded(
        ["bash", "-c", 'ulimit -n 200 && ulimit -Hn 200 && exec "$0" "$1" --no-pylint run',
         sys.executable, str(path)], flow_runner.root, flow_runner.env(), 240)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "@torch_distributed cannot run here" in output, output
    assert "open files on node 0" in " ".join(output.split()), output
    assert "Internal error" not in output, output


def test_the_preflight_of_a_local_step_is_said_by_the_package(flow_runner):
    res = flow_runner.cli("gang_flow.py", "torch-distributed", "preflight")
    assert res.returncode != 0, res
    assert "@torch_distributed preflight failed" in res.output, res
    assert "Internal error" not in res.output, res
