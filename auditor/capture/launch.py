"""``auditor run``: the launcher wrapper a batch script calls instead of the trainer.

It starts the command in a process group of its own with the dispatch values in its
environment, tees its stdout and stderr into ``training-<job>.log``, traps SIGTERM, SIGUSR1
and SIGINT (each is recorded as ``received_signal`` and forwarded to the command and every
descendant; SIGTERM and SIGINT start the grace, after which all of it is SIGKILLed), waits,
leaves nothing of the command behind (:mod:`auditor.capture.supervise`), and writes
``trial-<job>.json`` atomically.

``auditor run --step ROLE`` (:func:`run_step`) wraps one process of a multi-process attempt
instead (an srun step, a launcher's child, on any node): it finds the attempt from
``AUDITOR_ATTEMPT_DIR``, tees the output into ``worker-logs/<host>-<role>-<pid>.out`` (and
its own stdout, which srun forwards to the batch log) and writes only its process record
(:mod:`auditor.capture.processes`).

Exit statuses apply seed ``000``'s rule through the audit's own classifier
(:func:`auditor.reason.exits.classify_exit`, with every process record written so far, and
each ``--step``'s output left without one, its end unknown): a
coordinated shutdown (the controller's own 143, the flag truthy, no signal received, and no
other process's failure before it) exits 0, so a batch script built on it never requeues a
finished run; every other exit is passed on (128+N for a signal N), and a run whose wrapper
was signalled never exits 0.

Nothing here prints: :func:`run` returns a :class:`RunResult` for the command line to show.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from auditor import __version__
from auditor.capture import supervise
from auditor.capture._files import (
    ATTEMPT_DIR_VARIABLE,
    GPUS_VARIABLE,
    JOB_ID_VARIABLE,
    SHUTDOWN_FLAG_VARIABLE,
    UNUSABLE_JSON,
    dumps,
    hostname,
    open_regular,
    pair_name_problem,
    remove_temporaries,
    write_atomic,
)
from auditor.capture.processes import attempt_processes
from auditor.capture.supervise import Supervision
from auditor.capture.workers import keep_worker_logs
from auditor.model import Citation, ProcessExit, TrialRecord
from auditor.model.kinds import DEVICE_EVIDENCE, TRAINING_LOG, TRIAL
from auditor.model.lines import CONTROLLER_ENDED, ROLE_EXIT_WORDS, role_exit, step_end
from auditor.reason.exits import (
    ExitClass,
    attributed_in_log,
    classify_exit,
    controller_records,
)

DEFAULT_FLAG = "COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"
"""The contract's coordinated-shutdown flag (the default protocol's)."""
TRAPPED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
DEFAULT_GRACE_S = 20.0
"""Seconds between forwarding the first trapped SIGTERM or SIGINT and SIGKILLing what is
left: below Slurm's default ``KillWait`` (30 s), so the trial record is written before
Slurm's own SIGKILL reaches this process. SIGUSR1 starts no timer."""
DEFAULT_DRAIN_S = 5.0
"""Seconds the command's output is still read after it exited (a grandchild holding the
pipe), before its group's stragglers are SIGKILLed."""
SIGNAL_SETTLE_S = 1.0
"""Seconds the wrapper waits for a signal of its own after its command ended as a trapped
signal ends one (exit 143, 138 or 130) while none had reached the wrapper: scancel and
slurmstepd signal every process of the job, and the command can die of its signal before the
wrapper's arrives (once on the live cluster the record then said no signal was received, and
the audit could not say the attempt was signalled). A command that exits 143 of itself (a
coordinated shutdown) pays this once."""


class RunRefused(ValueError):
    """``auditor run`` cannot start as asked (no job id, an attempt already recorded)."""


class TrialLost(Exception):
    """The trial record could not be written once the command had ended (a full disk, say):
    the error, the status the run exits with (the command's, as classified: a launcher
    reading a 2 would requeue a finished run) and the record itself, for the caller to put
    where it can still be read (the batch log)."""

    def __init__(self, error: OSError, status: int, path: Path, document: dict[str, Any]
                 ) -> None:
        super().__init__(error)
        self.error = error
        self.status = status
        self.path = path
        self.document = document


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What ``auditor run`` was asked to do."""

    pair: str
    period: int
    gpus: int
    command: tuple[str, ...]
    attempt_dir: Path | None = None
    """Exactly where the attempt goes; None: the contract's place under ``root``."""
    root: Path = Path(".")
    role: str = "driver"
    dispatch: tuple[tuple[str, str], ...] = ()
    flag: str = DEFAULT_FLAG
    job_id: str | None = None
    """None: ``SLURM_JOB_ID``."""
    grace_s: float = DEFAULT_GRACE_S
    drain_s: float = DEFAULT_DRAIN_S
    echo_fd: int | None = None
    """Where the command's output is also copied (the wrapper's stdout); None: nowhere."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """Who this attempt is, from the scheduler's environment."""

    job_id: str
    restart_count: int
    array_job_id: str | None
    array_task_id: int | None
    directory: Path


@dataclass(frozen=True, slots=True)
class RunResult:
    """How the attempt ended and where its record is."""

    exit_status: int
    """What ``auditor run`` exits with."""
    attempt: Attempt
    trial_path: Path
    log_path: Path
    child_exit: int | None
    received_signal: str | None
    exit_class: ExitClass
    killed_after_grace: bool
    pipe_held_open: bool
    outlived: tuple[int, ...] = ()
    """Pids of the command's processes that outlived it (ended by the wrapper)."""


def _digits(value: str | None) -> str | None:
    """``value``'s ASCII digits (a job id, a count), else None: ``isdigit`` alone also takes
    ``\u0663`` or ``\u00b2``, which the audit refuses in a job id."""
    value = (value or "").strip()
    return value if value.isascii() and value.isdigit() else None


def resolve_attempt(spec: RunSpec, environ: Mapping[str, str]) -> Attempt:
    """The attempt's identity and directory (``attempt-<job>`` for restart 0,
    ``attempt-<job>-r<restart_count>`` after); refuses without a usable job id."""
    given = spec.job_id if spec.job_id is not None else environ.get("SLURM_JOB_ID")
    problem = pair_name_problem(spec.pair)
    if problem is not None:
        raise RunRefused(problem)
    job = _digits(given)
    if job is None:
        where = "--job-id" if spec.job_id is not None else "SLURM_JOB_ID"
        raise RunRefused(f"no job id: {where} is {given!r} (digits expected; outside SLURM "
                         "pass --job-id ID)")
    restart = _digits(environ.get("SLURM_RESTART_COUNT"))
    restart_count = int(restart) if restart is not None else 0
    task = _digits(environ.get("SLURM_ARRAY_TASK_ID"))
    if spec.attempt_dir is not None:
        directory = spec.attempt_dir
    else:
        name = f"attempt-{job}" + (f"-r{restart_count}" if restart_count else "")
        directory = spec.root / f"{spec.pair}-{spec.gpus}gpu" / name
    return Attempt(job, restart_count, _digits(environ.get("SLURM_ARRAY_JOB_ID")),
                   int(task) if task is not None else None, directory)


def run(spec: RunSpec, environ: Mapping[str, str] | None = None,
        keep_trapped: bool = False) -> RunResult:
    """Run the attempt (see the module docstring); call it from the main thread. The
    trapped signals get their handlers back once the trial record is written, or with
    ``keep_trapped`` (the command's own process, about to exit with the record's status)
    are ignored from then on: under Slurm a second SIGTERM (the batch script's forwarded
    one, the step's own) may come after the record is written, and with the handler back
    it made the command exit 130 where its record says 143."""
    if not spec.command:
        raise RunRefused("no command given after --")
    if threading.current_thread() is not threading.main_thread():
        raise RunRefused("auditor run must run in the main thread (it traps signals)")
    environ = dict(os.environ if environ is None else environ)
    attempt = resolve_attempt(spec, environ)
    directory = attempt.directory
    trial_path = directory / TRIAL.path_for(job=attempt.job_id)
    log_path = directory / TRAINING_LOG.path_for(job=attempt.job_id)
    if os.path.lexists(trial_path):  # (a link, dangling too)
        raise RunRefused(f"{directory}: already holds this job's trial record (an attempt is "
                         "never overwritten; a requeue has its own restart count)")
    if os.path.lexists(log_path):
        raise RunRefused(f"{directory}: already holds this job's training log but no trial "
                         "record: its wrapper is still running, or was killed (an attempt is "
                         "never overwritten; a requeue has its own restart count)")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunRefused(f"{directory}: cannot create ({error.strerror})") from None
    earlier = [] if spec.attempt_dir is not None else unfinished_attempts(attempt)
    child_env = {**environ, **dict(spec.dispatch), JOB_ID_VARIABLE: attempt.job_id,
                 ATTEMPT_DIR_VARIABLE: str(directory.resolve()), GPUS_VARIABLE: str(spec.gpus),
                 SHUTDOWN_FLAG_VARIABLE: spec.flag}
    state = Supervision(grace_s=spec.grace_s)
    previous = {signum: signal.signal(signum, state.on_signal) for signum in TRAPPED}
    reaper = supervise.become_subreaper()
    try:  # (trapped until the trial is written: a second scancel must not lose it)
        return _run_attempt(spec, attempt, child_env, state, earlier)
    finally:
        supervise.restore_subreaper(reaper)
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if keep_trapped else handler)


def unfinished_attempts(attempt: Attempt) -> list[dict[str, Any]]:
    """The earlier attempts of this attempt's job (``attempt-<job>``, ``-r<k>`` below its
    restart count) that have no trial record: their wrapper was killed (its command with
    it) or their node failed. The job ran again, so their writers are over: the
    temporaries a write killed midway left in them are removed. One item per attempt for
    the trial record (``unfinished_attempts``)."""
    found: list[dict[str, Any]] = []
    names = [f"attempt-{attempt.job_id}"] + [f"attempt-{attempt.job_id}-r{restart}"
                                             for restart in range(1, attempt.restart_count)]
    for name in names if attempt.restart_count else ():
        directory = attempt.directory.parent / name
        if not directory.is_dir() or directory.is_symlink() \
                or os.path.lexists(directory / TRIAL.path_for(job=attempt.job_id)):
            continue
        found.append({"attempt_dir": name,
                      "log": os.path.lexists(
                          directory / TRAINING_LOG.path_for(job=attempt.job_id)),
                      "temporaries_removed": remove_temporaries(directory, below=True)})
    return found


def unlinked(descriptor: int) -> bool:
    """Whether the file open as ``descriptor`` was removed meanwhile (no name left)."""
    try:
        return os.fstat(descriptor).st_nlink == 0
    except OSError:
        return False


def _run_attempt(spec: RunSpec, attempt: Attempt, child_env: dict[str, str],
                 state: Supervision, earlier: list[dict[str, Any]]) -> RunResult:
    directory = attempt.directory
    trial_path = directory / TRIAL.path_for(job=attempt.job_id)
    log_path = directory / TRAINING_LOG.path_for(job=attempt.job_id)
    # (made here, never through a link put in its place since the check: O_EXCL, O_NOFOLLOW)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                     | os.O_NOFOLLOW, 0o644)
    try:
        started_ns = time.time_ns()
        supervise.note(state, log_fd, f"{' '.join(spec.command)!s} (job {attempt.job_id}, "
                                      f"restart {attempt.restart_count}, grace "
                                      f"{spec.grace_s:g} s)")
        for item in earlier:
            supervise.note(state, log_fd, f"{item['attempt_dir']} has no trial record (its "
                                          "wrapper was killed, or its node failed); "
                                          "temporaries removed: "
                                          f"{len(item['temporaries_removed'])}")
        child_exit, child_pid, held = launch_and_wait(spec.command, child_env, log_fd, state,
                                                      spec.echo_fd, spec.drain_s)
        finished_ns = time.time_ns()
        await_own_signal(state, child_exit)
        received = state.signals[0] if state.signals else None
        supervise.note(state, log_fd, f"command exited {child_exit}")
        if state.lost:
            supervise.note(state, log_fd, f"{state.lost:,} bytes of the command's output could "
                                          f"not be written to this log ({state.lost_why})")
    finally:
        supervise.flush_notes(state, log_fd)
        removed = unlinked(log_fd)
        os.close(log_fd)
    trial, document = _trial(spec, attempt, child_env, started_ns, finished_ns, child_exit,
                             child_pid, received, trial_path)
    if removed:  # (written to the end, under no name: its lines are gone, and it says so)
        document["log_removed"] = True
    kept = keep_worker_logs(directory, hostname(), spec.command, state.seen, child_env)
    document["worker_logs"] = {"kept": kept.files, "notes": kept.notes}
    if state.lost:  # (the log could not take it all: said, the command never ended for it)
        document["log_lost"] = {"bytes": state.lost, "error": state.lost_why}
    records = attempt_processes(directory, _cancellations(log_path), host=hostname(),
                                kept=kept.files)
    judged = classify_exit(trial, spec.flag, records)
    said = said_in_log(log_path, TRAINING_LOG.path_for(job=attempt.job_id),
                       until=controller_records(records) if judged.reaped else None)
    exit_class = attributed_in_log(judged, said)
    status = _exit_status(exit_class, child_exit, received)
    document["invocation"]["exit_code"] = status
    document["status"] = "completed" if exit_class.clean else exit_class.kind
    # (the detail of the record as written, the wrapper's status in it, as the audit will
    # read it: a signalled wrapper whose command exited 0 says exit 138, not 0)
    document["status_detail"] = exit_class.detail if status == child_exit else \
        attributed_in_log(classify_exit(replace(trial, exit_code=status), spec.flag, records),
                          said).detail
    if exit_class.clean:  # (contract v1.2: the launcher checks too, as seed 002's did)
        from auditor.capture.check import check_terminal

        check = check_terminal(directory, log_path, dict(spec.dispatch),
                               spec.root if spec.attempt_dir is None else None)
        document["terminal_event"] = check.where
        if check.missing:
            document["status"] = "infrastructure_invalid"
            document["validation_error"] = check.validation_error()
    document["killed_after_grace"] = state.killed_after_grace
    document["pipe_held_open"] = held
    document["peak_mib"] = _peak_mib(directory)
    document["signals_received"] = list(state.signals)  # (one may come while writing)
    document["outlived"] = [{"pid": pid, "signal": sent}
                            for pid, sent in sorted(state.outlived.items())]
    document["process_records"] = len(records)
    document["unfinished_attempts"] = earlier
    try:
        write_atomic(trial_path, dumps(document))
    except OSError as error:  # (the command's own end is still what the launcher sees)
        raise TrialLost(error, status, trial_path, document) from None
    return RunResult(status, attempt, trial_path, log_path, child_exit, received, exit_class,
                     state.killed_after_grace, held, tuple(sorted(state.outlived)))


def said_in_log(log_path: Path, shown: str, until: Collection[str] | None = None
                ) -> list[tuple[str, int, Citation]]:
    """The launcher's own lines in the log naming another role's non-zero exit before the
    controller's (contract v1.2: such a 143 is never excused), as the audit reads them
    (:func:`auditor.model.lines.role_exit`); ``shown``: how a citation names the log. The
    log is searched in blocks for the lines' words, so a huge one costs a pass at disk
    speed, not a Python line loop. ``until``: stop too at the controller's wrapper's own line
    naming one of these records (after a controller's exit 0, which gives no launcher line
    to stop at)."""
    said: list[tuple[str, int, Citation]] = []
    try:
        with open(log_path, "rb") as handle:
            for number, raw in _lines_holding(handle, ROLE_EXIT_SEARCH):
                line = raw.decode("utf-8", "replace")
                if until is not None and (step_end(line) or ("", ""))[1] in until:
                    break  # (its wrapper's line)
                found = role_exit(line)
                if found is None:
                    continue
                if found[0] == "controller":
                    break
                said.append((*found, Citation(shown, line=number)))
    except OSError:
        pass
    return said


def _cancellations(log_path: Path) -> list[str]:
    """The log's lines saying Slurm cancelled a step (``*** STEP ... CANCELLED AT ...``),
    and the controller's wrapper's own line, in order: whether a step whose wrapper srun
    killed (no record) ended after the controller
    (:func:`~auditor.reason.exits.steps_cancelled`)."""
    try:
        with open(log_path, "rb") as handle:
            return [raw.decode("utf-8", "replace")
                    for _, raw in _lines_holding(handle, STEP_CANCELLED_SEARCH)]
    except OSError:
        return []


STEP_CANCELLED_SEARCH = re.compile(rb"CANCELLED AT|" + re.escape(CONTROLLER_ENDED.encode()))
"""The words every line :func:`~auditor.reason.exits.steps_cancelled` reads holds."""

ROLE_EXIT_SEARCH = re.compile(b"|".join(re.escape(word.encode()) for word in ROLE_EXIT_WORDS))
"""The words every line :func:`~auditor.model.lines.role_exit` reads holds, as one search."""


def _lines_holding(handle: Any, words: re.Pattern[bytes], block: int = 1 << 20
                   ) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of each line of ``handle`` that holds one of ``words``, in
    order."""
    rest, number = b"", 1  # (rest: the unfinished last line of the blocks read so far)
    while True:
        data = handle.read(block)
        text = rest + data
        end = len(text) if not data else text.rfind(b"\n") + 1
        searched, rest = text[:end], text[end:][-block:]  # (a line past a block: its tail)
        found = words.search(searched)
        start = 0
        while found is not None:
            at = found.start()
            first = searched.rfind(b"\n", 0, at) + 1
            last = searched.find(b"\n", at)
            last = len(searched) if last < 0 else last
            number += searched.count(b"\n", start, first)
            yield number, searched[first:last]
            start = first
            found = words.search(searched, last)
        number += searched.count(b"\n", start)
        if not data:
            return


def await_own_signal(state: Supervision, child_exit: int | None) -> None:
    """Wait up to :data:`SIGNAL_SETTLE_S` for a trapped signal to reach the wrapper, when the
    command ended as that signal ends one but none has come yet."""
    if state.signals or child_exit not in {128 + int(signum) for signum in TRAPPED}:
        return
    deadline = time.monotonic() + SIGNAL_SETTLE_S
    while not state.signals and time.monotonic() < deadline:
        time.sleep(0.01)


def _exit_status(exit_class: ExitClass, child_exit: int | None, received: str | None) -> int:
    """0 for a clean exit (0, or a coordinated shutdown); else the command's code; and a
    signalled wrapper whose command still exited 0 exits 128 + that signal."""
    if exit_class.clean:
        return 0
    if child_exit not in (0, None):
        return child_exit
    if received:
        return 128 + int(signal.Signals[received])
    return 1


def launch_and_wait(command: Sequence[str], env: dict[str, str], log_fd: int,
                    state: Supervision, echo_fd: int | None, drain_s: float,
                    started: Callable[[int], None] | None = None
                    ) -> tuple[int | None, int, bool]:
    """Start the command and tee its output until it and everything it started ended;
    returns (its exit code as the shell says it, its pid, whether a straggler held the
    pipe open). ``started`` is told the command's pid before its output is read; a signal
    that ended it is left in ``state.ended_by``."""
    try:
        process = supervise.start(command, env, state)
    except OSError as error:
        supervise.note(state, log_fd, f"cannot start {command[0]!r}: {error.strerror or error}")
        return 127 if isinstance(error, FileNotFoundError) else 126, os.getpid(), False
    if started is not None:
        started(process.pid)
    held = supervise.wait(process, state, log_fd, echo_fd, drain_s)
    code = process.returncode
    if code is not None and code < 0:
        state.ended_by = supervise.signal_name(-code)
    return (128 - code if code is not None and code < 0 else code), process.pid, held


def _trial(spec: RunSpec, attempt: Attempt, env: Mapping[str, str], started_ns: int,
           finished_ns: int, child_exit: int | None, child_pid: int, received: str | None,
           path: Path) -> tuple[TrialRecord, dict[str, Any]]:
    """The trial record as the audit's model (for the classifier) and as the document to
    write (its exit code and status are filled in from the classification)."""
    flag_env = {spec.flag: env[spec.flag]} if spec.flag in env else {}

    document: dict[str, Any] = {
        "schema": "run-evidence/trial/v1", "job_id": attempt.job_id, "pair": spec.pair,
        "period": spec.period, "gpus": spec.gpus, "attempt": attempt.restart_count + 1,
        "restart_count": attempt.restart_count, "array_job_id": attempt.array_job_id,
        "array_task_id": attempt.array_task_id, "dispatch": dict(spec.dispatch),
        "env": flag_env,
        "invocation": {"started_ns": started_ns, "finished_ns": finished_ns,
                       "exit_code": child_exit, "received_signal": received},
        "processes": [{"role": spec.role, "pid": child_pid, "exit_code": child_exit}],
        "status": "", "validation_error": None, "peak_mib": None,
        "hostname": hostname(), "command": list(spec.command),
        "launcher": f"auditor run {__version__}", "grace_s": spec.grace_s,
    }
    trial = TrialRecord(
        path=str(path), job_id=attempt.job_id, pair=spec.pair, period=spec.period,
        gpus=spec.gpus, attempt=attempt.restart_count + 1, dispatch=spec.dispatch,
        env=tuple(flag_env.items()), started_ns=started_ns, finished_ns=finished_ns,
        exit_code=child_exit, received_signal=received,
        processes=(ProcessExit(spec.role, child_pid, child_exit, "/processes/0"),),
    )
    return trial, document


DEVICE_LIMIT = 1 << 20
"""The most of a device file read for its peak (the audit's own limit for the kind)."""


def _peak_mib(directory: Path) -> int | None:
    """The highest ``peak_reserved_mib`` of the attempt's device files (None: none
    measured)."""
    import json

    peaks: list[int] = []
    for path in sorted(path for path in (directory / DEVICE_EVIDENCE.directory).glob("*")
                       if DEVICE_EVIDENCE.loose_compiled.fullmatch(path.name)):
        try:
            with open_regular(path) as handle:  # (a FIFO left there: never waited on)
                value = json.loads(handle.read(DEVICE_LIMIT)).get("peak_reserved_mib")
        except (OSError, AttributeError, *UNUSABLE_JSON):
            continue
        if type(value) is int:
            peaks.append(value)
    return max(peaks) if peaks else None


def parse_dispatch(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``K=V`` items as (key, value) pairs, in order; refuses an item without ``=`` or with
    a key that is not an environment variable name."""
    pairs: list[tuple[str, str]] = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not (key[0].isalpha() or key[0] == "_") \
                or not all(c.isalnum() or c == "_" for c in key):
            raise RunRefused(f"--dispatch {item!r}: expected NAME=VALUE (NAME a variable name)")
        pairs.append((key, value))
    return tuple(pairs)
