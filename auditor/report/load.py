"""An audit's outputs read back for analysis: ``auditor.load(DIR)``.

Its tables come back as pandas DataFrames and its ``summary.json`` as a dict, and only once
the directory has been verified against its output manifest (what ``auditor verify`` checks:
every output's SHA-256 and size, nothing added, nothing missing), each file's bytes checked
again as they are parsed: a table changed after the audit wrote it is never analysed as if
it were the audit's.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from auditor._io import regular_bytes
from auditor.errors import VerifyError
from auditor.model.results import TABLES
from auditor.report.output import MANIFEST, verify_outputs

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class LoadedAudit:
    """An audit's outputs, verified: its tables by name (``loaded.periods`` or
    ``loaded.tables["periods"]``) and its summary."""

    out: Path
    """The output directory."""
    summary: Mapping[str, Any]
    """``summary.json``: verdict counts, configurations, the gate (``summary["gate"]``)."""
    tables: Mapping[str, pd.DataFrame]
    """Every table the audit wrote (``periods``, ``findings``, ``evidence``, ``attempts``,
    ``phases``, ``devices``), one DataFrame each; a table an older auditor did not write
    is absent."""
    manifest_sha256: str
    """The SHA-256 of ``output_manifest.json``, as ``auditor verify`` prints it: what to
    quote when citing this audit."""

    def __getattr__(self, name: str) -> pd.DataFrame:
        # (only reached for names that are no field: the tables by attribute)
        tables = object.__getattribute__(self, "tables")
        if name in tables:
            table: pd.DataFrame = tables[name]
            return table
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r} (tables: "
                             f"{', '.join(tables)})")

    def __repr__(self) -> str:
        counts = ", ".join(f"{name} {len(frame):,}" for name, frame in self.tables.items())
        return f"<LoadedAudit {self.out}: {counts}; manifest {self.manifest_sha256[:16]}…>"


def load(out: Path | str, inputs: bool = False) -> LoadedAudit:
    """Verify the audit output directory ``out`` against its manifest (and, with ``inputs``,
    every evidence and input file it lists, as ``auditor verify`` does), then read its tables
    and summary. Raises :class:`~auditor.errors.VerifyError` (one line naming what differs)
    when anything does, or when ``out`` is no audit's output."""
    out = Path(out)
    manifest_bytes = _read(out / MANIFEST) if os.path.lexists(out / MANIFEST) else None
    manifest = None  # (parsed once: a million files' manifest is hundreds of megabytes)
    if manifest_bytes is not None:
        with contextlib.suppress(orjson.JSONDecodeError):  # (verify says what is wrong)
            manifest = orjson.loads(manifest_bytes)
    differences, _ = verify_outputs(out, inputs=inputs, manifest=manifest)
    if differences:
        first = differences[0]
        more = f" and {len(differences) - 1:,} more" if len(differences) > 1 else ""
        raise VerifyError(f"{out}: {first.path} {first.what}"
                          f"{f' ({first.detail})' if first.detail else ''}{more}, against "
                          f"its {MANIFEST}; nothing loaded ('auditor verify {out}' lists all)")
    if manifest is None or manifest_bytes is None or _read(out / MANIFEST) != manifest_bytes:
        raise VerifyError(f"{out / MANIFEST}: changed while it was read; nothing loaded")
    # (the manifest verified is the one read: its entries pin every byte parsed below)
    listed = {item["path"]: (item["sha256"], item["size"]) for item in manifest["outputs"]}
    tables = {name: _parsed(out, f"{name}.parquet", listed, _frame)
              for name in TABLES if f"{name}.parquet" in listed}
    summary = _parsed(out, "summary.json", listed, orjson.loads)
    if not isinstance(summary, dict):
        raise VerifyError(f"{out / 'summary.json'}: not a JSON object; nothing loaded")
    return LoadedAudit(out, summary, tables, hashlib.sha256(manifest_bytes).hexdigest())


def _parsed(out: Path, name: str, listed: Mapping[str, tuple[str, int]],
            parse: Callable[[bytes], Any]) -> Any:
    """Output ``name`` checked against the manifest (:func:`_checked`), then ``parse``d; a
    file pinned yet not what its name says (a forger re-pinned it) is a one-line
    :class:`VerifyError` naming it."""
    import pyarrow as pa

    data = _checked(out, name, listed)
    try:
        return parse(data)
    except (pa.ArrowException, orjson.JSONDecodeError, OSError, UnicodeDecodeError) as error:
        said = " ".join(str(error).split())  # (pyarrow's messages may span lines)
        raise VerifyError(f"{out / name}: pinned by its {MANIFEST}, yet it cannot be read as "
                          f"what its name says ({said}); nothing loaded") from None


def _frame(data: bytes) -> pd.DataFrame:
    """The Parquet table ``data`` as a DataFrame of its Arrow schema's columns. Its pandas
    metadata, which the audit never writes, is dropped unread: a forger's, re-pinned in the
    manifest, made pandas raise its own errors (a JSONDecodeError, a TypeError) past the
    one-line refusal, or rebuilt an index it invented."""
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(data))
    table.validate(full=True)  # (text not UTF-8 was loaded, then failed where it was used)
    kept = {key: value for key, value in (table.schema.metadata or {}).items()
            if key != b"pandas"}
    return table.replace_schema_metadata(kept or None).to_pandas()


def _read(path: Path) -> bytes:
    try:
        return regular_bytes(path, follow=False)
    except OSError as error:
        raise VerifyError(f"{path}: cannot read ({error.strerror or error})") from None


def _checked(out: Path, name: str, listed: Mapping[str, tuple[str, int]]) -> bytes:
    """The bytes of output ``name``, read once and checked against the manifest as they are
    parsed (the file could have changed since it was verified)."""
    if name not in listed:
        raise VerifyError(f"{out}: its {MANIFEST} lists no {name}; is this an audit's output?")
    data = _read(out / name)
    sha256, size = listed[name]
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
        raise VerifyError(f"{out / name}: changed while it was read (it no longer matches "
                          f"its {MANIFEST}); nothing loaded")
    return data
