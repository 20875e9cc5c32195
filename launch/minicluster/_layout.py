"""Names, addresses and files of the mini-cluster: one place that says what exists where.

Everything the cluster creates is named from here, so ``down`` can find it again from names
alone, also after an ``up`` that stopped halfway and wrote no state.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

PREFIX = "tfsc"
HEAD = "head"
SUBNET = "10.213.77"
PREFIX_LEN = 24
BRIDGE = "tfscbr0"
SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
SSH_PORT = 22
PARTITION = "debug"
STATE_DIR = Path(os.environ.get("TFSCALE_MINICLUSTER_DIR", "/run/tfscale-minicluster"))


@dataclasses.dataclass(frozen=True)
class Host:
    """One host of the cluster: the head (slurmctld, munge) or a compute node.

    Attributes:
        name: the host name inside its namespace (``head``, ``node1``, ...).
        address: its address on the cluster's bridge.
        cores: the host cores its daemons (and so its jobs) may run on.
    """

    name: str
    address: str
    cores: tuple[int, ...]

    @property
    def netns(self) -> str:
        """The network namespace's name (``ip netns``)."""
        return f"{PREFIX}-{self.name}"

    @property
    def veth(self) -> str:
        """The head-side end of this node's link (the node's end is ``eth0``)."""
        return f"{PREFIX}v{self.name}"

    @property
    def dir(self) -> Path:
        """This host's own files: pid of its namespace holder, node-local tmp, logs."""
        return STATE_DIR / "hosts" / self.name


def node_name(index: int) -> str:
    """``node1``, ``node2``, ... (1-based, as a cluster's nodes usually are)."""
    return f"node{index}"


def head(cores: tuple[int, ...]) -> Host:
    return Host(HEAD, f"{SUBNET}.1", cores)


def nodes(count: int, cores: list[tuple[int, ...]]) -> list[Host]:
    """The compute nodes, node ``i`` on ``cores[i]``."""
    return [Host(node_name(i + 1), f"{SUBNET}.{10 + i + 1}", cores[i]) for i in range(count)]


def share_cores(available: list[int], count: int) -> tuple[list[tuple[int, ...]], str]:
    """Each node's cores: disjoint equal shares of ``available`` when there are at least as
    many cores as nodes, else every node on all of them. Returns the shares and a sentence
    saying which."""
    if len(available) >= count:
        per = len(available) // count
        shares = [tuple(available[i * per:(i + 1) * per]) for i in range(count)]
        text = ", ".join(f"{node_name(i + 1)}: {_cores(s)}" for i, s in enumerate(shares))
        return shares, f"each node has cores of its own ({text})"
    return ([tuple(available)] * count,
            f"only {len(available)} core(s) for {count} nodes: the nodes share cores "
            f"{_cores(tuple(available))}, so their timings interfere")


def _cores(cores: tuple[int, ...]) -> str:
    return ",".join(str(c) for c in cores)


# Files under STATE_DIR.
SLURM_DIR = STATE_DIR / "etc-slurm"  # bind-mounted on /etc/slurm inside the cluster
SLURM_CONF = SLURM_DIR / "slurm.conf"
HOSTS_FILE = STATE_DIR / "hosts.txt"  # bind-mounted on /etc/hosts inside the cluster
SSH_DIR = STATE_DIR / "ssh"
SSH_CLIENT_CONFIG = SSH_DIR / "ssh_config"  # bind-mounted on /etc/ssh/ssh_config
MUNGE_DIR = STATE_DIR / "munge"
MUNGE_SOCKET = MUNGE_DIR / "munge.socket"
SLURM_TMPFS = STATE_DIR / "node-tmp"  # each node mounts its own directory here (PMIx)
LOG_DIR = STATE_DIR / "log"
CLUSTER_FILE = STATE_DIR / "cluster.json"
