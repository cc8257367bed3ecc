"""Read every evidence file of one attempt in one pass: hash and parse from the same bytes.

This is the unit of parallel work: :func:`read_attempt` is a pure function of a
picklable :class:`AttemptTask`, run in a worker process (or inline for small
studies). The trial record is read first because it names the dispatched step
count that the training-log scan matches the terminal event against.
"""

from __future__ import annotations

import errno
from dataclasses import replace

from auditor._io import Beneath, Bounded, HashingReader, open_reason
from auditor.collect.kinds import READ_ORDER, READERS, AttemptParts
from auditor.model import AttemptRead, AttemptTask, FileOutcome, FileTask, TrainingLogScan


def read_attempt(task: AttemptTask) -> AttemptRead:
    """Read, hash and parse every file of ``task``; never raises on file content. Each file
    is opened below the root's descriptor without following a link
    (:class:`~auditor._io.Beneath`) and read no further than its listed size plus one
    block; one that grew past it or changed while read is unreadable, saying so."""
    files = sorted(task.files, key=lambda f: (READ_ORDER.get(f.kind, 9), f.display))
    outcomes: list[FileOutcome] = []
    parts = AttemptParts()
    with Beneath(task.root) as beneath:
        for file in files:
            try:
                handle = _open(beneath, file)
            except OSError as error:
                outcomes.append(FileOutcome(file.display, file.kind, None, open_reason(error)))
                continue
            with handle:
                reader = HashingReader(handle)
                try:
                    parse = READERS.get(file.kind)
                    if parse is not None:
                        parse(reader, file.display, task, parts)
                    reader.drain()
                    problem = handle.problem()
                    if handle.cut:
                        _uncut(parts, file.display)
                except OSError as error:
                    problem = open_reason(error)
            outcomes.append(FileOutcome(file.display, file.kind, None, problem) if problem
                            else FileOutcome(file.display, file.kind, reader.digest()))
    return AttemptRead(task.key, tuple(outcomes), parts.trial, parts.log, tuple(parts.traces),
                       tuple(parts.devices), tuple(parts.findings),
                       tuple(parts.processes), tuple(parts.worker_logs),
                       tuple(parts.metrics), tuple(parts.idle))


def _uncut(parts: AttemptParts, display: str) -> None:
    """A log the audit stopped reading at its listed size (``AUD104`` says so) does not end
    mid-line by its writer's doing: its ``AUD017`` goes (the cut is the audit's)."""
    def kept(scan: TrainingLogScan) -> TrainingLogScan:
        if scan.path != display:
            return scan
        return replace(scan, findings=tuple(f for f in scan.findings if f.rule_id != "AUD017"))
    if parts.log is not None:
        parts.log = kept(parts.log)
    parts.worker_logs = [kept(scan) for scan in parts.worker_logs]
    parts.metrics = [kept(scan) for scan in parts.metrics]
    parts.findings = [f for f in parts.findings if f.rule_id != "AUD017"
                      or not f.citations or f.citations[0].path != display]


def _open(beneath: Beneath, file: FileTask) -> Bounded:
    """``file`` opened below the root: by its display path, or the real path its check
    resolved (a link inside the root, followed by the check, never by the open)."""
    rel = file.display if file.resolved is None else beneath.relative(file.resolved)
    if rel is None:
        raise OSError(errno.EXDEV, "resolves outside the root")
    return beneath.open(rel, file.size)


def hash_only(root: str, task: FileTask) -> FileOutcome:
    """Hash a file that is not parsed (unlisted files) below ``root``."""
    if task.resolved is None:  # (never opened relative to wherever this process runs)
        return FileOutcome(task.display, task.kind, None, "no path to open")
    try:
        with Beneath(root) as beneath, _open(beneath, task) as handle:
            reader = HashingReader(handle)
            reader.drain()
            problem = handle.problem()
    except OSError as error:
        return FileOutcome(task.display, task.kind, None, open_reason(error))
    return FileOutcome(task.display, task.kind, None, problem) if problem \
        else FileOutcome(task.display, task.kind, reader.digest())
