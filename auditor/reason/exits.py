"""Exit classification, applied after the fact (seed ``000_cc78674565d77a63``).

A process exit of 143 (128+SIGTERM) is a clean *coordinated shutdown* only
when every one of these holds, and excusing more would trade one false
verdict for another:

- the process is the ``controller`` (a policy or rollout 143 is a kill);
- the protocol's ``coordinated_shutdown_flag`` is truthy in the attempt's
  environment (``1``/``true``/``yes`` in any case; ``0``, ``false``, empty and
  absent are off, matching the launcher's own truthiness, not a non-empty test);
- the batch script itself received no signal (``received_signal`` empty):
  scancel and the pre-timeout ``SIGUSR1`` set it, and a wall-clock SIGTERM
  shows in sacct as ``TIMEOUT`` (checked by the caller against the element).

137 (SIGKILL) is never a success. Codes above 128 mean "killed by signal
``code - 128``".

Contract v1.2: an attempt may run many processes on many nodes, each leaving a process record
(``processes/<host>-<role>-<pid>.json``). The rule then applies to the controller's *own*
record (the wrapper around the whole launcher is the launcher, whatever role it was given),
its wrapper must have received no signal either, and a 143 the evidence attributes to another
process is never excused: another process that failed before the controller ended (a policy
replica SIGTERMed from outside makes the controller shut down "coordinated"), one that failed
after it other than by the launcher's reaping signal, or a launcher's own log line saying
another role exited non-zero before the controller did (``policy exited with code 143``).
"""

from __future__ import annotations

import signal
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from auditor.model import CLOCK_SLACK_NS, Citation, ExitKind, ProcessExit, TrialRecord
from auditor.model.kinds import WORKER_LOG
from auditor.model.lines import inline_code, step_end

TRUTHY = frozenset({"1", "true", "yes"})
SIGTERM_EXIT = 128 + signal.SIGTERM
SIGKILL_EXIT = 128 + signal.SIGKILL


def flag_is_on(value: str | None) -> bool:
    """The launcher's truthiness: ``1``/``true``/``yes`` in any case, nothing else."""
    return value is not None and value.lower() in TRUTHY  # (" 1" is off there too)


SIGNALS = frozenset(int(number) for number in signal.valid_signals())
"""The signal numbers this system has (1 to 64 on Linux)."""


def killed_by_signal(code: int) -> bool:
    """Whether exit ``code`` is 128 + a signal's number: 255 is no signal (none has number
    127), just the largest exit status a process can give."""
    return code > 128 and code - 128 in SIGNALS


def a_kill(code: int) -> bool:
    """Whether a process's exit ``code`` as a launcher reports it is a signal's: a shell's
    128 + N, or Python's and torchrun's -N."""
    return killed_by_signal(code) or (code < 0 and -code in SIGNALS)


def signal_name(code: int) -> str:
    """``SIGTERM`` for 143, ``signal 77`` for unknown numbers."""
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return f"signal {code - 128}"


def is_coordinated_controller_exit(
    role: str | None, exit_code: int | None, flag_value: str | None, received_signal: str | None
) -> bool:
    """The narrow rule of seed ``000``: controller, 143, flag on, script not signalled."""
    return (
        role == "controller"
        and exit_code == SIGTERM_EXIT
        and flag_is_on(flag_value)
        and not received_signal
    )


@dataclass(frozen=True, slots=True)
class ExitClass:
    """How an attempt ended, judged from its trial record."""

    clean: bool
    """Exit 0, or a coordinated controller shutdown."""
    kind: ExitKind
    detail: str
    """One sentence saying why, for the diagnosis."""
    citations: tuple[Citation, ...]
    blamed: tuple[str, int, Citation] | None = None
    """The launcher's log line naming another role's non-zero exit that the controller's
    shutdown followed (role, exit code, the line): the cause, the 143 its knock-on."""
    lost: ProcessExit | None = None
    """A step's output without its record that the unclean exit rests on
    (:func:`unrecorded_steps`): what ended it is unknown, and a controller's 143 after it is
    its knock-on, never the cause."""
    reaped: int = 0
    """How many failed processes a clean exit counts as the launcher's reaping after the
    controller's own exit 0 (:func:`attributed_in_log` weighs the launcher's lines against
    it, as against an excused 143)."""


EXIT_KINDS = frozenset({ExitKind.SIGNALLED, ExitKind.SIGKILL, ExitKind.SIGTERM, ExitKind.KILLED,
                        ExitKind.FAILURE, ExitKind.PROCESS_FAILURE, ExitKind.UNKNOWN})
"""The :attr:`ExitClass.kind` words of an unclean exit. ``auditor run`` records one as the
trial's ``status`` (it cannot know whether a failure is eligible): a status that says only
how the attempt exited, not a verdict the audit could disagree with."""


LAUNCHER = "launcher"
"""The role of the wrapper around a whole launcher: its exit is the invocation's."""
REAPING_EXITS = frozenset({128 + signal.SIGTERM, 128 + signal.SIGKILL, 128 + signal.SIGINT})
"""How a process the launcher stops after the controller ended exits (its knock-on)."""
REAPING_SIGNALS = frozenset(signal.Signals(code - 128).name for code in REAPING_EXITS)
"""The signals of :data:`REAPING_EXITS` as a record's ``signal`` names them: a crash's own
(``SIGSEGV``, ``SIGABRT``, ``SIGBUS``) is never the launcher's stopping."""


def processes_of(trial: TrialRecord, records: Sequence[ProcessExit]) -> tuple[ProcessExit, ...]:
    """The attempt's processes as the rule judges them: each process record, and the trial's
    own ``processes`` items. With process records present, a trial item that is no record of
    its own is the wrapper around the launcher (``auditor run`` on the batch node): its exit
    is the invocation's, judged as that, never as a controller's (the launcher's pid once
    passed for the controller's)."""
    if not records:
        return trial.processes
    recorded = {(p.role, p.pid) for p in records}
    own = tuple(replace(p, role=LAUNCHER) for p in trial.processes
                if (p.role, p.pid) not in recorded)
    return (*records, *own)


def _cite(trial: TrialRecord, process: ProcessExit, field: str, quote: str) -> Citation:
    if _only_output(process):  # (no record: its output, the one sign it ran)
        return Citation(process.path or "")
    return Citation(process.path or trial.path, pointer=f"{process.pointer}/{field}",
                    quote=quote)


def _shown(process: ProcessExit) -> str:
    """``the policy process (pid 42 on n2)``, ``the controller (pid 7)``."""
    where = f" on {process.host}" if process.host else ""
    what = "the controller" if process.role == "controller" else f"the {process.role} process"
    return f"{what} (pid {process.pid}{where})"


def _ended_by_signal(process: ProcessExit) -> bool:
    return bool(process.signal) or process.exit_code in REAPING_EXITS \
        or bool(process.received_signal)


def _reaped(process: ProcessExit) -> bool:
    """Whether ``process``'s end, once after the controller's, reads as the launcher's
    reaping: its wrapper received a signal (a provisional record says which), Slurm
    cancelled its step (a step's output without its record that :func:`unrecorded_steps`
    placed after the controller's end), or a reaping signal ended it. A crash's signal, or a
    record saying no exit with nothing that stopped it, is never (it may have failed)."""
    if process.received_signal or _only_output(process):
        return True
    if process.signal:  # (a child killed by SIGSEGV records exit 139 and signal SIGSEGV)
        return process.signal in REAPING_SIGNALS
    return process.exit_code in REAPING_EXITS


def _exit_unknown(process: ProcessExit) -> bool:
    """A process record that says no exit: it may have failed (a trial record's own item
    without one is v1's, where unknown counts as not failed)."""
    return process.path is not None and process.exit_code is None and not process.signal


def _exited(process: ProcessExit) -> str:
    """``exited 143``, or that its record says no exit, or that it left none."""
    if process.exit_code is None and not process.signal:
        return f"left no process record, only its output `{process.path}`" \
            if _only_output(process) else "left no exit code in its record"
    return f"exited {process.exit_code}"


def _finished_controller(records: Sequence[ProcessExit]) -> ProcessExit | None:
    """The controller's own record of a clean end (exit 0, no signal, none received by its
    wrapper), or None; of several, the one that ended last (one with no end time first)."""
    finished = [p for p in records if p.role == "controller" and p.exit_code == 0
                and not p.signal and not p.received_signal and not _only_output(p)]
    # (the first by name let a replica stopped while a later controller still ran pass for
    # the reaping after "the" end; an unknown end leaves every failure before it)
    return max(finished, key=lambda p: (p.ended_ns is None, p.ended_ns or 0), default=None)


def _lost(process: ProcessExit) -> ProcessExit | None:
    """``process`` where it stands for a step's output without its record, else None."""
    return process if _only_output(process) else None


def _only_output(process: ProcessExit) -> bool:
    """Whether ``process`` stands for a step's output without its record
    (:func:`unrecorded_steps`)."""
    return process.path is not None and f"/{WORKER_LOG.directory}/" in f"/{process.path}"


def unrecorded_steps(records: Sequence[ProcessExit], logs: Iterable[str],
                     hosts: Collection[str], cancelled: Mapping[str, bool] | None = None,
                     kept: Collection[str] | None = None) -> tuple[ProcessExit, ...]:
    """The processes ``auditor run --step`` started that left no record: a worker log of the
    step's name (``worker-logs/<host>-<role>-<pid>.out``, a role with a letter) with no
    process record of that host and pid. Its wrapper was killed, or it still ran when the
    attempt was sealed: its end is unknown, so it may have failed (a replica gone, seed
    000's case, is never dropped silently), unless Slurm says it reaped it: ``cancelled``
    (:func:`steps_cancelled`) says, by node, whether the batch log's ``*** STEP ... ON
    <node> CANCELLED AT ...`` line came after the controller's end (srun's cancellation
    SIGKILLs the wrapper at once); such a step ends just after the controller's record.

    ``kept``: the worker logs the run kept itself (the trial record's ``worker_logs.kept``,
    as ``worker-logs/<name>``), never a step's; any other is one, whatever its host (a
    replica lost with its node, the one file naming that node). Where the run does not say
    (None), only a log of a host among ``hosts`` is, none where no host is known: a kept
    log's ``<host>-<pid>.out`` of a host ending in letters reads as a step's name
    (``della-l01g3-4242.out``)."""
    recorded = {(p.host, p.pid) for p in records}
    found: dict[tuple[str, int], ProcessExit] = {}
    if kept is None and not hosts:
        return ()
    end = max((p.ended_ns for p in records if p.role == "controller" and p.ended_ns),
              default=None)
    for path in sorted(logs):
        name = path.rsplit("/", 1)[-1]
        parts = WORKER_LOG.names[0].parts(name)
        if parts is None or not any(char.isalpha() for char in parts["role"]) \
                or (parts["host"] not in hosts if kept is None
                    else f"{WORKER_LOG.directory}/{name}" in kept):
            continue
        key = (parts["host"], int(parts["pid"]))
        if key not in recorded:
            reaped = end is not None and (cancelled or {}).get(key[0], False)
            found.setdefault(key, ProcessExit(
                parts["role"], key[1], None, "", path=path, host=key[0],
                ended_ns=end + 1 if reaped and end is not None else None))
    return tuple(found.values())


def steps_cancelled(lines: Iterable[str], controllers: Collection[str] | None = None
                    ) -> dict[str, bool]:
    """:func:`reaped_steps` of a batch log's ``lines``, in order."""
    return reaped_steps(map(step_end, lines), controllers)


def reaped_steps(ends: Iterable[tuple[str, str] | None],
                 controllers: Collection[str] | None = None) -> dict[str, bool]:
    """By node, whether every one of the batch log's ``*** STEP <job>.<n> ON <node>
    CANCELLED AT <time> ***`` lines for it comes after the controller's wrapper's own line
    (``ends``: :func:`~auditor.model.lines.step_end` of the log's lines, in order): then
    Slurm cancelled that node's steps after the controller ended, the launcher's reaping.
    ``controllers``: the names of the attempt's controller records; a wrapper's line counts
    only where it names one (a launcher printing an earlier attempt's log prints that
    attempt's controller line, which would place this controller's end too early); None:
    any such line. A worker log names its node, never its step, so one step of that node
    cancelled before the controller's end leaves every step of it there of unknown end.
    The time the line states is never compared with a record's: slurmstepd prints its own
    local time, in whole seconds (``_handle_signal_container``), so a site not on UTC read
    it hours off, and a reaping within the second of the controller's end read as before
    it."""
    found: dict[str, bool] = {}
    ended = False
    for end in ends:
        if end is None:
            continue
        kind, what = end
        if kind == "controller":
            ended = ended or controllers is None or what in controllers
        else:  # (the last line alone let a later reaping excuse a step lost before the end)
            found[what] = found.get(what, True) and ended
    return found


def controller_records(records: Iterable[ProcessExit]) -> frozenset[str]:
    """The file names of the controllers' process records among ``records``."""
    return frozenset(p.path.rsplit("/", 1)[-1] for p in records
                     if p.role == "controller" and p.path and not _only_output(p))


def _attributed(controller: ProcessExit, others: Iterable[ProcessExit]) -> ProcessExit | None:
    """The first other process whose failure the evidence may have caused the controller's
    143 by: one that failed (or whose record says no exit) before the controller ended (or
    when either time is unknown), or failed after it other than by a reaping signal. On
    another node, a kill its wrapper did not pass on (no ``received_signal``: not the
    launcher's stopping of it, nor Slurm's cancellation of its step) is before the
    controller's end unless it came more than :data:`CLOCK_SLACK_NS` after it: that node's
    clock may run ahead. Another controller's failure is never the launcher's reaping (it
    stops its peers, not a controller), nor a crash's signal (:func:`_reaped`)."""
    end = controller.ended_ns
    for process in others:
        unknown = _exit_unknown(process)
        if not process.failed and not unknown:
            continue
        doubt = CLOCK_SLACK_NS if not process.received_signal and not _only_output(process) \
            and process.host and controller.host and process.host != controller.host else 0
        before = end is None or process.ended_ns is None or process.ended_ns <= end + doubt
        if before or process.role == "controller" or not _reaped(process):
            return process
    return None


def classify_exit(trial: TrialRecord, flag_name: str,
                  records: Sequence[ProcessExit] = ()) -> ExitClass:
    """Classify the attempt's exit from its trial record and its process records (see the
    module docstring)."""
    path = trial.path
    flag_value = trial.env_value(flag_name)
    if flag_value is None:
        flag_value = trial.dispatch_value(flag_name)
    received = trial.received_signal or None
    code = trial.exit_code
    code_cite = Citation(path, pointer="/invocation/exit_code", quote=str(code))
    processes = processes_of(trial, records)
    if received:
        return ExitClass(
            False,
            ExitKind.SIGNALLED,
            f"the batch script received {received} (invocation exit {code}); a signalled "
            "attempt is never a success",
            (Citation(path, pointer="/invocation/received_signal", quote=received), code_cite),
        )
    if code is None:
        return ExitClass(False, ExitKind.UNKNOWN, "the trial records no invocation exit code",
                         (code_cite,))
    coordinated = [
        p for p in processes
        if is_coordinated_controller_exit(p.role, p.exit_code, flag_value,
                                          received or p.received_signal)
    ]
    # (the trial's own item beside process records is the wrapper around the launcher: its
    # exit is the invocation's, judged below; a process record in the role is a process)
    # (a record that says no exit, or a step's output without its record, may have failed:
    # never dropped, with a controller or without one)
    failing = [p for p in processes if (p.failed or _exit_unknown(p)) and p not in coordinated
               and not (records and p.role == LAUNCHER and p.path is None)]
    reaped: list[ProcessExit] = []
    if coordinated and records:  # (v1.2: the knock-ons of the shutdown are the launcher's)
        cause = _attributed(coordinated[0], failing)
        failing = [] if cause is None else [cause]
    elif records and (finished := _finished_controller(records)) is not None:
        # (a controller that ended cleanly: its peers stopped after it are the launcher's
        # reaping, as after a coordinated shutdown; one failed before it is never excused)
        cause = _attributed(finished, failing)
        reaped, failing = ([], [cause]) if cause is not None else (failing, [])
    if code == 0 and not failing:
        if reaped:
            return _clean_after(trial, code_cite, _finished_controller(records) or reaped[0],
                                reaped)
        if coordinated:
            proc = coordinated[0]
            return ExitClass(
                True, ExitKind.COORDINATED_SHUTDOWN,
                f"invocation exit 0; {_shown(proc)} exited 143 by coordinated shutdown "
                f"({flag_name}={flag_value!s}) and no signal was received",
                (code_cite, _cite(trial, proc, "exit_code", "143")),
            )
        return ExitClass(True, ExitKind.CLEAN, "invocation exit 0", (code_cite,))
    if code == SIGTERM_EXIT and coordinated and not failing:
        proc = coordinated[0]
        return ExitClass(
            True, ExitKind.COORDINATED_SHUTDOWN,
            f"exit 143 is a coordinated shutdown: "
            f"{_shown(proc)} exited 143 "
            f"with {flag_name}={flag_value!s} and no signal received by the batch script",
            (code_cite, _cite(trial, proc, "exit_code", "143"),
             Citation(path, pointer="/env/" + flag_name, quote=str(flag_value))),
        )
    if code == 0:
        proc = failing[0]
        why = f": {_why_143_not_excused(trial, processes, (), flag_name, flag_value)[0]}" \
            if proc.role == "controller" and proc.exit_code == SIGTERM_EXIT else ""
        return ExitClass(
            False, ExitKind.PROCESS_FAILURE,
            f"invocation exit 0 but {_shown(proc)} {_exited(proc)}{why}",
            (code_cite, _cite(trial, proc, "exit_code", "null" if proc.exit_code is None
                              else str(proc.exit_code))), lost=_lost(proc),
        )
    if code == SIGKILL_EXIT:
        return ExitClass(False, ExitKind.SIGKILL, "exit 137: killed by SIGKILL, never a success",
                         (code_cite,))
    if code == SIGTERM_EXIT:
        why, cited = _why_143_not_excused(trial, processes, failing, flag_name, flag_value)
        # (a shutdown another process's failure caused ends as that failure did: a replica's
        # crash is an unclean exit, its kill a kill)
        kind = ExitKind.PROCESS_FAILURE if coordinated and failing \
            and not _ended_by_signal(failing[0]) and not _exit_unknown(failing[0]) \
            else ExitKind.SIGTERM
        return ExitClass(False, kind, f"exit 143 (SIGTERM) is not excused: {why}",
                         (code_cite, *cited), lost=_lost(failing[0]) if failing else None)
    if killed_by_signal(code):
        return ExitClass(False, ExitKind.KILLED, f"exit {code}: killed by {signal_name(code)}",
                         (code_cite,))
    if records and failing:  # (the kit's own exit 1 for a process_failure it found: named)
        proc = failing[0]
        return ExitClass(False, ExitKind.FAILURE, f"exit {code}; {_shown(proc)} {_exited(proc)}",
                         (code_cite, _cite(trial, proc, "exit_code", "null"
                                           if proc.exit_code is None else str(proc.exit_code))),
                         lost=_lost(proc))
    return ExitClass(False, ExitKind.FAILURE, f"exit {code}", (code_cite,))


def _clean_after(trial: TrialRecord, code_cite: Citation, controller: ProcessExit,
                 reaped: Sequence[ProcessExit]) -> ExitClass:
    """A clean exit: ``controller`` exited 0, and the launcher stopped ``reaped`` after it."""
    return ExitClass(
        True, ExitKind.CLEAN,
        f"invocation exit 0; {_shown(controller)} exited 0, and the launcher stopped "
        f"{len(reaped)} other process{'es' if len(reaped) > 1 else ''} after it "
        f"({_shown(reaped[0])} {_exited(reaped[0])})",
        (code_cite, _cite(trial, controller, "exit_code", "0")), reaped=len(reaped))


def _why_143_not_excused(trial: TrialRecord, processes: Sequence[ProcessExit],
                         failing: Sequence[ProcessExit], flag_name: str,
                         flag_value: str | None) -> tuple[str, tuple[Citation, ...]]:
    controllers = [p for p in processes if p.role == "controller"]
    if not controllers:
        return "no controller process is recorded", ()
    if not any(p.exit_code == SIGTERM_EXIT for p in controllers):
        return "the controller did not exit 143", ()
    if not flag_is_on(flag_value):
        shown = "unset" if flag_value is None else inline_code(flag_value) if flag_value \
            else "empty"
        return f"{flag_name} is off ({shown})", ()
    signalled = next((p for p in controllers if p.received_signal), None)
    if signalled is not None:
        return (f"the controller's wrapper received {signalled.received_signal}",
                (_cite(trial, signalled, "received_signal", signalled.received_signal or ""),))
    if failing:
        other = failing[0]
        return (f"{_shown(other)} {_exited(other)}"
                + (" before the controller ended" if other.ended_ns is not None else ""),
                (_cite(trial, other, "exit_code", "null" if other.exit_code is None
                       else str(other.exit_code)),))
    return "another process failed", ()


def attributed_in_log(exit_class: ExitClass, said: Iterable[tuple[str, int, Citation]]
                      ) -> ExitClass:
    """``exit_class`` unless it excuses a coordinated shutdown, or failed processes as the
    reaping after the controller's exit 0 (:attr:`ExitClass.reaped`), while the launcher's
    log says another role exited non-zero (``said``: role, code and citation of each such
    line before the controller's own exit, in order): then a 143 not excused, or a
    ``process_failure``, citing the line."""
    if exit_class.kind is not ExitKind.COORDINATED_SHUTDOWN and not exit_class.reaped:
        return exit_class
    for role, code, cite in said:
        if role != "controller" and exit_class.reaped:
            # (the reaping rests on a replica's end read as after the controller's: the
            # launcher's own word that one ended before it is never the launcher's reaping)
            return ExitClass(
                False, ExitKind.PROCESS_FAILURE,
                f"invocation exit 0 but the launcher's log says {role} exited with code "
                f"{code} before the controller ended", (*exit_class.citations, cite),
                (role, code, cite))
        if role != "controller":  # (as a process record's: a crash unclean, a kill killed)
            return ExitClass(
                False, ExitKind.SIGTERM if a_kill(code) else ExitKind.PROCESS_FAILURE,
                f"exit 143 (SIGTERM) is not excused: the launcher's log says {role} exited "
                f"with code {code} before the controller ended",
                (*exit_class.citations, cite), (role, code, cite))
    return exit_class
