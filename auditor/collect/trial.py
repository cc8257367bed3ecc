"""Read a trial record, ``trial-<job>.json`` (the launcher's own record of one attempt).

``dispatch`` and ``env`` values are kept as strings in file order: a string
as written, anything else as its JSON text (``1`` -> ``"1"``, ``["console"]``
-> ``'["console"]'``), so ``TOTAL_TRAINING_STEPS: 1`` and ``"1"`` read alike.

Mistyped fields read as None with a schema finding, with two deliberate
exceptions that keep a malformed record from looking *cleaner* than it is:
``invocation.received_signal`` of any non-string, non-null type is kept as its
JSON text (so ``15`` still counts as a received signal, never as "none"), and an
integer ``job_id`` is read as its digits.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import BinaryIO

from auditor._io import HashingReader
from auditor.collect.jsondoc import (
    DEFAULT_LIMIT,
    as_int,
    as_job_id,
    as_list,
    as_obj,
    as_str,
    as_text,
    finish,
    load_json,
)
from auditor.model import ProcessExit, TrialRecord
from auditor.schema import validate_document

TRIAL_LIMIT = DEFAULT_LIMIT
"""Largest trial record parsed (bytes)."""


def read_trial(stream: BinaryIO | HashingReader, path: str,
               env_keys: Collection[str] | None = None) -> TrialRecord:
    """Read one trial record from ``stream``; ``path`` is its root-relative POSIX path.
    ``env_keys``: the ``env`` entries kept (the rest are never read: an environment of a
    million variables held 175 MB a record through the audit); None: all."""
    doc, findings = load_json(stream, path, TRIAL_LIMIT, kind="trial record")
    finish(stream)
    if doc is None:
        return TrialRecord(path=path, findings=tuple(findings))
    findings.extend(validate_document("trial", doc, path))
    invocation = as_obj(doc.get("invocation"))
    return TrialRecord(
        path=path,
        job_id=as_job_id(doc.get("job_id")),
        pair=as_str(doc.get("pair")),
        period=as_int(doc.get("period")),
        gpus=as_int(doc.get("gpus")),
        attempt=as_int(doc.get("attempt")),
        dispatch=tuple((key, as_text(value)) for key, value in as_obj(doc.get("dispatch")).items()),
        env=tuple((key, as_text(value)) for key, value in as_obj(doc.get("env")).items()
                  if env_keys is None or key in env_keys),
        started_ns=as_int(invocation.get("started_ns")),
        finished_ns=as_int(invocation.get("finished_ns")),
        exit_code=as_int(invocation.get("exit_code")),
        received_signal=_signal(invocation.get("received_signal")),
        processes=tuple(
            _process(item, f"/processes/{index}")
            for index, item in enumerate(as_list(doc.get("processes")))
        ),
        status=as_str(doc.get("status")),
        validation_error=as_str(doc.get("validation_error")),
        peak_mib=as_int(doc.get("peak_mib")),
        findings=tuple(findings),
        restart_count=as_int(doc.get("restart_count")),
        array_job_id=as_job_id(doc.get("array_job_id")),
        array_task_id=as_int(doc.get("array_task_id")),
        kept_worker_logs=_kept(doc.get("worker_logs")),
    )


def _kept(value: object) -> tuple[str, ...] | None:
    """``worker_logs.kept`` as paths, or None where it is not a list of strings: a log it
    cannot say was kept may then read as a step's output only of a host the attempt names
    (:func:`~auditor.reason.exits.unrecorded_steps`)."""
    kept = as_obj(value).get("kept")
    if not isinstance(kept, list) or not all(isinstance(item, str) for item in kept):
        return None
    return tuple(kept)


def _signal(value: object) -> str | None:
    """None only for an explicit null or absence; any other value is kept as text."""
    if value is None:
        return None
    return as_text(value)


def _process(value: object, pointer: str) -> ProcessExit:
    obj = as_obj(value)
    return ProcessExit(
        role=as_str(obj.get("role")),
        pid=as_int(obj.get("pid")),
        exit_code=as_int(obj.get("exit_code")),
        pointer=pointer,
    )
