"""The audit as a stream of periods: each is judged as soon as its evidence is read, its
phase and device rows go to their tables, and it is kept as its summary; the pool reads
only a little ahead of that. The report is the same as if every period were kept whole."""

from __future__ import annotations

import os
import shutil
import sys
import time
import weakref
from pathlib import Path

import pytest

import auditor.pipeline.study
import auditor.pipeline.worker
from auditor._cli import main
from auditor.model import AuditOptions, PeriodSummary
from auditor.pipeline.audit import Auditor, drive, paused_gc, run_audit
from auditor.pipeline.pool import AHEAD, LocalPool, chunk_size
from auditor.pipeline.worker import KEPT_WHOLE
from auditor.report.tables import device_values
from tests.helpers import SharedValue, note_task, noted_tasks, shared_task

PERIODS = 2 * 20  # (two arms of a pair a element: both periods of an element share its job)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("streaming") / "study"
    assert main(["example", str(root), "--kind", "scale", "--elements", str(PERIODS // 2),
                 "--trace-samples", "2", "--log-lines", "3"]) == 0
    return root


def _outputs(out: Path) -> dict[str, bytes]:
    return {path.relative_to(out).as_posix(): path.read_bytes()
            for path in sorted(out.rglob("*")) if path.is_file()
            and path.name != "output_manifest.json"}


def test_a_judged_period_is_kept_as_its_summary_and_the_first_whole(study: Path) -> None:
    """Each judged period is kept as its summary: its record whole, each attempt's trial
    record whole, and of each trace its digest (one object for each alike digest); the
    first periods (the timeline plot's) are kept whole besides, as they were read."""
    result = run_audit(study)
    periods = result.collected.periods
    assert len(periods) == PERIODS > KEPT_WHOLE
    assert all(type(period) is PeriodSummary for period in periods)
    timeline = result.collected.timeline
    assert [p.subject for p in timeline] == [p.subject for p in periods[:KEPT_WHOLE]]
    assert all(p.record == s.record for p, s in zip(timeline, periods, strict=False))
    assert all(a.read.log is not None and a.read.trial and a.read.trial.processes
               and all(t.phases for t in a.read.traces)
               for p in timeline for a in p.attempts)
    shared: dict[object, object] = {}
    for period in periods:
        assert all(spec.evidence for spec in period.record.attempts)
        for attempt in period.attempts:
            assert attempt.trial is not None and attempt.trial.processes \
                and attempt.trial.dispatch
            assert attempt.traces and all(shared.setdefault(t, t) is t for t in attempt.traces)
    assert 0 < len(shared) < len(periods)
    # the texts the verdicts repeat are one object each (a group's diagnosis, its quotes)
    texts = [text for v in result.verdicts
             for text in (v.diagnosis, v.limits, *(c.quote for c in v.citations))]
    assert len({id(text) for text in texts}) == len(set(texts)) < len(texts) // 4
    # ...and each period's name one string, in its verdict, outcomes and attempts
    outcomes = {o.subject: o for o in result.reasoning.attempts}
    assert all(v.subject is p.subject is outcomes[p.subject].subject is a.subject
               for v, p in zip(result.verdicts, periods, strict=True) for a in p.attempts)
    whole = drive(Auditor(study).collect(), lambda event: None)  # (no fold: all kept)
    phases = sum(len(t.phases) for unit in whole.units for a in unit.evidence.attempts
                 for t in a.read.traces)
    assert result.collected.tables["phases"].rows == phases > 0
    for column, field in (("role", "role"), ("memory_total_mib", "memory_total_mib")):
        assert device_values(result, column) == {  # (what the report reads of devices)
            getattr(d, field) for unit in whole.units for a in unit.evidence.attempts
            for d in a.read.devices} != set()


def _steps_in_env(study: Path, root: Path) -> Path:
    """A copy of ``study`` whose trial records give the step count in ``env`` alone (the
    contract lets a launcher say it there), the manifests refitted."""
    import hashlib
    import json
    import shutil

    shutil.copytree(study, root)
    for path in sorted((root / "pairs").glob("*/period-*.json")):
        record = json.loads(path.read_text())
        for attempt in record.get("attempts") or [record]:
            for entry in attempt["evidence"]:
                if entry["kind"] == "trial":
                    trial_path = root / attempt["attempt_dir"] / entry["path"]
                    trial = json.loads(trial_path.read_text())
                    trial["env"]["TOTAL_TRAINING_STEPS"] = \
                        trial["dispatch"].pop("TOTAL_TRAINING_STEPS")
                    data = (json.dumps(trial, indent=2) + "\n").encode()
                    trial_path.write_bytes(data)
                    entry["sha256"], entry["size"] = hashlib.sha256(data).hexdigest(), len(data)
        path.write_text(json.dumps(record, indent=2) + "\n")
    return root


@pytest.mark.parametrize("steps_in", ["dispatch", "env"])
def test_keeping_summaries_changes_no_byte_of_the_report(
        study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps_in: str) -> None:
    """Every output of an audit that keeps judged periods as their summaries is that of one
    keeping them all whole: the tables from the kept rows, the diagnosis groups from the
    digests (a step count in the trial's env alone included: the groups' sentences read it
    after)."""
    if steps_in == "env":
        study = _steps_in_env(study, tmp_path / "study")
    assert main(["audit", str(study), "--out", str(tmp_path / "lean"), "--quiet"]) == 0
    for module in (auditor.pipeline.worker, auditor.pipeline.study):  # (the fold and workers)
        monkeypatch.setattr(module, "KEPT_WHOLE", 10**9)
    assert main(["audit", str(study), "--out", str(tmp_path / "whole"), "--quiet"]) == 0
    lean, whole = _outputs(tmp_path / "lean"), _outputs(tmp_path / "whole")
    assert lean.keys() == whole.keys() and len(lean) > 8
    assert [name for name in lean if lean[name] != whole[name]] == []
    if steps_in == "env":  # (the sentence the env's steps feed is there)
        assert b"at step " in lean["diagnostic.md"]


def test_the_pool_reads_only_a_little_ahead_of_the_audit(tmp_path: Path) -> None:
    """A caller slower than the workers (each period judged as it comes) holds the results
    of a few chunks, not of every task: the next chunk goes out as one is taken."""
    log = tmp_path / "started.log"
    tasks = [(str(log), number) for number in range(400)]
    pool = LocalPool(2)
    try:
        with paused_gc():
            results = pool.map(note_task, tasks, 400 << 20)
            first = next(results)
            time.sleep(1.5)  # (the workers would have started every task by now)
            started = len(log.read_text().splitlines())
            rest = list(results)
    finally:
        pool.close()
    assert [first, *rest] == list(range(400))
    chunk = chunk_size(400, 400 << 20, 2)
    assert started <= (AHEAD * 2 + 1) * chunk < 400


def test_the_tasks_are_made_only_as_the_pool_sends_them(tmp_path: Path) -> None:
    """Told how many there are, the pool takes tasks from a generator only as it sends
    them: the audit plans an attempt's reading as it goes (a million files' tasks, made at
    once, held 0.3 GB)."""
    log = tmp_path / "started.log"
    made: list[int] = []
    pool = LocalPool(2)
    try:
        results = pool.map(note_task, noted_tasks(log, 400, made), 400 << 20, count=400)
        first = next(results)
        planned = len(made)
        rest = list(results)
    finally:
        pool.close()
    assert [first, *rest] == list(range(400)) and len(made) == 400
    assert planned <= (AHEAD * 2 + 1) * chunk_size(400, 400 << 20, 2) < 400


def test_a_judged_periods_record_is_held_once(study: Path) -> None:
    """The judge lets go of the periods' records once its study-level checks have read
    them (it judged each period from the one it is given): the fold's judged period holds
    the only copy, whole."""
    from dataclasses import replace

    from auditor.model import AuditOptions
    from auditor.pipeline.study import Fold

    parts = drive(Auditor(study).collect(), lambda event: None)
    units = sorted(parts.units, key=lambda unit: unit.index)
    fold = Fold(replace(parts, units=()), [u.evidence.record.without_entries() for u in units],
                AuditOptions())
    assert fold.judge.study.periods == ()
    for unit in units:
        fold.add(unit)
    assert len(fold.periods) == PERIODS
    for slot, period in enumerate(fold.periods):
        assert period.record == units[slot].evidence.record
        assert all(spec.evidence for spec in period.record.attempts)


@pytest.mark.parametrize("count", [None, 400])
def test_the_pool_starts_working_when_asked_not_when_the_first_result_is(
        tmp_path: Path, count: int | None) -> None:
    """The first chunks go out as ``map`` is called: the audit walks the study while the
    workers read its period records (a pool that waited for the first result to be asked
    for read nothing during the walk)."""
    log = tmp_path / "started.log"
    pool = LocalPool(2)
    try:
        results = pool.map(note_task, noted_tasks(log, 400, []), 400 << 20, count=count)
        deadline = time.monotonic() + 10
        while not (log.exists() and log.read_text()):  # (no result asked for yet)
            assert time.monotonic() < deadline, "nothing started before a result was asked for"
            time.sleep(0.01)
        assert list(results) == list(range(400))
    finally:
        pool.close()


class _Cycle:
    """A value left in a reference cycle: only the collector frees it."""

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)
        self.me = self


_LEFT: weakref.WeakSet[_Cycle] = weakref.WeakSet()


def _leave_a_cycle(size: int) -> int:
    """(A pool task) make a result and leave garbage behind, as a parse may."""
    _LEFT.add(_Cycle(size))
    return os.getpid()


def _cycles_left(_: int) -> tuple[int, int]:
    """(A pool task) this worker and how many cycles are left in it."""
    return os.getpid(), len(_LEFT)


@pytest.mark.skipif(sys.platform != "linux", reason="forked workers share the paused collector")
def test_a_result_sent_from_a_worker_leaves_no_garbage_there() -> None:
    """A worker's collector is paused, as the audit's is: what a task's result left behind
    in it (the worker that parsed a million files' scheduler dump held 76 MB of PSS of it
    for the rest of the audit) is collected once the result is pickled, before the worker
    goes on."""
    with paused_gc():
        pool = LocalPool(2)
        try:
            worker = pool.soon(_leave_a_cycle, 1 << 20, 10_000)()
            seen: dict[int, int] = {}
            for _ in range(20):
                seen.update(pool.map(_cycles_left, range(16), 1 << 40))
                if worker in seen:
                    break
            assert seen.get(worker) == 0, seen
        finally:
            pool.close()


def test_the_manifest_entries_wait_packed_until_their_period_is_planned(study: Path) -> None:
    """Until a period's reads are planned, the process that plans them holds its manifest
    entries packed (one ``bytes`` a record), not as records: when this study's reading
    starts (read in this process: nothing is planned ahead of it), none is alive; while it
    goes, only those of the periods planned and not yet joined."""
    import gc

    from auditor.model import EvidenceEntry, Progress

    def alive() -> int:
        return sum(1 for item in gc.get_objects() if type(item) is EvidenceEntry)

    listed = sum(len(spec.evidence) for period in run_audit(study).collected.periods[:1]
                 for spec in period.record.attempts)
    gc.collect()
    before = alive()  # (the first periods of the result just made, kept whole)
    seen: list[int] = []

    def show(event: Progress) -> None:
        if event.stage == "read" and not seen:
            seen.append(alive() - before)

    with paused_gc():
        drive(Auditor(study).run(), show)
    assert listed > 0 and seen == [0]


def test_two_records_of_one_period_read_ahead_are_each_joined_with_their_own(
        tmp_path: Path) -> None:
    """A record copied under another pair names the same period as its original: read by
    the pool, which plans ahead of the joining, each is still joined with its own reads
    (once a KeyError: the two shared their reads' keys), as when read one at a time."""
    import shutil

    root = tmp_path / "study"
    assert main(["example", str(root), "--kind", "mixed"]) == 0
    original = sorted((root / "pairs").glob("*/period-1.json"))[0]
    (root / "pairs" / "aaa-copy").mkdir()
    shutil.copy(original, root / "pairs" / "aaa-copy" / "period-1.json")
    outs = {}
    for jobs in ("1", "2"):
        outs[jobs] = tmp_path / f"out-{jobs}"
        assert main(["audit", str(root), "--out", str(outs[jobs]), "--quiet", "--no-plots",
                     "--jobs", jobs]) in (0, 1)
    assert _outputs(outs["1"]) == _outputs(outs["2"])
    assert "pair is " in (outs["2"] / "diagnostic.md").read_text()  # (the copy's mismatch)


@pytest.mark.parametrize("fixture", ["kit", "24.11/kit"])
def test_the_real_kit_study_read_by_workers_says_what_one_process_says(
        tmp_path: Path, fixture: str) -> None:
    """The kit's own study from a real Slurm (an attempt whose first trace's shape the fold
    already kept, its next one new) read by the pool: once a KeyError (exit 3), the fold's
    sharing of trace digests stopping at the first one already kept."""
    study = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / fixture / "study"
    root = tmp_path / "study"
    shutil.copytree(study, root, symlinks=True)
    outs = {}
    for jobs in ("1", "2", "3"):
        outs[jobs] = tmp_path / f"out-{jobs}"
        assert main(["audit", str(root), "--out", str(outs[jobs]), "--quiet", "--no-plots",
                     "--jobs", jobs]) in (0, 1)
    assert _outputs(outs["1"]) == _outputs(outs["2"]) == _outputs(outs["3"])


def test_what_the_pool_shares_reaches_each_worker_once(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``map_shared`` sends its shared object to each worker once (each worker unpickles
    it once, whatever the number of tasks it runs), each item one task, the results in
    order; its file goes when the pool closes. Inline, nothing is pickled."""
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pool = LocalPool(2)
    try:
        results = list(pool.map_shared(shared_task, SharedValue(1000), iter(range(200)),
                                       200, 400 << 20))
        assert len(list(tmp_path.iterdir())) == 1  # (the shared file, while the pool is open)
    finally:
        pool.close()
    assert [value for _, _, value in results] == list(range(1000, 1200))
    workers = {pid for pid, _, _ in results}
    assert os.getpid() not in workers and 1 <= len(workers) <= 2
    assert {loads for _, loads, _ in results} == {1}
    assert list(tmp_path.iterdir()) == []
    inline = LocalPool(1)
    assert list(inline.map_shared(shared_task, SharedValue(1), iter(range(3)), 3, 0)) == [
        (os.getpid(), 0, n + 1) for n in range(3)]


def test_with_workers_the_periods_are_judged_there(study: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With two workers, no period is judged in the audit's own process (each is read,
    validated and judged in a worker, a batch of periods a task), and the report is
    that of an audit judging them all here, inline."""
    import os

    from auditor.reason.engine import PeriodJudge

    here: list[int] = []
    original = PeriodJudge.judge

    def spy(*args: object, **kwargs: object) -> object:
        here.append(os.getpid())
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PeriodJudge, "judge", spy)
    assert main(["audit", str(study), "--out", str(tmp_path / "inline"), "--quiet",
                 "--jobs", "1"]) == 0
    assert here.count(os.getpid()) == PERIODS
    here.clear()
    assert main(["audit", str(study), "--out", str(tmp_path / "pooled"), "--quiet",
                 "--jobs", "2"]) == 0
    assert here == []  # (the workers' calls were noted in their own copies)
    inline, pooled = _outputs(tmp_path / "inline"), _outputs(tmp_path / "pooled")
    assert inline.keys() == pooled.keys() and len(inline) > 8
    assert [name for name in inline if inline[name] != pooled[name]] == []


def test_the_walks_regular_files_are_let_go_before_the_reading(study: Path) -> None:
    """Of the walk's regular files, only those no period record names are held once the
    records are read (each record keeps the few paths it names that the walk did not see
    as regular files): at a million files the whole set held every path's string through
    the reading. When the reading starts no set holds a path a record names."""
    import gc

    from auditor.model import Progress

    named = [f"{spec.attempt_dir}/{entry.path}"
             for period in run_audit(study).collected.periods[:1]
             for spec in period.record.attempts for entry in spec.evidence]
    holding: list[int] = []

    def show(event: Progress) -> None:
        if event.stage == "read" and not holding:
            holding.append(sum(1 for item in gc.get_objects()
                               if isinstance(item, set | frozenset)
                               and any(path in item for path in named)))

    with paused_gc():
        drive(Auditor(study).run(), show)
    assert named and holding == [0]


def test_the_walk_keeps_a_directorys_files_as_one_string(study: Path) -> None:
    """The walk's inventory holds each attempt directory's files as one string, not a
    string a file: at a million files a tuple of paths a directory and a set of the
    regular ones were about 190 MB of the audit's process (about 220 bytes a file), and
    what they freed stayed in its heap through the reading. It still names every file
    below the attempt directories, in order."""
    import tracemalloc

    from auditor.collect.discover import discover, find_period_records

    root = study.resolve()
    periods = find_period_records(root)
    tracemalloc.start()
    try:
        layout = drive(discover(root, periods), lambda _: None)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    listing = layout.attempt_files
    walked = sorted(path.relative_to(root).as_posix() for directory in layout.attempt_dirs
                    for path in (root / directory).rglob("*") if path.is_file())
    assert list(listing.paths()) == walked and len(walked) > 300
    assert held / len(walked) < 120, held / len(walked)
    assert listing.irregular == frozenset()


def test_a_listed_path_the_walk_saw_as_no_regular_file_is_still_checked(
        tmp_path: Path) -> None:
    """The paths a record names that the walk did not see as regular files (a link, here
    one out of the root, and one that is missing) are checked on disk as their reads are
    planned, not taken for regular files: the link is unsafe and never opened, the missing
    file missing, and every other file verified."""
    import orjson

    root = tmp_path / "study"
    assert main(["example", str(root), "--kind", "mixed"]) == 0
    outside = tmp_path / "outside.jsonl"
    outside.write_text("{}\n")
    record_path = sorted((root / "pairs").glob("*/period-1.json"))[0]
    record = orjson.loads(record_path.read_bytes())
    where = record["attempt_dir"]
    victim, gone = record["evidence"][0], record["evidence"][1]
    target = root / where / victim["path"]
    target.unlink()
    target.symlink_to(outside)
    (root / where / gone["path"]).unlink()
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) == 0
    rows = {row["path"]: row for row in _evidence_rows(out)}
    assert rows[f"{where}/{victim['path']}"]["status"] == "unsafe"
    assert rows[f"{where}/{gone['path']}"]["status"] == "missing"
    assert sum(row["status"] == "verified" for row in rows.values()) == len(rows) - 2


def _evidence_rows(out: Path) -> list[dict[str, object]]:
    import pyarrow.parquet as pq

    rows: list[dict[str, object]] = pq.read_table(out / "evidence.parquet").to_pylist()
    return rows


def test_two_records_of_one_period_each_list_the_rules_of_their_own_verdict(
        tmp_path: Path) -> None:
    """A record copied under another pair is the period its path names (one verdict a
    subject: it was its original's period, two verdicts of one subject), and each period's
    entry in summary.json and row in periods.parquet lists the rules its own verdict rests
    on (the copy's identity mismatch, and both records' one attempt, among them)."""
    import shutil

    import orjson
    import pyarrow.parquet as pq

    root = tmp_path / "study"
    assert main(["example", str(root), "--kind", "mixed"]) == 0
    original = sorted((root / "pairs").glob("*/period-1.json"))[0]
    (root / "pairs" / "aaa-copy").mkdir()
    shutil.copy(original, root / "pairs" / "aaa-copy" / "period-1.json")
    out = tmp_path / "out"
    assert main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"]) in (0, 1)
    result = run_audit(root)
    own = [sorted({f.rule_id for f in verdict.findings}) for verdict in result.verdicts]
    entries = orjson.loads((out / "summary.json").read_bytes())["periods"]
    rows = pq.read_table(out / "periods.parquet").to_pylist()
    subjects = [verdict.subject for verdict in result.verdicts]
    assert len(subjects) == len(set(subjects)) and "aaa-copy/period-1" in subjects
    assert len(entries) == len(rows) == len(own)
    for entry, row, rules in zip(entries, rows, own, strict=True):
        assert set(rules) <= set(entry["rule_ids"]) and entry["rule_ids"] == row["rule_ids"]


def test_the_workers_get_the_study_without_its_listings(study: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the pool shares with its workers holds none of the layout's path listings
    (each worker held every period record's and attempt directory's path for the audit's
    life), but what judging a period cites of it, and the report is the inline one's."""
    shared: list[object] = []
    original = LocalPool._share

    def spy(self: LocalPool, value: object) -> str:
        shared.append(value)
        return original(self, value)

    monkeypatch.setattr(LocalPool, "_share", spy)
    assert main(["audit", str(study), "--out", str(tmp_path / "pooled"), "--quiet",
                 "--jobs", "2"]) == 0
    assert main(["audit", str(study), "--out", str(tmp_path / "inline"), "--quiet",
                 "--jobs", "1"]) == 0
    assert len(shared) == 1
    layout = shared[0].study.layout  # type: ignore[attr-defined]
    assert (layout.period_records, layout.attempt_dirs, layout.attempt_files) == ((), (), {})
    full = run_audit(study).collected.layout
    assert (layout.root, layout.sacct, layout.protocol, layout.execution_commits) == (
        full.root, full.sacct, full.protocol, full.execution_commits)
    assert full.execution_commits is not None
    inline, pooled = _outputs(tmp_path / "inline"), _outputs(tmp_path / "pooled")
    assert [name for name in inline if inline[name] != pooled[name]] == []


def test_the_audit_lets_the_layout_listings_go_once_its_findings_are_made(
        study: Path, tmp_path: Path) -> None:
    """The study's result holds none of the layout's listings (every period record's and
    attempt directory's path: about 24 MB at a million files, held to the report's end),
    yet reports what they show: an attempt directory no period names (AUD106) and a stray
    file under pairs/ (AUD105), once each, pooled or inline."""
    root = tmp_path / "study"
    shutil.copytree(study, root)
    pair = next(path for path in sorted((root / "pairs").iterdir()) if path.is_dir())
    (pair / "notes.txt").write_text("not a period record\n")
    host = next(path for path in sorted(root.iterdir())
                if path.is_dir() and path.name not in ("pairs", "accounting"))
    orphan = next(path for path in sorted(host.iterdir()) if path.name.startswith("attempt-"))
    shutil.copytree(orphan, host / "attempt-orphan")
    for jobs in ("1", "2"):
        result = run_audit(root, AuditOptions(jobs=int(jobs)))
        layout = result.collected.layout
        assert (layout.period_records, layout.attempt_dirs, layout.stray_pair_files) == (
            (), (), ())
        seen = [(item.rule_id, item.subject) for item in result.findings
                if item.subject in (f"pairs/{pair.name}/notes.txt", f"{host.name}/attempt-orphan")]
        assert seen == [("AUD105", f"pairs/{pair.name}/notes.txt"),
                        ("AUD106", f"{host.name}/attempt-orphan")]
