"""The Parquet tables written, each typed by its schema (the tables and their columns:
:mod:`auditor.store.tables`). Tables are written with fixed writer options so the same
result gives the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from auditor.model import AuditResult
from auditor.store.tables import SCHEMAS, record_batches


def _periods(result: AuditResult) -> Iterable[tuple[Any, ...]]:
    reasoning = result.reasoning
    for verdict, facts, rule_ids in zip(reasoning.verdicts, reasoning.facts,
                                        result.rule_ids(), strict=True):
        yield (
            verdict.subject, verdict.pair, verdict.period,
            facts.workload, facts.seed, facts.gpus, facts.array_task_id, facts.job_id,
            verdict.verdict.value, verdict.reason,
            verdict.cause.word if verdict.cause else None,
            verdict.cause.detail if verdict.cause else None,
            verdict.cause.citation.locator() if verdict.cause and verdict.cause.citation
            else None,
            rule_ids,
            verdict.diagnosis, verdict.limits,
            facts.actor_update_finished_ns, facts.post_update_sync_finished_ns,
            facts.raw_peak_mib, list(facts.pids_by_rank), facts.log_lines, facts.last_step,
            facts.array_job_id,
        )


def _attempts(result: AuditResult) -> Iterable[tuple[Any, ...]]:
    # (without the allocations' GPUs the reservation scope is unknown, as summary.json says:
    # never the period's GPUs in their place)
    reserved = result.collected.scopes_known()[1]
    for a in result.reasoning.attempts:
        timed = a.started_ns is not None and a.finished_ns is not None
        yield (
            a.subject, a.index + 1, a.job_id, a.attempt_dir, a.outcome, a.reason,
            a.exit_kind or "", a.exit_code, a.received_signal,
            a.started_ns, a.finished_ns,  # started, finished
            a.gpus, a.allocation_gpus if reserved else None,
            # (an attempt without its invocation time has none: unknown, not 0)
            round(a.task_gpu_seconds, 6) if timed else None,
            round(a.reservation_gpu_seconds, 6) if reserved and timed else None,
            a.counted, a.wasted, a.launcher_status,
        )


def _findings(result: AuditResult) -> Iterable[tuple[Any, ...]]:
    for f in sorted_findings(result):
        first = f.citations[0] if f.citations else None
        yield (
            f.rule_id, f.symbol, f.severity.value, f.subject, f.message,
            first.path if first else None, first.line if first else None,
            first.pointer if first else None,
            [c.locator() for c in f.citations],  # citations
        )


def _evidence(result: AuditResult) -> Iterable[tuple[Any, ...]]:
    for e in result.collected.evidence:
        yield (
            e.path, e.kind, e.pair or None, e.period, None if e.attempt is None else e.attempt + 1,
            e.job_id, e.manifest,
            e.actual_size,  # size
            e.expected_size, e.expected_sha256, e.actual_sha256, e.status, e.detail,
        )


def device_values(result: AuditResult, column: str) -> set[Any]:
    """Every value of one column of the ``devices`` table (read back from where the audit
    kept its rows)."""
    return {value for batch in result.collected.tables["devices"].batches()
            for value in batch.column(column).to_pylist()}


def sorted_findings(result: AuditResult) -> list[Any]:
    """Findings in a stable order: severity, rule, subject, message."""
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(result.findings,
                  key=lambda f: (order[f.severity.value], f.rule_id, f.subject, f.message))


ROWS: dict[str, Callable[[AuditResult], Iterable[tuple[Any, ...]]]] = {
    "periods": _periods,
    "attempts": _attempts,
    "findings": _findings,
    "evidence": _evidence,
}
"""The rows of each table made from the result as it is written; those of the others
(``phases``, ``devices``) were kept as the audit made them (:attr:`Collected.tables`)."""


ROW_GROUP_ROWS = 16_384
"""Rows per Parquet row group: only this many rows exist as Arrow at once, whatever the
table's size (and the same rows always give the same row groups: deterministic bytes).
A period's row is about 550 bytes as Arrow (its diagnosis and limits), so a group of
65,536 was 60 MB of a million-file audit's peak; at this size a group is 2-9 MB, for
tables 3.5-6.5% larger than in groups of 65,536 (at a million files 134.7 MB against
129.6 MB in all)."""


def write_table(name: str, result: AuditResult, sink: io.RawIOBase) -> int:
    """Write one table to ``sink`` as Parquet, typed by its schema; returns its row count.

    Streams: rows become Arrow a batch of :data:`~auditor.store.tables.BATCH_ROWS` at a
    time (or are read back a batch at a time from where the audit kept them,
    :class:`~auditor.store.tables.TableRows`), and each :data:`ROW_GROUP_ROWS` rows
    are written as one row group before the next are built,
    so memory stays bounded on a table of millions of rows. Writer options are fixed,
    so the same result gives the same bytes."""
    schema = SCHEMAS[name].with_metadata({
        **(SCHEMAS[name].metadata or {}),
        b"auditor.partial": b"true" if result.partial else b"false",
    })
    batches = result.collected.tables[name].batches() if name not in ROWS \
        else record_batches(ROWS[name](result), SCHEMAS[name])
    pending: list[pa.RecordBatch] = []
    pending_rows = total = 0
    with pq.ParquetWriter(sink, schema, compression="zstd", use_dictionary=True,
                          write_statistics=True, store_schema=True) as writer:
        for batch in batches:
            pending.append(pa.RecordBatch.from_arrays(batch.columns, schema=schema))
            pending_rows += batch.num_rows
            if pending_rows >= ROW_GROUP_ROWS:
                _write_group(writer, pending, schema)
                total += pending_rows
                pending, pending_rows = [], 0
        if pending:
            _write_group(writer, pending, schema)
            total += pending_rows
    return total


def _write_group(writer: pq.ParquetWriter, batches: list[pa.RecordBatch],
                 schema: pa.Schema) -> None:
    writer.write_table(pa.Table.from_batches(batches, schema=schema),
                       row_group_size=ROW_GROUP_ROWS)
