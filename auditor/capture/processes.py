"""Process records, ``processes/<host>-<role>-<pid>.json`` (contract v1.2): one per process of
an attempt, written atomically when it ended.

``auditor run --step ROLE -- CMD`` writes one around each srun step or child of a launcher
(:mod:`auditor.capture.launch`); a Python launcher that starts its processes itself records
each one's end with :func:`record_exit`. The batch node's ``auditor run`` reads them all
(:func:`read_records`) before it judges the attempt's exit: a controller's 143 is excused only
by its own record, and never when another process's failure came first.
"""

from __future__ import annotations

import json
import os
import re
import signal as signals
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from auditor.capture._files import (
    UNUSABLE_JSON,
    attempt_dir_of,
    claim_own,
    dumps,
    hostname,
    job_id,
    open_regular,
    write_own,
)
from auditor.model import ProcessExit
from auditor.model.kinds import ALLOCATOR_TRACE, DEVICE_EVIDENCE, PROCESS_RECORD, WORKER_LOG
from auditor.reason.exits import controller_records, steps_cancelled, unrecorded_steps

SCHEMA = "run-evidence/process/v1"
ROLE = re.compile(r"[A-Za-z0-9_.]+")
"""A role as a process record's name holds it (``<host>-<role>-<pid>``: no ``-``)."""
RECORD_LIMIT = 1 << 20
"""Largest process record the kit reads back (bytes)."""


def check_role(role: str) -> str:
    """``role`` when it can name a process record (letters, digits, ``_`` and ``.``), else
    ``ValueError`` saying why."""
    if not ROLE.fullmatch(role or ""):
        raise ValueError(f"role {role!r}: letters, digits, '_' and '.' only (it is part of "
                         "the names of the files the kit writes, <host>-<role>-<pid>.json and "
                         "worker-<role>-<rank>-<host>-<pid>.json)")
    return role


def signal_of(exit_code: int | None) -> str | None:
    """The signal a shell-style exit code above 128 names (``SIGTERM`` for 143), else None."""
    if exit_code is None or exit_code <= 128:
        return None
    try:
        return signals.Signals(exit_code - 128).name
    except ValueError:
        return None


def record_exit(role: str, pid: int, exit_code: int | None, *, started_ns: int | None = None,
                ended_ns: int | None = None, rank: int | None = None,
                signal: str | None = None, received_signal: str | None = None,
                host: str | None = None, attempt_dir: str | os.PathLike[str] | None = None,
                extra: dict[str, Any] | None = None, provisional: bool = False) -> Path:
    """Write the process record of one ended process (atomically; never over another's,
    only over its own provisional one) and return its path. ``provisional``: written as the
    process is told to end (``"provisional": true``, no exit yet), so a wrapper killed before
    the end still leaves when it was told and by what. ``exit_code`` as a shell gives it
    (128 + N for signal N), or as ``subprocess`` does (``-N``: killed by signal N, recorded
    as ``128 + N`` with ``signal`` set); ``signal``: the signal that ended it, when one did.
    The attempt directory defaults to the one ``auditor run`` exported; the host to this
    node's name."""
    check_role(role)
    if exit_code is not None and exit_code < 0:
        signal = signal or signal_of(128 - exit_code)
        exit_code = 128 - exit_code
    if type(pid) is not int or pid < 1:
        raise ValueError(f"pid {pid!r}: a positive integer expected")
    host = host or hostname()
    directory = attempt_dir_of(attempt_dir)
    path = directory / PROCESS_RECORD.path_for(host=host, role=role, pid=pid)
    what = "a process record of this host, role and pid"
    # (a record there that this process did not write is another node's, of the same
    # hostname and pid, its provisional one too: NameTaken, never overwritten)
    if claim_own(path, what) and not _provisional(path):
        raise FileExistsError(f"{path}: this process's record is already written")
    document: dict[str, Any] = {
        "schema": SCHEMA, "role": role, "host": host, "pid": pid, "rank": rank,
        "started_ns": started_ns, "ended_ns": time.time_ns() if ended_ns is None else ended_ns,
        "exit_code": exit_code, "signal": signal,
        "received_signal": received_signal,
    }
    if (job := job_id()) is not None:  # (outside a job: absent, never a null the schema refuses)
        document["job_id"] = job
    document.update(extra or {})
    if provisional:
        document["provisional"] = True
    write_own(path, dumps(document), what)
    return path


def _provisional(path: Path) -> bool:
    """Whether the record at ``path`` is a provisional one (its own, to be replaced)."""
    try:
        with open_regular(path) as handle:
            document = json.loads(handle.read(RECORD_LIMIT))
    except (OSError, *UNUSABLE_JSON):
        return False
    return isinstance(document, dict) and document.get("provisional") is True


def read_records(directory: Path) -> tuple[ProcessExit, ...]:
    """The process records under ``directory/processes`` (by name; an unreadable or
    malformed one is skipped here: the audit names it)."""
    folder = directory / PROCESS_RECORD.directory
    found: list[ProcessExit] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return ()
    for name in names:
        if PROCESS_RECORD.parts(name) is None:
            continue
        path = folder / name
        try:
            with open_regular(path) as handle:
                document = json.loads(handle.read(RECORD_LIMIT))
        except (OSError, *UNUSABLE_JSON):
            continue
        if isinstance(document, dict):
            found.append(_process(document, f"{PROCESS_RECORD.directory}/{name}"))
    return tuple(found)


def attempt_processes(directory: Path, cancellations: Iterable[str] = (),
                      host: str | None = None, kept: Collection[str] | None = None
                      ) -> tuple[ProcessExit, ...]:
    """The process records under ``directory``, and each ``--step``'s output without its
    record (its wrapper killed with its node, or still running: its end unknown), as the
    audit weighs them (:func:`~auditor.reason.exits.unrecorded_steps`; the hosts its files'
    names give, and ``host``, this node's, stand for the audit's hosts of the attempt).
    ``cancellations``: the batch log's lines of Slurm's step cancellations and the
    controller's wrapper's line, in order (:func:`~auditor.reason.exits.steps_cancelled`,
    against this attempt's controller records); ``kept``: the worker logs the batch node's
    run kept itself (Ray's, torchrun's: ``<host>-<pid>.out``), so that every other is a
    step's whatever its host; None: not known (then only a named host's is)."""
    records = read_records(directory)
    hosts = {p.host for p in records if p.host} | ({host} if host else set())
    for kind in (ALLOCATOR_TRACE, DEVICE_EVIDENCE):
        hosts.update(parts["host"] for name in _names(directory / kind.directory)
                     if (parts := kind.parts(name)) is not None and parts.get("host"))
    logs = [f"{WORKER_LOG.directory}/{name}" for name in _names(directory / WORKER_LOG.directory)]
    cancelled = steps_cancelled(cancellations, controller_records(records))
    return (*records, *unrecorded_steps(records, logs, hosts, cancelled, kept))


def _names(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _int(value: object) -> int | None:
    return value if type(value) is int else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _process(document: dict[str, Any], path: str) -> ProcessExit:
    return ProcessExit(
        role=_str(document.get("role")), pid=_int(document.get("pid")),
        exit_code=_int(document.get("exit_code")), pointer="", path=path,
        host=_str(document.get("host")), rank=_int(document.get("rank")),
        started_ns=_int(document.get("started_ns")), ended_ns=_int(document.get("ended_ns")),
        signal=_str(document.get("signal")),
        received_signal=_str(document.get("received_signal")))
