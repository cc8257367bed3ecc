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
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from auditor.model import Citation, ExitKind, TrialRecord

TRUTHY = frozenset({"1", "true", "yes"})
SIGTERM_EXIT = 128 + signal.SIGTERM
SIGKILL_EXIT = 128 + signal.SIGKILL


def flag_is_on(value: str | None) -> bool:
    """The launcher's truthiness: ``1``/``true``/``yes`` in any case, nothing else."""
    return value is not None and value.strip().strip('"').lower() in TRUTHY


SIGNALS = frozenset(int(number) for number in signal.valid_signals())
"""The signal numbers this system has (1 to 64 on Linux)."""


def killed_by_signal(code: int) -> bool:
    """Whether exit ``code`` is 128 + a signal's number: 255 is no signal (none has number
    127), just the largest exit status a process can give."""
    return code > 128 and code - 128 in SIGNALS


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


EXIT_KINDS = frozenset({ExitKind.SIGNALLED, ExitKind.SIGKILL, ExitKind.SIGTERM, ExitKind.KILLED,
                        ExitKind.FAILURE, ExitKind.PROCESS_FAILURE, ExitKind.UNKNOWN})
"""The :attr:`ExitClass.kind` words of an unclean exit. ``auditor run`` records one as the
trial's ``status`` (it cannot know whether a failure is eligible): a status that says only
how the attempt exited, not a verdict the audit could disagree with."""


def classify_exit(trial: TrialRecord, flag_name: str) -> ExitClass:
    """Classify the attempt's exit from its trial record (see module docstring)."""
    path = trial.path
    flag_value = trial.env_value(flag_name)
    if flag_value is None:
        flag_value = trial.dispatch_value(flag_name)
    received = trial.received_signal or None
    code = trial.exit_code
    code_cite = Citation(path, pointer="/invocation/exit_code", quote=str(code))
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
    failing = [
        p for p in trial.processes
        if p.exit_code not in (0, None)
        and not is_coordinated_controller_exit(p.role, p.exit_code, flag_value, received)
    ]
    coordinated = [
        p for p in trial.processes
        if is_coordinated_controller_exit(p.role, p.exit_code, flag_value, received)
    ]
    if code == 0 and not failing:
        if coordinated:
            proc = coordinated[0]
            return ExitClass(
                True, ExitKind.COORDINATED_SHUTDOWN,
                f"invocation exit 0; the controller (pid {proc.pid}) exited 143 by coordinated "
                f"shutdown ({flag_name}={flag_value!s})",
                (code_cite, Citation(path, pointer=proc.pointer + "/exit_code", quote="143")),
            )
        return ExitClass(True, ExitKind.CLEAN, "invocation exit 0", (code_cite,))
    if code == SIGTERM_EXIT and coordinated and not failing:
        proc = coordinated[0]
        return ExitClass(
            True, ExitKind.COORDINATED_SHUTDOWN,
            f"exit 143 is a coordinated shutdown: the controller (pid {proc.pid}) exited 143 "
            f"with {flag_name}={flag_value!s} and no signal received by the batch script",
            (code_cite, Citation(path, pointer=proc.pointer + "/exit_code", quote="143"),
             Citation(path, pointer="/env/" + flag_name, quote=str(flag_value))),
        )
    if code == 0:
        proc = failing[0]
        return ExitClass(
            False, ExitKind.PROCESS_FAILURE,
            f"invocation exit 0 but the {proc.role} process (pid {proc.pid}) exited "
            f"{proc.exit_code}",
            (code_cite, Citation(path, pointer=proc.pointer + "/exit_code",
                                 quote=str(proc.exit_code))),
        )
    if code == SIGKILL_EXIT:
        return ExitClass(False, ExitKind.SIGKILL, "exit 137: killed by SIGKILL, never a success",
                         (code_cite,))
    if code == SIGTERM_EXIT:
        why = _why_143_not_excused(trial, flag_name, flag_value)
        return ExitClass(False, ExitKind.SIGTERM, f"exit 143 (SIGTERM) is not excused: {why}",
                         (code_cite,))
    if killed_by_signal(code):
        return ExitClass(False, ExitKind.KILLED, f"exit {code}: killed by {signal_name(code)}",
                         (code_cite,))
    return ExitClass(False, ExitKind.FAILURE, f"exit {code}", (code_cite,))


def _why_143_not_excused(trial: TrialRecord, flag_name: str, flag_value: str | None) -> str:
    controllers = [p for p in trial.processes if p.role == "controller"]
    if not controllers:
        return "no controller process is recorded"
    if not any(p.exit_code == SIGTERM_EXIT for p in controllers):
        return "the controller did not exit 143"
    if not flag_is_on(flag_value):
        return f"{flag_name} is off ({flag_value!r})"
    return "another process failed"
