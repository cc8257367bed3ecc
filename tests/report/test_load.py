"""``auditor.load(DIR)``: an audit's outputs read back as DataFrames and its summary, only
once they match their output manifest."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

import auditor
from auditor import AuditOptions, run_audit, write_outputs
from auditor.errors import VerifyError
from auditor.model import TABLES
from auditor.report.tables import ROWS, SCHEMAS
from auditor.store.tables import KEPT_TABLES
from tests.helpers import copy_example


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("load")
    out = base / "out"
    write_outputs(run_audit(str(copy_example(base)), AuditOptions(jobs=1)), out, plots=False)
    return out


def test_load_gives_the_tables_and_the_summary_of_the_audit(audited: Path) -> None:
    loaded = auditor.load(audited)
    assert list(loaded.tables) == list(TABLES)
    for name in TABLES:  # (the written file, read by pandas itself, is the same frame)
        pd.testing.assert_frame_equal(loaded.tables[name],
                                      pd.read_parquet(audited / f"{name}.parquet"))
    assert loaded.periods is loaded.tables["periods"]
    assert len(loaded.periods) == 18
    assert loaded.summary["gate"]["passed"] is False
    assert loaded.summary["verdicts"] == {"resolved": 0, "failed": 9, "unresolved": 9}
    manifest = (audited / "output_manifest.json").read_bytes()
    assert loaded.manifest_sha256 == hashlib.sha256(manifest).hexdigest()
    text = repr(loaded)
    assert "periods 18" in text and "\n" not in text
    with pytest.raises(AttributeError, match="tables: periods, findings"):
        loaded.no_such_table  # noqa: B018


def test_every_table_has_its_schema_and_rows() -> None:
    assert set(SCHEMAS) == set(ROWS) | set(KEPT_TABLES) == set(TABLES)
    assert not set(ROWS) & set(KEPT_TABLES)


def _copy(audited: Path, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(audited, out)
    return out


def test_a_changed_table_is_never_loaded(audited: Path, tmp_path: Path) -> None:
    out = _copy(audited, tmp_path)
    table = out / "periods.parquet"
    table.write_bytes(table.read_bytes() + b"\0")
    with pytest.raises(VerifyError, match=r"periods\.parquet changed .*nothing loaded"):
        auditor.load(out)


def test_an_added_or_missing_output_is_refused(audited: Path, tmp_path: Path) -> None:
    out = _copy(audited, tmp_path)
    (out / "notes.txt").write_text("mine")
    with pytest.raises(VerifyError, match="notes.txt added"):
        auditor.load(out)
    (out / "notes.txt").unlink()
    (out / "summary.json").unlink()
    with pytest.raises(VerifyError, match="summary.json missing"):
        auditor.load(out)


def test_a_directory_that_is_no_audit_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="no output_manifest.json"):
        auditor.load(tmp_path)
    with pytest.raises(VerifyError, match="not a directory"):
        auditor.load(tmp_path / "absent")


def test_the_inputs_are_checked_when_asked(tmp_path: Path) -> None:
    study = copy_example(tmp_path)
    out = tmp_path / "out"
    write_outputs(run_audit(str(study), AuditOptions(jobs=1)), out, plots=False)
    trace = next(study.glob("*/attempt-*/allocator-traces/*.jsonl"))
    trace.write_bytes(trace.read_bytes() + b"\n")
    assert len(auditor.load(out).periods) == 18  # (outputs only, by default)
    with pytest.raises(VerifyError, match=r"allocator-.*\.jsonl changed"):
        auditor.load(out, inputs=True)


def test_a_table_changed_after_it_was_verified_is_never_loaded(
        audited: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bytes parsed are the bytes checked: a table swapped between the verification
    and the reading (a race with another writer) is refused too."""
    from auditor.report import load as loading

    out = _copy(audited, tmp_path)
    verify = loading.verify_outputs

    def verify_then_change(*args: object, **kwargs: bool) -> object:
        found = verify(*args, **kwargs)  # type: ignore[arg-type]
        table = out / "findings.parquet"
        table.write_bytes(table.read_bytes()[:-1] + b"X")
        return found

    monkeypatch.setattr(loading, "verify_outputs", verify_then_change)
    with pytest.raises(VerifyError, match=r"findings\.parquet: changed while it was read"):
        auditor.load(out)


def _repin(out: Path, name: str, data: bytes) -> None:
    """Replace output ``name`` by ``data`` and pin it in the manifest (a forger's edit:
    the directory then verifies)."""
    import orjson

    (out / name).write_bytes(data)
    manifest = orjson.loads((out / "output_manifest.json").read_bytes())
    for item in manifest["outputs"]:
        if item["path"] == name:
            item.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    (out / "output_manifest.json").write_bytes(orjson.dumps(manifest))


@pytest.mark.parametrize(("name", "data", "says"), [
    ("periods.parquet", b"PAR1 not a table", "cannot be read as what its name says"),
    ("summary.json", b"{nope", "cannot be read as what its name says"),
    ("summary.json", b"[1]", "summary.json: not a JSON object"),
])
def test_an_output_pinned_but_not_what_its_name_says_is_one_line(
        audited: Path, tmp_path: Path, name: str, data: bytes, says: str) -> None:
    out = _copy(audited, tmp_path)
    _repin(out, name, data)
    with pytest.raises(VerifyError, match=says):
        auditor.load(out)


def _parquet(table: object, **options: object) -> bytes:
    """``table`` (a pyarrow Table) as the bytes of a Parquet file."""
    import io

    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(table, sink, **options)
    return sink.getvalue()


def test_a_pinned_table_is_read_as_its_columns_whatever_pandas_metadata_it_claims(
        audited: Path, tmp_path: Path) -> None:
    """The audit writes no pandas metadata: a forger's, re-pinned, made pandas raise its own
    error (a JSONDecodeError, a TypeError) out of ``load``; it is not obeyed."""
    import pyarrow.parquet as pq

    out = _copy(audited, tmp_path)
    table = pq.read_table(audited / "periods.parquet")
    for claimed in (b"{not json", b'{"columns": 5, "index_columns": ["nope"]}'):
        forged = table.replace_schema_metadata({**table.schema.metadata, b"pandas": claimed})
        _repin(out, "periods.parquet", _parquet(forged))
        pd.testing.assert_frame_equal(auditor.load(out).periods,
                                      pd.read_parquet(audited / "periods.parquet"))


def _not_utf8_name(table: object) -> bytes:
    """``table`` as Parquet bytes whose column ``reason`` is named with a byte not UTF-8."""
    names = table.column_names  # type: ignore[attr-defined]
    renamed = table.rename_columns(  # type: ignore[attr-defined]
        ["zzzzzzzz" if name == "reason" else name for name in names])
    data = _parquet(renamed, store_schema=False)
    return data.replace(b"zzzzzzzz", b"\xffzzzzzzz")


def _not_utf8_text(table: object) -> bytes:
    """``table`` as Parquet bytes whose column ``reason`` holds text not UTF-8 (written
    from raw buffers: pyarrow checks the text it is given otherwise)."""
    import pyarrow as pa

    rows = table.num_rows  # type: ignore[attr-defined]
    offsets = pa.array(range(0, 2 * rows + 1, 2), type=pa.int32()).buffers()[1]
    raw = pa.py_buffer(b"\xff\xfe" * rows)
    text = pa.Array.from_buffers(pa.string(), rows, [None, offsets, raw])
    index = table.schema.get_field_index("reason")  # type: ignore[attr-defined]
    return _parquet(table.set_column(index, "reason", text))  # type: ignore[attr-defined]


@pytest.mark.parametrize("make", [_not_utf8_name, _not_utf8_text], ids=["name", "text"])
def test_a_pinned_table_not_utf8_is_one_line_naming_it(
        audited: Path, tmp_path: Path, make: Callable[[object], bytes]) -> None:
    """A column name not UTF-8 made ``load`` raise a UnicodeDecodeError; text not UTF-8 was
    loaded, and failed where the frame was used."""
    import pyarrow.parquet as pq

    out = _copy(audited, tmp_path)
    _repin(out, "periods.parquet", make(pq.read_table(audited / "periods.parquet")))
    with pytest.raises(VerifyError, match=r"periods\.parquet: pinned by its output_manifest"
                       r"\.json, yet it cannot be read as what its name says") as raised:
        auditor.load(out)
    assert "\n" not in str(raised.value)


def test_an_output_pinned_but_unreadable_is_named(audited: Path, tmp_path: Path) -> None:
    """The refusal names the file that cannot be read (it named the directory alone), on
    one line (pyarrow's message ended in a newline)."""
    out = _copy(audited, tmp_path)
    data = (audited / "devices.parquet").read_bytes()
    _repin(out, "devices.parquet", data[:-9] + b"\0\0\0\0PAR1")
    with pytest.raises(VerifyError) as raised:
        auditor.load(out)
    message = str(raised.value)
    assert message.startswith(f"{out / 'devices.parquet'}: pinned by its output_manifest.json")
    assert "\n" not in message


def test_a_manifest_nested_past_pythons_recursion_limit_is_read_or_refused_in_one_line(
        audited: Path, tmp_path: Path) -> None:
    """orjson parses 1,024 levels, more than Python's recursion limit: the schema check of
    such a manifest raised a RecursionError out of ``load``."""
    out = _copy(audited, tmp_path)
    manifest = (out / "output_manifest.json").read_bytes().rstrip()
    deep = b"[" * 1000 + b"]" * 1000
    (out / "output_manifest.json").write_bytes(manifest[:-1] + b', "extra": ' + deep + b"}\n")
    assert len(auditor.load(out).periods) == 18  # (a key it does not know: not its business)
    (out / "output_manifest.json").write_bytes(
        manifest.replace(b'"outputs": [', b'"outputs": [' + deep + b",", 1))
    with pytest.raises(VerifyError, match="malformed manifest: .*nested too deep to check"):
        auditor.load(out)
