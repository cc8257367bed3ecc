"""Read a process record, ``processes/<host>-<role>-<pid>.json`` (contract v1.2).

One process of an attempt (a controller, a policy or rollout replica, a torchrun rank), as
``auditor run --step`` or a launcher's own call wrote it when that process ended: its role,
host, pid, rank, times, exit code, the signal that ended it and any its wrapper received.
Mistyped fields read as None with a schema finding; a signal of any non-string type is kept
as its JSON text (it still counts as a signal, never as "none").
"""

from __future__ import annotations

from typing import BinaryIO

from auditor._io import HashingReader
from auditor.collect.jsondoc import (
    DEFAULT_LIMIT,
    as_int,
    as_obj,
    as_str,
    as_text,
    finish,
    load_json,
)
from auditor.model import Finding, ProcessExit
from auditor.schema import validate_document

PROCESS_LIMIT = DEFAULT_LIMIT
"""Largest process record parsed (bytes)."""


def read_process(stream: BinaryIO | HashingReader, path: str
                 ) -> tuple[ProcessExit | None, tuple[Finding, ...]]:
    """Read one process record from ``stream`` (``path``: its root-relative path): the
    process (None when the file is no JSON object) and the findings about the file."""
    doc, findings = load_json(stream, path, PROCESS_LIMIT, kind="process record")
    finish(stream)
    if doc is None:
        return None, tuple(findings)
    findings.extend(validate_document("process", doc, path))
    obj = as_obj(doc)
    return ProcessExit(
        role=as_str(obj.get("role")),
        pid=as_int(obj.get("pid")),
        exit_code=as_int(obj.get("exit_code")),
        pointer="",
        path=path,
        host=as_str(obj.get("host")),
        rank=as_int(obj.get("rank")),
        started_ns=as_int(obj.get("started_ns")),
        ended_ns=as_int(obj.get("ended_ns")),
        signal=_signal(obj.get("signal")),
        received_signal=_signal(obj.get("received_signal")),
    ), tuple(findings)


def _signal(value: object) -> str | None:
    """None only for an explicit null, absence or ``""``; any other value as text."""
    if value is None or value == "":
        return None
    return as_text(value)
