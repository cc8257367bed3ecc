"""The diagnostic report: golden file for the example study, untrusted text kept inert."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from auditor._cli import main
from auditor.report.markdown import code_block, code_span, md_escape
from tests.helpers import EXAMPLE, audit, find, outcome_study, rewrite

GOLDEN = Path(__file__).parent / "golden" / "example_diagnostic.md"
HOSTILE = ("torch.OutOfMemoryError: <img src=x> [click](http://evil.example) "
           "![x](http://evil.example/p.png) ``` # Heading \x1b[31mred\x1b[0m | col | <!-- -->")


def _without_output_hashes(text: str) -> str:
    """Output hashes depend on library versions (Parquet writer, PNG encoder): mask them."""
    return re.sub(r"^(\S+\.(?:parquet|png|json))  [0-9a-f]{64}  \d+$", r"\1  <sha256>  <size>",
                  text, flags=re.MULTILINE)


def test_example_report_matches_golden_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["audit", str(EXAMPLE), "--out", str(out), "--quiet", "--no-plots"]) == 0
    text = _without_output_hashes((out / "diagnostic.md").read_text())
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "report changed: rerun with UPDATE_GOLDEN=1 and review"


def test_untrusted_log_text_cannot_inject_markup(tmp_path: Path) -> None:
    root = outcome_study(tmp_path / "study", ["rollout_init_oom"])
    log = find(root, "*/attempt-*/training-*.log")
    rewrite(root, log, lambda b: b.replace(b"ray.exceptions.RayTaskError(OutOfMemoryError): ",
                                           HOSTILE.encode(), 1))
    audit(root, tmp_path / "out")
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "evil.example" in text  # the hostile line is quoted, inert
    assert "\x1b" not in text
    assert "<img" not in text and "<!--" not in text
    assert "](http://evil" not in text
    for line in text.splitlines():
        assert not line.startswith("# Heading")


@pytest.mark.parametrize("hostile", [HOSTILE, "`" * 5 + "x", "a\nb\r\nc", "<b>bold</b>",
                                     "[a](javascript:alert(1))", "-" * 3, "1. list"])
def test_escaping_helpers(hostile: str) -> None:
    escaped = md_escape(hostile)
    assert "\n" not in escaped and "<" not in escaped
    assert "](" not in escaped.replace("\\]\\(", "")
    span = code_span(hostile)
    fence = re.match(r"`+", span)
    assert fence is not None
    inner = span[len(fence.group()):-len(fence.group())]
    assert fence.group() not in inner
    block = code_block([hostile, "```", "~~~~"])
    opening = block.splitlines()[0].removesuffix("text")
    assert all(line.strip() != opening for line in block.splitlines()[1:-1])


_ESCAPE_ALPHABET = "a1. -=_*:<&\n\x00\u0661"


def test_plain_text_shortcut_escapes_as_the_full_path_does() -> None:
    # A leading NUL is removed by the full path, so it forces that path on the same text.
    # Exhaustive over short texts (a sample misses "1." or "-x"), at the clipping edges too.
    for size in range(5):
        for chars in itertools.product(_ESCAPE_ALPHABET, repeat=size):
            text = "".join(chars)
            for limit in (1, 2, 3, 300):
                assert md_escape(text, limit) == md_escape("\x00" + text, limit), (text, limit)


@given(st.text(alphabet="az09 ,.:;/@%=-_*`#|<&\n\x00\u202e", max_size=60))
def test_plain_text_shortcut_on_longer_texts(text: str) -> None:
    assert md_escape(text) == md_escape("\x00" + text)


def test_long_quotes_are_clipped() -> None:
    assert len(md_escape("x" * 10_000)) <= 300
    assert len(code_span("y" * 10_000)) <= 210


def test_every_table_row_fills_exactly_its_schema(tmp_path: Path) -> None:
    """Rows become Arrow batches by name: a misspelt key would quietly give a null column."""
    from auditor.audit import run_audit
    from auditor.report.tables import ROWS, SCHEMAS
    from tests.helpers import copy_example

    result = run_audit(copy_example(tmp_path))
    for name, rows in ROWS.items():
        keys = {tuple(row) for row in rows(result)}
        assert keys == {tuple(SCHEMAS[name].names)}, name


def test_tables_stream_in_row_groups_and_read_back_whole(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A table is written a row group at a time (bounded memory on millions of rows):
    with small groups it spans several, and still reads back row for row, as the manifest
    hashed it."""
    import pyarrow.parquet as pq

    from auditor.audit import run_audit
    from auditor.report import tables
    from tests.helpers import copy_example

    root = copy_example(tmp_path)
    expected = [dict(row) for row in tables.ROWS["phases"](run_audit(root))]
    monkeypatch.setattr(tables, "BATCH_ROWS", 7)
    monkeypatch.setattr(tables, "ROW_GROUP_ROWS", 49)
    out = tmp_path / "out"
    audit(root, out)
    parquet = pq.ParquetFile(out / "phases.parquet")
    assert len(expected) > 200
    groups = [parquet.metadata.row_group(i).num_rows for i in range(parquet.num_row_groups)]
    full, rest = divmod(len(expected), 49)
    assert groups == [49] * full + ([rest] if rest else [])
    read = parquet.read()
    assert read.schema.metadata[b"auditor.partial"] == b"false"
    assert read.num_rows == len(expected)
    assert read.column("line").to_pylist() == [row["line"] for row in expected]
    assert main(["verify", str(out)]) == 0


def test_output_directory_is_as_readable_as_the_umask_allows(tmp_path: Path) -> None:
    """The outputs are staged in a private temporary directory; the finished directory
    gets the usual mode, so colleagues on a shared cluster can read the report."""
    for mask, mode in ((0o022, 0o755), (0o077, 0o700), (0o002, 0o775)):
        old = os.umask(mask)
        try:
            out = tmp_path / f"out-{mask:o}"
            audit(EXAMPLE, out)
        finally:
            os.umask(old)
        assert out.stat().st_mode & 0o777 == mode
        assert (out / "diagnostic.md").stat().st_mode & 0o777 == mode & 0o666
