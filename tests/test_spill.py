"""Rows kept out of memory (:mod:`auditor._spill`): given back in the order ``sorted()``
gives, of equal keys the one added first, whatever the runs' and pieces' sizes."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

import auditor._spill as spill
from auditor._spill import SortedSpill
from auditor.pipeline.audit import Auditor, assemble_collected, drive, run_audit
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



@pytest.mark.parametrize("block", [1, 3, 64])
def test_a_packed_list_gives_back_the_records_it_was_given(block: int) -> None:
    """Records kept packed a block at a time come back equal, in order, however they are
    read: through, by place (from either end, in any order), by slice, and after a
    pickle's round trip (what a worker's result crosses)."""
    import pickle

    from auditor.model import Citation

    records = [Citation(f"a/{number}.jsonl", number or None, None, "\udcff" * (number % 3))
               for number in range(150)]
    packed: spill.PackedList[Citation] = spill.PackedList(block=block)
    for item in records:
        packed.append(item)
    assert len(packed) == 150 and list(packed) == records and list(packed) == records
    draw = random.Random(block)
    for place in [*range(150), *(draw.randrange(-150, 150) for _ in range(300))]:
        assert packed[place] == records[place]
    assert packed[::7] == records[::7] and packed[-5:] == records[-5:] and packed[3:3] == []
    with pytest.raises(IndexError):
        packed[150]
    with pytest.raises(IndexError):
        packed[-151]
    again = pickle.loads(pickle.dumps(packed))
    assert isinstance(again, spill.PackedList) and list(again) == records
    assert records[40] in packed and packed.index(records[40]) == 40
    assert list(spill.PackedList(records[:0])) == []
    drained = again.drain()
    assert next(drained) == records[0] and len(again) == 0  # (let go as it is read)
    assert [records[0], *drained] == records


def test_a_large_studys_periods_and_verdicts_are_kept_packed_and_report_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``PACK_PERIODS`` periods the study's judged periods and verdicts are kept
    packed until the report is written, read in the workers (two) or in the audit's own
    process: every output is the bytes of the audit that keeps them as objects, a retried
    period's rows among them."""
    import auditor.pipeline.study as fold
    from auditor._cli import main
    from tests.helpers import outcome_study
    from tests.test_shards import OUTPUTS

    root = outcome_study(tmp_path / "study", ["completed", "retried", "rollout_init_oom",
                                              "cancelled", "terminal_missing", "retried"])
    assert main(["audit", str(root), "--out", str(tmp_path / "objects"), "--quiet",
                 "--no-plots"]) == 0
    plain = run_audit(root)
    assert isinstance(plain.collected.periods, tuple) and isinstance(plain.verdicts, tuple)
    monkeypatch.setattr(fold, "PACK_PERIODS", 0)
    kinds: set[str] = set()
    append = spill.PackedList.append

    def noting(self: spill.PackedList[object], item: object) -> None:
        kinds.add(type(item).__name__)
        append(self, item)

    monkeypatch.setattr(spill.PackedList, "append", noting)
    monkeypatch.setattr(spill, "RUN_ROWS", 2)  # (the inputs sorted in runs on disk)
    packed = run_audit(root)
    # (the records as loaded, what judging each gave, the periods judged, their records'
    # inputs, and the study's verdicts, attempt outcomes, facts and reasoning's findings)
    assert kinds == {"LoadedPeriod", "Judged", "PeriodEvidence", "Verdict", "AttemptOutcome",
                     "PeriodFacts", "Finding", "InputFile"}
    assert isinstance(packed.collected.inputs, spill.PackedList)
    assert list(packed.collected.inputs) == list(plain.collected.inputs)
    assert len(plain.collected.inputs) > 6 and list(plain.collected.inputs) == sorted(
        plain.collected.inputs, key=lambda item: (item.group, item.path))
    for kept in (packed.reasoning.attempts, packed.reasoning.facts, packed.reasoning.findings):
        assert isinstance(kept, spill.PackedList) and len(kept) > 0
    assert isinstance(packed.collected.periods, spill.PackedList)
    assert isinstance(packed.verdicts, spill.PackedList) and packed.reasoning.verdicts is \
        packed.verdicts
    assert list(packed.verdicts) == list(plain.verdicts)
    assert packed.findings == plain.findings
    for name in ("attempts", "facts", "findings"):
        assert list(getattr(packed.reasoning, name)) == list(getattr(plain.reasoning, name))
    assert list(packed.collected.periods) == list(plain.collected.periods)
    diagnostic = (tmp_path / "objects" / "diagnostic.md").read_text()
    assert diagnostic.count(", attempt 2") >= 2  # (the retried periods' second rows)
    for jobs in ("1", "2"):
        out = tmp_path / f"packed-{jobs}"
        assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots",
                     "--jobs", jobs]) == 0
        for name in OUTPUTS:
            assert (out / name).read_bytes() == (tmp_path / "objects" / name).read_bytes(), \
                (jobs, name)


def test_the_period_table_sorts_and_lists_its_pids_out_of_memory_as_it_did_in_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The period table's rows are sorted with what each reads of its period's facts
    waiting on disk, and its PIDs lines wait there for the block after it: with runs of
    three rows (many runs merged, retried periods' extra rows among them) the report is
    the bytes of one held in memory, and while its rows are made no more of the packed
    study's facts are alive than one block of them (a million periods' facts were held
    for the sort)."""
    import gc

    import auditor.pipeline.study as fold
    from auditor.model import PeriodFacts
    from auditor.report import mdformat
    from auditor.report.markdown import render_markdown
    from tests.helpers import outcome_study

    root = outcome_study(tmp_path / "study", ["completed", "retried", "rollout_init_oom",
                                              "cancelled", "terminal_missing", "retried"] * 30)
    monkeypatch.setattr(fold, "PACK_PERIODS", 0)
    result = run_audit(root)
    whole = render_markdown(result)
    monkeypatch.setattr(spill, "RUN_ROWS", 3)
    alive: list[int] = []
    add = mdformat.SpilledCodeBlock.add

    def counting(self: mdformat.SpilledCodeBlock, line: str) -> None:
        if not alive:
            alive.append(sum(1 for item in gc.get_objects() if type(item) is PeriodFacts))
        add(self, line)

    monkeypatch.setattr(mdformat.SpilledCodeBlock, "add", counting)
    assert render_markdown(result) == whole
    assert len(result.reasoning.facts) == 180 and alive and alive[0] <= spill.PACK_BLOCK


@pytest.mark.parametrize("seed", range(4))
def test_a_spilled_code_block_is_the_code_block_of_its_lines(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines given one at a time and kept on disk (runs of five) make the block made of
    them in memory: control characters taken out, a fence longer than any run of
    backticks or tildes inside."""
    from auditor.report.mdformat import SpilledCodeBlock, code_block

    monkeypatch.setattr(spill, "RUN_ROWS", 5)
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


def test_a_spilled_list_keeps_its_blocks_on_disk_and_reads_back_as_a_list() -> None:
    """A :class:`~auditor._spill.SpilledList` is the sequence of what was appended, read
    over in order as often as wanted and at any place, with only its last, unfilled block
    in memory (the others in its temporary file)."""
    import pickle

    items = [(number, f"v{number}" * (number % 5)) for number in range(203)]
    kept = spill.SpilledList(items, block=16)
    assert len(kept) == 203 and list(kept) == items and list(kept) == items
    assert [kept[at] for at in (0, 15, 16, 202, -1, 100, 3)] == [
        items[at] for at in (0, 15, 16, 202, -1, 100, 3)]
    assert kept[5:40:7] == items[5:40:7]
    with pytest.raises(IndexError):
        kept[203]
    assert list(pickle.loads(pickle.dumps(kept))) == items
    assert list(kept.drain()) == items and len(kept) == 0


def test_a_spilled_list_holds_in_memory_only_what_a_packed_one_would_not() -> None:
    """2,000 records of a kilobyte of hexadecimal digits (which compress to half): a packed
    list holds them all (1.2 MB), a spilled one about a block of them."""
    import os
    import tracemalloc

    tracemalloc.start()
    try:
        held = []
        for kind in (spill.PackedList, spill.SpilledList):
            before = tracemalloc.get_traced_memory()[0]
            kept = kind((os.urandom(512).hex() for _ in range(2000)), block=16)
            held.append(tracemalloc.get_traced_memory()[0] - before)
            assert len(kept) == 2000
            del kept
    finally:
        tracemalloc.stop()
    assert held[0] > 1_000_000 and held[1] < 100_000, held


def test_a_large_studys_report_reads_each_period_a_few_times_whatever_its_groups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing a packed study's ``diagnostic.md`` makes each period anew only in a few
    passes over the study, not once per pass of each diagnosis group over its members
    (reading a member's period by its place remade the whole packed block it is in: at a
    million files, three groups read six times each took most of three minutes). The
    same bytes as before."""
    from collections import Counter
    from typing import Any

    import auditor.pipeline.study as fold
    from auditor.model import PeriodEvidence, Verdict
    from auditor.report import groups
    from auditor.report.markdown import render_markdown
    from tests.helpers import outcome_study

    root = outcome_study(tmp_path / "study", ["completed", "rollout_init_oom",
                                              "terminal_missing", "cancelled"] * 12)
    plain = render_markdown(run_audit(root))
    monkeypatch.setattr(fold, "PACK_PERIODS", 0)
    monkeypatch.setattr(spill, "PACK_BLOCK", 4)
    monkeypatch.setattr(groups, "COUNTED_KEPT", 2)  # (as a group of thousands of periods)
    result = run_audit(root)
    assert isinstance(result.collected.periods, spill.PackedList)
    made: Counter[str] = Counter()
    for kind in (PeriodEvidence, Verdict):
        def counting(self: object, *args: object, init: Any = kind.__init__,
                     **kwargs: object) -> None:
            made[type(self).__name__] += 1
            init(self, *args, **kwargs)

        monkeypatch.setattr(kind, "__init__", counting)
    assert render_markdown(result) == plain
    assert plain.count("\n### ") == 4
    # (about a dozen passes over the study; each group's verdicts read from its own list)
    assert made["PeriodEvidence"] <= 12 * 48 and made["Verdict"] <= 24 * 48, made
