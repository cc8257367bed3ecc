"""What ended a period that did not complete: one stable word, its detail, and the record it
rests on (contract v1.1, "Causes").

Every source is asked: the scheduler (sacct's state of the job's last attempt), the launcher
(the signal the batch script received, the exit code), the allocator traces (a phase that
raised), the process records (contract v1.2: the first to fail, by its own end time; every
later one is its knock-on) and the events of the training log and the worker logs the kit
kept. Among what they show, a cause of a higher tier wins (:data:`TIERS`: the scheduler's
and the node's word, an engine's death, memory and the other faults of the machine and its
services, a crash or a signal, an actor's death or a Python exception, NCCL, a launcher's
summary of a child's failure); in a tier, the first in time wins (trace records by their own
times; log lines by the times they state across files, one file's by its lines). Everything else
found is named as a knock-on (peers' NCCL errors after one rank ran out of memory). An
attempt that exited cleanly has no cause (None: a completed run, or one that lacks its
terminal line), unless its verdict rests on an infrastructure finding (the judge then asks
every source as for an unclean exit); one that ended otherwise with nothing found, or only
knock-ons, is ``unknown``.

The words and their tiers are data (:data:`TIERS`); a new cause is a word in
:class:`~auditor.model.CauseWord`, its tier and event kind here, a line pattern in
:mod:`auditor.collect.failure_texts` (a v1.2 kind's in ``_MORE_CAUSES``, with a literal of
each alternative in ``_MORE_WORDS``; another's tested in ``failure_events``, its first word in
``FAILURE_GATE_WORDS``: tests check both; and a literal of it in the log prefilter's words when
its line may hold no "rror"), and at least three real public logs in ``fixtures/causes``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain

from auditor.model import (
    Cause,
    CauseWord,
    Citation,
    ExitKind,
    LogEvent,
    PhaseRecord,
    ProcessExit,
    SacctJob,
    SacctStep,
    TrialRecord,
)
from auditor.reason.exits import ExitClass, a_kill, killed_by_signal, signal_name

C = CauseWord

TIERS: dict[CauseWord, int] = {
    C.NODE_FAILURE: 1, C.PREEMPTED: 1, C.TIME_LIMIT: 1, C.CANCELLED: 1,
    C.ENGINE_DEAD: 2,
    C.HOST_OOM: 3, C.GPU_OOM: 3, C.GPU_ERROR: 3, C.STORAGE: 3, C.RENDEZVOUS: 3,
    C.RAY_SYSTEM: 3, C.NETWORK: 3,
    C.SEGFAULT: 4, C.SIGNAL: 4, C.ABORTED: 4, C.NAN_LOSS: 4,
    C.ACTOR_DIED: 5, C.PYTHON_EXCEPTION: 5,
    C.NCCL: 6,
    C.CHILD_FAILED: 7,
}
"""Each cause word's tier: the lowest tier found is the cause (see the module docstring).
An engine's death outranks the error inside the engine that caused it (its own output holds
the root cause: named in the detail); a GPU fault, a write that failed, a job that never
formed, Ray's control plane or a remote service refusing outrank the exceptions and
collective errors they raise in the trainer."""

ENGINE_ROOT_TIERS = frozenset({TIERS[C.GPU_ERROR], TIERS[C.SEGFAULT], TIERS[C.PYTHON_EXCEPTION]})
"""What an engine's death may rest on, named in its detail: the first error of these tiers
(a fault of the machine, a crash or signal, an exception; never the scheduler's word)."""

LOG_CAUSES: dict[str, CauseWord] = {
    "slurm_time_limit": C.TIME_LIMIT, "slurm_cancelled": C.CANCELLED,
    "slurm_step_cancelled": C.CANCELLED,
    "slurm_preempted": C.PREEMPTED, "node_failure": C.NODE_FAILURE,
    "host_oom": C.HOST_OOM, "gpu_oom": C.GPU_OOM, "kv_cache_init_failure": C.GPU_OOM,
    "segfault": C.SEGFAULT, "signal": C.SIGNAL, "actor_died": C.ACTOR_DIED,
    "exception": C.PYTHON_EXCEPTION, "nccl_timeout": C.NCCL, "nccl_error": C.NCCL,
    "child_failed": C.CHILD_FAILED, "aborted": C.ABORTED,
    "engine_dead": C.ENGINE_DEAD, "gpu_error": C.GPU_ERROR, "nan_loss": C.NAN_LOSS,
    "storage": C.STORAGE, "rendezvous": C.RENDEZVOUS, "ray_system": C.RAY_SYSTEM,
    "network": C.NETWORK,
}
"""Log event kind -> the cause it shows."""

SACCT_CAUSES: dict[str, CauseWord] = {
    "TIMEOUT": C.TIME_LIMIT, "DEADLINE": C.TIME_LIMIT, "CANCELLED": C.CANCELLED,
    "PREEMPTED": C.PREEMPTED, "NODE_FAIL": C.NODE_FAILURE, "BOOT_FAIL": C.NODE_FAILURE,
    "OUT_OF_MEMORY": C.HOST_OOM,
}
"""sacct state of the job's last attempt -> the cause it shows."""

KNOCK_ON_TIER = 9
"""Below every cause: what only follows another (a knock-on) never wins."""

OOM_TYPES = ("OutOfMemoryError", "out of memory")
"""What a phase record's error names when it ran out of GPU memory."""


@dataclass(frozen=True, slots=True)
class _Found:
    word: CauseWord
    detail: str
    citation: Citation | None
    order: tuple[int, ...]
    """(source rank, then its own order: a line, or a time and a line): the scheduler
    first, the launcher's exit, the records in time, then the signal the batch script
    received (the log says whose it was)."""
    tier: int = 0
    """Its word's tier, or more for a knock-on that can never win (0: the word's own)."""


EXCEPTION_CAUSES: tuple[tuple[str, CauseWord], ...] = (
    ("ray.exceptions.OutOfMemoryError", C.HOST_OOM),  # Ray's memory monitor: host RAM
    ("RayOutOfMemoryError", C.HOST_OOM),  # (its legacy ray.memory_monitor's: host RAM too)
    ("OutOfMemoryError", C.GPU_OOM),  # torch's, also inside a RayTaskError
    ("ChildFailedError", C.CHILD_FAILED),
    ("SignalException", C.SIGNAL),
    ("KeyboardInterrupt", C.SIGNAL),
    ("ActorDiedError", C.ACTOR_DIED),
    ("RayActorError", C.ACTOR_DIED),
    ("EngineDeadError", C.ENGINE_DEAD),
    ("RendezvousConnectionError", C.RENDEZVOUS),
    ("RendezvousTimeoutError", C.RENDEZVOUS),
    ("DistStoreError", C.RENDEZVOUS),
    ("RaySystemError", C.RAY_SYSTEM),
    ("CommError", C.NETWORK),
)
"""An exception type that names another cause than a Python exception (first match)."""


def _exception_cause(exception: str) -> CauseWord:
    found = next((word for name, word in EXCEPTION_CAUSES if name in exception), None)
    if found is not None:
        return found
    # Python's own MemoryError (and numpy's _ArrayMemoryError, its subclass): the host's
    # memory ran out (contract v1.2), where torch's OutOfMemoryError is the GPU's
    return C.HOST_OOM if exception.rsplit(".", 1)[-1].endswith("MemoryError") \
        else C.PYTHON_EXCEPTION


def event_cause(event: LogEvent) -> CauseWord | None:
    """The cause a log event shows by itself (None: it shows none)."""
    word = LOG_CAUSES.get(event.kind)
    return _exception_cause(event.detail) if word == C.PYTHON_EXCEPTION else word


def cause_of_log(events: tuple[LogEvent, ...], log_path: str) -> Cause | None:
    """The cause a training log alone shows (``auditor causes LOG``): None when it holds
    none (its run may have completed, or ended without a word)."""
    found = _ranked(_sources(None, None, None, False, "", (), events, log_path))
    return _decided(found) if found else None


def _ranked(found: Iterator[_Found]) -> list[_Found]:
    """Best first: the lowest tier (a knock-on's is below all), then the earliest."""
    return sorted(found, key=lambda f: (f.tier or TIERS[f.word], f.order))


def _decided(found: list[_Found]) -> Cause:
    """The winner of ``found`` (sorted best first), its knock-ons named; of a launcher's
    summary of a failed child, its root-cause line (rank and exit code) if there is one."""
    first = found[0]
    if first.tier == KNOCK_ON_TIER:  # (only knock-ons: what they followed is unrecorded)
        return Cause(C.UNKNOWN, "nothing in the evidence says what ended the attempt; "
                     f"{first.detail} only follows it", None,
                     tuple(dict.fromkeys(f.word for f in found)))
    if first.word == C.CHILD_FAILED:
        first = next((f for f in found if f.word == C.CHILD_FAILED
                      and f.detail.startswith("root cause")), first)
    detail = first.detail
    if first.word == C.ENGINE_DEAD:  # (contract v1.2: its own output holds the root cause)
        root = min((f for f in found if (f.tier or TIERS[f.word]) in ENGINE_ROOT_TIERS),
                   key=lambda f: f.order, default=None)
        if root is not None:
            detail += f"; the first error before it: {root.word}, {root.detail}"
            found = [f for f in found if f is not root]  # (its root, not its knock-on)
    knock_on = tuple(dict.fromkeys(f.word for f in found if f.word != first.word))
    return Cause(first.word, detail, first.citation, knock_on)


def cause_of(trial: TrialRecord | None, exit_class: ExitClass | None,
             element: SacctJob | None, is_last: bool, sacct_path: str,
             traces: tuple[tuple[int | None, PhaseRecord], ...],
             events: tuple[LogEvent, ...], log_path: str | None,
             processes: Sequence[ProcessExit] = (),
             worker_logs: Sequence[tuple[str, tuple[LogEvent, ...]]] = ()) -> Cause | None:
    """The cause of an attempt's end (None when it exited cleanly, unless the trainer
    recorded its own abort: contract v1.2, an MLPerf ``run_stop`` aborted on exit 0)."""
    if exit_class is not None and exit_class.clean:
        abort = next((e for e in events if e.kind == "aborted"), None)
        if abort is None:
            return None
        return Cause(C.ABORTED, f"the trainer recorded its own abort ({abort.detail})",
                     Citation(log_path or "", line=abort.line, quote=abort.text))
    lost = exit_class.lost if exit_class is not None else None
    # (a step lost without its record came first: every recorded failure may follow it)
    first = None if lost is not None else _first_failed(processes)
    blamed = exit_class.blamed if exit_class is not None else None
    found = _ranked(chain(
        _sources(trial, exit_class, element, is_last, sacct_path, traces, events, log_path,
                 knock_on_exit=first is not None or blamed is not None or lost is not None,
                 worker_logs=worker_logs),
        _process_sources(processes, first), _blamed_source(blamed)))
    if lost is not None and (not found or found[0].tier == KNOCK_ON_TIER):
        where = f" on {lost.host}" if lost.host else ""
        return Cause(C.UNKNOWN, f"the {lost.role} process (pid {lost.pid}{where}) left no "
                     f"process record, only its output: what ended it is unknown (its wrapper "
                     "killed, as with its node, or still running at the seal)",
                     Citation(lost.path or ""), tuple(dict.fromkeys(f.word for f in found)))
    if not found:
        return Cause(C.UNKNOWN, "nothing in the evidence says what ended the attempt", None)
    return _decided(found)


def _blamed_source(blamed: tuple[str, int, Citation] | None) -> Iterator[_Found]:
    """The launcher's line naming the role whose exit the shutdown followed (no process
    records say it): a crash a failed child, a kill a signal, as a record would say."""
    if blamed is not None:
        role, code, cite = blamed
        yield _Found(C.SIGNAL if a_kill(code) else C.CHILD_FAILED,
                     f"the launcher's log says {role} exited with code {code} "
                     f"(log line {cite.line})", cite, (2, 0))


def _first_failed(processes: Sequence[ProcessExit]) -> ProcessExit | None:
    """The process record that failed first by its own end time (unknown times last)."""
    failed = [p for p in processes if p.failed]
    return min(failed, key=lambda p: (p.ended_ns is None, p.ended_ns or 0, p.path or ""),
               default=None)


def _process_sources(processes: Sequence[ProcessExit], first: ProcessExit | None
                     ) -> Iterator[_Found]:
    """The first failed process record (contract v1.2) as a source of its own: a signal
    that ended it, or a failed child; every later failure is its knock-on (a controller
    shutting down after its replicas, the launcher stopping the rest)."""
    for process in sorted((p for p in processes if p.failed),
                          key=lambda p: (p.ended_ns is None, p.ended_ns or 0, p.path or "")):
        where = f" on {process.host}" if process.host else ""
        who = f"the {process.role} process (pid {process.pid}{where})"
        code = process.exit_code
        if process.signal or (code is not None and killed_by_signal(code)):
            name = process.signal or signal_name(code or 0)
            detail = (f"{who} ended by {name}; its wrapper received {process.received_signal}"
                      if process.received_signal else
                      f"{who} was killed by {name} (sender not recorded)")
            word = C.SIGNAL
        else:
            detail, word = f"{who} exited {code}", C.CHILD_FAILED
        yield _Found(word, detail, Citation(process.path or "", pointer="/exit_code",
                                            quote=str(code)),
                     (2, process.ended_ns or 0),
                     tier=0 if process is first else KNOCK_ON_TIER)


def _sources(trial: TrialRecord | None, exit_class: ExitClass | None, element: SacctJob | None,
             is_last: bool, sacct_path: str, traces: tuple[tuple[int | None, PhaseRecord], ...],
             events: tuple[LogEvent, ...], log_path: str | None,
             knock_on_exit: bool = False,
             worker_logs: Sequence[tuple[str, tuple[LogEvent, ...]]] = ()
             ) -> Iterator[_Found]:
    if element is not None and is_last:
        word = SACCT_CAUSES.get(element.state)
        row: SacctJob | SacctStep = element
        where = ""
        step = next((step for step in element.steps if step.state == "OUT_OF_MEMORY"), None)
        if word is None and step is not None:  # (a step's own row says it, and is cited)
            word, row, where = C.HOST_OOM, step, f"step {step.step} of "
        if word is not None:
            yield _Found(word, f"sacct reports {row.state_raw} for {where}job "
                               f"{element.job_id}",
                         Citation(sacct_path, line=row.line, quote=row.state_raw),
                         (0, row.line))
    if trial is not None and trial.received_signal:
        signal = trial.received_signal.upper()
        timed = "USR1" in signal or (element is not None and is_last
                                    and element.state == "TIMEOUT")
        yield _Found(C.TIME_LIMIT if timed else C.CANCELLED,
                     f"the batch script received {trial.received_signal}"
                     + (" (the pre-timeout signal)" if "USR1" in signal else ""),
                     Citation(trial.path, pointer="/invocation/received_signal",
                              quote=trial.received_signal), (4, 0))  # (after the log's
        # word: a node failure, a preemption or a time limit also signal the batch script)
    elif trial is not None and exit_class is not None and trial.exit_code is not None \
            and killed_by_signal(trial.exit_code):
        why = exit_class.detail if exit_class.kind is ExitKind.SIGTERM else (
            f"exit {trial.exit_code}: killed by {signal_name(trial.exit_code)} (sender not "
            "recorded)")
        yield _Found(C.SIGNAL, why,  # (a process record's failure came first: its knock-on)
                     Citation(trial.path, pointer="/invocation/exit_code",
                              quote=str(trial.exit_code)), (1, 0),
                     tier=KNOCK_ON_TIER if knock_on_exit else 0)
    for rank, record in traces:
        oom = any(word in record.error_type or word in record.error_message
                  for word in OOM_TYPES)
        # first in time across ranks by each record's own time (contract v1.2), never by
        # its line in its own rank's file (rank 0's knock-on is often on an earlier line)
        when = record.finished_ns if record.finished_ns is not None else record.started_ns
        yield _Found(C.GPU_OOM if oom else C.PYTHON_EXCEPTION,
                     f"rank {rank}: {record.phase} raised {record.error_type}",
                     Citation(record.path, line=record.line,
                              quote=f"{record.phase} {record.error_type}"),
                     (2, when if when is not None else 1 << 63, record.line))
    earlier = stepped = False
    logs = [(log_path, events)] if log_path is not None else []
    merged = merged_events([*logs, *worker_logs])
    # (an exception whose own line names its failure is that failure: "RuntimeError: NCCL
    # communicator was aborted ... Watchdog caught collective operation timeout" is NCCL's,
    # a SignalException's line its signal's, as received)
    words = [event_cause(event) for _, event, _ in merged]
    named = {(path, event.line) for (path, event, _), word in zip(merged, words, strict=True)
             if event.kind != "exception" and word is not None}
    for (path, event, order), word in zip(merged, words, strict=True):
        if word is None or (event.kind == "exception" and word in (C.SIGNAL, C.PYTHON_EXCEPTION)
                            and (path, event.line) in named):
            continue
        detail = _slurm_detail(event) or event.detail or event.kind.replace("_", " ")
        # a cancellation line with no reason after another cause is srun killing the step
        # (after an out-of-memory error, a bus error, a task failure): its knock-on
        # (contract v1.2: a STEP line is one step ending, a launcher stopping its other
        # steps after one failed; the job's own cancellation is its JOB line, sacct's
        # CANCELLED or the batch script's signal, each a source of its own)
        knock_on = (event.kind == "slurm_cancelled" and earlier) \
            or event.kind == "slurm_step_cancelled" \
            or (stepped and event.kind == "signal" and "shell's report" in event.detail)
        # (srun's "task 0: Killed" of a step it cancelled: the step's end, not a cause)
        stepped = stepped or event.kind == "slurm_step_cancelled"
        where = "log line" if path == log_path else f"{path.rsplit('/', 1)[-1]} line"
        yield _Found(word, f"{detail} ({where} {event.line})",
                     Citation(path, line=event.line, quote=event.text), (3, *order),
                     tier=KNOCK_ON_TIER if knock_on else 0)
        earlier = earlier or event.kind != "slurm_step_cancelled"


_OWN_TIME = re.compile(
    r"(?<!\d)(?:\d{4}-)?(?P<month>\d\d)-(?P<day>\d\d)[ T](?P<clock>\d\d:\d\d:\d\d)"
    r"(?:[.,](?P<fraction>\d{1,9}))?"  # 2024-03-27 21:46:54,999 / vLLM's 05-01 14:39:06
    r"|\b[IWEF](?P<glog>\d{3,4}) (?P<gclock>\d\d:\d\d:\d\d)(?:\.(?P<gfraction>\d{1,9}))?"
    # (torch's and glog's E0321 / E321 02:07:08.408271257)
)
TIME_WITHIN = 120
"""Characters at a line's start in which its own time is looked for (a prefix's)."""


def own_time(text: str) -> tuple[int, int, int, int] | None:
    """When a log line says it was printed: (month, day, second of the day, nanosecond),
    from its first timestamp near its start; None when it states none. The year, which
    glog and vLLM leave out, is not compared (a run crosses no new year)."""
    found = _OWN_TIME.search(text, 0, TIME_WITHIN)
    if found is None:
        return None
    if found["glog"]:
        digits = found["glog"]
        month, day = int(digits[:-2]), int(digits[-2:])
        clock, fraction = found["gclock"], found["gfraction"] or ""
    else:
        month, day = int(found["month"]), int(found["day"])
        clock, fraction = found["clock"], found["fraction"] or ""
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return (month, day, hours * 3600 + minutes * 60 + seconds,
            int((fraction + "000000000")[:9]))


def merged_events(logs: Sequence[tuple[str, tuple[LogEvent, ...]]]
                  ) -> list[tuple[str, LogEvent, tuple[int, ...]]]:
    """Every log's events in one order (contract v1.2: first in time across ranks and files
    by their own times): one log's by line; several logs' by the time each line states (a
    line that states none takes the last time stated before it in its file; one before any
    comes first), then by file and line. Each with its path and its order."""
    if len(logs) <= 1:
        return [(path, event, (event.line,)) for path, events in logs
                for event in sorted(events, key=lambda e: e.line)]
    merged = []
    for index, (path, events) in enumerate(logs):
        last: tuple[int, int, int, int] = (0, 0, 0, 0)
        for event in sorted(events, key=lambda e: e.line):
            last = own_time(event.text) or last
            merged.append((path, event, (*last, index, event.line)))
    return sorted(merged, key=lambda item: item[2])


SLURM_ENDS = {"slurm_time_limit": "cancelled at its time limit", "slurm_cancelled": "cancelled",
              "slurm_step_cancelled": "cancelled", "node_failure": "cancelled due to node failure",
              "slurm_task_failure": "cancelled due to a task's failure"}
"""What slurmstepd's ``*** JOB|STEP <id> ... CANCELLED AT ...`` line says, by its event."""


def _slurm_detail(event: LogEvent) -> str:
    """A cause's detail for slurmstepd's cancellation line: which job or step, and why, in
    words (its event's detail is the bare id); ``""`` for any other event."""
    if event.kind == "slurm_preempted":
        why = ("cancelled for a job requeue" if "REQUEUE" in event.text.upper()
               else "cancelled for preemption")
    elif event.kind in SLURM_ENDS and "CANCELLED" in event.text:
        why = SLURM_ENDS[event.kind]
    else:
        return ""
    what = "step" if "." in event.detail else "job"
    return f"slurmstepd: {what} {event.detail} {why}"
