"""Read every evidence file of one attempt in one pass: hash and parse from the same bytes.

This is the unit of parallel work: :func:`read_attempt` is a pure function of a
picklable :class:`AttemptTask`, run in a worker process (or inline for small
studies). The trial record is read first because it names the dispatched step
count that the training-log scan matches the terminal event against.
"""

from __future__ import annotations

import os

from auditor._io import CHUNK_SIZE, HashingReader
from auditor.collect.kinds import READ_ORDER, READERS, AttemptParts
from auditor.model import AttemptRead, AttemptTask, FileOutcome, FileTask


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
    files = sorted(task.files, key=lambda f: (READ_ORDER.get(f.kind, 9), f.display))
    outcomes: list[FileOutcome] = []
    parts = AttemptParts()
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
                parse = READERS.get(file.kind)
                if parse is not None:
                    parse(reader, file.display, task, parts)
                reader.drain()
            except OSError as error:
                outcomes.append(FileOutcome(file.display, file.kind, None, _os_reason(error)))
                continue
        outcomes.append(FileOutcome(file.display, file.kind, reader.digest()))
    return AttemptRead(task.key, tuple(outcomes), parts.trial, parts.log, tuple(parts.traces),
                       tuple(parts.devices), tuple(parts.findings),
                       tuple(parts.processes), tuple(parts.worker_logs))


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
