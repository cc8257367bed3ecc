"""Read every evidence file of one attempt in one pass: hash and parse from the same bytes.

This is the unit of parallel work: :func:`read_attempt` is a pure function of a
picklable :class:`AttemptTask`, run in a worker process (or inline for small
studies). The trial record is read first because it names the dispatched step
count that the training-log scan matches the terminal event against.
"""

from __future__ import annotations

import os

from auditor._io import CHUNK_SIZE, HashingReader
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
_ORDER = {"trial": 0, "device_evidence": 1, "allocator_trace": 2, "training_log": 3}
"""The order an attempt's files are read in (the trial record first, see above)."""


class _Descriptor:
    """A file read through its descriptor (``os.open``, ``os.read``): no file object, whose
    making and closing took 2 of the 10 us that opening, hashing and closing a small file
    costs. A directory opens, and its first read raises ``IsADirectoryError`` as
    ``open`` would have: the caller reports the file unreadable either way."""

    __slots__ = ("fd",)

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self, size: int = CHUNK_SIZE) -> bytes:
        return os.read(self.fd, size)

    def __enter__(self) -> _Descriptor:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self.fd)


def read_attempt(task: AttemptTask) -> AttemptRead:
    """Read, hash and parse every file of ``task``; never raises on file content."""
    files = sorted(task.files, key=lambda f: (_ORDER.get(f.kind, 9), f.display))
    outcomes: list[FileOutcome] = []
    findings: list[Finding] = []
    trial: TrialRecord | None = None
    log: TrainingLogScan | None = None
    traces: list[AllocatorTrace] = []
    devices: list[DeviceEvidence] = []
    for file in files:
        path = file.resolved or f"{task.root}/{file.display}"
        try:
            handle = _Descriptor(path)
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
        with _Descriptor(task.resolved) as handle:
            reader = HashingReader(handle)
            reader.drain()
            return FileOutcome(task.display, task.kind, reader.digest())
    except OSError as error:
        return FileOutcome(task.display, task.kind, None, _os_reason(error))
