"""DuckDB over a catalogue: its tables as views, three built-in views, one query's result.

Each table is a view over its parts, read with ``hive_partitioning`` (the ``study`` column
comes from ``study=<name>``, always text) and ``union_by_name`` (a part of an earlier
layout reads its absent columns as null); a table no study has yet is an empty view of
its schema. A query runs reading statements only (:func:`check_read_only`): it never writes
a file, the catalogue's parts included. The built-in views:

``verdicts``
    periods by study, configuration (``workload@gpus``), verdict, reason and cause (the
    ``cause`` column where the periods have one, else null).
``gpu_seconds``
    each study's GPU time by scope (allocation, task, reservation, wasted, unresolved: the
    scopes overlap and are never to be added together), from its ``summary.json``.
``suspect_hardware``
    attempts and failures by node (hostname) and by GPU (UUID), across every study, from
    the ``devices`` table joined to ``attempts``. A unit's trials are the attempts it took
    part in (an attempt counts once per node and once per GPU it used); a failure is an
    attempt ending unresolved for a run-time reason (:data:`FAILURE_REASONS`: not a
    protocol-listed failure, a person's cancel, an unfinished element or an evidence
    problem). Each unit is tested against the catalogue-wide failure rate of its kind, p0
    (failures / trials over every unit of the kind), by the exact one-sided binomial tail
    P(X >= failures | trials, p0), summed term by term in log space; a unit is ``suspect``
    when that is below ``ALPHA`` / m, m the units of its kind tested (Bonferroni), ALPHA =
    0.01.
"""

from __future__ import annotations

import os
import re
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from auditor.catalog.store import CATALOG_JSON, CATALOG_TABLES, PART, SCOPES
from auditor.errors import InputError, UsageError

ALPHA = 0.01
"""Family-wise significance level of ``suspect_hardware`` (Bonferroni over the units of a
kind: a unit is suspect when its p-value is below ALPHA / m)."""
FAILURE_REASONS = ("infrastructure_failure", "killed", "unclean_exit", "time_limit")
"""Reasons of an unresolved attempt that count as a failure of the hardware it ran on."""
BUILT_IN = ("verdicts", "gpu_seconds", "suspect_hardware")


def load_duckdb() -> Any:
    """The duckdb module; one line (exit 2) when it is not installed."""
    try:
        import duckdb
    except ImportError:
        raise UsageError("query: needs duckdb (pip install 'auditor[catalog]')") from None
    return duckdb


def connect(catalog: Path) -> Any:
    """An in-memory DuckDB connection with the catalogue's tables and built-in views."""
    duckdb = load_duckdb()
    if not (catalog / CATALOG_JSON).is_file():
        raise InputError(f"query: {catalog}: no {CATALOG_JSON}; is this a catalogue made by "
                         "'auditor catalog'?")
    con = duckdb.connect(":memory:")
    everything = [str(part) for table in CATALOG_TABLES for part in _parts(catalog / table)]
    for table in CATALOG_TABLES:
        parts = _parts(catalog / table)
        if parts:
            listed = ", ".join(_literal(str(p)) for p in parts)
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet([{listed}], "
                        "hive_partitioning = true, union_by_name = true, "
                        "hive_types = {'study': 'VARCHAR'})")
        else:
            con.register(f"_empty_{table}", _empty(table))
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM _empty_{table}")
    columns = {row[0] for row in con.execute("DESCRIBE periods").fetchall()}
    con.execute(verdicts_sql("cause" in columns))
    con.execute(gpu_seconds_sql({row[0] for row in con.execute("DESCRIBE studies").fetchall()}))
    con.execute(SUSPECT_HARDWARE_SQL)
    # A query reads the catalogue's own parts and nothing else: no read_csv('/etc/passwd')
    # or ATTACH (and the settings cannot be undone). The allowed paths could be written
    # (COPY ... TO a part): run_query runs reading statements only (check_read_only)
    con.execute(f"SET allowed_paths = [{', '.join(_literal(p) for p in everything)}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


@dataclass(frozen=True, slots=True)
class QueryResult:
    """One query's result: its columns, its first rows, how many it has in all."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    """Every row, or the first ``limit`` of them."""
    total: int
    """How many rows the query gave (``len(rows)`` when none was left out)."""


COUNT_BATCH = 65_536
"""Rows fetched at a time when only counted (past the limit)."""


def run_query(catalog: Path, sql: str, limit: int | None = None) -> QueryResult:
    """Run ``sql`` over the catalogue: its columns and rows (the first ``limit`` rows, when
    given; the rest are counted, never kept). Bad SQL is one line (exit 2)."""
    duckdb = load_duckdb()
    if not sql.strip().strip(";").strip():
        raise UsageError("query: no SQL statement given")
    con = None
    try:
        check_read_only(sql)
        con = connect(catalog)  # (a part that cannot be read fails here, or in the query)
        cursor = con.execute(sql)
        if cursor is None or cursor.description is None:
            return QueryResult([], [], 0)
        columns = unique_names([str(d[0]) for d in cursor.description])
        if limit is None:
            rows = cursor.fetchall()
            return QueryResult(columns, rows, len(rows))
        rows = cursor.fetchmany(limit) if limit > 0 else []
        total = len(rows)
        while batch := cursor.fetchmany(COUNT_BATCH):
            total += len(batch)
        return QueryResult(columns, rows, total)
    except duckdb.Error as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"query: {first}") from None
    finally:
        if con is not None:
            con.close()


READING = ("SELECT", "MULTI")
"""The statement types a query may hold (DuckDB's ``StatementType``): SELECT (also WITH,
FROM ..., VALUES, DESCRIBE, SHOW, SUMMARIZE) and MULTI (PIVOT); EXPLAIN [ANALYZE] of one of
them too."""
EXPLAIN = re.compile(r"\s*EXPLAIN\s+(?:ANALY[SZ]E\s+)?(?:\([^()]*\)\s*)?", re.IGNORECASE)


def check_read_only(sql: str) -> None:
    """Refuse SQL holding a statement that is not a reading one (:data:`READING`), in one
    line. DuckDB's allowed paths, which let a query read the parts, let it write them too:
    ``COPY ... TO '<a part>' (USE_TMP_FILE false)`` overwrote one; so no COPY, EXPORT,
    ATTACH, PRAGMA, CALL, CREATE, INSERT, SET... is run at all."""
    duckdb = load_duckdb()
    for statement in duckdb.extract_statements(sql):  # (a syntax error: duckdb.Error)
        kind = statement.type.name
        if kind == "EXPLAIN":
            shown = EXPLAIN.match(statement.query)
            inner = duckdb.extract_statements(statement.query[shown.end():]) if shown else []
            if len(inner) == 1 and inner[0].type.name in READING:
                continue
            kind = "EXPLAIN of anything but a SELECT"
        if kind not in READING:
            raise UsageError(f"query: {kind.replace('_', ' ')} statement refused: a query only "
                             "reads the catalogue (SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, "
                             "SUMMARIZE, PIVOT, EXPLAIN), it never writes a file")


def unique_names(names: list[str]) -> list[str]:
    """``names`` made unique as DuckDB makes a subquery's (``SELECT * FROM (SELECT 1 AS a,
    2 AS a)`` has ``a``, ``a_1``): a name already taken, whatever the case of its ASCII
    letters, gets the first free ``_<n>`` from 1. So a query's result has the names the same
    query has wrapped in ``SELECT * FROM (...)``, and no JSON object loses a value to a
    repeated key."""
    taken: set[str] = set()
    unique = []
    for name in names:
        chosen, number = name, 0
        while chosen.translate(_ASCII_LOWER) in taken:
            number += 1
            chosen = f"{name}_{number}"
        taken.add(chosen.translate(_ASCII_LOWER))
        unique.append(chosen)
    return unique


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
"""DuckDB's identifiers are case-insensitive in their ASCII letters only."""


def _parts(folder: Path) -> list[Path]:
    """The parts of one table, ``<folder>/study=<name>/part-0.parquet``, sorted."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as error:
        raise InputError(f"query: cannot list {folder} ({error.strerror})") from None
    return [Path(e.path) / PART for e in entries
            if e.name.startswith("study=") and (Path(e.path) / PART).is_file()]


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _empty(table: str) -> Any:
    """An empty Arrow table of ``table``'s columns (with ``study`` and ``schema_version``)."""
    import pyarrow as pa

    from auditor.catalog.store import studies_schema
    from auditor.report.tables import SCHEMAS

    schema = studies_schema() if table == "studies" else \
        SCHEMAS[table].append(pa.field("schema_version", pa.int64()))
    return schema.append(pa.field("study", pa.string())).empty_table()


def verdicts_sql(has_cause: bool) -> str:
    """The ``verdicts`` view; ``cause`` is null while the periods have no such column."""
    cause = "cause" if has_cause else "CAST(NULL AS VARCHAR)"
    return f"""
CREATE VIEW verdicts AS
SELECT study, workload || '@' || CAST(gpus AS VARCHAR) AS configuration, workload, gpus,
       verdict, reason, {cause} AS cause, count(*) AS periods
FROM periods
GROUP BY ALL
ORDER BY study, configuration, verdict, reason, cause
"""


def gpu_seconds_sql(columns: Container[str]) -> str:
    """The ``gpu_seconds`` view over a ``studies`` table of ``columns``: a figure is a lower
    bound (``at_least``) where some allocation records' length is unknown (the allocation's),
    or some attempt's invocation time (the attempts' scopes), as the report's "at least";
    unknown (null) for an audit catalogued before the column, and where no part has the
    column at all (a catalogue of older audits only)."""
    def bound(column: str) -> str:
        return f"coalesce({column} > 0, NULL)" if column in columns else "CAST(NULL AS BOOLEAN)"

    return "CREATE VIEW gpu_seconds AS\n" + "\nUNION ALL\n".join(
        f"SELECT study, '{scope}' AS scope, {scope}_gpu_seconds AS gpu_seconds, "
        f"{scope}_gpu_seconds / 3600 AS gpu_hours, "
        + bound("allocation_records_unknown" if scope == "allocation"
                else "attempts_without_times")
        + f" AS at_least, {order} AS scope_order FROM studies"
        for order, scope in enumerate(SCOPES)) + "\nORDER BY study, scope_order"

_FAILED = ", ".join(f"'{reason}'" for reason in FAILURE_REASONS)
SUSPECT_HARDWARE_SQL = f"""
CREATE VIEW suspect_hardware AS
WITH trials AS (
    SELECT study, subject, attempt,
           coalesce(outcome = 'unresolved' AND reason IN ({_FAILED}), false) AS failed
    FROM attempts),
used AS (
    SELECT DISTINCT 'node' AS kind, hostname AS unit, study, subject, attempt, hostname
    FROM devices WHERE hostname IS NOT NULL
    UNION ALL
    SELECT DISTINCT 'gpu' AS kind, gpu_uuid AS unit, study, subject, attempt, hostname
    FROM devices WHERE gpu_uuid IS NOT NULL),
per_unit AS (
    SELECT u.kind, u.unit, count(DISTINCT (u.study, u.subject, u.attempt)) AS attempts,
           count(DISTINCT (u.study, u.subject, u.attempt)) FILTER (WHERE t.failed) AS failures,
           list(DISTINCT u.study ORDER BY u.study) AS studies,
           list(DISTINCT u.hostname ORDER BY u.hostname) AS hosts
    FROM used u JOIN trials t USING (study, subject, attempt)
    GROUP BY u.kind, u.unit),
rates AS (
    SELECT kind, sum(failures) / sum(attempts) AS p0, count(*) AS units
    FROM per_unit GROUP BY kind),
tails AS (
    SELECT u.kind, u.unit,
           sum(exp(lgamma(u.attempts + 1) - lgamma(i + 1) - lgamma(u.attempts - i + 1)
                   + i * ln(greatest(r.p0, 1e-300))
                   + (u.attempts - i) * ln(greatest(1 - r.p0, 1e-300)))) AS tail
    FROM per_unit u JOIN rates r USING (kind), range(u.failures, u.attempts + 1) AS k(i)
    GROUP BY u.kind, u.unit)
SELECT u.kind, u.unit, u.attempts, u.failures,
       u.failures / u.attempts AS failure_rate,
       r.p0 AS catalogue_rate,
       u.attempts * r.p0 AS expected_failures,
       CASE WHEN u.failures = 0 OR r.p0 >= 1 THEN 1.0 ELSE least(t.tail, 1.0) END AS p_value,
       {ALPHA} / r.units AS threshold,
       coalesce(u.failures > 0 AND r.p0 < 1 AND t.tail < {ALPHA} / r.units, false) AS suspect,
       u.studies, u.hosts
FROM per_unit u JOIN rates r USING (kind) LEFT JOIN tails t USING (kind, unit)
ORDER BY u.kind DESC, p_value, u.unit
"""
