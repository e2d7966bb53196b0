"""Commands and environments of exec'd gang processes (node agents and exec'd ranks).

An exec'd member runs Metaflow's hidden `spin-step` command: it loads the flow and the step's
real inputs from the original datastore, runs our decorator's hooks (which read the gang spec
from the environment), and leaves no trace in the run's metadata or datastore
(reference/metaflow_internals.md, section 5, option D).
"""

import json
import os
import re
import sys

from ..mf import internals

# Words that read the same in every shell context: left as they are.
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def nested_word(word):
    """`word` written so that it reaches the remote process unchanged through Metaflow's pod and
    job commands, which embed a command's text in `bash -c "..."` and split that with shlex
    first (a double-quoted string, where only \\ and \" are escapes): quoted for bash with
    single quotes (a ' inside as '\\''), then \\ and " escaped for shlex. No double quote
    and no lone backslash remain for shlex to take."""
    if _PLAIN_WORD.match(word):
        return word
    quoted = "'%s'" % word.replace("'", "'\\''")
    return quoted.replace("\\", "\\\\").replace('"', '\\"')


def member_command(spec, hidden_task_id, decorator_name, base_env):
    """(argv, env) of an exec'd member (agent or rank) described by `spec`."""
    argv = spin_step_argv(interpreter(), script_path(), spec.top_args, spec.step_name,
                          spec.identity(), hidden_task_id)
    env = spin_env(base_env, spec, decorator_name, os.path.join(spec.work_dir, "spin"))
    return argv, env


def spin_step_argv(executable, script, top_args, step_name, identity, hidden_task_id):
    """argv of a spin-step process running `step_name` of the same task under a hidden id."""
    return [executable, "-u", script, *top_args, "spin-step",
            *spin_step_options(step_name, identity, hidden_task_id)]


def spin_step_options(step_name, identity, hidden_task_id):
    """What follows `spin-step` in a member's command line."""
    argv = [step_name,
            "--run-id", identity.run_id,
            "--task-id", hidden_task_id,
            "--input-paths", identity.input_paths,
            "--retry-count", str(identity.retry_count),
            "--max-user-code-retries", str(identity.max_user_code_retries),
            "--orig-flow-datastore", identity.orig_datastore,
            "--no-persist"]
    if identity.split_index is not None:
        argv += ["--split-index", str(identity.split_index)]
    if identity.namespace is not None:
        argv += ["--namespace", identity.namespace]
    return argv


def spin_env(base_env, spec, decorator_name, spin_root):
    """The environment of a spin-step member: the task's own, plus what spin-step needs to run
    our decorator and to keep its bookkeeping out of the user's directories."""
    env = dict(base_env)
    env.update(spin_env_additions(base_env, spec, decorator_name))
    env[internals.SPIN_SYSROOT_ENV] = spin_root
    return env


def spin_env_additions(base_env, spec, decorator_name):
    """The variables a spin-step member needs on top of `base_env`: its GangSpec, and the
    spin-step decorator allow-list extended by our decorator."""
    # The variable wins over Metaflow's configuration (its config file included), as in Metaflow.
    allowed = json.loads(base_env.get(internals.SPIN_ALLOWED_ENV, "null") or "null")
    allowed = list(allowed or internals.spin_allowed_decorators())
    if decorator_name not in allowed:
        allowed.append(decorator_name)
    return {**spec.to_env(), internals.SPIN_ALLOWED_ENV: json.dumps(allowed)}


def interpreter():
    # Not environment.executable(): it returns "python", which a non-activated venv lacks.
    return sys.executable


def script_path():
    return os.path.abspath(sys.argv[0])
