"""Add finished audits to a catalogue: ``CAT/<table>/study=<name>/part-0.parquet``.

Each audit is verified first (:func:`auditor.report.output.verify_outputs`: every output and
input it lists is re-hashed); one that fails is refused and nothing is written. Its tables
(``periods``, ``attempts``, ``findings``, ``evidence``, ``phases``, ``devices``) are copied
with a ``schema_version`` column, and ``studies`` gets one row from its ``summary.json``
(verdict counts, the accounting's scopes, the gate). The study's name is the summary's
(``--name`` overrides it); it must be a safe partition name.

A study is identified by its inputs: the digest of every input the output manifest lists
(path, SHA-256, size). Adding an audit under a name the catalogue holds for *other* inputs
is refused (``--name`` tells them apart); under the same inputs it replaces the entry. Each
partition is written beside its place and renamed in; ``CAT/catalog.json`` records what
was added (name, source, digests, the time: the only place a time is kept).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from auditor._io import regular_bytes
from auditor._signals import signals_deferred
from auditor._text import printable, printable_json
from auditor.errors import InputError, OutputError, UsageError
from auditor.model.results import TABLES

AUDIT_TABLES = TABLES
"""The audit's own tables the catalogue copies."""
CATALOG_TABLES = (*AUDIT_TABLES, "studies")
"""Every table of a catalogue (``studies``: one row per study, from ``summary.json``)."""
SCHEMA_VERSION = 1
"""``schema_version`` of a part holding every column this auditor writes; a part of an
earlier layout (a column or more absent: queries read them as null) has 0."""
CATALOG_JSON = "catalog.json"
CATALOG_SCHEMA = "auditor/catalog/v1"
PART = "part-0.parquet"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
"""A study name that is a safe partition directory (``study=<name>``) as it is."""
BATCH_ROWS = 65_536


@dataclass(frozen=True, slots=True)
class Audit:
    """One verified audit, ready to be added."""

    source: Path
    name: str
    summary: dict[str, Any]
    summary_sha256: str
    input_sha256: str
    root: str


@dataclass(frozen=True, slots=True)
class Added:
    """What adding one audit did."""

    name: str
    source: str
    replaced: bool
    rows: dict[str, int]


def add_audits(outs: list[Path], into: Path, name: str | None = None,
               replace: bool = False) -> list[Added]:
    """Verify every audit of ``outs``, then add them all to the catalogue ``into``.
    ``replace``: a study the catalogue holds under the same name from other inputs (an
    audit of the study since more evidence came: a capture made again) is replaced by the
    new audit; else that is refused (two studies sharing a name)."""
    if name is not None and len(outs) != 1:
        raise UsageError("catalog: --name names one audit; give one OUT with it")
    audits = [_verified(out, name) for out in outs]
    _check_batch(audits)
    into = Path(os.path.abspath(into))
    for audit in audits:
        _check_place(into, audit)
    _check_stranger(into)
    try:
        into.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"catalog: cannot make {into} ({error.strerror or error})") from None
    with _locked(into):
        entries = _read_catalog(into)
        for audit in audits:
            if not replace:
                _check_clash(audit, entries.get(audit.name), into)
            else:
                _check_same_root(audit, entries.get(audit.name), into)
        return _write(into, audits, entries)


def _verified(out: Path, name: str | None) -> Audit:
    """``out`` verified and read; refused with one line when it fails verification."""
    from auditor.report.output import MANIFEST, verify_outputs

    try:  # (verify would wait for ever on a FIFO put in the manifest's place)
        regular_bytes(out / MANIFEST, read=False, follow=False)
    except FileNotFoundError:
        pass  # (verify says so)
    except OSError as error:
        raise InputError(f"catalog: {out / MANIFEST}: unreadable ({error.strerror})") from None
    differences, _ = verify_outputs(out)
    if differences:
        first = differences[0]
        raise InputError(
            f"catalog: {out} fails verification ({len(differences)} difference(s), first: "
            f"{first.what} {first.group}/{first.path}); nothing was added (see 'auditor "
            f"verify {out}')")
    try:
        data = regular_bytes(out / "summary.json", follow=False)
        summary = orjson.loads(data)
        manifest = orjson.loads(regular_bytes(out / MANIFEST, follow=False))
    except (OSError, orjson.JSONDecodeError) as error:
        raise InputError(f"catalog: {out}: unreadable summary or manifest ({error})") from None
    problem = summary_problem(summary)
    if problem is not None:  # (its manifest may pin it: a forger can re-pin what he edits)
        raise InputError(f"catalog: {out / 'summary.json'}: {problem}; nothing was added")
    chosen = name if name is not None else summary.get("study")
    if not isinstance(chosen, str) or not NAME.fullmatch(chosen):
        raise UsageError(f"catalog: {out}: the study name {chosen!r} cannot name a partition "
                         "(letters, digits, '.', '_', '+', '-'; not first a dot); give --name")
    inputs = hashlib.sha256()
    for group in ("raw_evidence", "source_inputs", "protocol_inputs"):
        for item in sorted(manifest.get(group, []), key=lambda i: i["path"]):
            inputs.update(orjson.dumps([group, item["path"], item["sha256"], item["size"]]))
    return Audit(Path(os.path.abspath(out)), chosen, summary, hashlib.sha256(data).hexdigest(),
                 inputs.hexdigest(), str(manifest.get("root", "")))


COUNT_MAX = (1 << 63) - 1
"""The largest count a ``studies`` column (int64) holds."""
SUMMARY_FIELDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("study",), "string"), (("auditor_version",), "string"), (("partial",), "boolean"),
    (("launches",), "count"), (("periods",), "array"),
    (("verdicts",), "object"),
    *((("verdicts", verdict), "count") for verdict in ("resolved", "failed", "unresolved")),
    (("configurations_resolved",), "count"), (("configurations_total",), "count"),
    (("accounting",), "object"),
    *((("accounting", f"{scope}_gpu_seconds"), "number") for scope in (
        "allocation", "task", "reservation", "wasted", "unresolved")),
    (("accounting", "wasted_attempts"), "count"),
    (("gate",), "object"), (("gate", "passed"), "boolean"),
    (("gate_allow_partial",), "object"), (("gate_allow_partial", "passed"), "boolean"),
)
"""Every field of ``summary.json`` the catalogue reads (a JSON pointer's keys) and what it
must be when present and not null (an older audit's summary may lack one)."""
WANTED = {"string": "a string", "boolean": "a boolean", "array": "an array",
          "object": "an object", "number": "a number",
          "count": f"a whole number from 0 to {COUNT_MAX}"}


def summary_problem(summary: Any) -> str | None:
    """What is wrong with the fields of ``summary`` the catalogue reads (the first, as
    ``<JSON pointer>: expected ..., found ...``); None when nothing is."""
    from auditor.schema import json_text, json_type, pointer_of

    if not isinstance(summary, dict):
        return f"expected an object, found {json_type(summary)}"
    for keys, kind in SUMMARY_FIELDS:
        parent = summary
        for key in keys[:-1]:
            parent = parent.get(key) or {}  # (an ill-typed parent was refused first)
        value = parent.get(keys[-1])
        if value is None or _is_kind(value, kind):
            continue
        return (f"{pointer_of(keys)}: expected {WANTED[kind]} or null, found "
                f"{json_type(value)} {json_text(value, 40)}")
    return None


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "count":
        return type(value) is int and 0 <= value <= COUNT_MAX
    if kind == "number":
        return type(value) in (int, float)
    types = {"string": str, "boolean": bool, "array": list, "object": dict}
    return type(value) is types[kind]


def _check_batch(audits: list[Audit]) -> None:
    """Refuse two audits of one command that share a name but not their inputs."""
    seen: dict[str, Audit] = {}
    for audit in audits:
        other = seen.setdefault(audit.name, audit)
        if other.input_sha256 != audit.input_sha256:
            raise UsageError(f"catalog: {other.source} and {audit.source} are audits of "
                             f"different studies both named {audit.name!r}; add them one at "
                             "a time with --name to tell them apart")


def _check_place(into: Path, audit: Audit) -> None:
    """The catalogue must not be inside an audit's output or under its evidence root."""
    place = into.resolve()
    for where, what in ((audit.source, "the audit's output"), (Path(audit.root), "the "
                                                                "evidence root")):
        where = where.resolve()
        if place == where or where in place.parents:
            raise UsageError(f"catalog: {into} is inside {what} {where}; put the catalogue "
                             "elsewhere")
    if into.exists() and not into.is_dir():
        raise UsageError(f"catalog: {into} exists and is not a directory")


def _check_clash(audit: Audit, entry: dict[str, Any] | None, into: Path) -> None:
    if entry is not None and entry.get("input_sha256") != audit.input_sha256:
        raise UsageError(
            f"catalog: {into} already holds a study named {audit.name!r} (from "
            f"{entry.get('source')}) with other inputs than {audit.source}; give --name "
            "to tell them apart, or --replace where this audit supersedes it")


def _check_same_root(audit: Audit, entry: dict[str, Any] | None, into: Path) -> None:
    """``--replace`` takes a later audit of the study the catalogue holds: of the same
    evidence root (another root under that name is another study, which it would drop)."""
    if entry is not None and entry.get("evidence_root") != audit.root:
        raise UsageError(
            f"catalog: {into}'s study {audit.name!r} is of the evidence root "
            f"{entry.get('evidence_root')!r}, {audit.source}'s of {audit.root!r}: --replace "
            "takes a later audit of the same root; give --name for another study")


@contextlib.contextmanager
def _locked(into: Path) -> Iterator[None]:
    """Hold the catalogue's lock (``CAT/.lock``, a regular file, never a link followed out
    of the catalogue): one writer at a time."""
    path = into / ".lock"
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK,
                             0o644)
    except OSError as error:
        raise InputError(f"catalog: {path}: cannot be opened ({error.strerror}); is it a "
                         "link? remove it") from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise InputError(f"catalog: {path}: not a regular file; remove it")
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def _check_stranger(into: Path) -> None:
    """Refuse a directory that holds something and is no catalogue."""
    try:
        if not into.is_dir() or (into / CATALOG_JSON).exists():
            return
        stray = sorted(p.name for p in into.iterdir() if p.name != ".lock")
    except OSError as error:
        raise InputError(f"catalog: cannot read {into} ({error.strerror or error})") from None
    if stray:
        raise UsageError(f"catalog: {into} is not empty and has no {CATALOG_JSON} (it holds "
                         f"{stray[0]}); choose a new or empty directory")


def _read_catalog(into: Path) -> dict[str, dict[str, Any]]:
    """The catalogue's entries by name (none for a new, empty one)."""
    path = into / CATALOG_JSON
    try:
        document = orjson.loads(regular_bytes(path))
    except FileNotFoundError:
        _check_stranger(into)  # (again: under the lock)
        return {}
    except OSError as error:
        raise InputError(f"catalog: {path}: unreadable ({error.strerror})") from None
    except orjson.JSONDecodeError as error:
        raise InputError(f"catalog: {path}: unreadable ({error})") from None
    if not isinstance(document, dict) or document.get("schema") != CATALOG_SCHEMA:
        raise InputError(f"catalog: {path}: not an auditor catalogue")
    studies = document.get("studies", [])
    if not isinstance(studies, list) or not all(
            isinstance(entry, dict) and isinstance(entry.get("name"), str)
            and NAME.fullmatch(entry["name"]) for entry in studies):
        raise InputError(f"catalog: {path}: its 'studies' are not a list of entries each "
                         "with a study's name; not a catalogue 'auditor catalog' wrote")
    return {entry["name"]: entry for entry in studies}


def catalog_entries(into: Path) -> list[dict[str, Any]]:
    """What ``CAT/catalog.json`` records, sorted by name."""
    return [entries for _, entries in sorted(_read_catalog(into).items())]


def _write(into: Path, audits: list[Audit], entries: dict[str, dict[str, Any]]) -> list[Added]:
    """Stage every partition, then rename them into place and rewrite ``catalog.json``."""
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{os.getpid()}-", dir=into))
    try:
        staged: dict[str, dict[str, tuple[int, int, list[str]]]] = {}
        for audit in audits:  # (a name given twice: the last audit of it wins)
            staged[audit.name] = _stage(audit, staging / audit.name)
        done: list[Added] = []
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        with signals_deferred():  # a few renames: never left half done
            for audit in {a.name: a for a in audits}.values():
                tables = staged[audit.name]
                for table in CATALOG_TABLES:
                    _swap(staging / audit.name / table, into / table / f"study={audit.name}",
                          staging / "old" / audit.name / table)
                done.append(Added(audit.name, str(audit.source), audit.name in entries,
                                  {t: rows for t, (rows, _, _) in tables.items()}))
                entries[audit.name] = {
                    "name": audit.name, "source": str(audit.source),
                    "evidence_root": audit.root, "summary_sha256": audit.summary_sha256,
                    "input_sha256": audit.input_sha256,
                    "auditor_version": audit.summary.get("auditor_version"),
                    "added_utc": now,
                    "tables": {t: {"rows": rows, "schema_version": version,
                                   "missing_columns": missing}
                               for t, (rows, version, missing) in sorted(tables.items())},
                }
            _write_catalog(into, entries)
        return done
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _swap(new: Path, target: Path, trash: Path) -> None:
    """Put the staged partition ``new`` at ``target`` (an earlier one moved to ``trash``);
    with nothing staged (the audit has no such table), an earlier partition is removed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(target, trash)
    if new.exists():
        os.rename(new, target)


def _write_catalog(into: Path, entries: dict[str, dict[str, Any]]) -> None:
    document = {"schema": CATALOG_SCHEMA,
                "studies": [entries[name] for name in sorted(entries)]}
    temporary = into / f".{CATALOG_JSON}.tmp-{os.getpid()}"
    # (an output directory's name that is not UTF-8 written printable, as manifests do)
    temporary.write_bytes(orjson.dumps(printable_json(document), option=orjson.OPT_INDENT_2)
                          + b"\n")
    os.replace(temporary, into / CATALOG_JSON)


def _stage(audit: Audit, where: Path) -> dict[str, tuple[int, int, list[str]]]:
    """Write the audit's partitions under ``where/<table>/``; (rows, schema version,
    missing columns) per table written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from auditor.report.tables import SCHEMAS

    written: dict[str, tuple[int, int, list[str]]] = {}
    for table in AUDIT_TABLES:
        source = audit.source / f"{table}.parquet"
        if not source.is_file():  # (an audit older than the table)
            continue
        with contextlib.ExitStack() as stack:
            try:  # (opened here: pyarrow takes no name that is not UTF-8; Python does)
                reader = pq.ParquetFile(stack.enter_context(open(source, "rb")))
            except (OSError, pa.ArrowException, UnicodeDecodeError) as error:  # (a column
                # name not UTF-8: pyarrow decodes it as it opens the file)
                raise InputError(f"catalog: {printable(str(source))}: unreadable table "
                                 f"({' '.join(str(error).split())}); nothing was added"
                                 ) from None
            names = reader.schema_arrow.names
            problem = _column_problem(reader.schema_arrow, SCHEMAS[table],
                                      VIEW_COLUMNS.get(table, ()))
            if problem is not None:  # (its manifest may pin it: a forger can re-pin it)
                raise InputError(f"catalog: {printable(str(source))}: {problem}; nothing "
                                 "was added")
            missing = [n for n in SCHEMAS[table].names if n not in names]
            version = 0 if missing else SCHEMA_VERSION
            schema = reader.schema_arrow.append(pa.field("schema_version", pa.int64(), False))
            rows = _copy(reader, schema, version, where / table, source)
        written[table] = (rows, version, missing)
    written["studies"] = (_write_studies(audit, where / "studies"), SCHEMA_VERSION, [])
    return written


OWN_COLUMNS = ("study", "schema_version")
"""Columns the catalogue gives every part (``study`` from the partition's name)."""
VIEW_COLUMNS = {"periods": ("workload", "gpus", "verdict", "reason"),
                "attempts": ("subject", "attempt", "outcome", "reason"),
                "devices": ("subject", "attempt", "hostname", "gpu_uuid")}
"""The columns of each table the built-in views (:mod:`auditor.catalog.query`) read, which
every audit has written: a catalogue where no part has one answers no query at all."""


def _column_problem(found: Any, expected: Any, needed: tuple[str, ...] = ()) -> str | None:
    """What keeps a table of schema ``found`` out of the catalogue, where the audit writes
    ``expected``: a column of another type (one study's would change the column's type for
    every study: DuckDB reads ``union_by_name`` a column of text and one of numbers as
    text), a name given twice, a column the catalogue adds itself, or one of ``needed`` (the
    built-in views') absent. Another column absent (an older audit's) or unknown (a newer
    one's) is not a problem."""
    names = found.names
    for name in needed:
        if name not in names:
            return f"no column {name!r}, which every audit writes; is it an audit's table?"
    for name in names:
        if names.count(name) > 1:
            return f"column {name!r} is there more than once; is it an audit's table?"
        if name in OWN_COLUMNS:
            return f"a column {name!r}, which the catalogue adds itself; is it an audit's table?"
        if name in expected.names and found.field(name).type != expected.field(name).type:
            return (f"column {name!r} is {found.field(name).type}, not "
                    f"{expected.field(name).type}; is it an audit's table?")
    return None


def _copy(reader: Any, schema: Any, version: int, folder: Path, source: Path) -> int:
    """Copy ``reader``'s rows (of the table ``source``), a batch at a time, with the
    ``schema_version`` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.rmtree(folder, ignore_errors=True)  # (a study given twice: the last wins)
    folder.mkdir(parents=True)
    rows = 0
    batches = reader.iter_batches(batch_size=BATCH_ROWS)
    with open(folder / PART, "wb") as sink, \
            pq.ParquetWriter(sink, schema, compression="zstd") as writer:
        while (batch := _next_batch(batches, source)) is not None:
            column = pa.array([version] * batch.num_rows, type=pa.int64())
            writer.write_batch(pa.RecordBatch.from_arrays([*batch.columns, column],
                                                          schema=schema))
            rows += batch.num_rows
    return rows


def _next_batch(batches: Iterator[Any], source: Path) -> Any:
    """The next batch of ``batches`` (``source``'s rows), validated whole; None after the
    last. A page that cannot be read, or text that is not UTF-8, is refused in one line (a
    forger may re-pin the table; text not UTF-8 copied in made every query of the
    catalogue that read its column fail, every study's)."""
    import pyarrow as pa

    try:
        batch = next(batches, None)
        if batch is not None:
            batch.validate(full=True)
    except (OSError, pa.ArrowException, UnicodeDecodeError) as error:  # (pyarrow says a
        # page it cannot read with an OSError)
        raise InputError(f"catalog: {printable(str(source))}: unreadable table "
                         f"({' '.join(str(error).split())}); nothing was added") from None
    return batch


def _write_studies(audit: Audit, folder: Path) -> int:
    """One ``studies`` row from the summary: counts, the accounting's scopes, the gate."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    summary = audit.summary
    verdicts = summary.get("verdicts") or {}
    accounting = summary.get("accounting") or {}
    row: dict[str, Any] = {
        "auditor_version": summary.get("auditor_version"),
        "partial": summary.get("partial"),
        "launches": summary.get("launches"),
        "periods": len(summary.get("periods") or []),
        "resolved": verdicts.get("resolved"),
        "failed": verdicts.get("failed"),
        "unresolved": verdicts.get("unresolved"),
        "configurations_resolved": summary.get("configurations_resolved"),
        "configurations_total": summary.get("configurations_total"),
        **{f"{scope}_gpu_seconds": _number(accounting.get(f"{scope}_gpu_seconds"))
           for scope in SCOPES},
        "wasted_attempts": accounting.get("wasted_attempts"),
        "allocation_records_unknown": accounting.get("allocation_records_unknown"),
        "attempts_without_times": accounting.get("attempts_without_times"),
        "requeued_gpu_seconds": _number(accounting.get("requeued_gpu_seconds")),
        "outside_array_gpu_seconds": _number(accounting.get("outside_array_gpu_seconds")),
        "jobs_without_element": _strings(accounting.get("jobs_without_element")),
        "gate_passed": (summary.get("gate") or {}).get("passed"),
        "gate_allow_partial_passed": (summary.get("gate_allow_partial") or {}).get("passed"),
        "gate_included_configurations": _strings(
            (summary.get("gate") or {}).get("included_configurations")),
        "gate_allow_partial_included_configurations": _strings(
            (summary.get("gate_allow_partial") or {}).get("included_configurations")),
        "summary_sha256": audit.summary_sha256,
        "input_sha256": audit.input_sha256,
        "schema_version": SCHEMA_VERSION,
    }
    table = pa.Table.from_pylist([row], schema=studies_schema())
    shutil.rmtree(folder, ignore_errors=True)  # (a study given twice: the last wins)
    folder.mkdir(parents=True)
    with open(folder / PART, "wb") as sink:
        pq.write_table(table, sink, compression="zstd")
    return 1


def _strings(value: Any) -> list[str] | None:
    """A list of strings as the summary gives it; None for anything else (an older
    summary without the key)."""
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


SCOPES = ("allocation", "task", "reservation", "wasted", "unresolved")
"""The accounting's GPU-second scopes (they overlap: never to be added together)."""


def studies_schema() -> Any:
    """The Arrow schema of the ``studies`` table."""
    import pyarrow as pa

    counts = ("launches", "periods", "resolved", "failed", "unresolved",
              "configurations_resolved", "configurations_total")
    return pa.schema([
        pa.field("auditor_version", pa.string()),
        pa.field("partial", pa.bool_()),
        *(pa.field(name, pa.int64()) for name in counts),
        *(pa.field(f"{scope}_gpu_seconds", pa.float64()) for scope in SCOPES),
        pa.field("wasted_attempts", pa.int64()),
        pa.field("allocation_records_unknown", pa.int64()),
        pa.field("attempts_without_times", pa.int64()),
        pa.field("requeued_gpu_seconds", pa.float64()),
        pa.field("outside_array_gpu_seconds", pa.float64()),
        pa.field("jobs_without_element", pa.list_(pa.string())),
        pa.field("gate_passed", pa.bool_()),
        pa.field("gate_allow_partial_passed", pa.bool_()),
        pa.field("gate_included_configurations", pa.list_(pa.string())),
        pa.field("gate_allow_partial_included_configurations", pa.list_(pa.string())),
        pa.field("summary_sha256", pa.string()),
        pa.field("input_sha256", pa.string()),
        pa.field("schema_version", pa.int64(), False),
    ])

