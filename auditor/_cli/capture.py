"""The producer kit's commands: ``auditor run`` (the launcher wrapper) and ``auditor seal``.

``run`` exits with the status :func:`auditor.capture.launch.run` computed (seed ``000``'s
rule: 0 for a coordinated shutdown, the command's code otherwise); ``seal`` exits 0 when it
wrote the period record or found the identical one, 2 when it refuses. Both refuse a usage
error in one line (exit 2).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any

from auditor.errors import UsageError
from auditor.model import INT64_MAX, INT64_MIN
from auditor.model.lines import STEP_ENDED


def add_parsers(commands: Any) -> None:
    """Add ``run`` and ``seal`` to the ``auditor`` sub-parsers."""
    run = commands.add_parser(
        "run", help="run a training command as one attempt and write its trial record",
        description="Run CMD as one attempt of a period: own process group, dispatch values "
        "in its environment, output teed into training-<job>.log, SIGTERM/SIGUSR1/SIGINT "
        "recorded and forwarded to it and every process it started (SIGKILL --grace "
        "seconds after a SIGTERM or SIGINT; SIGUSR1 starts no timer), nothing of it left "
        "running, trial-<job>.json written at the end. With --step ROLE: one process of a "
        "multi-process attempt (an srun step, on any node), writing only its process record "
        "and worker-logs/<host>-<role>-<pid>.out into $AUDITOR_ATTEMPT_DIR. Exits 0 for a "
        "coordinated shutdown (the controller's own 143 with the flag on, no signal received, "
        "no other process failed before it), else with the command's status.")
    run.add_argument("--step", metavar="ROLE", help="wrap one process of the attempt "
                     "(controller, policy, rollout, rank...): its process record only")
    run.add_argument("--rank", type=_count, default=None,
                     help="with --step: its rank within its role (default: SLURM_PROCID of a "
                     "multi-task step, else none)")
    run.add_argument("--pair")
    run.add_argument("--period", type=_positive)
    run.add_argument("--gpus", type=_positive)
    where = run.add_mutually_exclusive_group()
    where.add_argument("--attempt-dir", type=Path, help="exactly where the attempt goes")
    where.add_argument("--root", type=Path, default=Path("."), help="the study root: the "
                       "attempt goes to ROOT/<pair>-<gpus>gpu/attempt-<job>[-r<restart>] "
                       "(default: the current directory)")
    run.add_argument("--role", default="driver",
                     help="the command's role in the trial record (driver, controller...)")
    run.add_argument("--dispatch", action="append", default=[], metavar="K=V",
                     help="a dispatch value, exported to the command (repeatable)")
    run.add_argument("--flag", default=None, metavar="NAME", help="the coordinated-shutdown "
                     "flag (default: the protocol's coordinated_shutdown_flag in "
                     "ROOT/protocol.json, else COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS; a --step "
                     "takes its batch run's, $AUDITOR_SHUTDOWN_FLAG)")
    run.add_argument("--job-id", help="the job id outside SLURM (default: $SLURM_JOB_ID)")
    run.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                     help="seconds from a trapped signal to SIGKILL of the group (default 20)")
    run.add_argument("--drain", type=float, default=None, metavar="SECONDS",
                     help="seconds after the command exited until what outlived it gets "
                     "SIGKILL (SIGTERM at once), and the output is read meanwhile (default 5)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...")

    seal = commands.add_parser(
        "seal", help="write the period record (manifest) of an attempt",
        description="Write ROOT/pairs/<pair>/period-<n>.json for the attempt in "
        "ROOT/ATTEMPT_DIR: every file with its kind, SHA-256 and size, the workers, the job "
        "ids; again after a retry, the attempt is added. Exit 0: written or identical; 2: "
        "refused.")
    seal.add_argument("root", type=Path, help="the study root")
    seal.add_argument("--pair", required=True)
    seal.add_argument("--period", type=_positive, required=True)
    seal.add_argument("--gpus", type=_positive, required=True)
    seal.add_argument("--attempt-dir", required=True, metavar="REL",
                      help="the attempt directory, relative to ROOT")
    source = seal.add_mutually_exclusive_group()
    source.add_argument("--commit", help="the source commit the attempt ran")
    source.add_argument("--git", type=Path, metavar="DIR",
                        help="read the commit from the HEAD of this git tree")
    seal.add_argument("--workload")
    seal.add_argument("--seed", type=_int64)
    seal.add_argument("--model")
    seal.add_argument("--study", help="the study's name (default: the name the period "
                      "record has, else ROOT's directory name)")
    seal.add_argument("--idle-check", action="store_true",
                      help="ask NVML whether the GPUs were left idle (on the attempt's node, "
                      "inside its job); on a multi-node attempt, also gather each node's own "
                      "result (written by --idle-check-only)")
    seal.add_argument("--idle-check-only", action="store_true",
                      help="only check this node's GPUs and write its result into the "
                      "attempt (run once per node, e.g. srun --ntasks-per-node=1, before the "
                      "seal)")


def _whole(text: str, least: int | None) -> int:
    """``text`` as a whole number in ASCII digits, at least ``least``, that the records'
    64-bit integers hold (what the audit accepts of them)."""
    if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", text):  # (int() also takes other digits)
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    value = int(text)
    if least is not None and value < least:
        raise argparse.ArgumentTypeError(
            f"{value} is not {'positive' if least == 1 else f'{least} or more'}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"{value} is past what a record holds (2^63-1)")
    return value


def _positive(text: str) -> int:
    return _whole(text, 1)


def _count(text: str) -> int:
    return _whole(text, 0)


def _int64(text: str) -> int:
    return _whole(text, None)


def _run(args: argparse.Namespace) -> int:
    from auditor.capture import launch
    from auditor.capture.check import shutdown_flag

    command = list(args.cmd)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("run: no command given (auditor run ... -- CMD...)")
    for name in ("grace", "drain"):
        value = getattr(args, name)
        if value is not None and not (value >= 0 and math.isfinite(value)):  # (nan, inf: no)
            raise UsageError(f"run: --{name} must be a finite number of seconds, 0 or more, "
                             f"not {value}")
    if args.step is not None:
        return _step(args, command)
    missing = [f"--{name}" for name in ("pair", "period", "gpus")
               if getattr(args, name) is None]
    if missing:
        raise UsageError(f"run: {', '.join(missing)} required (or --step ROLE for one process "
                         "of an attempt)")
    if args.rank is not None:
        raise UsageError("run: --rank goes with --step")
    try:
        spec = launch.RunSpec(
            pair=args.pair, period=args.period, gpus=args.gpus, command=tuple(command),
            attempt_dir=args.attempt_dir, root=args.root, role=args.role,
            dispatch=launch.parse_dispatch(args.dispatch),
            flag=args.flag or _protocol_flag(args, shutdown_flag), job_id=args.job_id,
            grace_s=launch.DEFAULT_GRACE_S if args.grace is None else args.grace,
            drain_s=launch.DEFAULT_DRAIN_S if args.drain is None else args.drain,
            echo_fd=_stdout_fd())
        attempt = launch.resolve_attempt(spec, _environ())
        _check_attempt(attempt)  # (a refusal is then the only line: no banner before it)
        print(f"auditor run: job {attempt.job_id} restart {attempt.restart_count}, attempt "
              f"{attempt.directory}; a trapped SIGTERM/SIGINT is forwarded to the "
              f"command's process group, SIGKILL {spec.grace_s:g} s later (SIGUSR1: "
              "forwarded, no timer)", file=sys.stderr, flush=True)
        result = launch.run(spec, keep_trapped=_only_exiting())
    except launch.RunRefused as error:
        raise UsageError(f"run: {error}") from None
    except launch.TrialLost as lost:
        import json

        from auditor._cli import _inert

        # the record goes to the batch log, whole (ASCII: no control or bidi character
        # reaches the terminal), and the run ends as its command did
        print(_inert(f"auditor run: the trial record could not be written ({lost.path}: "
                     f"{lost.error.strerror or lost.error}); the command's own exit, "
                     f"{lost.status}, is passed on; the record follows, one line, to be "
                     "saved as that file by hand"), file=sys.stderr)
        print(json.dumps(lost.document), file=sys.stderr, flush=True)
        return lost.status
    except OSError as error:  # (the log or the trial record could not be written)
        raise UsageError(f"run: {error.filename or attempt.directory}: "
                         f"{error.strerror or error} (the attempt's log or trial record could "
                         "not be written)") from None
    signalled = f", received {result.received_signal}" if result.received_signal else ""
    print(f"auditor run: command exited {result.child_exit}{signalled}; "
          f"{result.exit_class.kind}: {result.exit_class.detail}; exit {result.exit_status}; "
          f"trial record {result.trial_path}", file=sys.stderr)
    return result.exit_status


def _protocol_flag(args: argparse.Namespace, shutdown_flag: Any) -> str:
    """The coordinated-shutdown flag's name the run classifies by without ``--flag``: the
    protocol's under ``--root`` (an empty one a flag never on), else the default."""
    from auditor.capture import launch

    found = shutdown_flag(args.root) if args.attempt_dir is None else None
    return launch.DEFAULT_FLAG if found is None else str(found)


def _step(args: argparse.Namespace, command: list[str]) -> int:
    from auditor._cli import _inert
    from auditor.capture import launch, step
    from auditor.capture._files import SHUTDOWN_FLAG_VARIABLE

    if args.pair is not None or args.period is not None or args.gpus is not None \
            or args.dispatch or args.job_id is not None:
        raise UsageError("run: --step takes no --pair/--period/--gpus/--dispatch/--job-id "
                         "(the batch node's 'auditor run' records the attempt)")
    if args.root != Path("."):
        raise UsageError("run: --step finds the attempt from $AUDITOR_ATTEMPT_DIR (or "
                         "--attempt-dir), not --root")
    spec = step.StepSpec(
        role=args.step, command=tuple(command), attempt_dir=args.attempt_dir, rank=args.rank,
        flag=args.flag or _environ().get(SHUTDOWN_FLAG_VARIABLE, launch.DEFAULT_FLAG),
        grace_s=launch.DEFAULT_GRACE_S if args.grace is None else args.grace,
        drain_s=launch.DEFAULT_DRAIN_S if args.drain is None else args.drain,
        echo_fd=_stdout_fd())
    try:
        result = step.run_step(spec, keep_trapped=_only_exiting())
    except launch.RunRefused as error:
        raise UsageError(f"run: {error}") from None
    except step.RecordLost as lost:
        print(_inert(f"auditor run --step {args.step}: the process record could not be "
                     f"written ({lost.error.filename or ''}: {lost.error.strerror or lost.error});"
                     f" the command's own exit, {lost.status}, is passed on"), file=sys.stderr)
        return lost.status
    except OSError as error:
        raise UsageError(f"run: {error.filename or ''}: {error.strerror or error} (the "
                         "process record or its output could not be written)") from None
    signalled = f", received {result.received_signal}" if result.received_signal else ""
    judged = f"; {result.exit_class.kind}: {result.exit_class.detail}" \
        if result.exit_class is not None else ""
    # ("exited with": a word the training log's scan looks for, so the audit reads where the
    # controller's line falls among Slurm's STEP lines, whatever the judgement says)
    print(f"{STEP_ENDED.format(role=args.step)} with {result.child_exit}{signalled}"
          f"{judged}; exit {result.exit_status}; process record {result.record}",
          file=sys.stderr)
    return result.exit_status


def _check_attempt(attempt: Any) -> None:
    """Refuse, before anything is printed, what :func:`auditor.capture.launch.run` would
    refuse once started, and a directory where its files cannot be written: the attempt's
    trial record or log already there (or a link in its place, which would be written
    through), a directory that cannot be made or written in (run from the main thread)."""
    import os
    import tempfile
    import threading

    from auditor.capture import launch
    from auditor.model.kinds import TRAINING_LOG, TRIAL

    if threading.current_thread() is not threading.main_thread():
        raise launch.RunRefused("auditor run must run in the main thread (it traps signals)")
    directory = attempt.directory
    for kind in (TRIAL, TRAINING_LOG):
        what = kind.title
        if os.path.lexists(directory / kind.path_for(job=attempt.job_id)):
            raise launch.RunRefused(f"{directory}: already holds this job's {what} (an "
                                    "attempt is never overwritten; a requeue has its own "
                                    "restart count)")
    if directory.exists() and not directory.is_dir():
        raise launch.RunRefused(f"{directory}: exists and is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise launch.RunRefused(f"{directory}: cannot create ({error.strerror})") from None
    try:  # (the only proof a file can be made there: /proc or /sys say yes to access())
        handle, probe = tempfile.mkstemp(prefix=".auditor-run-", dir=directory)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise launch.RunRefused(f"{directory}: cannot write there "
                                f"({error.strerror or error})") from None


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def _stdout_fd() -> int | None:
    try:
        sys.stdout.flush()
        return sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # (a test's captured stdout has none)
        return None


def _commit(args: argparse.Namespace) -> str:
    if args.commit is not None:
        return str(args.commit).strip().lower()
    if args.git is None:
        raise UsageError("seal: the record's commit is required: pass --commit SHA or "
                         "--git DIR")
    import subprocess

    try:
        done = subprocess.run(["git", "-C", str(args.git), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UsageError(f"seal: cannot run git for --git {args.git}: {error}") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["git rev-parse HEAD failed"])[-1]
        raise UsageError(f"seal: --git {args.git}: {why}")
    commit = done.stdout.strip().lower()
    try:  # (tracked files changed since HEAD: the source that ran need not be the commit)
        status = subprocess.run(["git", "-C", str(args.git), "status", "--porcelain",
                                 "--untracked-files=no"], capture_output=True, text=True,
                                timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        status = None
    if status is not None and status.returncode == 0 and status.stdout.strip():
        from auditor._cli import _inert

        changed = [line for line in status.stdout.splitlines() if line.strip()]
        print(_inert(f"seal: --git {args.git} has {len(changed)} tracked file(s) changed since "
                     f"its HEAD {commit[:12]} (first: {changed[0][3:]}): the commit pinned is "
                     "not exactly the source there; pin the commit the attempt ran with "
                     "--commit"), file=sys.stderr)
    return commit


def _seal(args: argparse.Namespace) -> int:
    from auditor.capture import seal

    if args.idle_check_only:
        return _seal_node(args)
    spec = seal.SealSpec(root=args.root, pair=args.pair, period=args.period, gpus=args.gpus,
                         attempt_dir=args.attempt_dir, commit=_commit(args),
                         workload=args.workload, seed=args.seed, model=args.model,
                         study=args.study, idle_check=args.idle_check)
    try:
        result = seal.seal(spec)
    except seal.SealRefused as error:
        raise UsageError(f"seal: {error}") from None
    except OSError as error:
        raise UsageError(f"seal: {error.filename or args.root}: {error.strerror}") from None
    if result.written:
        print(f"sealed {result.path}: {result.files} files, attempt {result.attempts}")
    else:
        print(f"{result.path}: this attempt is sealed already, identically; unchanged")
    if result.removed:
        print(f"seal: removed what a killed seal left beside the record: "
              f"{', '.join(result.removed)}", file=sys.stderr)
    if result.missing:
        print(f"seal: the record lacks {', '.join(result.missing)} (pass --workload, --seed, "
              "--model): the audit will flag it", file=sys.stderr)
    if result.idle_check is not None and result.idle_check.get("passed") is None:
        print("seal: no idle check could be made: "
              f"{result.idle_check.get('unavailable') or 'no reason recorded'}",
              file=sys.stderr)
    return 0


def _seal_node(args: argparse.Namespace) -> int:
    """``seal --idle-check-only``: this node's idle check, into ATTEMPT/idle/<host>.json."""
    from auditor.capture import seal

    if args.idle_check or args.commit is not None or args.git is not None:
        raise UsageError("seal: --idle-check-only writes this node's check only (no "
                         "--idle-check, --commit or --git: the batch node's seal takes them)")
    spec = seal.SealSpec(root=args.root, pair=args.pair, period=args.period, gpus=args.gpus,
                         attempt_dir=args.attempt_dir, commit="", idle_check_only=True)
    try:
        path, result = seal.check_node(spec)
    except seal.SealRefused as error:
        raise UsageError(f"seal: {error}") from None
    except OSError as error:
        raise UsageError(f"seal: {error.filename or args.root}: {error.strerror}") from None
    said = "passed" if result.get("passed") else "did not pass" \
        if result.get("passed") is False \
        else f"could not be made: {result.get('unavailable') or 'no reason recorded'}"
    print(f"idle check of {result['host']} {said}: {path}")
    return 0


HANDLERS = {"run": _run, "seal": _seal}


def _only_exiting() -> bool:
    """Whether this is the command's own process (:func:`auditor._cli.entry`), which exits
    once the attempt is run: a signal after its trial record is written is then ignored,
    not made an interruption (exit 130) that would contradict the record."""
    from auditor import _cli

    return _cli._ONLY_EXITING
