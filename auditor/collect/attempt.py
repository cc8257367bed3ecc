"""Read every evidence file of one attempt in one pass: hash and parse from the same bytes.

This is the unit of parallel work: :func:`read_attempt` is a pure function of a
picklable :class:`AttemptTask`, run in a worker process (or inline for small
studies). The trial record is read first because it names the dispatched step
count that the training-log scan matches the terminal event against.
"""

from __future__ import annotations

from auditor._io import HashingReader
from auditor.collect.allocator_trace import read_allocator_trace
from auditor.collect.device import read_device
from auditor.collect.log_events import _compile_pattern as compile_pattern
from auditor.collect.training_log import scan_training_log
from auditor.collect.trial import read_trial
from auditor.model import (
    AllocatorTrace,
    AttemptRead,
    AttemptTask,
    DeviceEvidence,
    FileOutcome,
    FileTask,
    Finding,
    TrainingLogScan,
    TrialRecord,
)

PARSED_KINDS = ("trial", "training_log", "allocator_trace", "device_evidence")


def read_attempt(task: AttemptTask) -> AttemptRead:
    """Read, hash and parse every file of ``task``; never raises on file content."""
    order = {"trial": 0, "device_evidence": 1, "allocator_trace": 2, "training_log": 3}
    files = sorted(task.files, key=lambda f: (order.get(f.kind, 9), f.display))
    outcomes: list[FileOutcome] = []
    findings: list[Finding] = []
    trial: TrialRecord | None = None
    log: TrainingLogScan | None = None
    traces: list[AllocatorTrace] = []
    devices: list[DeviceEvidence] = []
    for file in files:
        path = file.resolved or f"{task.root}/{file.display}"
        try:
            handle = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below
        except OSError as error:
            outcomes.append(FileOutcome(file.display, file.kind, None, _os_reason(error)))
            continue
        with handle:
            reader = HashingReader(handle)
            try:
                if file.kind == "trial":
                    trial = read_trial(reader, file.display)
                    findings.extend(trial.findings)
                elif file.kind == "device_evidence":
                    device = read_device(reader, file.display)
                    devices.append(device)
                    findings.extend(device.findings)
                elif file.kind == "allocator_trace":
                    trace = read_allocator_trace(reader, file.display)
                    traces.append(trace)
                    findings.extend(trace.findings)
                elif file.kind == "training_log" and log is None:
                    log = _scan_log(reader, file.display, task, trial)
                    findings.extend(log.findings)
                reader.drain()
            except OSError as error:
                outcomes.append(FileOutcome(file.display, file.kind, None, _os_reason(error)))
                continue
        outcomes.append(FileOutcome(file.display, file.kind, reader.digest()))
    return AttemptRead(
        task.key, tuple(outcomes), trial, log, tuple(traces), tuple(devices), tuple(findings)
    )


def _scan_log(
    reader: HashingReader, display: str, task: AttemptTask, trial: TrialRecord | None
) -> TrainingLogScan:
    """Scan the training log; a protocol pattern that will not compile falls back to the
    built-in matcher (the protocol collector already reported it)."""
    steps = trial.dispatched_int(task.steps_from) if trial is not None else None
    pattern = task.terminal_pattern
    if pattern is not None:
        try:  # (refused before a byte is read; nothing else the scan raises is caught here)
            compile_pattern(pattern)
        except ValueError:
            pattern = None
    return scan_training_log(reader, display, steps, pattern)


def _os_reason(error: OSError) -> str:
    """A short reason for an OS error, without the path (the caller has it)."""
    return error.strerror or type(error).__name__


def hash_only(task: FileTask) -> FileOutcome:
    """Hash a file that is not parsed (unlisted files): ``task.resolved`` is its path."""
    if task.resolved is None:  # (never opened relative to wherever this process runs)
        return FileOutcome(task.display, task.kind, None, "no path to open")
    try:
        with open(task.resolved, "rb", buffering=0) as handle:
            reader = HashingReader(handle)
            reader.drain()
            return FileOutcome(task.display, task.kind, reader.digest())
    except OSError as error:
        return FileOutcome(task.display, task.kind, None, _os_reason(error))
