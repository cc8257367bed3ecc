"""What a review threw at the catalogue: text that looks like markup or holds control bytes,
integers past 64 bits, no SQL at all, the same study given twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor._cli import main
from tests.helpers import copy_example


@pytest.fixture(scope="module")
def cat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("hostile")
    root = copy_example(tmp)
    assert main(["audit", str(root), "--out", str(tmp / "out"), "--quiet", "--no-plots"]) == 0
    # the same audit twice in one call: the last of a name wins, no crash
    assert main(["catalog", str(tmp / "out"), str(tmp / "out"), "--into", str(tmp / "cat")]) \
        == 0
    return tmp / "cat"


def test_markup_emoji_and_control_bytes_print_as_they_are(
        cat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    sql = ("SELECT '[/pytorch/x.cpp:12] failed' AS a, 'root:x:0:0' AS b, "
           "chr(27) || '[31mred' AS c")
    assert main(["query", str(cat), sql]) == 0
    out = capsys.readouterr().out
    assert "[/pytorch/x.cpp:12] failed" in out and "root:x:0:0" in out
    assert "\x1b" not in out and "\\x1b[31mred" in out


def test_an_integer_past_64_bits_and_no_sql(cat: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["query", str(cat), "SELECT 170141183460469231731687303715884105727::hugeint "
                 "AS h", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"h": "170141183460469231731687303715884105727"}]
    for sql in ("", ";", "  ;  "):
        assert main(["query", str(cat), sql]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no SQL statement" in err


@pytest.mark.parametrize("sql", [
    "COPY (SELECT 1 AS x) TO '{tmp}/written.csv'",
    "SELECT * FROM read_csv('/etc/passwd')",
    "ATTACH '{tmp}/other.db' AS other",
    "SET enable_external_access = true",
])
def test_a_query_reads_the_catalogue_only_and_writes_nothing(
        cat: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sql: str) -> None:
    capsys.readouterr()
    assert main(["query", str(cat), sql.format(tmp=tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not any(tmp_path.iterdir())
    assert main(["query", str(cat), "SELECT count(*) AS n FROM periods", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 18}]


def _digests(cat: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(cat)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(cat.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("sql", [
    # DuckDB's allowed paths (the parts, so that they can be read) let these write them:
    # without its temporary file, a COPY went straight to the part and overwrote it
    "COPY (SELECT 1 AS x) TO '{part}' (FORMAT parquet, USE_TMP_FILE false)",
    "COPY (SELECT 1 AS x) TO '{part}' (FORMAT csv, USE_TMP_FILE false)",
    "COPY periods TO '{part}' (FORMAT parquet)",
    "SELECT 1; COPY (SELECT 1 AS x) TO '{part}' (FORMAT parquet, USE_TMP_FILE false)",
    "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{part}' (FORMAT parquet, USE_TMP_FILE false)",
    "EXPORT DATABASE '{cat}/periods'",
    "ATTACH '{part}' AS part",
    "COPY FROM DATABASE memory TO memory",
    "CALL pragma_version()",
    "CREATE TABLE t AS SELECT 1 AS x",
    "PRAGMA table_info('periods')",
])
def test_a_query_cannot_write_the_catalogues_own_parts(
        cat: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], sql: str) -> None:
    import shutil

    cat = Path(shutil.copytree(cat, tmp_path / "cat"))  # (one that might be overwritten)
    part = cat / "periods" / "study=estimation_host_capacity" / "part-0.parquet"
    before = _digests(cat)
    capsys.readouterr()
    assert main(["query", str(cat), sql.format(part=part, cat=cat), "--csv"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.out == "", captured.err
    assert "statement refused: a query only reads the catalogue" in captured.err
    assert _digests(cat) == before
    assert main(["query", str(cat), "SELECT count(*) AS n FROM verdicts", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 6}]


@pytest.mark.parametrize(("sql", "first"), [
    ("DESCRIBE periods", "column_name"), ("SHOW TABLES", "name"),
    ("SUMMARIZE studies", "column_name"), ("FROM periods SELECT count(*) AS n", "n"),
    ("VALUES (1)", "col0"), ("WITH x AS (SELECT 1 AS y) SELECT * FROM x", "y"),
    ("PIVOT (SELECT verdict, gpus FROM periods) ON verdict USING count(*)", "gpus"),
    ("EXPLAIN SELECT count(*) FROM periods", "explain_key"),
    ("explain analyze SELECT count(*) FROM periods", "explain_key"),
])
def test_reading_statements_still_run(cat: Path, capsys: pytest.CaptureFixture[str],
                                      sql: str, first: str) -> None:
    capsys.readouterr()
    assert main(["query", str(cat), sql, "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split(",")[0] == first


def _catalogue_holding(tmp_path: Path, cat: Path, name: str, what: str) -> Path:
    """A copy of ``cat`` whose ``name`` is ``what``: a link out of it, or a JSON text."""
    import shutil

    own = Path(shutil.copytree(cat, tmp_path / "cat"))
    (own / name).unlink()
    if what == "link":
        (own / name).symlink_to(tmp_path / "outside")
    else:
        (own / name).write_text(what)
    return own


@pytest.mark.parametrize(("name", "what", "said"), [
    ("catalog.json", '{"schema": "auditor/catalog/v1", "studies": [{"x": 1}]}',
     "its 'studies' are not a list of entries each with a study's name"),
    ("catalog.json", '{"schema": "auditor/catalog/v1", "studies": 5}',
     "its 'studies' are not a list of entries each with a study's name"),
    ("catalog.json", '{"schema": "auditor/catalog/v1", "studies": [{"name": "../x"}]}',
     "its 'studies' are not a list of entries each with a study's name"),
    (".lock", "link", "cannot be opened (Too many levels of symbolic links); is it a link?"),
])
def test_a_catalogue_whose_own_files_were_tampered_with_is_one_line(
        cat: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        name: str, what: str, said: str) -> None:
    """They crashed (KeyError, TypeError: exit 3); a .lock linked out of the catalogue
    made the file it points to."""
    own = _catalogue_holding(tmp_path, cat, name, what)
    capsys.readouterr()
    assert main(["catalog", str(cat.parent / "out"), "--into", str(own)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"catalog: {own / name}: {said}" in err, err
    assert not (tmp_path / "outside").exists()


@pytest.mark.parametrize(("name", "said"), [
    ("catalog.json", "unreadable (not a regular file)"), (".lock", "not a regular file")])
def test_a_fifo_in_the_catalogue_is_one_line_not_waited_on(
        cat: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        name: str, said: str) -> None:
    """A FIFO catalog.json waited for ever; a FIFO .lock crashed (not seekable: exit 3)."""
    import shutil

    from tests.catalog.studies import fifo_in_place_of

    own = Path(shutil.copytree(cat, tmp_path / "cat"))
    capsys.readouterr()
    with fifo_in_place_of(own / name):
        assert main(["catalog", str(cat.parent / "out"), "--into", str(own)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"catalog: {own / name}: {said}" in err, err


def test_names_that_are_not_utf8_are_catalogued(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """An audit's output directory, or the catalogue's, named in bytes that are not UTF-8
    (verify, gate and merge take them): added, never a crash (pyarrow takes no such name)."""
    import os

    out = Path(os.fsdecode(bytes(tmp_path) + b"/out\xff"))
    assert main(["audit", str(copy_example(tmp_path)), "--out", str(out), "--quiet",
                 "--no-plots"]) == 0
    catalogue = Path(os.fsdecode(bytes(tmp_path) + b"/cat\xfe"))
    for into in (tmp_path / "cat", catalogue):
        assert main(["catalog", str(out), "--into", str(into)]) == 0
    assert "added" in capsys.readouterr().out
    assert main(["query", str(tmp_path / "cat"), "select count(*) from periods"]) == 0
    assert "18" in capsys.readouterr().out


def test_an_audits_path_with_escape_sequences_is_printed_inert(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The line saying what was added names the audit's path as the other commands do: a
    terminal shows its escape sequences, never obeys them."""
    out = tmp_path / "out_\x1b[31mRED"
    assert main(["audit", str(copy_example(tmp_path)), "--out", str(out), "--quiet",
                 "--no-plots"]) == 0
    capsys.readouterr()
    assert main(["catalog", str(out), "--into", str(tmp_path / "cat")]) == 0
    said = capsys.readouterr().out
    assert "\x1b" not in said and "out_\\x1b[31mRED" in said
