"""An existing torchrun-style script, run by a rank (current.torch_distributed.run_script).

The script runs as a child of the rank's process, with the rank's environment (RANK,
WORLD_SIZE, MASTER_ADDR, ...), so its init_process_group() joins the gang's group as the rank
would; its stdout and stderr are the rank's, so every line carries the rank's prefix. A
non-zero exit fails the rank, and so the gang; the group check counts the script's group as the
rank's (groupcheck.joined_in_child).
"""

import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Union

from ..mf import groupcheck
from ..core.errors import TorchDistributedScriptFailed

# What run_script takes: the script's path, and its arguments (argv words, or {flag: value}).
ScriptPath = Union[str, "os.PathLike[str]"]
ScriptArgs = Union[Sequence[object], Dict[str, object], None]


def script_argv(path: ScriptPath, args: ScriptArgs = None,
                python: Optional[str] = None) -> List[str]:
    """The command line of `path` with `args`: a list (each item as a string) or a dict
    ({"epochs": 2, "fast": True} -> --epochs 2 --fast; False and None leave a flag out), as
    metaflow-torchrun's entrypoint_args. Pure."""
    argv = [python or sys.executable, str(path)]
    if isinstance(args, dict):
        for name, value in args.items():
            if value is True:
                argv.append("--%s" % name)
            elif value not in (False, None):
                argv += ["--%s" % name, str(value)]
    else:
        argv += [str(a) for a in (args or ())]
    return argv


def run_script(step_name: str, rank: int, world_size: int, path: ScriptPath,
               args: ScriptArgs = None, python: Optional[str] = None) -> None:
    argv = script_argv(path, args, python)
    sys.stdout.flush()
    sys.stderr.flush()
    code = subprocess.run(argv).returncode  # stopped with the rank: same process group
    if code != 0:
        raise TorchDistributedScriptFailed(step_name, rank, argv, code)
    groupcheck.joined_in_child(world_size)
