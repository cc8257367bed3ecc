"""``evidence.md`` and ``diagnostic.md`` are written a batch of lines at a time: the bytes
are those of the whole text made printable at once, whatever the batch (a name that is not
UTF-8 included)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from auditor._cli import main
from auditor._text import printable
from auditor.pipeline.audit import run_audit
from auditor.report.markdown import (
    evidence_md_lines,
    markdown_chunks,
    render_evidence_md,
    render_markdown,
)
from auditor.report.output import _write_lines

LINES = ["# Evidence cited\n", "- `a/period-1`: trial-\udcff.json\n", "\n", "- é \ud800 ok\n"] * 5


@pytest.mark.parametrize("batch", [1, 2, 3, 4096])
def test_lines_written_in_batches_are_the_whole_text(batch: int) -> None:
    sink = io.BytesIO()
    _write_lines(iter(LINES), sink, batch)  # type: ignore[arg-type]
    assert sink.getvalue() == printable("".join(LINES)).encode("utf-8")
    assert b"\\xff" in sink.getvalue() and b"\\ud800" in sink.getvalue()


def test_the_report_is_made_in_pieces_its_period_table_a_row_at_a_time(
        tmp_path: Path) -> None:
    """``diagnostic.md`` is written as it is made: its sections one after another, the
    period table's rows each a piece of its own (never the whole table, nor the whole
    report, at once); the pieces are the whole report."""
    root = tmp_path / "study"
    assert main(["example", str(root), "--kind", "mixed"]) == 0
    result = run_audit(root)
    chunks = list(markdown_chunks(result))
    assert "".join(chunks) == render_markdown(result)
    rows = [chunk for chunk in chunks if chunk.startswith("| ")]
    assert len(rows) >= 4 + 2  # (the header, its rule, a row each of the four that got far)
    assert all(chunk.count("\n") == 0 for chunk in rows)
    lines = list(evidence_md_lines(result))  # (every period's row, one piece each)
    assert "".join(lines) == render_evidence_md(result)
    rows = [line for line in lines if line.startswith("| ")]
    assert len(rows) >= len(result.verdicts) + 2
    assert all(line.count("\n") == 1 for line in rows)
