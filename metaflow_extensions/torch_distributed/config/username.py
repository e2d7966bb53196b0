"""A user name for Metaflow where the environment gives none (a fresh container, a CI runner).

Metaflow takes the user from METAFLOW_USER, else SUDO_USER, USERNAME or USER, skips "root", and
refuses to run when nothing is left ("Unknown user"). A shell started as root in a container
usually has no USER, or USER=root, so `python flow.py run` stops there. Only in that case does
this package give Metaflow a name: the login name of the process's user, or `root@HOSTNAME`
for root (Metaflow refuses a bare "root"). Any name the environment or Metaflow's configuration
gives wins; METAFLOW_USER sets another one.
"""

import os
import pwd
import socket
from typing import Mapping, Optional

# The variables Metaflow reads after METAFLOW_USER, in its order (metaflow.util.get_username).
USER_VARIABLES = ("SUDO_USER", "USERNAME", "USER")


def user_name(configured: Optional[str], environ: Mapping[str, str], uid: Optional[int] = None,
              hostname: Optional[str] = None) -> Optional[str]:
    """The value for Metaflow's USER setting: `configured` (METAFLOW_USER, or the user setting
    of Metaflow's configuration file) when given or when the environment names a user Metaflow
    accepts, else a name for this process's user that Metaflow accepts."""
    named = [environ.get(v) for v in USER_VARIABLES]
    if configured or any(name and name != "root" for name in named):
        return configured
    uid = os.getuid() if uid is None else uid
    try:
        login = pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid with no passwd entry (docker run --user 1234)
        login = "uid%d" % uid
    if login != "root":
        return login
    return "root@%s" % (hostname or socket.gethostname())
