"""The results store: what it keeps comes back the same whatever it decides to keep where,
and an audit that keeps everything out of memory from the first record writes every output
byte for byte as one that keeps objects (the test suite's run of the spilling path)."""

from __future__ import annotations

import os
import pickle
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import auditor.store.sorted as sorted_rows
from auditor._cli import main
from auditor._studygen import OUTCOMES
from auditor.model import Citation
from auditor.pipeline.audit import Auditor, assemble_collected, drive, run_audit
from auditor.store import SPILL_FROM_VARIABLE, Kept, SortedRows
from tests.helpers import copy_example, outcome_study
from tests.test_shards import OUTPUTS, _damaged, _shards


def _spill_from(monkeypatch: pytest.MonkeyPatch, records: int) -> None:
    monkeypatch.setenv(SPILL_FROM_VARIABLE, str(records))


@pytest.mark.parametrize(("run_rows", "piece_rows"), [(1, 1), (7, 3), (64, 64), (10**6, 4)])
def test_rows_come_back_as_a_stable_sort_gives_them(run_rows: int, piece_rows: int) -> None:
    draw = random.Random(run_rows)
    rows = [(f"p{draw.randrange(40):02d}", number, "\udcff" * (number % 2))  # (not UTF-8)
            for number in range(500)]
    kept = SortedRows(0, run_rows, piece_rows)
    for start in range(0, len(rows), 37):
        kept.extend(rows[start:start + 37])
    assert len(kept) == 500
    assert list(kept) == sorted(rows, key=lambda row: row[0])
    assert list(kept) == list(kept)  # (read again: the same)


@pytest.mark.parametrize("spill_from", [0, 1, 63, 64, 65, 10**6])
def test_a_kept_sequence_is_the_records_it_was_given(
        spill_from: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """However many records it holds as objects before it packs them on disk, a
    :class:`Kept` gives back what it was given, in order, however it is read:
    through, by place (from either end, in any order), by slice, after a pickle's round
    trip (what a worker's result crosses), and drained (let go as read)."""
    _spill_from(monkeypatch, spill_from)
    records = [Citation(f"a/{number}.jsonl", number or None, None, "\udcff" * (number % 3))
               for number in range(150)]
    kept: Kept[Citation] = Kept()
    for item in records:
        kept.append(item)
    assert len(kept) == 150 and list(kept) == records and list(kept) == records
    assert kept == records and kept == tuple(records) and kept != records[:-1]
    draw = random.Random(spill_from)
    for place in [*range(150), *(draw.randrange(-150, 150) for _ in range(300))]:
        assert kept[place] == records[place]
    assert kept[::7] == records[::7] and kept[-5:] == records[-5:] and kept[3:3] == []
    with pytest.raises(IndexError):
        kept[150]
    with pytest.raises(IndexError):
        kept[-151]
    again = pickle.loads(pickle.dumps(kept))
    assert isinstance(again, Kept) and list(again) == records
    assert records[40] in kept and kept.index(records[40]) == 40
    assert list(Kept(records[:0])) == []
    drained = again.drain()
    assert next(drained) == records[0] and len(again) == 0  # (let go as it is read)
    assert [records[0], *drained] == records
    again.append(records[1])  # (and kept again from empty)
    assert list(again) == [records[1]]


@pytest.mark.parametrize("spill_from", [16, 10**6])
def test_a_kept_sequence_holds_little_of_it_in_memory_once_packed(
        spill_from: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 records of a kilobyte of hexadecimal digits: as objects 2.2 MB, packed (from
    the 17th) about a block of them."""
    import tracemalloc

    _spill_from(monkeypatch, spill_from)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = Kept(os.urandom(512).hex() for _ in range(2000))
        held = tracemalloc.get_traced_memory()[0] - before
        assert len(kept) == 2000
    finally:
        tracemalloc.stop()
    assert (held < 100_000) if spill_from == 16 else (held > 2_000_000), held


def test_a_bad_spill_setting_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(SPILL_FROM_VARIABLE, "lots")
    assert main(["audit", str(copy_example(tmp_path)), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and SPILL_FROM_VARIABLE in err and "whole number" in err


def test_a_studys_evidence_rows_sorted_on_disk_are_the_sorted_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's evidence rows, kept out of memory in runs of 5, are the rows of the whole
    collection sorted by path, and what the report counts of them is theirs."""
    monkeypatch.setattr(sorted_rows, "RUN_ROWS", 5)
    monkeypatch.setattr(sorted_rows, "PIECE_ROWS", 2)
    root = _damaged(tmp_path)
    spilled = run_audit(root).collected
    whole = assemble_collected(drive(Auditor(root).collect(), lambda event: None))
    rows = list(whole.evidence)
    assert len(rows) > 50 and list(spilled.evidence) == rows
    assert spilled.evidence_statuses() == whole.evidence_statuses()
    assert {"mismatched", "unlisted", "verified"} <= set(spilled.evidence_statuses())
    assert spilled.unusual_evidence() == whole.unusual_evidence() != []
    assert spilled.input_counts() == whole.input_counts()
    assert list(spilled.all_inputs()) == list(whole.all_inputs())


def _outputs(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in OUTPUTS}


@pytest.mark.parametrize("study", ["every outcome", "mixed example"])
def test_spilling_from_the_first_record_writes_the_same_bytes(
        study: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's one path at every size: an audit whose store packs every sequence from
    its first record, sorts in runs of a few rows on disk and keeps the report's groups on
    disk (``AUDITOR_SPILL_FROM=0``) writes every output byte for byte as the audit that
    keeps them as objects, judged in the workers (two) or in the audit's own process (one),
    a retried period's rows among them; and it leaves nothing in the temporary directory."""
    if study == "every outcome":
        root = outcome_study(tmp_path / "study", [o for o in OUTCOMES if o != "pending"]
                             + ["retried", "completed"])
    else:
        root = tmp_path / "study"
        assert main(["example", "--kind", "mixed", str(root)]) == 0
    assert main(["audit", str(root), "--out", str(tmp_path / "objects"), "--quiet",
                 "--no-plots"]) in (0, 1)
    objects = _outputs(tmp_path / "objects")
    assert objects["evidence.md"].count(b", attempt 2") >= 1  # (a retried period's row)
    _spill_from(monkeypatch, 0)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr("tempfile.tempdir", None)
    for jobs in ("1", "2"):
        out = tmp_path / f"spilled-{jobs}"
        assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots",
                     "--jobs", jobs]) in (0, 1)
        assert _outputs(out) == objects, jobs
    assert list(temporary.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["study", "objects", "spilled-1", "spilled-2", "tmp"])  # (nothing beside --out)


def test_a_merge_spilling_from_the_first_record_is_the_single_audit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge judges every period in its own process: spilling from the first record, it
    writes the single audit's bytes."""
    root = _damaged(tmp_path)
    assert main(["audit", str(root), "--out", str(tmp_path / "single"), "--quiet",
                 "--no-plots"]) in (0, 1)
    _spill_from(monkeypatch, 0)
    parts = _shards(root, tmp_path / "parts", 3)
    assert main(["merge", *map(str, parts), "--out", str(tmp_path / "merged"), "--quiet",
                 "--no-plots"]) in (0, 1)
    assert _outputs(tmp_path / "merged") == _outputs(tmp_path / "single")


def test_the_period_table_sorts_and_lists_its_pids_out_of_memory_as_it_did_in_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The period table's rows are sorted with what each reads of its period's facts
    waiting on disk, and its PIDs lines wait there for the block after it: with runs of
    three rows (many runs merged, retried periods' extra rows among them) the report is
    the bytes of one held in memory."""
    from auditor.report.markdown import render_markdown

    root = outcome_study(tmp_path / "study", ["completed", "retried", "rollout_init_oom",
                                              "cancelled", "terminal_missing", "retried"] * 30)
    _spill_from(monkeypatch, 0)
    result = run_audit(root)
    whole = render_markdown(result)
    monkeypatch.setattr(sorted_rows, "RUN_ROWS", 3)
    assert render_markdown(result) == whole


@pytest.mark.parametrize("seed", range(4))
def test_a_code_block_kept_on_disk_is_the_code_block_of_its_lines(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines given one at a time and kept on disk (runs of five) make the block made of
    them in memory: control characters taken out, a fence longer than any run of
    backticks or tildes inside."""
    from auditor.report.mdformat import SpilledCodeBlock, code_block

    monkeypatch.setattr(sorted_rows, "RUN_ROWS", 5)
    draw = random.Random(seed)
    pieces = ["a", "```", "~~~~", "`````", "\x1b[31m", "\u202e", " ", "7,8"]
    lines = ["".join(draw.choice(pieces) for _ in range(draw.randrange(6)))
             for _ in range(draw.randrange(0, 40))]
    block = SpilledCodeBlock()
    for line in lines:
        block.add(line)
    fence = "`" * max(3, 1 + max((len(run) for line in lines
                                  for run in re.findall("`{3,}|~{3,}", line)), default=0))
    clean = [re.sub("[\x00-\x1f\u202e]", "", line) for line in lines]
    assert "\n".join(block) == code_block(lines) == "\n".join([fence + "text", *clean, fence])


def test_a_temporary_directory_it_cannot_use_is_one_line_not_a_bug(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without ``--out`` the store's files go to the temporary directory: one that is gone
    (or full: ENOSPC, seen on a 64 KiB tmpfs) is the user's to fix, one line and exit 2.
    With ``--out`` they go beside it, and ``TMPDIR`` is not needed."""
    import tempfile

    root = copy_example(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    assert main(["audit", str(root), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "temporary directory" in err and "TMPDIR" in err
    assert main(["audit", str(root), "--out", str(tmp_path / "out"), "--quiet",
                 "--no-plots"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", root.name])


def test_a_temporary_directory_inside_the_evidence_root_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The auditor never writes under the evidence root, its store's unnamed files neither."""
    import tempfile

    root = copy_example(tmp_path)
    inside = root / "pairs"
    monkeypatch.setattr(tempfile, "tempdir", str(inside))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    assert main(["audit", str(root), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "inside the evidence root" in err
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_a_tmpdir_inside_the_root_is_refused_before_it_is_tried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Python finds its temporary directory by writing a file in each candidate: asked first,
    it wrote (and removed) one under the evidence root before the refusal."""
    import tempfile

    root = copy_example(tmp_path)
    inside = root / "pairs"
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setenv("TMPDIR", str(inside))
    before = inside.stat().st_mtime_ns
    os.utime(inside, ns=(before - 10**9, before - 10**9))  # (a write now would move it)
    assert main(["audit", str(root), "--quiet"]) == 2
    assert "inside the evidence root" in capsys.readouterr().err
    assert inside.stat().st_mtime_ns == before - 10**9


def _in_a_child_and_here(read: Callable[[], object], passes: int = 30) -> None:
    """``read()`` ``passes`` times in a forked child and in this process at once: both must
    give what one read alone gives (the store's temporary files are shared through the fork,
    their offsets with them)."""
    expected = read()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 0 if all(read() == expected for _ in range(passes)) else 1
        finally:
            os._exit(code)
    try:
        here = [read() == expected for _ in range(passes)]
    finally:
        _, status = os.waitpid(pid, 0)
    assert all(here) and os.waitstatus_to_exitcode(status) == 0


def test_kept_records_read_in_a_forked_child_and_here_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SPILL_FROM_VARIABLE, "0")
    kept = Kept(("record", number, "x" * (number % 97)) for number in range(3000))
    rows = SortedRows(key=0, run_rows=500, piece_rows=50)
    rows.extend((-number, str(number)) for number in range(3000))
    _in_a_child_and_here(lambda: (list(kept), list(rows)))


def test_table_rows_read_in_a_forked_child_and_here_at_once() -> None:
    import pyarrow as pa

    from auditor.store.tables import BATCH_ROWS, TableRows

    def value(kind: pa.DataType, number: int) -> object:
        return (f"{number}" if pa.types.is_string(kind) else number % 100
                if pa.types.is_integer(kind) else number / 7 if pa.types.is_floating(kind)
                else number % 2 == 0 if pa.types.is_boolean(kind) else None)

    table = TableRows("devices")
    table.extend(tuple(value(field.type, number) for field in table.schema)
                 for number in range(5 * BATCH_ROWS + 7))
    table.finish()  # (what the report does before it forks a helper)
    _in_a_child_and_here(lambda: [batch.column("path").to_pylist()
                                  for batch in table.batches()], passes=15)
