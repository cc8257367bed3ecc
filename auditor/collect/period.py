"""Read a period record, ``pairs/<pair>/period-<n>.json``, into a :class:`PeriodRecord`.

Both forms of the contract are read: the single-attempt form (``job_id``,
``attempt_dir``, ``workers``, ``evidence`` at the top) becomes one
:class:`AttemptSpec` with pointer ``""``; the retried form lists its attempts in
``attempts`` (in launch order), each with pointer ``/attempts/<i>``. When
``attempts`` is present it wins and top-level single-attempt fields are ignored.

A record that cannot be read (empty, too large, not JSON, duplicate keys, not
an object) still yields a record: ``readable=False``, the pair and period taken
from its path, the cause's finding and an ``AUD011``. Nothing on disk silently
drops out of the audit. A readable record at a record's path
(``pairs/<pair>/period-<n>.json``) is the period its path names, whatever its ``pair``
and ``period`` say (``AUD015`` when they differ): one record a period, so a copy of a
record elsewhere, or a typo, is a period of its own, never a second verdict of another's.
Field values of the wrong type are read as None, except an integer
``job_id``/``array_job_id``, which is read as its digits (the schema still flags
it): the id is unambiguous and identity checks keep working.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from sys import intern
from typing import Any, BinaryIO

from auditor import rules
from auditor._io import HashingReader
from auditor.collect.jsondoc import (
    DEFAULT_LIMIT,
    as_bool,
    as_int,
    as_job_id,
    as_list,
    as_obj,
    as_str,
    finish,
    load_json,
)
from auditor.model import (
    INT64_MAX,
    AttemptSpec,
    Citation,
    EvidenceEntry,
    Finding,
    HostIdle,
    IdleCheck,
    PeriodRecord,
    Worker,
)
from auditor.model.kinds import KINDS
from auditor.model.paths import period_number
from auditor.schema import validate_document

PERIOD_LIMIT = DEFAULT_LIMIT
"""Largest period record parsed (bytes)."""

_PERIOD_NAME = re.compile(r"period-(?P<period>[0-9]{1,19})(?![0-9])")


def identity_from_path(path: str) -> tuple[str, int]:
    """(pair, period) from ``pairs/<pair>/period-<n>.json``.

    For a path of another shape: the parent directory's name (or the file's
    stem) and the first number after ``period-`` in the name (or 0).
    """
    named = _named(path)
    if named is not None:
        return named
    posix = PurePosixPath(path)
    name_match = _PERIOD_NAME.search(posix.name)
    number = int(name_match["period"]) if name_match else 0
    return posix.parent.name or posix.stem, number if number <= INT64_MAX else 0


def _named(path: str) -> tuple[str, int] | None:
    """(pair, period) of a path ``[.../]pairs/<pair>/period-<n>.json`` whose name is a
    period record's (:func:`~auditor.model.paths.period_number`), else None."""
    parts = path.rsplit("/", 3)
    if len(parts) < 3 or parts[-3] != "pairs" or not parts[-2]:
        return None
    number = period_number(parts[-1])
    return None if number is None else (parts[-2], number)


def read_period(stream: BinaryIO | HashingReader, path: str) -> PeriodRecord:
    """Read one period record from ``stream``; ``path`` is its root-relative POSIX path."""
    doc, findings = load_json(stream, path, PERIOD_LIMIT, kind="period record")
    digest = finish(stream)
    path_pair, path_period = identity_from_path(path)
    if doc is None:
        findings.append(_unreadable(path, findings))
        return PeriodRecord(
            path=path,
            pair=path_pair,
            period=path_period,
            readable=False,
            digest=digest,
            findings=tuple(findings),
        )
    findings.extend(validate_document("period", doc, path))
    if "attempts" in doc:
        attempts = tuple(
            _attempt(item, index, f"/attempts/{index}")
            for index, item in enumerate(as_list(doc["attempts"]))
        )
    else:
        attempts = (_attempt(doc, 0, ""),)
    for spec in attempts:  # (a typo, "trial_record", would otherwise say only "no trial")
        for entry in spec.evidence:
            if entry.kind not in KINDS:  # (hash-checked only)
                findings.append(rules.finding(
                    "AUD018", path, [Citation(path, pointer=f"{entry.pointer}/kind",
                                              quote=entry.kind)],
                    pointer=entry.pointer, kind=entry.kind, file=entry.path))
    pair = as_str(doc.get("pair"))
    period = as_int(doc.get("period"))
    named = _named(path) is not None  # (period-0.json names period 0)
    for field, inside, outside in (("pair", pair, path_pair),
                                   ("period", period, path_period if named else None)):
        if inside is not None and outside not in (None, "") and inside != outside:
            findings.append(rules.finding(
                "AUD015", path, [Citation(path, pointer=f"/{field}", quote=str(inside))],
                field=field, inside=inside, outside=outside))
    # in a study, a record is the period its path names (one record a period, so every
    # period one verdict, however a copy or a typo says); a path of another shape, read
    # alone, is what the record says it is
    return PeriodRecord(
        path=path,
        pair=path_pair if named else pair or path_pair,
        period=path_period if named or period is None else period,
        readable=True,
        study=as_str(doc.get("study")),
        workload=as_str(doc.get("workload")),
        seed=as_int(doc.get("seed")),
        model=as_str(doc.get("model")),
        gpus=as_int(doc.get("gpus")),
        array_job_id=as_job_id(doc.get("array_job_id")),
        array_task_id=as_int(doc.get("array_task_id")),
        commit=as_str(doc.get("commit")),
        attempts=attempts,
        idle_check=_idle_check(doc.get("idle_check")),
        digest=digest,
        findings=tuple(findings),
        sealed_ns=as_int(doc.get("sealed_ns")),
        sealed_by=_sealed_by(doc.get("sealed_by")),
    )


def _sealed_by(value: object) -> str | None:
    """``tool version`` of ``sealed_by`` (an object, or a string as it is)."""
    if isinstance(value, str):
        return value
    obj = as_obj(value)
    words = [text for key in ("tool", "version") if (text := as_str(obj.get(key)))]
    return " ".join(words) or None


def _unreadable(path: str, causes: list[Finding]) -> Finding:
    if causes:
        cause = causes[0]
        detail = rules.describe(cause)
        error = f"{detail} ({cause.rule_id} {cause.symbol})"
    else:  # pragma: no cover - load_json always explains a None document
        error = "unreadable"
    return rules.finding("AUD011", path, [Citation(path)], error=error)


def _attempt(value: object, index: int, pointer: str) -> AttemptSpec:
    obj = as_obj(value)
    return AttemptSpec(
        index=index,
        job_id=as_job_id(obj.get("job_id")),
        attempt_dir=as_str(obj.get("attempt_dir")),
        workers=tuple(
            _worker(item, f"{pointer}/workers/{position}")
            for position, item in enumerate(as_list(obj.get("workers")))
        ),
        evidence=tuple(
            entry
            for position, item in enumerate(as_list(obj.get("evidence")))
            if (entry := _evidence(item, f"{pointer}/evidence/{position}")) is not None
        ),
        pointer=pointer,
        restart_count=as_int(obj.get("restart_count")),
        array_task_id=as_int(obj.get("array_task_id")),
        # (the single-attempt form's idle_check is the record's, the period's end)
        idle_check=_idle_check(obj.get("idle_check")) if pointer else None,
    )


def _worker(value: object, pointer: str) -> Worker:
    obj = as_obj(value)
    role = as_str(obj.get("role"))
    return Worker(
        role=intern(role) if role is not None else None,
        rank=as_int(obj.get("rank")),
        pid=as_int(obj.get("pid")),
        pointer=intern(pointer),
        host=intern(host) if (host := as_str(obj.get("host"))) else None,
    )


def _evidence(value: object, pointer: str) -> EvidenceEntry | None:
    """An evidence entry, or None when it has no string ``path`` (the schema says so)."""
    obj: dict[str, Any] = as_obj(value)
    path = as_str(obj.get("path"))
    if path is None:
        return None
    sha256 = as_str(obj.get("sha256"))
    return EvidenceEntry(
        path=path,
        kind=intern(as_str(obj.get("kind")) or ""),
        sha256=sha256.lower() if sha256 is not None else None,
        size=as_int(obj.get("size")),
        pointer=intern(pointer),
    )


def _idle_check(value: object) -> IdleCheck | None:
    if type(value) is not dict:
        return None
    return IdleCheck(
        passed=as_bool(value.get("passed")),
        checked_ns=as_int(value.get("checked_ns")),
        gpu_memory_used_mib=tuple(
            item for item in as_list(value.get("gpu_memory_used_mib")) if type(item) is int
        ),
        gpu_processes=as_int(value.get("gpu_processes")),
        unavailable=as_str(value.get("unavailable")),
        hosts=tuple(_host_idle(host, item) for host, item
                    in sorted(as_obj(value.get("hosts")).items())),
    )


def _host_idle(host: str, value: object) -> HostIdle:
    """One node's result in ``idle_check.hosts`` (contract v1.2)."""
    obj = as_obj(value)
    return HostIdle(host, as_bool(obj.get("passed")), as_str(obj.get("unavailable")),
                    as_int(obj.get("checked_ns")))
