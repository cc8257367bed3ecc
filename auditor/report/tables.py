"""Parquet tables with explicit, documented Arrow schemas.

| table | one row per |
| --- | --- |
| ``periods.parquet`` | period: verdict, reason, diagnosis, limits, the report's figures |
| ``attempts.parquet`` | attempt: outcome, exit, invocation window, GPU-seconds, wasted |
| ``findings.parquet`` | finding: rule, severity, subject, message, first citation |
| ``evidence.parquet`` | evidence file: expected and actual hash and size, status |
| ``phases.parquet`` | allocator phase record: pid, rank, phase, step, times, error, peaks |
| ``devices.parquet`` | device file (a rank of an attempt): host, GPU uuid/name/bus, peaks |

Times are ``timestamp[ns, UTC]``; byte counts ``int64``; absent values are null.
Tables are written with fixed writer options so the same result gives the same bytes.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from auditor._spill import spilling
from auditor._text import printable_json
from auditor.model import AuditResult
from auditor.report.rows import device_rows, phase_rows

TS = pa.timestamp("ns", tz="UTC")

ATTEMPT_DOC = ("launch order within the period, from 1 (the trial record's attempt and the "
               "report's 'attempt 2' count the same way)")
PERIODS_SCHEMA = pa.schema([
    pa.field("subject", pa.string(), nullable=False),
    pa.field("pair", pa.string(), nullable=False),
    pa.field("period", pa.int64(), nullable=False),
    pa.field("workload", pa.string()),
    pa.field("seed", pa.int64()),
    pa.field("gpus", pa.int64()),
    pa.field("array_task_id", pa.int64()),
    pa.field("job_id", pa.string(), metadata={"doc": "actual job id of the counted attempt"}),
    pa.field("verdict", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("cause", pa.string(), metadata={
        "doc": "what ended the period when it did not complete (null: a clean exit)"}),
    pa.field("cause_detail", pa.string()),
    pa.field("cause_at", pa.string(), metadata={"doc": "the line or record it rests on"}),
    pa.field("rule_ids", pa.list_(pa.string())),
    pa.field("diagnosis", pa.string()),
    pa.field("limits", pa.string()),
    pa.field("actor_update_finished", TS),
    pa.field("post_update_sync_finished", TS),
    pa.field("raw_peak_mib", pa.int64()),
    pa.field("pids_by_rank", pa.list_(pa.int64())),
    pa.field("log_lines", pa.int64()),
    pa.field("last_step", pa.int64()),
])

ATTEMPTS_SCHEMA = pa.schema([
    pa.field("subject", pa.string(), nullable=False),
    pa.field("attempt", pa.int64(), nullable=False, metadata={"doc": ATTEMPT_DOC}),
    pa.field("job_id", pa.string()),
    pa.field("attempt_dir", pa.string()),
    pa.field("outcome", pa.string(), nullable=False),
    pa.field("reason", pa.string()),
    pa.field("exit_kind", pa.string()),
    pa.field("exit_code", pa.int64()),
    pa.field("received_signal", pa.string()),
    pa.field("started", TS),
    pa.field("finished", TS),
    pa.field("gpus", pa.int64()),
    pa.field("allocation_gpus", pa.int64()),
    pa.field("task_gpu_seconds", pa.float64()),
    pa.field("reservation_gpu_seconds", pa.float64()),
    pa.field("counted", pa.bool_()),
    pa.field("wasted", pa.bool_()),
    pa.field("launcher_status", pa.string()),
])

FINDINGS_SCHEMA = pa.schema([
    pa.field("rule_id", pa.string(), nullable=False),
    pa.field("symbol", pa.string(), nullable=False),
    pa.field("severity", pa.string(), nullable=False),
    pa.field("subject", pa.string(), nullable=False),
    pa.field("message", pa.string(), nullable=False),
    pa.field("path", pa.string()),
    pa.field("line", pa.int64()),
    pa.field("pointer", pa.string()),
    pa.field("citations", pa.list_(pa.string()), metadata={"doc": "every citation locator"}),
])

EVIDENCE_SCHEMA = pa.schema([
    pa.field("path", pa.string(), nullable=False),
    pa.field("kind", pa.string(), nullable=False),
    pa.field("pair", pa.string()),
    pa.field("period", pa.int64()),
    pa.field("attempt", pa.int64(), metadata={"doc": ATTEMPT_DOC}),
    pa.field("job_id", pa.string()),
    pa.field("manifest", pa.string()),
    pa.field("size", pa.int64(), metadata={"doc": "actual size in bytes"}),
    pa.field("expected_size", pa.int64()),
    pa.field("expected_sha256", pa.string()),
    pa.field("actual_sha256", pa.string()),
    pa.field("status", pa.string(), nullable=False),
    pa.field("detail", pa.string()),
])

PHASES_SCHEMA = pa.schema([
    pa.field("subject", pa.string(), nullable=False),
    pa.field("attempt", pa.int64(), nullable=False, metadata={"doc": ATTEMPT_DOC}),
    pa.field("path", pa.string(), nullable=False),
    pa.field("line", pa.int64(), nullable=False),
    pa.field("pid", pa.int64()),
    pa.field("rank", pa.int64()),
    pa.field("role", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("phase", pa.string(), nullable=False),
    pa.field("step", pa.int64()),
    pa.field("started", TS),
    pa.field("finished", TS),
    pa.field("error_type", pa.string()),
    pa.field("peak_allocated_bytes", pa.int64()),
    pa.field("peak_reserved_bytes", pa.int64()),
])

DEVICES_SCHEMA = pa.schema([
    pa.field("subject", pa.string(), nullable=False),
    pa.field("pair", pa.string(), nullable=False),
    pa.field("period", pa.int64(), nullable=False),
    pa.field("attempt", pa.int64(), nullable=False, metadata={"doc": ATTEMPT_DOC}),
    pa.field("job_id", pa.string(), metadata={"doc": "the device file's job_id"}),
    pa.field("rank", pa.int64()),
    pa.field("role", pa.string()),
    pa.field("pid", pa.int64()),
    pa.field("hostname", pa.string()),
    pa.field("cuda_visible_devices", pa.string()),
    pa.field("local_device", pa.int64()),
    pa.field("gpu_uuid", pa.string()),
    pa.field("gpu_name", pa.string()),
    pa.field("gpu_pci_bus_id", pa.string()),
    pa.field("memory_total_mib", pa.int64()),
    pa.field("peak_allocated_mib", pa.int64()),
    pa.field("peak_reserved_mib", pa.int64()),
    pa.field("captured", TS),
    pa.field("gpu_unavailable", pa.string(),
             metadata={"doc": "why no GPU was visible (the GPU columns are then null)"}),
    pa.field("path", pa.string(), nullable=False, metadata={"doc": "the device file"}),
])

SCHEMAS: dict[str, pa.Schema] = {
    "periods": PERIODS_SCHEMA,
    "attempts": ATTEMPTS_SCHEMA,
    "findings": FINDINGS_SCHEMA,
    "evidence": EVIDENCE_SCHEMA,
    "phases": PHASES_SCHEMA,
    "devices": DEVICES_SCHEMA,
}


# Each table's rows are tuples in its schema's column order (a dict per row cost more to
# build, and more again for pyarrow to take apart, than the rest of writing the table).


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
        )


def _attempts(result: AuditResult) -> Iterable[tuple[Any, ...]]:
    for a in result.reasoning.attempts:
        yield (
            a.subject, a.index + 1, a.job_id, a.attempt_dir, a.outcome, a.reason,
            a.exit_kind or "", a.exit_code, a.received_signal,
            a.started_ns, a.finished_ns,  # started, finished
            a.gpus, a.allocation_gpus,
            round(a.task_gpu_seconds, 6), round(a.reservation_gpu_seconds, 6),
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
            e.path, e.kind, e.pair, e.period, None if e.attempt is None else e.attempt + 1,
            e.job_id, e.manifest,
            e.actual_size,  # size
            e.expected_size, e.expected_sha256, e.actual_sha256, e.status, e.detail,
        )


def _phases(result: AuditResult) -> Iterable[tuple[Any, ...]]:
    for period in result.collected.periods:
        for attempt in period.attempts:
            yield from phase_rows(period, attempt)


def _devices(result: AuditResult) -> Iterable[tuple[Any, ...]]:
    for period in result.collected.periods:
        for attempt in period.attempts:
            yield from device_rows(period, attempt)


def device_values(result: AuditResult, column: str) -> set[Any]:
    """Every value of one column of the ``devices`` table (read back from its spilled rows
    when the audit let the periods' devices go, else from the periods)."""
    spilled = result.collected.tables.get("devices")
    if spilled is not None:
        return {value for batch in spilled.batches()
                for value in batch.column(column).to_pylist()}
    index = SCHEMAS["devices"].names.index(column)
    return {row[index] for row in _devices(result)}


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
    "phases": _phases,
    "devices": _devices,
}


BATCH_ROWS = 8192
"""Rows converted to Arrow at a time: only this many row tuples exist at once."""

ROW_GROUP_ROWS = 16_384
"""Rows per Parquet row group: only this many rows exist as Arrow at once, whatever the
table's size (and the same rows always give the same row groups: deterministic bytes).
A period's row is about 550 bytes as Arrow (its diagnosis and limits), so a group of
65,536 was 60 MB of a million-file audit's peak; at this size a group is 2-9 MB, for
tables 3.5-6.5% larger than in groups of 65,536 (at a million files 134.7 MB against
129.6 MB in all)."""


def write_table(name: str, result: AuditResult, sink: io.RawIOBase) -> int:
    """Write one table to ``sink`` as Parquet, typed by its schema; returns its row count.

    Streams: rows become Arrow a batch of :data:`BATCH_ROWS` at a time (or are read back a
    batch at a time from where the audit spilled them, :class:`SpilledRows`), and each
    :data:`ROW_GROUP_ROWS` rows are written as one row group before the next are built,
    so memory stays bounded on a table of millions of rows. Writer options are fixed,
    so the same result gives the same bytes."""
    schema = SCHEMAS[name].with_metadata({
        **(SCHEMAS[name].metadata or {}),
        b"auditor.partial": b"true" if result.partial else b"false",
    })
    spilled = result.collected.tables.get(name)
    batches = spilled.batches() if spilled is not None else _batches(ROWS[name](result),
                                                                     SCHEMAS[name])
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


def _batches(rows: Iterable[tuple[Any, ...]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``rows`` as record batches of :data:`BATCH_ROWS` rows (only that many row tuples
    exist at once)."""
    rows = iter(rows)
    while chunk := list(islice(rows, BATCH_ROWS)):
        yield _batch(chunk, schema)


def _batch(chunk: list[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    columns = zip(*chunk, strict=True)
    return pa.RecordBatch.from_arrays(
        [_array(column, column_field.type)
         for column, column_field in zip(columns, schema, strict=True)], schema=schema)


class SpilledRows:
    """One table's rows as an audit makes them, kept out of memory: every
    :data:`BATCH_ROWS` rows become an Arrow record batch, written (IPC, LZ4) to an unnamed
    temporary file, which :meth:`batches` reads back for :func:`write_table` (the same
    batches it would have built: the same bytes). The file has no name on disk and goes
    when this object does. Once read, no row can be added."""

    def __init__(self, name: str) -> None:
        self.schema = SCHEMAS[name]
        self.rows = 0
        self._pending: list[tuple[Any, ...]] = []
        with spilling():
            self._file: IO[bytes] = tempfile.TemporaryFile()
            self._writer: pa.ipc.RecordBatchStreamWriter | None = pa.ipc.new_stream(
                self._file, self.schema, options=pa.ipc.IpcWriteOptions(compression="lz4"))

    def extend(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Add ``rows`` (tuples in the table's column order)."""
        if self._writer is None:
            raise ValueError("rows added to a table already read")
        before = len(self._pending)
        self._pending.extend(rows)
        self.rows += len(self._pending) - before
        while len(self._pending) >= BATCH_ROWS:
            self._spill(self._pending[:BATCH_ROWS])
            del self._pending[:BATCH_ROWS]

    def _spill(self, chunk: list[tuple[Any, ...]]) -> None:
        assert self._writer is not None
        batch = _batch(chunk, self.schema)
        with spilling():
            self._writer.write_batch(batch)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Every row, a batch of :data:`BATCH_ROWS` at a time, in the order added."""
        if self._writer is not None:
            if self._pending:
                self._spill(self._pending)
                self._pending = []
            with spilling():
                self._writer.close()
            self._writer = None
        self._file.seek(0)
        yield from pa.ipc.open_stream(self._file)


def _array(column: tuple[Any, ...], kind: pa.DataType) -> pa.Array:
    """One column as Arrow; a text with a lone surrogate (a file name that is not UTF-8)
    is written :func:`auditor._text.printable` (in lists and records too)."""
    try:
        return pa.array(column, type=kind)
    except UnicodeEncodeError:
        return pa.array([printable_json(v) for v in column], type=kind)


def _write_group(writer: pq.ParquetWriter, batches: list[pa.RecordBatch],
                 schema: pa.Schema) -> None:
    writer.write_table(pa.Table.from_batches(batches, schema=schema),
                       row_group_size=ROW_GROUP_ROWS)
