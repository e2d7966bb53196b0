"""An OCI bundle for srun --container on the CI cluster of .ci/slurm, as a site builds one:
shared by tests/slurm (conftest.slurm_bundle) and bench/slurm_launch.py."""

import json
import os
import shutil
import sys
from pathlib import Path

# Slurm's commands, hidden in the test bundle as an image without Slurm lacks them: the job's
# batch script asks Slurm what the nodes need, outside the container.
SLURM_COMMANDS = ("scontrol", "srun", "sbatch", "squeue", "scancel", "sinfo")


def oci_bundle(folder: Path, shared: list[str], mark: str) -> Path:
    """An OCI bundle (config.json and its root filesystem) as a site builds one for srun's
    --container, the way HPC container runtimes (enroot, Apptainer) run one: its own mount
    namespace and root filesystem, the node's network, PIDs and host name. Its system is this
    machine's (/usr, /etc and the interpreter, read-only; Slurm's commands hidden), its /tmp
    and /dev/shm its own; `shared` are the shared filesystem's folders, mounted at the same
    path. `mark` is the content of /td-bundle, which only a process inside it can read."""
    rootfs = folder / "rootfs"
    rootfs.mkdir(parents=True)
    (rootfs / "td-bundle").write_text(mark)
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "nodev", "mode=1777"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=1777"]},
    ]
    for top in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        if os.path.islink("/" + top):  # a merged /usr's links, as an image has them
            os.symlink(os.readlink("/" + top), rootfs / top)
    system = ["/usr", "/etc", sys.base_prefix]
    system += ["/" + top for top in ("bin", "sbin", "lib", "lib64")
               if os.path.isdir("/" + top) and not os.path.islink("/" + top)]
    for path in system:
        mounts.append({"destination": path, "type": "bind", "source": path,
                       "options": ["rbind", "ro"]})
    for name in SLURM_COMMANDS:
        found = shutil.which(name)
        if found:
            mounts.append({"destination": os.path.realpath(found), "type": "bind",
                           "source": "/dev/null", "options": ["bind", "ro"]})
    for path in shared:
        mounts.append({"destination": path, "type": "bind", "source": path,
                       "options": ["rbind", "rw"]})
    caps = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID",
            "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_KILL", "CAP_AUDIT_WRITE"]
    config = {
        "ociVersion": "1.0.2",
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["/bin/false"],
                    "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                    "cwd": "/", "noNewPrivileges": True,
                    "capabilities": {kind: caps for kind in ("bounding", "effective",
                                                             "permitted")}},
        "root": {"path": "rootfs", "readonly": True},
        "mounts": mounts,
        "linux": {"namespaces": [{"type": "mount"}]},
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
