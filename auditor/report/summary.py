"""``summary.json``: the machine-readable result, keys as the contract fixes them.

A pure function of the :class:`~auditor.pipeline.audit.AuditResult`; deterministic (no
time, no absolute paths), so two audits of the same evidence give the same bytes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import islice
from typing import Any

import orjson

from auditor import __version__
from auditor._text import printable_json
from auditor.model import AuditResult, GateResult, Severity, VerdictKind

SCHEMA = "run-evidence/summary/v1"


def gate_json(gate: GateResult) -> dict[str, Any]:
    """One gate mode as JSON."""
    return {
        "passed": gate.passed,
        "allow_partial": gate.allow_partial,
        "included_configurations": list(gate.included_configurations),
        "reasons": list(gate.reasons),
        "waived": list(gate.waived),
        "included_by_waiver": list(gate.included_by_waiver),
    }


def build_summary(result: AuditResult, periods: bool = True) -> dict[str, Any]:
    """The ``summary.json`` document (``periods=False``: its ``periods`` empty, as the
    terminal's summary needs none of them; :func:`summary_chunks` writes them a batch at
    a time)."""
    reasoning = result.reasoning
    counts = {kind.value: 0 for kind in VerdictKind}
    for verdict in reasoning.verdicts:
        counts[verdict.verdict.value] += 1
    severities = {s.value: 0 for s in Severity}
    for item in result.findings:
        severities[item.severity.value] += 1
    return {
        "schema": SCHEMA,
        "auditor_version": __version__,
        "study": _study_name(result),
        "partial": result.partial,
        "launches": len(reasoning.attempts),
        "verdicts": counts,
        "configurations": [
            {"workload": c.workload, "gpus": c.gpus, "status": c.status, "outcome": c.outcome,
             "periods": len(c.periods), "seeds": list(c.seeds),
             "missing_seeds": list(c.missing_seeds),
             "task_gpu_seconds": c.task_gpu_seconds,
             "reservation_gpu_seconds": c.reservation_gpu_seconds}
            for c in reasoning.configurations
        ],
        "configurations_resolved": sum(1 for c in reasoning.configurations
                                       if c.status == "resolved"),
        "configurations_total": len(reasoning.configurations),
        "periods": list(_period_entries(result)) if periods else [],
        "accounting": _accounting(result),
        "integrity": _integrity(result),
        "findings": {"total": len(result.findings), **severities,
                     "not_kept": result.findings_not_kept},
        "gate": gate_json(reasoning.gate),
        "gate_allow_partial": gate_json(reasoning.gate_partial),
        "waivers": [
            {"rule_id": w.rule_id, "subject": w.subject, "reason": w.reason,
             "matched": w.matched}
            for w in reasoning.waivers
        ],
        "disagreements": [
            {"subject": s, "launcher_status": st, "launcher_error": err, "auditor_verdict": v}
            for s, st, err, v in reasoning.disagreements
        ],
    }


def _period_entries(result: AuditResult) -> Iterator[dict[str, Any]]:
    """``periods``: one entry per period, with every rule that said something about it."""
    reasoning = result.reasoning
    # (of each period's counted attempt only its job: the outcomes were a million
    # periods' 55 MB held while the document was written)
    counted_job = {a.subject: a.job_id for a in reasoning.attempts if a.counted}
    attempts_per_subject = Counter(a.subject for a in reasoning.attempts)
    for verdict, facts, rule_ids in zip(reasoning.verdicts, reasoning.facts,
                                        result.rule_ids(), strict=True):
        yield {
            "pair": verdict.pair,
            "period": verdict.period,
            "workload": facts.workload,
            "seed": facts.seed,
            "gpus": facts.gpus,
            "job_id": counted_job.get(verdict.subject),
            "verdict": verdict.verdict.value,
            "reason": verdict.reason,
            "cause": verdict.cause.word if verdict.cause else None,
            "attempts": attempts_per_subject[verdict.subject],
            "rule_ids": rule_ids,
        }


def _integrity(result: AuditResult) -> dict[str, int]:
    """``integrity``: every listed file (and period record) by its status."""
    collected = result.collected
    integrity = {"files_listed": 0, "verified": 0, "mismatched": 0, "missing": 0,
                 "unlisted": 0, "unsafe_paths": 0, "unreadable": 0}
    for status, count in sorted(collected.evidence_statuses().items()):
        if status == "unlisted":
            integrity["unlisted"] += count
            continue
        integrity["files_listed"] += count
        key = {"unsafe": "unsafe_paths"}.get(status, status)
        integrity[key] = integrity.get(key, 0) + count
    # The period records are evidence too (the seed's locator names them beside the files
    # they list, and the contract's seed summary counts them: 162 = 144 files + 18 records):
    # listed, and verified when read and parsed.
    unreadable_records = sum(1 for p in collected.periods if not p.record.readable)
    integrity["files_listed"] += len(collected.periods)
    integrity["verified"] += len(collected.periods) - unreadable_records
    integrity["unreadable"] += unreadable_records
    # a pair directory that is a link is an unsafe path too (never followed: AUD022)
    integrity["unsafe_paths"] += sum(1 for item in collected.findings if item.rule_id == "AUD022")
    # and one that cannot be listed is unreadable (its records are missing: AUD025)
    integrity["unreadable"] += sum(1 for item in collected.findings if item.rule_id == "AUD025")
    integrity["period_records"] = len(collected.periods)
    integrity["period_records_unreadable"] = unreadable_records
    return integrity


def _accounting(result: AuditResult) -> dict[str, Any]:
    """``accounting``: the overlapping scopes (never added together), unknown ones null."""
    accounting = result.reasoning.accounting
    return {
        "allocation_gpu_seconds": accounting.allocation_gpu_seconds,
        "task_gpu_seconds": accounting.task_gpu_seconds,
        "reservation_gpu_seconds": accounting.reservation_gpu_seconds,
        "wasted_gpu_seconds": accounting.wasted_gpu_seconds,
        "unresolved_gpu_seconds": accounting.unresolved_gpu_seconds,
        "wasted_attempts": accounting.wasted_attempts,
        "jobs_without_element": list(accounting.jobs_without_element),
        "requeued_gpu_seconds": accounting.requeued_gpu_seconds,
        "jobs_outside_array": list(accounting.jobs_outside_array),
        "outside_array_gpu_seconds": accounting.outside_array_gpu_seconds,
        "allocation_records_unknown": accounting.allocation_records_unknown,
        "attempts_without_times": accounting.attempts_without_times,
        "allocation_gpu_hours": None if accounting.allocation_gpu_seconds is None
        else round(accounting.allocation_gpu_seconds / 3600, 9),
        "task_gpu_hours": round(accounting.task_gpu_seconds / 3600, 9),
        "reservation_gpu_hours": None if accounting.reservation_gpu_seconds is None
        else round(accounting.reservation_gpu_seconds / 3600, 9),
        "scopes_overlap": True,
    }


def _study_name(result: AuditResult) -> str:
    for period in result.collected.periods:
        if period.record.study:
            return period.record.study
    return result.collected.root.name


def dumps(document: dict[str, Any]) -> bytes:
    """Stable JSON bytes (sorted keys would reorder the contract's keys; insertion order is
    already deterministic)."""
    try:
        return orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n"
    except orjson.JSONEncodeError:  # (a lone surrogate: a file name that is not UTF-8, or
        # an integer past 64 bits that hostile figures multiply to: written as its digits)
        return orjson.dumps(json_safe_numbers(printable_json(document)),
                            option=orjson.OPT_INDENT_2) + b"\n"


_EMPTY_PERIODS = b'\n  "periods": [],\n'
"""Where the periods go in a summary built without them (a string's newline is escaped
in JSON: only the document's own layout has one there)."""


def summary_chunks(result: AuditResult, batch: int = 1024) -> Iterator[bytes]:
    """``summary.json``, byte for byte :func:`dumps` of :func:`build_summary`, in pieces:
    the periods' entries ``batch`` at a time (a million periods' entries were about 60 MB
    as a document, 160 MB while it was written, held through the whole report)."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
    head = dumps(build_summary(result, periods=False))
    entries = _period_entries(result)
    chunk = list(islice(entries, batch))
    if not chunk:
        yield head
        return
    at = head.index(_EMPTY_PERIODS)
    yield head[:at] + b'\n  "periods": [\n'
    first = True
    while chunk:
        yield (b"" if first else b",\n") + b",\n".join(_entry(entry) for entry in chunk)
        first = False
        chunk = list(islice(entries, batch))
    yield b"\n  ],\n" + head[at + len(_EMPTY_PERIODS):]


def _entry(entry: dict[str, Any]) -> bytes:
    """One period's entry as :func:`dumps` lays it out in the document's ``periods``."""
    return b"    " + dumps(entry)[:-1].replace(b"\n", b"\n    ")


def json_safe_numbers(value: Any) -> Any:
    """``value`` with every integer outside 64 bits as the string of its digits."""
    if isinstance(value, dict):
        return {key: json_safe_numbers(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe_numbers(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) \
            and not -(1 << 63) <= value < (1 << 64):
        return str(value)
    return value
