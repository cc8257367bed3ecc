"""Each evidence kind's reader, registered against its entry in :data:`auditor.model.kinds.KINDS`.

A reader takes one file's hashing stream and adds what it parsed (and its findings) to the
attempt being read (:class:`AttemptParts`); :func:`auditor.collect.attempt.read_attempt`
reads an attempt's files in the kinds' read order and calls the reader of each file's kind.
A kind without a reader here is hash-checked only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from auditor._io import HashingReader
from auditor.collect.allocator_trace import read_allocator_trace
from auditor.collect.device import read_device
from auditor.collect.idle import read_idle
from auditor.collect.log_events import _compile_pattern as compile_pattern
from auditor.collect.metrics import read_metrics
from auditor.collect.process import read_process
from auditor.collect.training_log import scan_training_log
from auditor.collect.trial import read_trial
from auditor.model import (
    AllocatorTrace,
    AttemptTask,
    DeviceEvidence,
    Finding,
    HostIdle,
    ProcessExit,
    TrainingLogScan,
    TrialRecord,
)
from auditor.model.kinds import (
    ALLOCATOR_TRACE,
    DEVICE_EVIDENCE,
    IDLE_CHECK,
    KINDS,
    METRICS_LOG,
    PROCESS_RECORD,
    TRAINING_LOG,
    TRIAL,
    WORKER_LOG,
)


@dataclass
class AttemptParts:
    """What the readers have made of one attempt's files so far (the trial record first)."""

    trial: TrialRecord | None = None
    log: TrainingLogScan | None = None
    traces: list[AllocatorTrace] = field(default_factory=list)
    devices: list[DeviceEvidence] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    processes: list[ProcessExit] = field(default_factory=list)
    worker_logs: list[TrainingLogScan] = field(default_factory=list)
    metrics: list[TrainingLogScan] = field(default_factory=list)
    idle: list[HostIdle] = field(default_factory=list)


Reader = Callable[[HashingReader, str, AttemptTask, AttemptParts], None]
"""(the file's hashing stream, its root-relative path, the attempt's task, the attempt so
far): adds what the file holds to the attempt; never raises on the file's content."""


def _trial(reader: HashingReader, display: str, task: AttemptTask,
           parts: AttemptParts) -> None:
    parts.trial = read_trial(reader, display, task.env_keys)
    parts.findings.extend(parts.trial.findings)


def _device(reader: HashingReader, display: str, _: AttemptTask, parts: AttemptParts) -> None:
    device = read_device(reader, display)
    parts.devices.append(device)
    parts.findings.extend(device.findings)


def _process(reader: HashingReader, display: str, _: AttemptTask,
             parts: AttemptParts) -> None:
    process, findings = read_process(reader, display)
    if process is not None:
        parts.processes.append(process)
    parts.findings.extend(findings)


def _idle(reader: HashingReader, display: str, _: AttemptTask, parts: AttemptParts) -> None:
    idle, findings = read_idle(reader, display)
    if idle is not None:
        parts.idle.append(idle)
    parts.findings.extend(findings)


def _trace(reader: HashingReader, display: str, _: AttemptTask, parts: AttemptParts) -> None:
    trace = read_allocator_trace(reader, display)
    parts.traces.append(trace)
    parts.findings.extend(trace.findings)


def _scan(reader: HashingReader, display: str, task: AttemptTask,
          parts: AttemptParts) -> TrainingLogScan:
    """A log scanned for the terminal event of the dispatched steps; a protocol pattern that
    will not compile falls back to the built-in matcher (the protocol collector already
    reported it)."""
    trial = parts.trial
    steps = trial.dispatched_int(task.steps_from) if trial is not None else None
    if task.terminal is not None:  # (checked as the protocol was read)
        return scan_training_log(reader, display, steps, terminal=task.terminal)
    pattern = task.terminal_pattern
    if pattern is not None:
        try:  # (refused before a byte is read; nothing else the scan raises is caught here)
            compile_pattern(pattern)
        except ValueError:
            pattern = None
    return scan_training_log(reader, display, steps, pattern)


def _log(reader: HashingReader, display: str, task: AttemptTask, parts: AttemptParts) -> None:
    """Scan the training log (the first listed; another is hash-checked only)."""
    if parts.log is not None:
        return
    parts.log = _scan(reader, display, task, parts)
    parts.findings.extend(parts.log.findings)


def _worker_log(reader: HashingReader, display: str, task: AttemptTask,
                parts: AttemptParts) -> None:
    """Scan a worker's own output as the training log is (contract v1.2: it may hold the
    terminal line the driver's copy lost); only when the protocol allows it as a source."""
    if WORKER_LOG.name not in task.terminal_sources:
        return
    scan = _scan(reader, display, task, parts)
    parts.worker_logs.append(scan)
    parts.findings.extend(scan.findings)


def _metrics(reader: HashingReader, display: str, task: AttemptTask,
             parts: AttemptParts) -> None:
    """A metrics file (contract v1.2): a JSON document, or JSON lines, or ``:::MLLOG``
    lines, read for the record that meets the protocol's JSON predicates (its terminal
    event); only when the protocol has predicates and allows the source."""
    spec = task.terminal
    if spec is None or not spec.json or METRICS_LOG.name not in task.terminal_sources:
        return
    trial = parts.trial
    steps = trial.dispatched_int(task.steps_from) if trial is not None else None
    scan = read_metrics(reader, display, spec, steps)
    parts.metrics.append(scan)
    parts.findings.extend(scan.findings)


READERS: Mapping[str, Reader] = {
    TRIAL.name: _trial,
    DEVICE_EVIDENCE.name: _device,
    ALLOCATOR_TRACE.name: _trace,
    TRAINING_LOG.name: _log,
    PROCESS_RECORD.name: _process,
    WORKER_LOG.name: _worker_log,
    METRICS_LOG.name: _metrics,
    IDLE_CHECK.name: _idle,
}
"""The reader of each evidence kind, by its period-record word."""

READ_ORDER: Mapping[str, int] = {name: kind.read_order for name, kind in KINDS.items()}
"""Where each kind's files are read among an attempt's (others last)."""
