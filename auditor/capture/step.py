"""``auditor run --step ROLE -- CMD``: one process of a multi-process attempt, on any node.

A launcher that starts its processes with ``srun`` (seed ``000``'s two-node template: a
controller, policy replicas, rollout replicas) wraps each one in ``auditor run --step``. The
wrapper finds the attempt from ``AUDITOR_ATTEMPT_DIR`` (the batch node's ``auditor run``
exports it, and srun passes it on), supervises the command as ``auditor run`` does (own
process group, signals forwarded to all of it, nothing of it left behind), tees its output
into ``worker-logs/<host>-<role>-<pid>.out`` and its own stdout (srun forwards that into the
batch log), and writes only its process record, ``processes/<host>-<role>-<pid>.json``. The
trial record and the training log stay the batch node's ``auditor run``'s.

It exits with the command's status, but for the controller: its coordinated shutdown (its own
143, the flag truthy in its environment, no signal received by this wrapper, and no other
process's failure recorded before it ended) exits 0, so a launcher that returns the
controller's status, as seed ``000``'s does, never requeues a finished run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from auditor.capture import supervise
from auditor.capture._files import (
    ATTEMPT_DIR_VARIABLE,
    NameTaken,
    hostname,
    own_folder,
    rename_new,
)
from auditor.capture.launch import (
    DEFAULT_DRAIN_S,
    DEFAULT_FLAG,
    DEFAULT_GRACE_S,
    TRAPPED,
    RunRefused,
    await_own_signal,
    launch_and_wait,
    unlinked,
)
from auditor.capture.processes import check_role, read_records, record_exit
from auditor.capture.supervise import GRACE_SIGNALS, Supervision
from auditor.model import TrialRecord
from auditor.model.kinds import WORKER_LOG
from auditor.reason.exits import ExitClass, classify_exit


@dataclass(frozen=True, slots=True)
class StepSpec:
    """What ``auditor run --step`` was asked to do."""

    role: str
    command: tuple[str, ...]
    attempt_dir: Path | None = None
    """None: ``AUDITOR_ATTEMPT_DIR``."""
    rank: int | None = None
    """None: ``SLURM_PROCID`` when srun started it as one of several tasks, else null."""
    flag: str = DEFAULT_FLAG
    grace_s: float = DEFAULT_GRACE_S
    drain_s: float = DEFAULT_DRAIN_S
    echo_fd: int | None = None


@dataclass(frozen=True, slots=True)
class StepResult:
    """How the process ended and where its record is."""

    exit_status: int
    record: Path
    output: Path
    child_exit: int | None
    received_signal: str | None
    exit_class: ExitClass | None
    """The controller's judgement (None for another role: its status is its own)."""
    outlived: tuple[int, ...]


def attempt_of(spec: StepSpec, environ: Mapping[str, str]) -> Path:
    """The attempt directory, which must exist (the batch node's ``auditor run`` made it)."""
    given = spec.attempt_dir if spec.attempt_dir is not None \
        else environ.get(ATTEMPT_DIR_VARIABLE) or None
    if given is None:
        raise RunRefused(f"--step: no attempt directory ({ATTEMPT_DIR_VARIABLE} is not set: "
                         "run the launcher under the batch node's 'auditor run', or pass "
                         "--attempt-dir)")
    directory = Path(given)
    if not directory.is_dir():
        raise RunRefused(f"--step: {directory}: not an attempt directory (the batch node's "
                         "'auditor run' makes it)")
    return directory


def _rank(spec: StepSpec, environ: Mapping[str, str]) -> int | None:
    if spec.rank is not None:
        return spec.rank
    tasks = environ.get("SLURM_NTASKS", "").strip()
    procid = environ.get("SLURM_PROCID", "").strip()
    return int(procid) if procid.isdigit() and tasks.isdigit() and int(tasks) > 1 else None


def run_step(spec: StepSpec, environ: Mapping[str, str] | None = None,
             keep_trapped: bool = False) -> StepResult:
    """Run one process of the attempt (see the module docstring); from the main thread."""
    if not spec.command:
        raise RunRefused("no command given after --")
    try:
        check_role(spec.role)
    except ValueError as error:
        raise RunRefused(f"--step {error}") from None
    if threading.current_thread() is not threading.main_thread():
        raise RunRefused("auditor run must run in the main thread (it traps signals)")
    environ = dict(os.environ if environ is None else environ)
    directory = attempt_of(spec, environ)
    host = hostname()
    state = Supervision(grace_s=spec.grace_s)
    previous = {signum: signal.signal(signum, state.on_signal) for signum in TRAPPED}
    reaper = supervise.become_subreaper()
    try:
        return _run(spec, directory, host, dict(environ), state)
    finally:
        supervise.restore_subreaper(reaper)
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if keep_trapped else handler)


def _run(spec: StepSpec, directory: Path, host: str, env: dict[str, str],
         state: Supervision) -> StepResult:
    own_folder(directory / WORKER_LOG.directory)
    started_ns = time.time_ns()
    # the output file is named for the command's pid, known once it started: until then
    # it goes to a file of the wrapper's own pid, renamed (the command's output waits in
    # the pipe meanwhile: nothing is read before the rename)
    early = directory / WORKER_LOG.path_for(host=host, role=spec.role, pid=os.getpid())
    try:
        log_fd = os.open(early, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                         | os.O_NOFOLLOW, 0o644)
    except FileExistsError:  # (another node's wrapper of this hostname and pid: said so)
        raise NameTaken(early, "a step's output of this host, role and pid") from None
    output = early
    running: list[int] = []
    told = [False]

    def on_signal(signum: int, frame: object) -> None:
        """The wrapper's own handling, and, the first time it is told to end while the
        command runs, a provisional record: srun's cancellation SIGKILLs a wrapper still in
        its grace (KillWait), and its process was then dropped without a word."""
        state.on_signal(signum, frame)
        if signum in GRACE_SIGNALS and running and not told[0]:
            told[0] = True
            with contextlib.suppress(OSError, ValueError):
                record_exit(spec.role, running[0], None, started_ns=started_ns,
                            rank=_rank(spec, env), received_signal=signal.Signals(signum).name,
                            host=host, attempt_dir=directory, provisional=True)

    for signum in TRAPPED:
        signal.signal(signum, on_signal)
    try:
        def named(pid: int) -> None:
            nonlocal output
            running.append(pid)
            output = directory / WORKER_LOG.path_for(host=host, role=spec.role, pid=pid)
            # (never renamed over another node's output of this hostname and pid: kept under
            # the wrapper's pid, and the record that then cannot be written says why)
            if not rename_new(early, output):
                output = early
        child_exit, child_pid, _ = launch_and_wait(spec.command, env, log_fd, state,
                                                   spec.echo_fd, spec.drain_s,
                                                   started=named)
        ended_ns = time.time_ns()
        await_own_signal(state, child_exit)
        supervise.flush_notes(state, log_fd)
    finally:
        state.removed = unlinked(log_fd)
        os.close(log_fd)
    received = state.signals[0] if state.signals else None
    status = child_exit if child_exit is not None else 1
    try:
        record = _record(spec, directory, host, env, state, child_pid, child_exit,
                         started_ns, ended_ns, received)
    except OSError as error:  # (the command's own end is still what the launcher sees)
        raise RecordLost(error, status) from None
    exit_class = None
    if spec.role == "controller":
        exit_class = _controller(record, directory, env, spec.flag, child_exit, received)
        if exit_class.clean:
            status = 0
    return StepResult(status, record, output, child_exit, received, exit_class,
                      tuple(sorted(state.outlived)))


class RecordLost(Exception):
    """The process record could not be written: the error, and the command's own status,
    which the step exits with (a launcher reading a 2 would report another failure)."""

    def __init__(self, error: OSError, status: int) -> None:
        super().__init__(error)
        self.error = error
        self.status = status


def _record(spec: StepSpec, directory: Path, host: str, env: dict[str, str],
            state: Supervision, child_pid: int, child_exit: int | None, started_ns: int,
            ended_ns: int, received: str | None) -> Path:
    """Write the process record of the step's command."""
    return record_exit(
        spec.role, child_pid, child_exit, started_ns=started_ns, ended_ns=ended_ns,
        rank=_rank(spec, env), signal=state.ended_by, received_signal=received, host=host,
        attempt_dir=directory,
        extra={"command": list(spec.command), "signals_received": list(state.signals),
               "killed_after_grace": state.killed_after_grace,
               **({"log_lost": {"bytes": state.lost, "error": state.lost_why}}
                  if state.lost else {}),
               **({"output_removed": True} if state.removed else {}),
               "outlived": [{"pid": pid, "signal": sent}
                            for pid, sent in sorted(state.outlived.items())]})


def _controller(record: Path, directory: Path, env: Mapping[str, str], flag: str,
                child_exit: int | None, received: str | None) -> ExitClass:
    """Seed 000's rule on the controller's own record, with every other process record
    written so far (a replica's failure before the controller ended is never excused)."""
    trial = TrialRecord(path=str(record), exit_code=child_exit, received_signal=received,
                        env=((flag, env[flag]),) if flag in env else ())
    return classify_exit(trial, flag, read_records(directory))
