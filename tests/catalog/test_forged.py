"""Audits whose files were edited and re-pinned in their output manifest (so that
``auditor verify`` passes) into something no audit writes: an ill-typed ``summary.json``
for ``auditor catalog``, an ill-typed ``periods.parquet`` for ``auditor rerun``. Each is
refused in one line naming the file and what is wrong, exit 2 (they crashed, exit 3)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from auditor._cli import main
from tests.catalog.studies import audited, fifo_in_place_of, repin
from tests.helpers import copy_example


@pytest.fixture(scope="module")
def audit_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("forged")
    return audited(copy_example(tmp), tmp / "out")


def forged(audit_out: Path, tmp_path: Path, name: str, change: Callable[[Path], object],
           capsys: pytest.CaptureFixture[str]) -> Path:
    """A copy of ``audit_out`` whose ``name`` was changed then re-pinned: it verifies."""
    out = tmp_path / "out"
    shutil.copytree(audit_out, out)
    change(out / name)
    repin(out, name)
    assert main(["verify", str(out), "--quiet"]) == 0
    capsys.readouterr()
    return out


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert "internal error" not in captured.err and "Traceback" not in captured.err
    return captured.err


def _set(pointer: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(summary: dict[str, Any]) -> None:
        for key in pointer[:-1]:
            summary = summary[key]
        summary[pointer[-1]] = value
    return change


@pytest.mark.parametrize(("pointer", "value", "said"), [
    (("study",), 5, "/study: expected a string or null, found integer 5"),
    (("verdicts",), "many", '/verdicts: expected an object or null, found string "many"'),
    (("verdicts", "resolved"), "x", "/verdicts/resolved: expected a whole number"),
    (("verdicts", "failed"), True, "/verdicts/failed: expected a whole number"),
    (("verdicts", "unresolved"), -1, "/verdicts/unresolved: expected a whole number"),
    (("launches",), 1.5, "/launches: expected a whole number"),
    (("periods",), 18, "/periods: expected an array or null, found integer 18"),
    (("accounting",), [1], "/accounting: expected an object or null, found array [1]"),
    (("accounting", "task_gpu_seconds"), "lots", "/accounting/task_gpu_seconds: expected a "
     "number or null"),
    (("accounting", "wasted_attempts"), {}, "/accounting/wasted_attempts: expected a whole"),
    (("gate",), "passed", '/gate: expected an object or null, found string "passed"'),
    (("gate", "passed"), "yes", '/gate/passed: expected a boolean or null, found string'),
    (("gate_allow_partial", "passed"), 1, "/gate_allow_partial/passed: expected a boolean"),
    (("partial",), "no", "/partial: expected a boolean or null"),
    (("auditor_version",), 3, "/auditor_version: expected a string or null"),
    (("configurations_total",), [6], "/configurations_total: expected a whole number"),
])
def test_catalog_refuses_an_ill_typed_summary_even_when_re_pinned(
        audit_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        pointer: tuple[str, ...], value: Any, said: str) -> None:
    def change(path: Path) -> None:
        summary = orjson.loads(path.read_bytes())
        _set(pointer, value)(summary)
        path.write_bytes(orjson.dumps(summary))

    out = forged(audit_out, tmp_path, "summary.json", change, capsys)
    err = refused(capsys, "catalog", str(out), "--into", str(tmp_path / "cat"))
    assert f"catalog: {out / 'summary.json'}: {said}" in err, err
    assert "nothing was added" in err
    assert not (tmp_path / "cat" / "catalog.json").exists()


@pytest.mark.parametrize(("text", "said"), [
    (b"[1, 2]", "summary.json: expected an object, found array"),
    (b'{"launches": 9223372036854775808}', "/launches: expected a whole number from 0 to "
     "9223372036854775807 or null, found integer 9223372036854775808"),
    # (nested past Python's recursion limit, within orjson's: quoting it raised
    # RecursionError, exit 3)
    (b'{"launches": ' + b"[" * 1000 + b"]" * 1000 + b"}",
     "/launches: expected a whole number from 0 to 9223372036854775807 or null, found array "
     "nested too deep to show"),
])
def test_catalog_refuses_a_summary_no_audit_writes(
        audit_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        text: bytes, said: str) -> None:
    out = forged(audit_out, tmp_path, "summary.json", lambda p: p.write_bytes(text), capsys)
    err = refused(capsys, "catalog", str(out), "--into", str(tmp_path / "cat"),
                  "--name", "forged")
    assert said in err, err


def test_a_well_typed_summary_of_an_older_audit_is_still_added(
        audit_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Fields absent or null (an older auditor's summary) are not ill-typed."""
    def change(path: Path) -> None:
        summary = orjson.loads(path.read_bytes())
        for key in ("partial", "gate_allow_partial", "auditor_version"):
            summary.pop(key)
        summary["accounting"]["task_gpu_seconds"] = None
        summary["accounting"]["wasted_gpu_seconds"] = 7  # (an integer is a number)
        path.write_bytes(orjson.dumps(summary))

    out = forged(audit_out, tmp_path, "summary.json", change, capsys)
    assert main(["catalog", str(out), "--into", str(tmp_path / "cat")]) == 0
    capsys.readouterr()
    assert main(["query", str(tmp_path / "cat"), "SELECT partial, task_gpu_seconds, "
                 "wasted_gpu_seconds FROM studies", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out) == [
        {"partial": None, "task_gpu_seconds": None, "wasted_gpu_seconds": 7.0}]


def _not_utf8(where: str) -> Callable[[Path], None]:
    """Rewrite the Parquet file with a byte not UTF-8 in column ``reason``'s name
    (``where="name"``) or its text (``"text"``, written from raw buffers: pyarrow checks
    the text it is given otherwise)."""
    def change(path: Path) -> None:
        table = pq.read_table(path)
        if where == "name":
            renamed = [("zzzzzzzz" if n == "reason" else n) for n in table.column_names]
            pq.write_table(table.rename_columns(renamed), path, store_schema=False)
            path.write_bytes(path.read_bytes().replace(b"zzzzzzzz", b"\xffzzzzzzz"))
            return
        rows = table.num_rows
        offsets = pa.array(range(0, 2 * rows + 1, 2), type=pa.int32()).buffers()[1]
        text = pa.Array.from_buffers(pa.string(), rows,
                                     [None, offsets, pa.py_buffer(b"\xff\xfe" * rows)])
        index = table.schema.get_field_index("reason")
        pq.write_table(table.set_column(index, "reason", text), path)
    return change


def _bad_page(path: Path) -> None:
    """Overwrite the first data page's header: the footer (the schema) still reads."""
    data = bytearray(path.read_bytes())
    data[4:24] = b"\xff" * 20
    path.write_bytes(bytes(data))


def _column(name: str, values: Callable[[int], Any]) -> Callable[[Path], None]:
    """Replace ``name`` in the Parquet file by ``values(rows)``, or drop it (``None``)."""
    def change(path: Path) -> None:
        table = pq.read_table(path)
        replaced = values(table.num_rows)
        index = table.schema.get_field_index(name)
        table = table.remove_column(index) if replaced is None else \
            table.set_column(index, name, replaced)
        pq.write_table(table, path)
    return change


@pytest.mark.parametrize(("change", "said"), [
    (_column("verdict", lambda n: None), "no column 'verdict'"),
    (_column("array_task_id", lambda n: None), "no column 'array_task_id'"),
    (_column("array_task_id", lambda n: pa.array(["x"] * n)),
     "column 'array_task_id' is string, not int64"),
    (_column("array_task_id", lambda n: pa.array([1.5] * n)),
     "column 'array_task_id' is double, not int64"),
    (_column("verdict", lambda n: pa.array(range(n))), "column 'verdict' is int64, not string"),
    (_column("reason", lambda n: pa.array([["a"]] * n)),
     "column 'reason' is list<element: string>, not string"),
    (_column("verdict", lambda n: pa.array(["unresolved"] * (n - 1) + [None])),
     "row 17: verdict None is not what an audit writes"),
    (_column("verdict", lambda n: pa.array(["maybe"] * n)),
     "row 0: verdict 'maybe' is not what an audit writes"),
    (_column("subject", lambda n: pa.array([None] * n, pa.string())),
     "row 0: no subject is not what an audit writes"),
    (_column("reason", lambda n: pa.array([None] * n, pa.string())),
     "row 0: no reason is not what an audit writes"),
    (_column("array_task_id", lambda n: pa.array([-1] * n)),
     "row 0: array_task_id -1 is not what an audit writes"),
    (lambda path: path.write_bytes(b"PAR1 not a table"), "unreadable (Parquet magic bytes"),
    (_not_utf8("name"), "unreadable ('utf-8' codec can't decode byte 0xff"),  # (exit 3)
    (_not_utf8("text"), "unreadable ('utf-8' codec can't decode byte 0xff"),  # (exit 3)
])
def test_rerun_refuses_an_ill_typed_periods_table_even_when_re_pinned(
        audit_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        change: Callable[[Path], None], said: str) -> None:
    out = forged(audit_out, tmp_path, "periods.parquet", change, capsys)
    for argv in (["rerun", str(out)], ["rerun", str(out), "--json"]):
        err = refused(capsys, *argv)
        assert f"rerun: {out / 'periods.parquet'}: {said}" in err, err


def test_rerun_reads_the_bytes_it_checked_against_the_manifest(
        audit_out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The pinned table still plans (the guard refuses only what no audit writes)."""
    capsys.readouterr()
    assert main(["rerun", str(audit_out), "--json"]) == 0
    assert [g["array"] for g in orjson.loads(capsys.readouterr().out)] == ["0-8"]


@pytest.mark.parametrize(("table", "change", "said"), [
    ("periods", _column("gpus", lambda n: pa.array(["x"] * n)),
     "column 'gpus' is string, not int64"),
    ("attempts", _column("attempt", lambda n: pa.array([1.5] * n)),
     "column 'attempt' is double, not int64"),
    ("devices", _column("hostname", lambda n: pa.array(range(n))),
     "column 'hostname' is int64, not string"),
    ("periods", lambda path: pq.write_table(
        pq.read_table(path).append_column("study", pa.array(["other"] * 18)), path),
     "a column 'study', which the catalogue adds itself"),
    ("findings", lambda path: pq.write_table(pa.Table.from_arrays(
        [pa.array([1]), pa.array([2])], names=["rule_id", "rule_id"]), path),
     "column 'rule_id' is there more than once"),
    # (added, a catalogue of it alone answered no query: the views name the column)
    ("periods", _column("workload", lambda n: None),
     "no column 'workload', which every audit writes"),
    ("devices", lambda path: pq.write_table(pa.table({"x": [1]}), path),
     "no column 'subject', which every audit writes"),
    # (a page pyarrow cannot read, a name not UTF-8: exit 3; text not UTF-8: added, then
    # every query reading the column failed, for every study)
    ("periods", _bad_page, "unreadable table (Couldn't deserialize thrift"),
    ("periods", _not_utf8("name"), "unreadable table ('utf-8' codec can't decode byte 0xff"),
    ("periods", _not_utf8("text"), "unreadable table (In column"),
])
def test_catalog_refuses_a_table_of_another_column_type_even_when_re_pinned(
        audit_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str,
        change: Callable[[Path], None], said: str) -> None:
    """One study's column of text would make the column text for every study (DuckDB
    reads union_by_name): sum(gpus) failed over the whole catalogue."""
    assert main(["catalog", str(audit_out), "--into", str(tmp_path / "cat")]) == 0
    out = forged(audit_out, tmp_path, f"{table}.parquet", change, capsys)
    err = refused(capsys, "catalog", str(out), "--into", str(tmp_path / "cat"), "--name",
                  "forged")
    assert f"catalog: {out / f'{table}.parquet'}: {said}" in err and "nothing was added" in err
    assert main(["query", str(tmp_path / "cat"), "SELECT DISTINCT study, sum(gpus) AS gpus "
                 "FROM periods GROUP BY study", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out) == [
        {"study": "estimation_host_capacity", "gpus": 54}]


def test_catalog_refuses_a_fifo_in_place_of_the_manifest_not_waited_on(
        audit_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Verification waited for ever for a writer (one opening it after 10 s ends the wait,
    so without the guard this fails instead of hanging)."""
    out = tmp_path / "out"
    shutil.copytree(audit_out, out)
    with fifo_in_place_of(out / "output_manifest.json") as fifo:
        err = refused(capsys, "catalog", str(out), "--into", str(tmp_path / "cat"))
    assert f"catalog: {fifo}: unreadable (not a regular file)" in err
    assert not (tmp_path / "cat").exists()


def test_catalog_refuses_a_manifest_nested_past_pythons_recursion_limit(
        audit_out: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """orjson parses 1,024 levels, more than Python's recursion limit: checking such a
    manifest against its schema raised RecursionError (exit 3); ``auditor rerun``'s reading
    of its outputs too."""
    out = tmp_path / "out"
    shutil.copytree(audit_out, out)
    manifest = out / "output_manifest.json"
    deep = b'{"a":' * 1000 + b"1" + b"}" * 1000
    manifest.write_bytes(manifest.read_bytes().replace(
        b'"outputs": [', b'"outputs": [{"path": ' + deep + b', "sha256": "' + b"0" * 64
        + b'", "size": 1},', 1))
    err = refused(capsys, "catalog", str(out), "--into", str(tmp_path / "cat"))
    assert f"{manifest}: malformed manifest" in err and "nested too deep to check" in err
    err = refused(capsys, "rerun", str(out))
    assert f"rerun: {out / 'periods.parquet'}: does not match {manifest}" in err
