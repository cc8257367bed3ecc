"""A real single-node Slurm cluster for the test suite: install, configure, start, stop.

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

Facts this encodes (issue 19): a GPU gres needs ``File=`` device nodes (character major
195) or the node goes INVAL; ``proctrack/linuxproc`` and ``task/none`` work without
cgroups; ``JobAcctGatherParams=OverMemoryKill`` enforces ``--mem``;
``SlurmdParameters=config_overrides`` lets the node claim more CPUs than the machine has,
so a dozen elements run at once; ``cred_expire`` (default 120 s) is how long a requeued
job waits before it is eligible again, so it is set short.
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
CLUSTER = "auditor"
GPUS = 24
"""Fake GPUs (``/dev``-like nodes in the temp dir) on the node."""
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


@dataclass
class Cluster:
    """One running cluster rooted at ``root`` (a temporary directory); see the module doc."""

    root: Path
    ports: dict[str, int] = field(default_factory=dict)
    daemons: list[_Daemon] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    def start(cls, root: Path | None = None) -> Cluster:
        """Write the configuration and start every daemon; wait until the node is idle."""
        base = Path(tempfile.mkdtemp(prefix="auditor-slurm-")) if root is None else root
        cluster = cls(root=base)
        started = time.monotonic()
        try:
            cluster._configure()
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
        """Cancel this cluster's jobs, end the daemons it started (newest first), and
        remove the temporary directory unless ``remove`` is false."""
        started = time.monotonic()
        if self.jobs and any(d.name == "slurmctld" and d.process.poll() is None
                             for d in self.daemons):
            self.run(["scancel", *self.jobs], check=False)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self._queued(self.jobs):
                time.sleep(1)
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
        """The PID of each daemon this cluster started."""
        return {daemon.name: daemon.process.pid for daemon in self.daemons}

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

    def sbatch(self, script: str, *options: str) -> str:
        """Submit ``script`` (its text) with ``options``; the job (array) id."""
        jobs = self.root / "jobs"
        path = jobs / f"script-{len(self.jobs)}.sh"
        path.write_text(script)
        path.chmod(0o755)
        result = self.run(["sbatch", "--parsable", f"--chdir={jobs}",
                           f"--output={jobs}/%A_%a.out", *options, str(path)])
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

    def wait_done(self, job: str, timeout: float = 300) -> float:
        """Wait until ``job`` has left the queue and sacct shows every row ended; seconds."""
        started = time.monotonic()
        deadline = started + timeout
        while self._queued([job]):
            if time.monotonic() > deadline:
                raise ClusterError(f"job {job} still queued after {timeout} s: "
                                   f"{self.states(job)}")
            time.sleep(1)
        while True:  # accounting lags the controller by a moment
            rows = [line.split("|") for line in
                    self.sacct(job, fmt="JobID,State,End").splitlines() if line]
            if rows and all(state.split()[0].rstrip("+") not in _RUNNING_STATES
                            and end not in ("", "Unknown") for _, state, end in rows):
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
        for sub in ("etc", "run", "log", "state", f"spool/{NODE}", "jobs", "dev", "munge",
                    "mysql"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # job scripts run as root anyway; munge wants no group write
        (self.root / "munge").chmod(0o700)
        for name in ("mariadb", "slurmdbd", "slurmctld", "slurmd"):
            self.ports[name] = _free_port()
        for index in range(GPUS):
            node = self.root / "dev" / f"nvidia{index}"
            os.mknod(node, 0o666 | 0o020000, os.makedev(195, index))
        etc = self.root / "etc"
        (etc / "slurm.conf").write_text(self._slurm_conf())
        (etc / "gres.conf").write_text(
            "# Fake GPUs: character device nodes (major 195) made with mknod; a GPU without\n"
            "# File= is dropped ('Removing file-less GPU') and the node goes INVAL.\n"
            f"AutoDetect=off\nNodeName={NODE} Name=gpu Type=a100 "
            f"File={self.root}/dev/nvidia[0-{GPUS - 1}]\n")
        (etc / "cgroup.conf").write_text(
            "# No cgroups here: proctrack/linuxproc and task/none never load a cgroup plugin.\n"
            "CgroupAutomount=no\n")
        dbd = etc / "slurmdbd.conf"
        dbd.write_text(self._slurmdbd_conf())
        dbd.chmod(0o600)  # slurmdbd refuses a readable one (it holds the storage password)

    def _auth_info(self) -> str:
        return f"socket={self.root}/munge/munge.socket"

    def _slurm_conf(self) -> str:
        r = self.root
        return "\n".join([
            f"ClusterName={CLUSTER}",
            "SlurmctldHost=localhost(127.0.0.1)",
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
            f"SlurmdPidFile={r}/run/slurmd.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherFrequency=task=1",
            "JobAcctGatherParams=OverMemoryKill",
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=localhost",
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
            "KillWait=5",
            "InactiveLimit=0",
            "OverTimeLimit=0",
            "MpiDefault=none",
            "SwitchType=switch/none",
            f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory={MEMORY_MB} "
            f"Gres=gpu:a100:{GPUS} State=UNKNOWN",
            f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
            "",
        ])

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

    def _start_slurmd(self) -> None:
        log = self.root / "log" / "slurmd.log"
        daemon = self._spawn("slurmd", ["slurmd", "-D", "-N", NODE], log)

        def idle() -> bool:
            result = self.run(["sinfo", "-h", "-n", NODE, "-o", "%T"], check=False)
            state = result.stdout.strip()
            if state.startswith(("inval", "drain")):
                raise ClusterError(f"node {NODE} is {state}: {self._tail(daemon)}")
            return state == "idle"

        self._await(daemon, idle, "idle")
