"""The workers judge each batch of periods with only the scheduler rows it may look up.

A worker used to hold the whole parsed ``sacct`` dump for the audit's life (about 80 MB
at a million files); now the context it is given keeps the dump's fields and findings
without a row, and each batch brings the rows its periods' look-ups may return
(:class:`~auditor.validate.checks.SchedulerRows`). These tests hold the narrowing to the
look-ups: every key, the dump's order, and the periods that cannot be narrowed.
"""

from __future__ import annotations

import gc
import io
import pickle
import shutil
from dataclasses import replace
from pathlib import Path

import orjson
import pandas as pd
import pytest

from auditor.collect.sacct import parse_sacct
from auditor.model import (
    AttemptSpec,
    AuditOptions,
    PeriodRecord,
    SacctDump,
    SacctJob,
    StudyLayout,
)
from auditor.pipeline.audit import run_audit
from auditor.pipeline.study import Fold
from auditor.pipeline.worker import FoldedPeriod
from auditor.reason.engine import JudgeContext
from auditor.validate.checks import SchedulerRows
from tests.helpers import audit, edit_record, outcome_study, period_records, verdicts
from tests.reason.values import collected

FORMAT = "JobID|JobIDRaw|JobName|State|ExitCode|Start|End|ElapsedRaw|AllocTRES|NodeList|Reason"
ROWS = [
    "7000000_0|7000001|a|COMPLETED|0:0|2026-09-15T18:00:00|2026-09-15T19:00:00|3600|"
    "gres/gpu=4|n1|None",
    "7000000_0.batch|7000001.batch|batch|COMPLETED|0:0|2026-09-15T18:00:00|"
    "2026-09-15T19:00:00|3600||n1|",
    "7000000_1|7000002|a|FAILED|1:0|2026-09-15T18:00:00|2026-09-15T18:10:00|600|"
    "gres/gpu=4|n2|None",
    "7000000_[2-3]|7000000|a|PENDING|0:0|Unknown|Unknown|0||None assigned|Priority",
    "8000000_0|8000001|b|COMPLETED|0:0|2026-09-15T18:00:00|2026-09-15T19:00:00|3600|"
    "gres/gpu=4|n3|None",
    "123|123|plain|COMPLETED|0:0|2026-09-15T18:00:00|2026-09-15T19:00:00|3600|"
    "gres/gpu=4|n4|None",
]


def _dump(text: str) -> SacctDump:
    return parse_sacct(io.BytesIO(text.encode()), "accounting/sacct-raw.psv")


def _record(array: str | None, task: int | None, *jobs: str) -> PeriodRecord:
    return PeriodRecord(
        path="pairs/p/period-1.json", pair="p", period=1, readable=True,
        array_job_id=array, array_task_id=task,
        attempts=tuple(AttemptSpec(index, job, None, (), (), "") for index, job
                       in enumerate(jobs)))


def _narrowed(rows: SchedulerRows, records: list[PeriodRecord]) -> SacctDump:
    """The dump as a batch of ``records`` is sent it (what the audit does)."""
    return rows.at(place for record in records for place in rows.places(record))


def _ids(dump: SacctDump) -> list[str]:
    return [job.job_id for job in dump.jobs]


def test_a_batch_gets_its_jobs_its_elements_and_its_arrays_pending_ranges_in_order() -> None:
    dump = _dump("\n".join([FORMAT, *ROWS]) + "\n")
    rows = SchedulerRows(dump)
    # its job (by JobIDRaw, spaces as the look-up strips them) and its array's pending range
    assert _ids(_narrowed(rows, [_record("7000000", 0, " 7000001 ")])) == [
        "7000000_0", "7000000_[2-3]"]
    # the element the record names, which sacct knows by another job id than the record's
    assert _ids(_narrowed(rows, [_record("7000000", 1, "9999999")])) == [
        "7000000_1", "7000000_[2-3]"]
    # two periods of two arrays: their rows in the dump's order, not the records'
    assert _ids(_narrowed(rows, [_record("8000000", 0, "8000001"),
                                  _record("7000000", 2, "7000000")])) == [
        "7000000_[2-3]", "8000000_0"]
    assert _ids(_narrowed(rows, [_record(None, None, "123")])) == ["123"]
    assert _ids(_narrowed(rows, [_record(None, None, "555")])) == []
    narrowed = _narrowed(rows, [_record("8000000", 0, "8000001")])
    assert (narrowed.path, narrowed.fields, narrowed.findings, narrowed.digest) == (
        dump.path, dump.fields, dump.findings, dump.digest)


def test_without_a_jobidraw_column_a_job_is_found_by_its_printed_id() -> None:
    header = FORMAT.replace("|JobIDRaw", "")
    text = "\n".join([header, *("|".join(row.split("|")[:1] + row.split("|")[2:])
                                for row in ROWS)]) + "\n"
    rows = SchedulerRows(_dump(text))
    assert _ids(_narrowed(rows, [_record(None, None, "123")])) == ["123"]
    assert _ids(_narrowed(rows, [_record(None, None, "7000000_1")])) == ["7000000_1"]


def test_the_workers_context_holds_no_row_of_the_dump() -> None:
    """What each worker is given once (pickled to a file it loads) keeps the dump's
    fields, findings and digest, not its rows: a dump of 20,000 more jobs adds only its
    digest's larger size to it."""
    small = _dump("\n".join([FORMAT, *ROWS]) + "\n")
    large = _dump("\n".join([FORMAT, *ROWS, *(
        f"9{n:06d}|9{n:06d}|x|COMPLETED|0:0|2026-09-15T18:00:00|2026-09-15T19:00:00|"
        "3600|gres/gpu=1|n9|None" for n in range(20_000))]) + "\n")
    sizes = []
    for dump in (small, large):
        context = JudgeContext(collected(dump=dump), AuditOptions(), ())
        shared = context.for_workers()
        assert shared.study.sacct is not None and shared.study.sacct.jobs == ()
        assert (shared.study.sacct.fields, shared.study.sacct.digest) == (dump.fields,
                                                                          dump.digest)
        sizes.append(len(pickle.dumps(shared, protocol=pickle.HIGHEST_PROTOCOL)))
    assert len(large.jobs) - len(small.jobs) == 20_000
    assert sizes[1] - sizes[0] < 8 < len(pickle.dumps(large)) // 100_000


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return outcome_study(tmp_path_factory.mktemp("rows") / "study",
                         ["completed", "rollout_init_oom", "coordinated_shutdown"])


def test_a_dump_without_jobidraw_gives_the_verdicts_of_one_with_it(study: Path,
                                                                  tmp_path: Path) -> None:
    """Every job printed by its raw id and no JobIDRaw column: each attempt's job is still
    found (by its printed JobID), so the verdicts are the full dump's and no job is said to
    have no allocation row."""
    root = tmp_path / "study"
    shutil.copytree(study, root)
    dump = root / "accounting/sacct-raw.psv"
    fields = FORMAT.split("|")
    lines = []
    for line in dump.read_text().splitlines():
        values = line.split("|")
        values[0] = values[1]  # (JobID as JobIDRaw: a plain job's, as sacct prints it)
        del values[1]
        lines.append("|".join(values))
    dump.write_text("\n".join(["|".join(fields[:1] + fields[2:]), *lines]) + "\n")
    before = audit(study, tmp_path / "before")
    after = audit(root, tmp_path / "after")
    assert verdicts(after) == verdicts(before)
    findings = pd.read_parquet(tmp_path / "after/findings.parquet")
    assert "AUD119" not in set(findings["rule_id"])


def test_a_record_whose_job_id_is_empty_is_judged_by_its_trials_job(study: Path,
                                                                    tmp_path: Path) -> None:
    """``"job_id": ""`` and no array task id (schema findings: the evidence is invalid)
    leave the job to the
    trial record, known only once read: such a study is judged where the whole dump is,
    and the trial's job is found in it (the workers' rows are chosen from the records'
    job ids, and ``""`` names none)."""
    root = tmp_path / "study"
    shutil.copytree(study, root)
    record = period_records(root)[0]

    def unnamed(doc: dict[str, object]) -> None:
        doc["job_id"] = ""
        del doc["array_task_id"]  # (nor is the job found by its element)

    edit_record(record, unnamed)
    summary = audit(root, tmp_path / "out")
    subject = f"{record.parent.name}/{record.stem}"
    assert verdicts(summary)[subject] == ("unresolved", "evidence_invalid")
    findings = pd.read_parquet(tmp_path / "out/findings.parquet")
    assert findings[(findings["rule_id"] == "AUD119")
                    & (findings["subject"] == subject)].empty


def test_the_workers_context_holds_no_pin_and_each_batch_brings_its_pairs(
        study: Path, tmp_path: Path) -> None:
    """The pinned commits go to the workers a batch's pairs at a time, not all in the
    context each is given once (a million files' 55,556 pins were 11 MB in each): a pair
    pinned to another commit and a pair not pinned are still told apart from one pinned
    right, whether the workers judge or this process does."""
    context = JudgeContext(collected(), AuditOptions(), ())
    assert context.study.execution_commits is None
    assert context.for_workers().study.execution_commits is None
    pinned = JudgeContext(replace(collected(), execution_commits={"p": "a" * 40}),
                          AuditOptions(), ())
    assert pinned.for_workers().study.execution_commits == {}
    root = tmp_path / "study"
    shutil.copytree(study, root)
    pins = orjson.loads((root / "execution_commits.json").read_bytes())
    first, second, third = sorted(pins)
    pins[first] = "0" * 40
    del pins[second]
    (root / "execution_commits.json").write_bytes(orjson.dumps(pins))
    for jobs in ("2", "1"):
        audit(root, tmp_path / jobs, "--jobs", jobs)
        findings = pd.read_parquet(tmp_path / jobs / "findings.parquet")
        pinned_rows = findings[findings["rule_id"] == "AUD121"]
        assert sorted(pinned_rows["subject"]) == [f"{first}/period-1", f"{second}/period-1"]
        assert third not in " ".join(pinned_rows["message"])


def test_the_audit_holds_no_row_of_the_dump_while_the_workers_judge(
        study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the workers judge, each batch with its rows, the audit's own process keeps
    the dump's rows set aside (packed: 55 MB as objects at a million files): no row is
    alive in it as each judged period comes back, nor the layout's listings, not even when
    the study's checks looked rows up (an array element the records name that the dump
    does not show: known by its job id, AUD111); the result has the whole dump, as
    parsed."""
    root = tmp_path / "study"
    shutil.copytree(study, root)
    edit_record(period_records(root)[1], lambda doc: doc.update(array_task_id=977))
    held: list[tuple[int, int, int]] = []
    original = Fold.add_folded

    def spy(self: Fold, folded: FoldedPeriod) -> None:
        sacct = self.judge.study.sacct
        alive = gc.get_objects()
        held.append((-1 if sacct is None else len(sacct.jobs),
                     sum(isinstance(item, SacctJob) for item in alive),
                     sum(isinstance(item, StudyLayout) and bool(item.period_records)
                         for item in alive)))
        original(self, folded)

    monkeypatch.setattr(Fold, "add_folded", spy)
    result = run_audit(root, AuditOptions(jobs=2))
    assert held == [(0, 0, 0)] * 3
    record = period_records(root)[1]
    assert [item.rule_id for item in result.findings if "977" in item.message] == ["AUD111"]
    assert [item.subject for item in result.findings if item.rule_id == "AUD111"] == [
        f"{record.parent.name}/{record.stem}"]
    with (root / "accounting/sacct-raw.psv").open("rb") as handle:
        parsed = parse_sacct(handle, "accounting/sacct-raw.psv")
    assert result.collected.sacct is not None and len(parsed.jobs) == 3
    assert result.collected.sacct.jobs == parsed.jobs


def test_a_commit_many_pairs_pin_is_held_once(study: Path) -> None:
    """``execution_commits.json`` pins every pair to one commit: the audit holds one
    string for it, not one per pair (55,556 copies, 5 MB, at a million files)."""
    pins = run_audit(study).collected.execution_commits
    assert pins is not None and len(pins) == 3
    assert len({id(commit) for commit in pins.values()}) == 1
