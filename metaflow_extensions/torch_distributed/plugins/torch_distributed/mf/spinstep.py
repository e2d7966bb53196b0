"""Commands and environments of exec'd gang processes (node agents and exec'd ranks).

An exec'd member runs Metaflow's hidden `spin-step` command: it loads the flow and the step's
real inputs from the original datastore, runs our decorator's hooks (which read the gang spec
from the environment), and leaves no trace in the run's metadata or datastore
(reference/metaflow_internals.md, section 5, option D).
"""

import dataclasses
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..core.gangspec import ORDER_ENV, SPEC_ENV, AgentOrder, GangSpec, TaskIdentity
from ..mf import internals

# Words that read the same in every shell context: left as they are.
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def nested_word(word: str) -> str:
    """`word` written so that it reaches the remote process unchanged through Metaflow's pod and
    job commands, which embed a command's text in `bash -c "..."` and split that with shlex
    first (a double-quoted string, where only \\ and \" are escapes): quoted for bash with
    single quotes (a ' inside as '\\''), then \\ and " escaped for shlex. No double quote
    and no lone backslash remain for shlex to take."""
    if _PLAIN_WORD.match(word):
        return word
    quoted = "'%s'" % word.replace("'", "'\\''")
    return quoted.replace("\\", "\\\\").replace('"', '\\"')


class Shell(str):
    """A word of a command that the node's shell expands (a variable, an arithmetic
    expansion): written as it is, never quoted."""


@dataclass(frozen=True)
class SpinOptions:
    """What follows `spin-step <step>` in a member's command: the task's identity, under the
    member's hidden task id. Each value is a plain value (an argv word; quoted in shell text)
    or a Shell word the node expands."""

    run_id: str
    task_id: str  # the member's hidden id (naming.hidden_task_id)
    input_paths: str
    retry_count: str
    max_user_code_retries: str
    orig_datastore: str
    split_index: Optional[str] = None
    namespace: Optional[str] = None

    @classmethod
    def of_task(cls, identity: TaskIdentity, hidden_task_id: str, **words: str) -> "SpinOptions":
        """The options of a member of the task `identity`; `words` replace some of its values
        (Shell words the node expands, e.g. the input paths a remote node reads)."""
        options = cls(
            run_id=identity.run_id, task_id=hidden_task_id, input_paths=identity.input_paths,
            retry_count=str(identity.retry_count),
            max_user_code_retries=str(identity.max_user_code_retries),
            orig_datastore=identity.orig_datastore,
            split_index=None if identity.split_index is None else str(identity.split_index),
            namespace=identity.namespace)
        return dataclasses.replace(options, **words)

    def words(self, step_name: str) -> List[str]:
        words = [step_name,
                 "--run-id", self.run_id,
                 "--task-id", self.task_id,
                 "--input-paths", self.input_paths,
                 "--retry-count", self.retry_count,
                 "--max-user-code-retries", self.max_user_code_retries,
                 "--orig-flow-datastore", self.orig_datastore,
                 "--no-persist"]
        if self.split_index is not None:
            words += ["--split-index", self.split_index]
        if self.namespace is not None:
            words += ["--namespace", self.namespace]
        return words


def shell_text(words: Sequence[str]) -> str:
    """`words` as one line of shell text that survives Metaflow's `bash -c "..."`: every plain
    word quoted (nested_word), every Shell word left for the node's shell to expand."""
    return " ".join(w if isinstance(w, Shell) else nested_word(w) for w in words)


def spin_step_words(step_name: str, options: SpinOptions) -> List[str]:
    """The words from `spin-step` on."""
    return ["spin-step", *options.words(step_name)]


def member_command(spec: GangSpec, hidden_task_id: str, decorator_name: str,
                   base_env: Mapping[str, str]) -> Tuple[List[str], Dict[str, str]]:
    """(argv, env) of an exec'd member (agent or rank) described by `spec`."""
    argv = [interpreter(), "-u", script_path(), *spec.attempt.top_args,
            *spin_step_words(spec.blueprint.step_name,
                             SpinOptions.of_task(spec.attempt.task, hidden_task_id))]
    env = spin_env(base_env, spec, decorator_name, os.path.join(spec.work_dir, "spin"))
    return argv, env


def spin_env(base_env: Mapping[str, str], spec: GangSpec, decorator_name: str,
             spin_root: str) -> Dict[str, str]:
    """The environment of a spin-step member: the task's own, plus what spin-step needs to run
    our decorator and to keep its bookkeeping out of the user's directories."""
    env = dict(base_env)
    env.update(spin_env_additions(base_env, spec, decorator_name))
    env[internals.SPIN_SYSROOT_ENV] = spin_root
    return env


def spin_env_additions(base_env: Mapping[str, str], spec: Union[GangSpec, AgentOrder],
                       decorator_name: str) -> Dict[str, str]:
    """The variables a spin-step member needs on top of `base_env`: its GangSpec (or, for a
    node agent on another machine, its AgentOrder), and the spin-step decorator allow-list
    extended by our decorator."""
    # The variable wins over Metaflow's configuration (its config file included), as in Metaflow.
    allowed = json.loads(base_env.get(internals.SPIN_ALLOWED_ENV, "null") or "null")
    allowed = list(allowed or internals.spin_allowed_decorators())
    if decorator_name not in allowed:
        allowed.append(decorator_name)
    return {**spec.to_env(), internals.SPIN_ALLOWED_ENV: json.dumps(allowed)}


def quiet_if_member(environ: Mapping[str, str]) -> None:
    """In a gang member (an exec'd rank or a node agent, told by its environment), Metaflow's
    spin-step does not warn that it skips the flow's other decorators: the task runs them, and
    the warning, a line per rank, step and decorator, would say they are ignored."""
    if SPEC_ENV in environ or ORDER_ENV in environ:
        internals.quiet_spin_skips()


def interpreter() -> str:
    # Not environment.executable(): it returns "python", which a non-activated venv lacks.
    return sys.executable


def script_path() -> str:
    return os.path.abspath(sys.argv[0])
