"""Read one node's own idle check, ``ATTEMPT/idle/<host>.json`` (contract v1.2).

``auditor seal --idle-check-only`` writes it on each node of a multi-node attempt, and the
batch node's ``auditor seal`` gathers them into the period record's ``idle_check.hosts``: the
file is the node's own word, pinned by the same record, which the checks hold the record's
entry to (a node whose file says it failed never passes on the record's say-so). Mistyped
fields read as None with a schema finding.
"""

from __future__ import annotations

from typing import BinaryIO

from auditor._io import HashingReader
from auditor.collect.jsondoc import (
    DEFAULT_LIMIT,
    as_bool,
    as_int,
    as_obj,
    as_str,
    finish,
    load_json,
)
from auditor.model import Finding, HostIdle
from auditor.schema import validate_document

IDLE_LIMIT = DEFAULT_LIMIT
"""Largest idle check file parsed (bytes)."""


def read_idle(stream: BinaryIO | HashingReader, path: str
              ) -> tuple[HostIdle | None, tuple[Finding, ...]]:
    """Read one node's idle check from ``stream`` (``path``: its root-relative path): the
    result (None when the file is no JSON object or names no host) and the findings about
    the file."""
    doc, findings = load_json(stream, path, IDLE_LIMIT, kind="idle check")
    finish(stream)
    if doc is None:
        return None, tuple(findings)
    findings.extend(validate_document("idle-check", doc, path))
    obj = as_obj(doc)
    host = as_str(obj.get("host"))
    if not host:
        return None, tuple(findings)
    return HostIdle(host, as_bool(obj.get("passed")), as_str(obj.get("unavailable")),
                    as_int(obj.get("checked_ns")), path=path), tuple(findings)
