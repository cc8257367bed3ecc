"""``evidence.md`` is written a batch of lines at a time: the bytes are those of the whole
text made printable at once, whatever the batch (a name that is not UTF-8 included)."""

from __future__ import annotations

import io

import pytest

from auditor._io import printable
from auditor.report.output import _write_lines

LINES = ["# Evidence cited\n", "- `a/period-1`: trial-\udcff.json\n", "\n", "- é \ud800 ok\n"] * 5


@pytest.mark.parametrize("batch", [1, 2, 3, 4096])
def test_lines_written_in_batches_are_the_whole_text(batch: int) -> None:
    sink = io.BytesIO()
    _write_lines(iter(LINES), sink, batch)  # type: ignore[arg-type]
    assert sink.getvalue() == printable("".join(LINES)).encode("utf-8")
    assert b"\\xff" in sink.getvalue() and b"\\ud800" in sink.getvalue()
