"""The Debian packages the mini-cluster runs on, installed the first time they are missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

# Command that must be on the PATH -> the Debian package that brings it.
NEEDED = {
    "slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client",
    "munged": "munge", "sshd": "openssh-server", "ssh": "openssh-client",
    "ssh-keygen": "openssh-client", "mpirun": "openmpi-bin", "ip": "iproute2",
    "tc": "iproute2", "nsenter": "util-linux", "unshare": "util-linux", "taskset": "util-linux",
}
_SBIN = ("/usr/sbin", "/sbin")


def missing() -> list[str]:
    """The packages whose commands are not installed, in a stable order."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    return sorted({pkg for cmd, pkg in NEEDED.items() if shutil.which(cmd, path=path) is None})


def ensure(say: Callable[[str], None]) -> None:
    """Installs the missing packages with apt-get (as root), saying what it does.

    Raises:
        RuntimeError: when apt-get is not there or fails, with its last lines.
    """
    packages = missing()
    if not packages:
        return
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"missing {', '.join(packages)} and no apt-get to install them: "
                           "install them with this system's package manager")
    say(f"installing {' '.join(packages)} from Debian's packages (first time only)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]):
        proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if proc.returncode:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            raise RuntimeError(f"`{' '.join(command)}` failed (exit {proc.returncode}):\n{tail}")
    say("installed")
