"""The output tables' columns (:data:`SCHEMAS`), and their rows kept out of memory as an
audit makes them (:class:`TableRows`).

| table | one row per |
| --- | --- |
| ``periods.parquet`` | period: verdict, reason, diagnosis, limits, the report's figures |
| ``attempts.parquet`` | attempt: outcome, exit, invocation window, GPU-seconds, wasted |
| ``findings.parquet`` | finding: rule, severity, subject, message, first citation |
| ``evidence.parquet`` | evidence file: expected and actual hash and size, status |
| ``phases.parquet`` | allocator phase record: pid, rank, phase, step, times, error, peaks |
| ``devices.parquet`` | device file (a rank of an attempt): host, GPU uuid/name/bus, peaks |

Times are ``timestamp[ns, UTC]``; byte counts ``int64``; absent values are null. The
reporters write the tables (:mod:`auditor.report.tables`); the store keeps the rows of those
an audit makes as it reads (``phases``, ``devices``), as Arrow, on disk. It imports pyarrow:
the workers, which make those rows as plain tuples (:mod:`auditor.store.rows`), never
import this module.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import IO, Any

import pyarrow as pa

from auditor._text import printable_json
from auditor.store.settings import ReadFromStart, spilling, temporary_file

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
    pa.field("array_job_id", pa.string(), metadata={"doc": "the job array its record names"}),
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

KEPT_TABLES = ("phases", "devices")
"""The tables whose rows the audit makes as it reads each period, kept here
(:class:`TableRows`) until they are written; the others are made from the result."""

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

BATCH_ROWS = 8192
"""Rows converted to Arrow at a time: only this many row tuples exist at once."""



def record_batches(rows: Iterable[tuple[Any, ...]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``rows`` as record batches of :data:`BATCH_ROWS` rows (only that many row tuples
    exist at once)."""
    rows = iter(rows)
    while chunk := list(islice(rows, BATCH_ROWS)):
        yield record_batch(chunk, schema)


def record_batch(chunk: list[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    columns = zip(*chunk, strict=True)
    return pa.RecordBatch.from_arrays(
        [arrow_array(column, column_field.type)
         for column, column_field in zip(columns, schema, strict=True)], schema=schema)


def arrow_array(column: tuple[Any, ...], kind: pa.DataType) -> pa.Array:
    """One column as Arrow; a text with a lone surrogate (a file name that is not UTF-8)
    is written :func:`auditor._text.printable` (in lists and records too)."""
    try:
        return pa.array(column, type=kind)
    except UnicodeEncodeError:
        return pa.array([printable_json(v) for v in column], type=kind)


class TableRows:
    """One table's rows as an audit makes them, kept out of memory: every
    :data:`BATCH_ROWS` rows become an Arrow record batch, written (IPC, LZ4) to an unnamed
    temporary file, which :meth:`batches` reads back for the writer
    (:func:`auditor.report.tables.write_table`: the same batches it would have built, the
    same bytes). The file has no name on disk and goes
    when this object does. Once read, no row can be added."""

    def __init__(self, name: str) -> None:
        self.schema = SCHEMAS[name]
        self.rows = 0
        self._pending: list[tuple[Any, ...]] = []
        self._file: IO[bytes] = temporary_file()
        weakref.finalize(self, self._file.close)  # (closed with its owner: no warning)
        with spilling():
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
        batch = record_batch(chunk, self.schema)
        with spilling():
            self._writer.write_batch(batch)

    def finish(self) -> None:
        """No more rows: what is pending is written out and the file closed for writing, so
        that reading it never writes (a helper forked to write the report reads it too)."""
        if self._writer is not None:
            if self._pending:
                self._spill(self._pending)
                self._pending = []
            with spilling():
                self._writer.close()
                self._file.flush()  # (read by position: from the file, not this buffer)
            self._writer = None

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Every row, a batch of :data:`BATCH_ROWS` at a time, in the order added."""
        self.finish()
        # (by position, on one thread: a forked helper reads the same file, and a pool of
        # threads made before the fork has none of its threads in the child)
        yield from pa.ipc.open_stream(ReadFromStart(self._file),
                                      options=pa.ipc.IpcReadOptions(use_threads=False))
