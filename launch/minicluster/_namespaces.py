"""Linux namespaces as cluster hosts: each host is a network namespace (``ip netns``) plus a
UTS and a mount namespace held open by one sleeping process.

Why not ``ip netns exec``: it remounts /sys, which hides /sys/fs/cgroup, and slurmd then refuses
to start. So the network namespace is entered with ``nsenter --net`` and the UTS and mount
namespaces are made with ``unshare`` from there; their holder's pid is the handle that
:func:`enter` uses. The mount namespace gives the host its own /dev/shm (a tmpfs), and binds the
cluster's /etc/hosts, Slurm, ssh and Open MPI configuration over the machine's; everything else
of the filesystem stays shared, as a cluster's parallel filesystem is.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from launch.minicluster._layout import BRIDGE, PREFIX, PREFIX_LEN, Host

NETNS_DIR = Path("/run/netns")
HOLDER_PID = "holder.pid"
SHM_SIZE = "1g"


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs a command, raising RuntimeError with its output when it fails (``check``)."""
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and proc.returncode:
        raise RuntimeError(f"`{shlex.join(args)}` failed (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc


def why_not_possible() -> str:
    """Why namespaces cannot be made here ("" when they can): not root, or the kernel or
    sandbox refuses new network, UTS or mount namespaces."""
    if os.geteuid() != 0:
        return "the mini-cluster needs root (network, UTS and mount namespaces, daemons)"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"],
                           capture_output=True, text=True, check=False)
    if probe.returncode:
        return ("this machine refuses new namespaces (`unshare --net --uts --mount true`: "
                f"{probe.stderr.strip() or probe.returncode})")
    return ""


def existing_netns() -> list[str]:
    """The cluster's network namespaces that exist now (by their name prefix)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"{PREFIX}-"))


def create_network(head: Host, nodes: Sequence[Host]) -> None:
    """The head's namespace with a bridge, and one namespace per node linked to it by a veth
    pair. The addresses exist only inside these namespaces and there is no default route, so
    nothing leaves them."""
    for host in (head, *nodes):
        run("ip", "netns", "add", host.netns)
        run("ip", "-n", host.netns, "link", "set", "lo", "up")
    run("ip", "-n", head.netns, "link", "add", BRIDGE, "type", "bridge")
    run("ip", "-n", head.netns, "addr", "add", f"{head.address}/{PREFIX_LEN}", "dev", BRIDGE)
    run("ip", "-n", head.netns, "link", "set", BRIDGE, "up")
    for node in nodes:
        run("ip", "-n", head.netns, "link", "add", node.veth, "type", "veth", "peer", "name",
            "eth0", "netns", node.netns)
        run("ip", "-n", head.netns, "link", "set", node.veth, "master", BRIDGE, "up")
        run("ip", "-n", node.netns, "addr", "add", f"{node.address}/{PREFIX_LEN}", "dev", "eth0")
        run("ip", "-n", node.netns, "link", "set", "eth0", "up")


def start_holder(host: Host, binds: Iterable[tuple[Path, str]]) -> int:
    """Starts the process that holds ``host``'s UTS and mount namespaces: it sets the host
    name, mounts a tmpfs of its own on /dev/shm and the ``(source, target)`` binds, then
    sleeps. Returns its pid (also written to ``host.dir / holder.pid``)."""
    host.dir.mkdir(parents=True, exist_ok=True)
    pid_file = host.dir / HOLDER_PID
    pid_file.unlink(missing_ok=True)
    lines = [f"hostname {shlex.quote(host.name)}",
             f"mount -t tmpfs -o size={SHM_SIZE},mode=1777 tmpfs /dev/shm"]
    lines += [f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)}" for src, dst in binds]
    lines += [f"echo $$ > {shlex.quote(str(pid_file))}", "exec sleep infinity"]
    script = "set -e\n" + "\n".join(lines)
    log = open(host.dir / "holder.log", "w")  # noqa: SIM115 (the holder outlives this call)
    subprocess.Popen(
        ["nsenter", f"--net={NETNS_DIR / host.netns}", "--", "unshare", "--uts", "--mount",
         "--propagation", "private", "--fork", "--", "sh", "-c", script],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = pid_file.read_text().strip() if pid_file.exists() else ""
        if text:
            return int(text)
        time.sleep(0.05)
    raise RuntimeError(f"{host.name}: its namespaces did not come up in 10 s: "
                       f"{(host.dir / 'holder.log').read_text().strip()}")


def holder_pid(host: Host) -> int:
    """The pid holding ``host``'s namespaces, or 0 when it is not running."""
    path = host.dir / HOLDER_PID
    try:
        pid = int(path.read_text())
    except (OSError, ValueError):
        return 0
    return pid if alive(pid) and _same_netns(pid, host.netns) else 0


def enter(host: Host, pid: int = 0, workdir: str = "") -> list[str]:
    """The command prefix that runs a program on ``host`` (its network, host name and mounts),
    in ``workdir`` (entering a mount namespace would otherwise reset it to /)."""
    pid = pid or holder_pid(host)
    if not pid:
        raise RuntimeError(f"{host.name} is not running; start the cluster with "
                           "`python -m launch.minicluster up`")
    return ["nsenter", "-t", str(pid), "--net", "--uts", "--mount",
            f"--wd={workdir or os.getcwd()}", "--"]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs and is not a zombie (orphans are reaped slowly here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _netns_inode(name: str) -> int:
    try:
        return os.stat(NETNS_DIR / name).st_ino
    except OSError:
        return 0


def _same_netns(pid: int, name: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == _netns_inode(name)
    except OSError:
        return False


def processes_in(names: Sequence[str]) -> list[int]:
    """Every process whose network namespace is one of ``names``: the cluster's daemons, its
    namespace holders and whatever its jobs started."""
    inodes = {_netns_inode(n) for n in names} - {0}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry / "ns" / "net").st_ino in inodes and alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def stop_processes(names: Sequence[str], grace_s: float = 3.0) -> list[int]:
    """SIGTERM, then after ``grace_s`` SIGKILL, every process in the namespaces ``names``.
    Returns the pids still alive after that (normally none)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = processes_in(names)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = [p for p in pids if alive(p)]
        if not pids:
            return []
    return processes_in(names)


def delete_netns(names: Sequence[str]) -> None:
    """Deletes the network namespaces (their veths and bridge go with them)."""
    for name in names:
        run("ip", "netns", "del", name, check=False)
