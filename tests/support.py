"""Running real flows through Metaflow's CLI, bounded and isolated (the e2e tests' FlowRunner,
the emulation tests' `metaflow`), and the one check that a test left no process running."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

FLOWS = Path(__file__).parent / "e2e" / "flows"
REPO = Path(__file__).parent.parent


class Result:
    def __init__(self, proc, elapsed, stdout, stderr):
        self.returncode = proc.returncode
        self.elapsed = elapsed
        self.stdout = stdout
        self.stderr = stderr
        self.output = stdout + stderr

    def __repr__(self):
        return "Result(rc=%s, %.1fs)\n%s" % (self.returncode, self.elapsed, self.output[-6000:])


class FlowRunner:
    """Copies a flow into its own folder (datastore, metadata and METAFLOW_HOME inside it)."""

    def __init__(self, root):
        self.root = Path(root)
        self.marks = self.root / "marks"
        self.marks.mkdir(exist_ok=True)

    def env(self, extra=None):
        env = dict(os.environ)
        for key in list(env):
            if key.startswith(("TD_", "METAFLOW_")) or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
                del env[key]
        env.update({
            "METAFLOW_HOME": str(self.root / "mfhome"),
            "METAFLOW_DEFAULT_DATASTORE": "local",
            "METAFLOW_DEFAULT_METADATA": "local",
            "METAFLOW_DATASTORE_SYSROOT_LOCAL": str(self.root),
            "USERNAME": "tester",
            "TD_MARK_DIR": str(self.marks),
        })
        env.update({k: str(v) for k, v in (extra or {}).items()})
        return env

    def flow_path(self, name):
        target = self.root / name
        if not target.exists():
            shutil.copy(FLOWS / name, target)
        return target

    def cli(self, name, *args, env=None, timeout=240):
        path = self.flow_path(name)
        proc, elapsed = run_bounded([sys.executable, str(path), "--no-pylint", *args],
                                    self.root, self.env(env), timeout)
        return Result(proc, elapsed, proc.stdout, proc.stderr)

    def run(self, name, *args, env=None, timeout=240):
        return self.cli(name, "run", *args, env=env, timeout=timeout)

    def run_in_cgroup(self, group, name, env=None, timeout=180):
        """`python flow.py run` with every process of the run in cgroup `group` (a folder of
        /sys/fs/cgroup, as a container's), which is removed after it with rmdir, not killed:
        a process left in it is for assert_no_leftovers to find. (stdout + stderr, exit code)."""
        path = self.flow_path(name)
        try:
            proc = subprocess.run(
                ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group),
                 sys.executable, str(path), "--no-pylint", "run"],
                cwd=self.root, env=self.env(env), capture_output=True, text=True,
                timeout=timeout)
        finally:
            try:
                group.rmdir()
            except OSError:
                pass
        return proc.stdout + proc.stderr, proc.returncode

    def popen(self, name, *args, env=None):
        path = self.flow_path(name)
        return subprocess.Popen([sys.executable, str(path), "--no-pylint", *args], cwd=self.root,
                                env=self.env(env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=_like_a_terminal)

    def failed_at(self):
        mark = self.marks / "failed-at"
        text = mark.read_text().strip() if mark.exists() else ""
        return float(text) if text else None  # an empty file: the rank is writing it

    def client(self, code, env=None):
        """Evaluate `code` with Metaflow's client in a fresh interpreter pointed at this test's
        datastore (Metaflow reads its roots once per process); `code` sets `result`."""
        script = ("import json\nfrom metaflow import Flow, Run, Task, namespace\n"
                  "namespace(None)\n%s\nprint('@@' + json.dumps(result))" % code)
        proc = subprocess.run([sys.executable, "-c", script], cwd=self.root, env=self.env(env),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.rsplit("@@", 1)[1])

    def leftovers(self):
        """Processes still running from this test's folder."""
        return live_processes(started_in(self.root))

    def assert_no_leftovers(self, wait=5.0):
        assert_none_left(started_in(self.root), "processes left behind", wait)


# -- the one runner of a flow's CLI -----------------------------------------------------------

RUN_TIMEOUT_S = 120
KILL_GRACE_S = 10


def isolated_env(*layers, home):
    """The test's environment without any Metaflow or AWS settings, then `layers`, with an
    empty Metaflow home (no ~/.metaflowconfig profile can leak in)."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("METAFLOW_", "AWS_"))}
    for layer in layers:
        env.update(layer)
    env["METAFLOW_HOME"] = str(home)
    env["METAFLOW_USER"] = "tester"
    return env


def run_bounded(argv, cwd, env, timeout_s=RUN_TIMEOUT_S):
    """Run `argv` in its own session, so that a hung run is stopped with every process it
    started: SIGTERM first (Metaflow's atexit hook then stops its remote jobs), SIGKILL after
    KILL_GRACE_S. Returns (CompletedProcess, seconds); a run past `timeout_s` fails the test
    with its output."""
    import pytest

    started = time.monotonic()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate(timeout=KILL_GRACE_S)
        pytest.fail("%s timed out after %d s\n%s\n%s" % (argv, timeout_s, stdout, stderr))
    elapsed = time.monotonic() - started
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr), elapsed


def metaflow(flow, args, cwd, env, timeout_s=RUN_TIMEOUT_S):
    """`python flow --no-pylint args...`, bounded (run_bounded)."""
    done, _ = run_bounded([sys.executable, flow, "--no-pylint", *args], cwd, env, timeout_s)
    return done


# -- the one check that nothing is left running --------------------------------------------------

def live_processes(where):
    """Live processes (not zombies) for which `where(process)` holds; `process.info` has its
    pid, cmdline and environ (None where it cannot be read)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "environ", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and where(process):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def started_in(folder):
    """Processes whose command line names a path under `folder` (a test's own flows)."""
    return lambda p: any(str(folder) in part for part in (p.info["cmdline"] or []))


def with_env(name, value):
    """Processes whose environment has `name` set to `value` (an emulator's marker)."""
    return lambda p: (p.info["environ"] or {}).get(name) == value


def descendants():
    """Processes this test process started, directly or not (taken now)."""
    pids = {child.pid for child in psutil.Process().children(recursive=True)}
    return lambda p: p.pid in pids


def assert_none_left(where, what, wait=5.0):
    """Wait up to `wait` s for the processes `where` selects to end; kill any still running and
    fail naming them."""
    deadline = time.monotonic() + wait
    while True:
        left = live_processes(where)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    assert not left, "%s: %s" % (what, [(p.pid, p.info["cmdline"]) for p in left])


def _like_a_terminal():
    """Give the run the SIGINT of a user's terminal: the suite itself may run where SIGINT is
    ignored (a background job of a non-interactive shell, as CI may start it), and an ignored
    SIGINT is inherited, so a test's Ctrl-C would never reach the run."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def card_json(html):
    """The data a Metaflow card page carries (base64 JSON in window.__MF_DATA__), as text."""
    import base64
    import re

    found = re.search(r'window.__MF_DATA__\["[^"]+"\] = "([A-Za-z0-9+/=]+)"', html)
    return json.dumps(json.loads(base64.b64decode(found.group(1))))


def card_charts(data):
    """(bars, markers, every chart spec) of the gang timeline in card data `data` (card_json)."""
    charts = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("type") == "vegaChart":
                charts.append(node["spec"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(data))
    spec = next(c for c in charts if str(c.get("title", "")).startswith("Every rank"))
    return spec["layer"][0]["data"]["values"], spec["layer"][1]["data"]["values"], charts


def flight_recorder_for_gloo():
    """Whether the torch of this venv (the ranks' torch) keeps a Flight Recorder for gloo
    (2.9 and later)."""
    import torch._C._distributed_c10d as c10d

    return hasattr(c10d, "_dump_fr_trace")


def assert_collective_history(out, waiting, everyone):
    """The hang report's part on each rank's last collectives (stacks.history_text): the
    ranks `waiting` (as the report names them, e.g. "ranks 0, 1, 3 (nodes 0, 1)") in an
    all_reduce not completed, where torch keeps a Flight Recorder for gloo; else `everyone`
    with torch's version and no history."""
    import re

    start = "Each rank's last collectives (torch's Flight Recorder"
    assert start in out, out[-6000:]
    history = out[out.index(start):]
    if flight_recorder_for_gloo():
        assert re.search(r"%s: (.*; )?all_reduce #\d+ on default_pg \(Float\[\d+\]\) NOT "
                         r"COMPLETED\n" % re.escape(waiting), history), history[:2000]
    else:
        assert re.search(r"%s: none: torch \S+ keeps no Flight Recorder for gloo"
                         % re.escape(everyone), history), history[:2000]
    return history


def same_weights(resumed, uninterrupted):
    """Whether two trainings' final weights (nested lists, as checkpoint_flow.py keeps them)
    are equal but for the last bits. A resumed DDP run may lay its gradient bucket out
    otherwise (DDP rebuilds buckets in the order gradients came ready), which moves an element
    to another chunk of gloo's ring allreduce and so changes the order of its sum across ranks:
    seen once under load, a bias 9e-7 apart, relatively. A wrong checkpoint is far further."""
    import pytest

    def flat(values):
        return [x for v in values for x in flat(v)] if isinstance(values, list) else [values]

    return flat(resumed) == pytest.approx(flat(uninterrupted), rel=1e-5, abs=1e-9)
