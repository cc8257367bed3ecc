"""A real Slurm cluster for the test suite (one node, or several in namespaces): install,
configure, start, stop.

:func:`ensure_installed` installs Debian's Slurm 22.05 (``slurmctld slurmd slurmdbd
slurm-client munge mariadb-server``) with apt-get when, and only when, a program is
missing; it raises :class:`Unavailable` (the tests skip, saying why) when this is not
root, there is no apt-get, or the install fails (a registry that does not answer).

:class:`Cluster` writes every configuration file into one temporary directory (slurm.conf,
slurmdbd.conf, gres.conf, cgroup.conf, a munge key, a MariaDB data directory, Slurm's
state, spool and log directories, fake GPU device nodes made with ``mknod``) and starts
munged, mariadbd, slurmdbd, slurmctld and slurmd there as plain background processes
(no systemd): each in the foreground of its own session, so the PID recorded is the
daemon's. :meth:`Cluster.stop` cancels the cluster's jobs and ends only those PIDs
(SIGTERM, then SIGKILL). Nothing is written outside the temporary directory except the
packages themselves; a daemon that does not come up raises :class:`ClusterError` with the
tail of its log (the tests then fail: the cluster installed but misbehaves).

``Cluster.start(nodes=3)`` makes three compute nodes ``n1 n2 n3`` on this one machine
(:mod:`tests.slurm.multinode`): each slurmd (``slurmd -D -N n2``) runs in its own network,
UTS, mount and pid namespace, its ``eth0`` on a bridge whose host end holds the
controller's address (``10.231.X.1``; munged, mariadbd, slurmdbd and slurmctld stay on the
host), ``NodeAddr=10.231.X.(10+i)``, ``%n`` in the slurmd spool, log and pid file names,
two fake GPUs each. Jobs span the nodes as on a real cluster: a step on ``n2`` sees the
hostname ``n2``, its own pid namespace (pid 1 is the node's init) and the same filesystem
(the temporary directory, /work, /tmp). Namespaces or links that cannot be made (not
root, no ``ip``, ``unshare`` or ``nsenter``, the kernel refuses) raise
:class:`Unavailable`; :meth:`Cluster.stop` ends each node's whole pid namespace and
removes the veth pairs and the bridge.

Facts this encodes (issue 19): a GPU gres needs ``File=`` device nodes (character major
195) or the node goes INVAL; ``proctrack/linuxproc`` and ``task/none`` work without
cgroups; ``JobAcctGatherParams=OverMemoryKill`` enforces ``--mem``;
``SlurmdParameters=config_overrides`` lets the node claim more CPUs than the machine has,
so a dozen elements run at once; ``cred_expire`` (default 120 s) is how long a requeued
job waits before it is eligible again, so it is set short.

Facts of the multi-node cluster: ``nsenter --net=`` rather than ``ip netns exec`` (which
remounts /sys, and Slurm 22.05's slurmd loses the cgroup mount it reads); each node needs a
fresh /proc (``unshare --mount-proc``: proctrack/linuxproc and jobacct_gather read the
step's processes there by their pid in the node's namespace), and ``unshare --mount`` makes
the mounts private so that /proc does not leak to the host while every path stays shared;
a pid namespace's init must reap orphans (slurmstepd is double-forked and reparents to it),
so it is a bash in ``wait``, not slurmd; ``unshare --fork`` ignores SIGTERM, so the init is
the one signalled, and when it exits the kernel kills the rest of the namespace;
``SlurmctldHost=localhost(<bridge address>)`` passes slurmctld's is-this-host check while
the nodes reach it by address; munged's pathname socket is reachable from every network
namespace, so one munged serves every node; slurmdbd listens on every address, so with
``AccountingStorageHost`` the bridge address sacct works inside a job too; a job that ends
within a second of starting reads ``allocation`` on its batch node alone in sacct for a
moment (:meth:`Cluster.wait_done`'s ``named`` waits that out). It starts in
about 3 s (mariadb-install-db is most of it) on a 2-core machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.slurm.multinode import NamespaceUnavailable, Node, NodeNetwork, unavailable_reason

__all__ = [
    "CONTRACT_FORMAT",
    "PACKAGES",
    "Cluster",
    "ClusterError",
    "Unavailable",
    "ensure_installed",
    "skip_reason",
]

PACKAGES: tuple[str, ...] = (
    "slurmctld", "slurmd", "slurmdbd", "slurm-client", "munge", "mariadb-server",
)
"""Debian 12's packages for a one-node cluster with accounting."""

PROGRAMS: tuple[str, ...] = (
    "slurmctld", "slurmd", "slurmdbd", "sbatch", "sacct", "sacctmgr", "scontrol", "squeue",
    "scancel", "sinfo", "srun", "munged", "munge", "mungekey", "mariadbd", "mariadb-install-db",
)
"""What the cluster runs; any one missing means an install."""

CONTRACT_FORMAT = (
    "JobID,JobIDRaw,JobName,State,ExitCode,Start,End,ElapsedRaw,AllocTRES,NodeList,Reason"
)
"""The evidence contract's sacct ``--format``."""

NODE = "node01"
"""The one node's name when there is one (``Cluster.start()``)."""
CLUSTER = "auditor"
GPUS = 24
"""Fake GPUs (``/dev``-like nodes in the temp dir) on the one node."""
NODE_GPUS = 2
"""Fake GPUs on each node of a multi-node cluster (``Cluster.start(nodes=3)``)."""
CPUS = 16
"""CPUs the node claims (``config_overrides``): more than the machine's, on purpose."""
MEMORY_MB = 16000
INSTALL_TIMEOUT_S = 600
START_TIMEOUT_S = 60
_RUNNING_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "CONFIGURING",
                             "COMPLETING", "RESIZING", "REQUEUE_HOLD", "REQUEUE_FED",
                             "SIGNALING", "STAGE_OUT", "STOPPED"})


class Unavailable(Exception):
    """The cluster cannot be had here (not root, no apt-get, install failed): skip."""


class ClusterError(Exception):
    """The cluster was installed but misbehaves (a daemon did not come up, a command failed)."""


def skip_reason() -> str | None:
    """Why the real-Slurm tests cannot run here (one line), or None when they can."""
    if os.environ.get("AUDITOR_SLURM") != "1":
        return "real-Slurm tests run only with AUDITOR_SLURM=1 (.ci/run sets it)"
    if os.geteuid() != 0:
        return "real-Slurm tests need root (they install Slurm and start its daemons)"
    return None


def _missing_programs() -> list[str]:
    paths = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [name for name in PROGRAMS if shutil.which(name, path=paths) is None]


def ensure_installed() -> float:
    """Install the packages if a program is missing; the seconds it took (0.0 if none).

    Raises :class:`Unavailable` when this process cannot install (not root, no apt-get)
    or the install fails; the message says why in one line.
    """
    missing = _missing_programs()
    if not missing:
        return 0.0
    if os.geteuid() != 0:
        raise Unavailable(f"real-Slurm tests need root to install Slurm (missing: "
                          f"{', '.join(missing)})")
    if shutil.which("apt-get") is None:
        raise Unavailable(f"real-Slurm tests need apt-get to install Slurm (missing: "
                          f"{', '.join(missing)})")
    started = time.monotonic()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # No daemon may be started by the packages' scripts: the harness starts its own.
    policy = Path("/usr/sbin/policy-rc.d")
    made_policy = not policy.exists()
    if made_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
        result = _apt(install, env)
        if result.returncode != 0:
            update = _apt(["apt-get", "update", "-q"], env)
            if update.returncode != 0:
                raise Unavailable("apt-get update failed: " + _last_line(update.stdout))
            result = _apt(install, env)
        if result.returncode != 0:
            raise Unavailable("apt-get install failed: " + _last_line(result.stdout))
    finally:
        if made_policy:
            policy.unlink()
    still = _missing_programs()
    if still:
        raise Unavailable(f"installed {' '.join(PACKAGES)} but still missing: {', '.join(still)}")
    return time.monotonic() - started


def _apt(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, text=True, timeout=INSTALL_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"{' '.join(command[:2])} timed out after {INSTALL_TIMEOUT_S} s "
                          "(a registry that does not answer?)") from None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("E:", "Err:"))]
    return (errors or lines or ["(no output)"])[-1][:300]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    node: Node | None = None
    """The namespaces this slurmd runs in (multi-node); ``process`` is then its unshare."""


@dataclass
class Cluster:
    """One running cluster rooted at ``root`` (a temporary directory); see the module doc."""

    root: Path
    nodes: list[str] = field(default_factory=lambda: [NODE])
    """The compute nodes' names: ``[NODE]``, or ``n1 .. nN`` for ``start(nodes=N)``."""
    gpus: int = GPUS
    """Fake GPUs per node."""
    network: NodeNetwork | None = None
    """The bridge and namespaces of a multi-node cluster (None for one node)."""
    ports: dict[str, int] = field(default_factory=dict)
    daemons: list[_Daemon] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    def start(cls, root: Path | None = None, *, nodes: int = 1,
              gpus: int | None = None) -> Cluster:
        """Write the configuration and start every daemon; wait until every node is idle.

        ``nodes=1`` runs slurmd on the host as node ``node01`` with :data:`GPUS` fake GPUs.
        ``nodes=N`` (N > 1) runs N slurmds named ``n1 .. nN``, each in its own network,
        UTS, mount and pid namespace on a bridge (:mod:`tests.slurm.multinode`), with
        :data:`NODE_GPUS` fake GPUs each; :class:`Unavailable` when the namespaces or
        links cannot be made (checked before anything starts, where it can be).
        """
        if nodes < 1:
            raise ValueError(f"nodes must be at least 1, not {nodes}")
        if nodes > 1 and (reason := unavailable_reason()) is not None:
            raise Unavailable(reason)
        base = Path(tempfile.mkdtemp(prefix="auditor-slurm-")) if root is None else root
        names = [NODE] if nodes == 1 else [f"n{index}" for index in range(1, nodes + 1)]
        per_node = gpus if gpus is not None else (GPUS if nodes == 1 else NODE_GPUS)
        cluster = cls(root=base, nodes=names, gpus=per_node)
        started = time.monotonic()
        try:
            if nodes > 1:
                cluster._claim_network()
            cluster._configure()
            if nodes > 1:
                cluster._make_nodes()
            cluster._start_munge()
            cluster._start_mariadb()
            cluster._start_slurmdbd()
            cluster._start_slurmctld()
            cluster._start_slurmd()
        except BaseException:
            cluster.stop()
            raise
        cluster.timings["start_s"] = time.monotonic() - started
        return cluster

    def stop(self, *, remove: bool = True) -> None:
        """Cancel this cluster's jobs, end the daemons it started (newest first; a node's
        whole pid namespace with its slurmd), remove the links and bridge it made, and
        remove the temporary directory unless ``remove`` is false."""
        started = time.monotonic()
        if self.jobs and any(d.name == "slurmctld" and d.process.poll() is None
                             for d in self.daemons):
            self.run(["scancel", *self.jobs], check=False)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self._queued(self.jobs):
                time.sleep(1)
        if self.network is not None:  # the nodes first, while slurmctld still answers
            self.network.close()
        for daemon in reversed(self.daemons):
            if daemon.process.poll() is None:
                daemon.process.send_signal(signal.SIGTERM)
        for daemon in reversed(self.daemons):
            try:
                daemon.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.process.kill()
                daemon.process.wait(timeout=10)
        self.timings["stop_s"] = time.monotonic() - started
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)

    def pids(self) -> dict[str, int]:
        """The PID of each daemon this cluster started (a node's: its ``unshare``)."""
        return {daemon.name: daemon.process.pid for daemon in self.daemons}

    @property
    def controller(self) -> str:
        """The address slurmctld and slurmdbd are reached at, from the host and every node."""
        return "127.0.0.1" if self.network is None else self.network.controller

    def on_node(self, node: str, command: Sequence[str], *, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``command`` inside ``node``'s namespaces (multi-node only), as a job step
        would see the machine: its hostname, network, /proc and pid numbers."""
        if self.network is None:
            raise ClusterError("on_node needs a multi-node cluster (Cluster.start(nodes=N))")
        found = [n for n in self.network.nodes if n.name == node]
        if not found:
            raise ClusterError(f"no node {node!r} (nodes: {' '.join(self.nodes)})")
        return self.run(found[0].enter(command), check=check, timeout=timeout)

    # ------------------------------------------------------------------ commands
    @property
    def env(self) -> dict[str, str]:
        """The environment Slurm's commands need to find this cluster."""
        return dict(os.environ, SLURM_CONF=str(self.root / "etc" / "slurm.conf"))

    def run(self, command: Sequence[str], *, check: bool = True, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command against this cluster; :class:`ClusterError` if it fails."""
        result = subprocess.run(list(command), env=env or self.env, capture_output=True,
                                stdin=subprocess.DEVNULL, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise ClusterError(f"{' '.join(command)} exited {result.returncode}: "
                               f"{result.stderr.strip()[-500:]}")
        return result

    def sbatch(self, script: str, *options: str, env: dict[str, str] | None = None) -> str:
        """Submit ``script`` (its text) with ``options`` (and ``env`` added to the
        environment sbatch exports to the job); the job (array) id."""
        jobs = self.root / "jobs"
        path = jobs / f"script-{len(self.jobs)}.sh"
        path.write_text(script)
        path.chmod(0o755)
        result = self.run(["sbatch", "--parsable", f"--chdir={jobs}",
                           f"--output={jobs}/%A_%a.out", *options, str(path)],
                          env={**self.env, **(env or {})})
        job = result.stdout.strip().split(";")[0]
        self.jobs.append(job)
        return job

    def sacct(self, job: str, *, fmt: str = CONTRACT_FORMAT, header: bool = False,
              duplicates: bool = False, delimiter: str | None = None) -> str:
        """sacct's output for ``job``, captured the contract's way unless told otherwise."""
        command = ["sacct", "-P", "-j", job, f"--format={fmt}"]
        if not header:
            command.insert(1, "-n")
        if duplicates:
            command.append("-D")
        if delimiter is not None:
            command.append(f"--delimiter={delimiter}")
        env = dict(self.env, TZ="UTC", SLURM_TIME_FORMAT="standard")
        return self.run(command, env=env).stdout

    def states(self, job: str) -> dict[str, str]:
        """squeue's view: array element (``123_4`` or a pending range) to its state."""
        result = self.run(["squeue", "-h", "-j", job, "-o", "%i|%T"], check=False)
        if result.returncode != 0:  # a job that has left the queue is an error for squeue
            return {}
        rows = (line.split("|", 1) for line in result.stdout.splitlines() if "|" in line)
        return dict(rows)

    def wait_state(self, element: str, wanted: set[str], timeout: float = 120) -> str:
        """Wait until squeue shows ``element`` in one of ``wanted``; that state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.states(element).get(element)
            if state in wanted:
                return state
            time.sleep(0.5)
        raise ClusterError(f"{element} not {sorted(wanted)} after {timeout} s "
                           f"(squeue: {self.states(element)})")

    def wait_started(self, element: str, timeout: float = 120) -> None:
        """Wait until ``element`` is no longer pending (running, or already gone)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.states(element).get(element) != "PENDING":
                return
            time.sleep(0.5)
        raise ClusterError(f"{element} still pending after {timeout} s")

    def wait_done(self, job: str, timeout: float = 300, *, named: str | None = None) -> float:
        """Wait until ``job`` has left the queue and sacct shows every row ended; seconds.

        ``named`` (a plain job's name) also waits until the job's own row bears it: a job
        that ends within a second or so of starting is first recorded as ``allocation`` on
        its batch node alone (seen with Slurm 22.05; its steps' records came first, it
        seems), and a moment later as itself on all its nodes.
        """
        started = time.monotonic()
        deadline = started + timeout
        while self._queued([job]):
            if time.monotonic() > deadline:
                raise ClusterError(f"job {job} still queued after {timeout} s: "
                                   f"{self.states(job)}")
            time.sleep(1)
        while True:  # accounting lags the controller by a moment
            rows = [line.split("|") for line in
                    self.sacct(job, fmt="JobID,State,End,JobName").splitlines() if line]
            if (rows and all(state.split()[0].rstrip("+") not in _RUNNING_STATES
                             and end not in ("", "Unknown") for _, state, end, _ in rows)
                    and (named is None or [job, named] in ([r[0], r[3]] for r in rows))):
                return time.monotonic() - started
            if time.monotonic() > deadline:
                raise ClusterError(f"sacct still shows {job} unfinished after {timeout} s")
            time.sleep(1)

    def wait_queue_empty(self, timeout: float = 300) -> None:
        """Wait until squeue shows no job at all (an earlier array still on the node would
        change when a new one's elements start)."""
        deadline = time.monotonic() + timeout
        while self.run(["squeue", "-h", "-o", "%i"]).stdout.strip():
            if time.monotonic() > deadline:
                raise ClusterError(f"the queue is not empty after {timeout} s")
            time.sleep(1)

    def _queued(self, jobs: Sequence[str]) -> bool:
        return bool(self.states(",".join(jobs)))

    # ------------------------------------------------------------- configuration
    def _configure(self) -> None:
        for sub in ("etc", "run", "log", "state", "jobs", "dev", "munge", "mysql",
                    *(f"spool/{node}" for node in self.nodes)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # job scripts run as root anyway; munge wants no group write
        (self.root / "munge").chmod(0o700)
        for name in ("mariadb", "slurmdbd", "slurmctld", "slurmd"):
            self.ports[name] = _free_port()
        gres = ["# Fake GPUs: character device nodes (major 195) made with mknod; a GPU",
                "# without File= is dropped ('Removing file-less GPU'), the node goes INVAL.",
                "AutoDetect=off"]
        for node in self.nodes:
            dev = self._dev(node)
            dev.mkdir(parents=True, exist_ok=True)
            for index in range(self.gpus):
                os.mknod(dev / f"nvidia{index}", 0o666 | 0o020000, os.makedev(195, index))
            gres.append(f"NodeName={node} Name=gpu Type=a100 "
                        f"File={dev}/nvidia[0-{self.gpus - 1}]")
        etc = self.root / "etc"
        (etc / "slurm.conf").write_text(self._slurm_conf())
        (etc / "gres.conf").write_text("\n".join(gres) + "\n")
        (etc / "cgroup.conf").write_text(
            "# No cgroups here: proctrack/linuxproc and task/none never load a cgroup plugin.\n"
            "CgroupAutomount=no\n")
        dbd = etc / "slurmdbd.conf"
        dbd.write_text(self._slurmdbd_conf())
        dbd.chmod(0o600)  # slurmdbd refuses a readable one (it holds the storage password)

    def _dev(self, node: str) -> Path:
        """Where ``node``'s fake GPUs are: ``dev/`` for the one node, ``dev/<node>/`` for
        each of several (every node sees the same filesystem)."""
        return self.root / "dev" if self.network is None else self.root / "dev" / node

    def _auth_info(self) -> str:
        return f"socket={self.root}/munge/munge.socket"

    def _slurm_conf(self) -> str:
        r = self.root
        # several slurmds share one directory: %n (the node's name) keeps their files apart
        per_node = "" if self.network is None else "-%n"
        return "\n".join([
            f"ClusterName={CLUSTER}",
            # "localhost" passes slurmctld's is-this-host check; the address is the one the
            # nodes reach (the bridge's, for several nodes)
            f"SlurmctldHost=localhost({self.controller})",
            f"SlurmctldPort={self.ports['slurmctld']}",
            f"SlurmdPort={self.ports['slurmd']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "MailProg=/bin/true",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire is also how long a requeued job waits to be eligible (default 120 s)
            f"AuthInfo={self._auth_info()},cred_expire=10",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd{per_node}.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd{per_node}.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=task=1",
            "JobAcctGatherParams=OverMemoryKill",
            "AccountingStorageType=accounting_storage/slurmdbd",
            # (the bridge's address for several nodes: sacct works inside a job there too)
            "AccountingStorageHost=" + ("localhost" if self.network is None
                                        else self.controller),
            f"AccountingStoragePort={self.ports['slurmdbd']}",
            # the munge socket for slurmdbd connections (AuthInfo's is not used for them)
            f"AccountingStoragePass={self.root}/munge/munge.socket",
            "AccountingStorageTRES=gres/gpu,gres/gpu:a100",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=5",
            "GresTypes=gpu",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MinJobAge=600",
            # (a scancelled or timed-out element seals after its run, before Slurm's SIGKILL:
            # 5 s was too short on a loaded machine, its period record never written; still
            # below the kit's 20 s grace, so Slurm's SIGKILL comes first, as with the default 30)
            "KillWait=15",
            "InactiveLimit=0",
            "OverTimeLimit=0",
            "MpiDefault=none",
            "SwitchType=switch/none",
            *(f"NodeName={node} NodeAddr={address} CPUs={CPUS} RealMemory={MEMORY_MB} "
              f"Gres=gpu:a100:{self.gpus} State=UNKNOWN"
              for node, address in self._addresses().items()),
            f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES "
            "MaxTime=INFINITE State=UP",
            "",
        ])

    def _addresses(self) -> dict[str, str]:
        """Each node's ``NodeAddr``: the host's loopback, or its own address on the bridge."""
        if self.network is None:
            return {NODE: "127.0.0.1"}
        return {node: self.network.address(index)
                for index, node in enumerate(self.nodes, start=1)}

    def _slurmdbd_conf(self) -> str:
        r = self.root
        return "\n".join([
            "AuthType=auth/munge",
            f"AuthInfo={self._auth_info()}",
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            f"DbdPort={self.ports['slurmdbd']}",
            "SlurmUser=root",
            "DebugLevel=info",
            f"LogFile={r}/log/slurmdbd.log",
            f"PidFile={r}/run/slurmdbd.pid",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={self.ports['mariadb']}",
            "StorageUser=root",
            "StorageLoc=slurm_acct_db",
            "",
        ])

    # ------------------------------------------------------------------- daemons
    def _spawn(self, name: str, command: list[str], log: Path) -> _Daemon:
        out = open(self.root / "log" / f"{name}.stdout", "wb")  # noqa: SIM115 - kept by Popen
        with out:
            process = subprocess.Popen(command, env=self.env, stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        daemon = _Daemon(name, process, log)
        self.daemons.append(daemon)
        return daemon

    def _await(self, daemon: _Daemon, ready: object, what: str) -> None:
        started = time.monotonic()
        deadline = started + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if daemon.process.poll() is not None:
                raise ClusterError(f"{daemon.name} exited {daemon.process.returncode} "
                                   f"before {what}: {self._tail(daemon)}")
            if callable(ready) and ready():
                self.timings[f"{daemon.name}_s"] = time.monotonic() - started
                return
            time.sleep(0.25)
        raise ClusterError(f"{daemon.name} not {what} after {START_TIMEOUT_S} s: "
                           f"{self._tail(daemon)}")

    def _tail(self, daemon: _Daemon) -> str:
        texts = []
        for path in (daemon.log, self.root / "log" / f"{daemon.name}.stdout"):
            if path.is_file():
                lines = path.read_text(errors="replace").strip().splitlines()
                texts.append(" | ".join(lines[-6:]))
        return " || ".join(texts) or "(no log)"

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        key = munge / "munge.key"
        self.run(["mungekey", "--create", f"--keyfile={key}"])
        key.chmod(0o400)
        log = self.root / "log" / "munged.log"
        daemon = self._spawn("munged", [
            "munged", "--foreground", "--force", f"--key-file={key}",
            f"--socket={munge}/munge.socket", f"--pid-file={self.root}/run/munged.pid",
            f"--log-file={log}", f"--seed-file={munge}/munge.seed",
        ], log)
        socket_path = munge / "munge.socket"
        self._await(daemon, socket_path.exists, "listening")

    def _start_mariadb(self) -> None:
        data = self.root / "mysql"
        log = self.root / "log" / "mariadb.log"
        self.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                  "--skip-test-db", "--auth-root-authentication-method=normal"], timeout=120)
        port = self.ports["mariadb"]
        daemon = self._spawn("mariadbd", [
            "mariadbd", "--no-defaults", f"--datadir={data}", "--user=root",
            f"--socket={self.root}/run/mysqld.sock", f"--pid-file={self.root}/run/mysqld.pid",
            f"--port={port}", "--bind-address=127.0.0.1", f"--log-error={log}",
            # slurmdbd connects over TCP as root with no password: no grant tables at all
            "--skip-grant-tables", "--skip-name-resolve", "--innodb-buffer-pool-size=128M",
            "--innodb-lock-wait-timeout=900", "--innodb-log-file-size=64M",
        ], log)
        self._await(daemon, lambda: _port_open(port), "listening")

    def _start_slurmdbd(self) -> None:
        log = self.root / "log" / "slurmdbd.log"
        daemon = self._spawn("slurmdbd", ["slurmdbd", "-D"], log)
        self._await(daemon, lambda: _port_open(self.ports["slurmdbd"]), "listening")
        listed = self.run(["sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster"],
                          check=False)
        if CLUSTER not in listed.stdout.split():
            self.run(["sacctmgr", "-i", "add", "cluster", CLUSTER])

    def _start_slurmctld(self) -> None:
        log = self.root / "log" / "slurmctld.log"
        daemon = self._spawn("slurmctld", ["slurmctld", "-D", "-i"], log)
        self._await(daemon, lambda: self.run(["scontrol", "ping"], check=False)
                    .stdout.count("UP") > 0, "answering")

    def _claim_network(self) -> None:
        try:
            self.network = NodeNetwork.claim()
        except NamespaceUnavailable as error:
            raise Unavailable(str(error)) from None

    def _make_nodes(self) -> None:
        """Start each node's namespaces and link them to the bridge; their inits wait for
        the go that :meth:`_start_slurmd` gives once slurmctld answers."""
        assert self.network is not None
        started = time.monotonic()
        for node in self.nodes:
            try:
                made = self.network.add_node(
                    node, ["slurmd", "-D", "-N", node], go=self.root / "run" / f"go-{node}",
                    stdout=self.root / "log" / f"slurmd-{node}.stdout", env=self.env)
            except NamespaceUnavailable as error:
                raise Unavailable(str(error)) from None
            self.daemons.append(_Daemon(f"slurmd-{node}", made.process,
                                        self.root / "log" / f"slurmd-{node}.log", made))
        self.timings["namespaces_s"] = time.monotonic() - started

    def _start_slurmd(self) -> None:
        if self.network is None:
            log = self.root / "log" / "slurmd.log"
            daemon = self._spawn("slurmd", ["slurmd", "-D", "-N", NODE], log)
        else:
            self.network.go()
            daemon = self.daemons[-1]
        nodes = [d for d in self.daemons if d.name == "slurmd" or d.node is not None]

        def idle() -> bool:
            result = self.run(["sinfo", "-h", "-N", "-n", ",".join(self.nodes), "-o", "%N %T"],
                              check=False)
            states = dict(line.split() for line in result.stdout.splitlines()
                          if len(line.split()) == 2)
            for node, state in states.items():
                if state.startswith(("inval", "drain")):
                    bad = next((d for d in nodes if d.node is None or d.node.name == node),
                               daemon)
                    raise ClusterError(f"node {node} is {state}: {self._tail(bad)}")
            for other in nodes:
                if other.process.poll() is not None:
                    raise ClusterError(f"{other.name} exited {other.process.returncode}: "
                                       f"{self._tail(other)}")
            return sorted(states) == sorted(self.nodes) and set(states.values()) == {"idle"}

        self._await(daemon, idle, "idle")
