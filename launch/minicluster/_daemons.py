"""The cluster's configuration files and daemons: munge and slurmctld on the head; slurmd and
a key-based sshd on every node (for ``srun``, ``mpirun`` and ``horovodrun``).

Each daemon runs in the foreground inside its host's namespaces, bound to the host's cores, and
logs to ``STATE_DIR/log``. One munge daemon serves every host: its socket is a path in the
shared filesystem, which every namespace reaches.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from launch.minicluster import _namespaces as ns
from launch.minicluster._layout import (
    CLUSTER_FILE,
    HOSTS_FILE,
    LOG_DIR,
    MUNGE_DIR,
    MUNGE_SOCKET,
    PARTITION,
    SLURM_CONF,
    SLURM_DIR,
    SLURM_TMPFS,
    SLURMCTLD_PORT,
    SLURMD_PORT,
    SSH_CLIENT_CONFIG,
    SSH_DIR,
    STATE_DIR,
    SUBNET,
    Host,
)

OPENMPI_PARAMS = Path("/etc/openmpi/openmpi-mca-params.conf")
OPENMPI_CLUSTER_PARAMS = STATE_DIR / "openmpi-mca-params.conf"
SSHD_PRIVSEP = Path("/run/sshd")
CREATED_PRIVSEP = STATE_DIR / "created-run-sshd"
READY_TIMEOUT_S = 60.0


def binds(host: Host, is_head: bool) -> list[tuple[Path, str]]:
    """What ``host``'s mount namespace binds over the machine's files: the cluster's
    /etc/hosts, Slurm, ssh-client and Open MPI configuration, and for a node its own
    directory as Slurm's TmpFS (PMIx fails when nodes share it)."""
    pairs = [(HOSTS_FILE, "/etc/hosts"), (SLURM_DIR, "/etc/slurm"),
             (SSH_CLIENT_CONFIG, "/etc/ssh/ssh_config")]
    if OPENMPI_PARAMS.exists():
        pairs.append((OPENMPI_CLUSTER_PARAMS, str(OPENMPI_PARAMS)))
    if not is_head:
        (host.dir / "tmp").mkdir(parents=True, exist_ok=True)
        pairs.append((host.dir / "tmp", str(SLURM_TMPFS)))
    return pairs


def write_configuration(head: Host, nodes: Sequence[Host], cpus_per_node: int) -> None:
    """Every file the daemons and clients read, under ``STATE_DIR``."""
    for folder in (SLURM_DIR, LOG_DIR, SLURM_TMPFS, STATE_DIR / "slurmctld"):
        folder.mkdir(parents=True, exist_ok=True)
    HOSTS_FILE.write_text("127.0.0.1 localhost\n" + "".join(
        f"{h.address} {h.name}\n" for h in (head, *nodes)))
    if OPENMPI_PARAMS.exists():
        OPENMPI_CLUSTER_PARAMS.write_text(
            OPENMPI_PARAMS.read_text()
            + "\n# tfscale mini-cluster: MPI traffic on the cluster's bridge only.\n"
            f"btl_tcp_if_include = {SUBNET}.0/24\noob_tcp_if_include = {SUBNET}.0/24\n"
            "# Its nodes run more ranks than they have cores (2 on 1 in the tests and\n"
            "# bench.shaped_links): a rank waiting in MPI gives its core to the other instead\n"
            "# of spinning on it (1.3-1.45x the images/s of 2x2 mlp at 1 Gbit/s).\n"
            "mpi_yield_when_idle = 1\n")
    _write_slurm_conf(head, nodes, cpus_per_node)
    _write_munge_key()
    _write_ssh_files()


def _write_slurm_conf(head: Host, nodes: Sequence[Host], cpus_per_node: int) -> None:
    lines = [
        "# Written by python -m launch.minicluster up; removed by down.",
        "ClusterName=tfscale",
        f"SlurmctldHost={head.name}({head.address})",
        "SlurmUser=root", "SlurmdUser=root",
        # A requeued job waits for the credentials' lifetime before it runs again (120 s by
        # default): 10 s keeps a requeue test short.
        "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={MUNGE_SOCKET},cred_expire=10",
        # No cgroups in these namespaces: track processes by parentage; the nodes' cores are
        # set by their daemons' affinity, so Slurm does no binding of its own.
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        # The nodes report the CPUs configured here, not the cores they are bound to.
        "SlurmdParameters=config_overrides",
        "ReturnToService=2", "MpiDefault=none",
        f"StateSaveLocation={STATE_DIR / 'slurmctld'}",
        f"SlurmdSpoolDir={STATE_DIR / 'hosts' / '%n' / 'spool'}",
        f"SlurmctldPidFile={STATE_DIR / 'slurmctld.pid'}",
        f"SlurmdPidFile={STATE_DIR / 'hosts' / '%n' / 'slurmd.pid'}",
        f"SlurmctldLogFile={LOG_DIR / 'slurmctld.log'}",
        f"SlurmdLogFile={LOG_DIR / 'slurmd-%n.log'}",
        f"SlurmctldPort={SLURMCTLD_PORT}", f"SlurmdPort={SLURMD_PORT}",
        f"TmpFS={SLURM_TMPFS}",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "MinJobAge=300",
        "KillWait=10", "Waittime=0",
        # A requeued job may run again (Slurm's --requeue and scontrol requeue).
        "JobRequeue=1",
        # Slurm schedules on a submission, and otherwise every 60 s (backfill every 30 s): a
        # requeued job whose begin time passes, or one submitted while a node still completes,
        # would wait for that pass. Two nodes and a handful of jobs: look every second.
        "SchedulerParameters=sched_interval=1,bf_interval=1",
    ]
    lines += [f"NodeName={n.name} NodeAddr={n.address} NodeHostname={n.name} "
              f"CPUs={cpus_per_node} State=UNKNOWN" for n in nodes]
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    SLURM_CONF.write_text("\n".join(lines) + "\n")
    (SLURM_DIR / "plugstack.conf").write_text("")


def _write_munge_key() -> None:
    MUNGE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    MUNGE_DIR.chmod(0o700)
    key = MUNGE_DIR / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)


def _write_ssh_files() -> None:
    SSH_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in ("host_ed25519", "id_ed25519"):
        if not (SSH_DIR / name).exists():
            ns.run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"tfscale-{name}",
                   "-f", str(SSH_DIR / name))
    shutil.copyfile(SSH_DIR / "id_ed25519.pub", SSH_DIR / "authorized_keys")
    (SSH_DIR / "sshd_config").write_text("\n".join([
        f"HostKey {SSH_DIR / 'host_ed25519'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
        f"AuthorizedKeysFile {SSH_DIR / 'authorized_keys'}",
        "AcceptEnv LANG LC_*", "PrintMotd no", "Subsystem sftp internal-sftp", ""]))
    # Bound over /etc/ssh/ssh_config inside the cluster: ssh, mpirun and horovodrun log in
    # with the cluster's key, and nothing is written to ~/.ssh.
    SSH_CLIENT_CONFIG.write_text("\n".join([
        "Host *", f"  IdentityFile {SSH_DIR / 'id_ed25519'}", "  StrictHostKeyChecking no",
        "  UserKnownHostsFile /dev/null", "  LogLevel ERROR", "  BatchMode yes", ""]))


def _start(host: Host, name: str, command: Sequence[str]) -> None:
    """Starts a daemon in the foreground inside ``host``, on its cores, logging to LOG_DIR."""
    log = open(LOG_DIR / f"{name}.out", "ab")  # noqa: SIM115 (the daemon keeps it)
    cores = ",".join(str(c) for c in host.cores)
    subprocess.Popen([*ns.enter(host, workdir="/"), "taskset", "-c", cores, *command],
                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    log.close()


def start(head: Host, nodes: Sequence[Host]) -> None:
    """Starts munge and slurmctld on the head, slurmd and sshd on every node, and waits until
    Slurm reports every node idle and ssh reaches every node with the cluster's key.

    Raises:
        RuntimeError: when a daemon does not come up, with the end of its log.
    """
    _start(head, "munged", ["munged", "-F", "--force", f"--socket={MUNGE_SOCKET}",
                            f"--key-file={MUNGE_DIR / 'munge.key'}",
                            f"--pid-file={MUNGE_DIR / 'munged.pid'}",
                            f"--seed-file={MUNGE_DIR / 'munged.seed'}",
                            f"--log-file={LOG_DIR / 'munged.log'}"])
    _wait(lambda: MUNGE_SOCKET.exists(), "munged", LOG_DIR / "munged.log")
    _start(head, "slurmctld", ["slurmctld", "-D", "-i"])
    _wait(lambda: "UP" in _on(head, "scontrol", "ping").stdout, "slurmctld",
          LOG_DIR / "slurmctld.log")
    if not SSHD_PRIVSEP.exists():
        SSHD_PRIVSEP.mkdir(mode=0o755)
        CREATED_PRIVSEP.write_text("1")
    for node in nodes:
        _start(node, f"slurmd-{node.name}", ["slurmd", "-D", "-N", node.name])
        _start(node, f"sshd-{node.name}", ["/usr/sbin/sshd", "-D", "-e",
                                            "-f", str(SSH_DIR / "sshd_config"),
                                            "-o", f"ListenAddress={node.address}",
                                            "-o", f"PidFile={node.dir / 'sshd.pid'}"])
    names = [n.name for n in nodes]
    _wait(lambda: all(state.startswith("idle") for state in node_states(head, names).values()),
          "slurmd", LOG_DIR / f"slurmd-{names[-1]}.log")
    for node in nodes:
        _wait(functools.partial(_ssh_answers, head, node.name), f"sshd on {node.name}",
              LOG_DIR / f"sshd-{node.name}.out")


def _ssh_answers(head: Host, node: str) -> bool:
    return _on(head, "ssh", node, "true").returncode == 0


def node_states(head: Host, names: Sequence[str]) -> dict[str, str]:
    """Slurm's state of each node (``idle``, ``alloc``, ``down*``...; "unknown" when
    slurmctld does not answer)."""
    proc = _on(head, "sinfo", "-h", "-N", "-o", "%N %T")
    states = dict(line.split(None, 1) for line in proc.stdout.splitlines() if " " in line)
    return {name: states.get(name, "unknown").strip() for name in names}


def _on(host: Host, *command: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([*ns.enter(host, workdir="/"), *command], capture_output=True,
                              text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(command), 124, "", "timed out")


def _wait(ready: Callable[[], bool], what: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.3)
    tail = log.read_text(errors="replace").strip().splitlines()[-8:] if log.exists() else []
    raise RuntimeError(f"{what} did not come up in {READY_TIMEOUT_S:g} s; the end of {log}:\n"
                       + "\n".join(tail))


def forget() -> None:
    """Removes what ``up`` wrote outside the namespaces: the state directory, and /run/sshd if
    ``up`` made it."""
    if CREATED_PRIVSEP.exists():
        shutil.rmtree(SSHD_PRIVSEP, ignore_errors=True)
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    CLUSTER_FILE.unlink(missing_ok=True)
