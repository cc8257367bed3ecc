"""Rows kept out of memory (:mod:`auditor._spill`): given back in the order ``sorted()``
gives, of equal keys the one added first, whatever the runs' and pieces' sizes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import auditor._spill as spill
from auditor._spill import SortedSpill
from auditor.audit import Auditor, assemble_collected, drive, run_audit
from tests.test_shards import _damaged


@pytest.mark.parametrize(("run_rows", "piece_rows"), [(1, 1), (7, 3), (64, 64), (10**6, 4)])
def test_rows_come_back_as_a_stable_sort_gives_them(run_rows: int, piece_rows: int) -> None:
    draw = random.Random(run_rows)
    rows = [(f"p{draw.randrange(40):02d}", number, "\udcff" * (number % 2))  # (not UTF-8)
            for number in range(500)]
    kept = SortedSpill(0, run_rows, piece_rows)
    for start in range(0, len(rows), 37):
        kept.extend(rows[start:start + 37])
    assert len(kept) == 500
    assert list(kept) == sorted(rows, key=lambda row: row[0])
    assert list(kept) == list(kept)  # (read again: the same)


def test_a_studys_spilled_evidence_is_the_sorted_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's evidence rows, kept out of memory in runs of 5, are the rows of the whole
    collection sorted by path, and what the report counts of them is theirs."""
    monkeypatch.setattr(spill, "RUN_ROWS", 5)
    monkeypatch.setattr(spill, "PIECE_ROWS", 2)
    root = _damaged(tmp_path)
    spilled = run_audit(root).collected
    whole = assemble_collected(drive(Auditor(root).collect(), lambda event: None))
    rows = list(whole.evidence)
    assert isinstance(spilled.evidence, spill.EvidenceSpill) and len(rows) > 50
    assert list(spilled.evidence) == rows
    assert spilled.evidence_statuses() == whole.evidence_statuses()
    assert {"mismatched", "unlisted", "verified"} <= set(spilled.evidence_statuses())
    assert spilled.unusual_evidence() == whole.unusual_evidence() != []
    assert spilled.input_counts() == whole.input_counts()
    assert list(spilled.all_inputs()) == list(whole.all_inputs())


def test_a_temporary_directory_it_cannot_use_is_one_line_not_a_bug(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The rows go to the temporary directory: one that is gone (or full: ENOSPC, seen on a
    64 KiB tmpfs) is the user's to fix, one line and exit 2, no output left."""
    import tempfile

    from auditor._cli import main
    from tests.helpers import copy_example

    root = copy_example(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    assert main(["audit", str(root), "--out", str(tmp_path / "out"), "--quiet", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "temporary directory" in err and "TMPDIR" in err
    assert not (tmp_path / "out").exists()

