"""Issue 19's sacct fixes, each on a real Slurm 22.05 dump (``fixtures/slurm/``) and on
generated studies audited through the CLI.

- an exit code that lost 128 (``15:0`` is 15 or 143): never a contradiction with a trial's 143;
- the attempt ledger of a ``-D`` dump: every record's GPU-seconds in the allocation scope,
  the share lost to requeue or preemption named; ``Restarts`` above the records present is
  a dump without ``-D``;
- a requeued period (``attempt-<job>`` then ``attempt-<job>-r1``): one job, each attempt's
  invocation inside its own record, none without ``-D`` (said, not a contradiction), with a
  one-second tolerance on sacct's End and no more;
- a pending range is what remains pending;
- a header that disagrees with ``--format`` is one finding saying the header was used;
- GPU-seconds unknown (not 0) without ElapsedRaw/AllocTRES; a plain message for a dump of
  the wrong field count; a retry job outside the array counted apart.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pytest

from auditor._cli import main
from auditor._io import HashingReader
from auditor.collect.sacct import parse_sacct
from auditor.model import SacctDump
from tests.helpers import (
    audit,
    edit_json,
    edit_record,
    element_study,
    outcome_study,
    period_records,
    period_spec,
    rewrite,
    verdicts,
)

DUMPS = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
NS = 1_000_000_000
RETRIED = "host-qwen25-7b-gsm8k-c2-s162/period-1"
DIR = "host-qwen25-7b-gsm8k-c2-s162-4gpu"


def real(name: str) -> SacctDump:
    with open(DUMPS / f"{name}.psv", "rb") as handle:
        return parse_sacct(HashingReader(handle), f"fixtures/slurm/{name}.psv")


def task(dump: SacctDump, number: int | None) -> Any:
    return next(job for job in dump.jobs if job.array_task_id == number)


def findings(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "findings.parquet")


def rules_of(summary: dict[str, Any], subject: str) -> set[str]:
    period = next(p for p in summary["periods"] if f"{p['pair']}/period-{p['period']}" == subject)
    return set(period["rule_ids"])


def sacct_json(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["sacct", str(path), "--json", *extra]) == 0
    document: dict[str, Any] = orjson.loads(capsys.readouterr().out)
    return document


# ---------------------------------------------------------------- 1. exit codes that lost 128


def test_the_model_says_which_code_the_trial_shows() -> None:
    """Task 2's script exited 143, sacct printed ``15:0``; task 8's ``0:9`` is a signal."""
    dump = real("contract")
    two, ten, eleven, eight = task(dump, 2), task(dump, 10), task(dump, 11), task(dump, 8)
    assert (two.exit_code, two.exit_code_may_be) == (15, (15, 143))
    assert two.exit_shown(143) == 143 and two.exit_shown(15) == 15 and two.exit_shown(1) is None
    assert (ten.exit_code_may_be, eleven.exit_code_may_be) == ((9, 137), (127, 255))
    assert eight.exit_code_may_be == (0,) and eight.exit_shown(137) is None
    assert two.steps[0].exit_code_may_be == (15, 143)          # the .batch step too


def test_a_trials_143_against_sacct_15_0_is_no_contradiction(tmp_path: Path) -> None:
    """The generated flag-off 143 study with what a real Slurm's ``sacct -P`` prints for it,
    ``FAILED 15:0``, and with the exact ``FAILED 143:0`` (as ``sacct --json``'s code reads):
    the same verdicts, the same findings."""
    root = outcome_study(tmp_path / "study", ["flag_off_143", "coordinated_shutdown"])
    assert b"|FAILED|15:0|" in (root / "accounting/sacct-raw.psv").read_bytes()
    before = audit(root, tmp_path / "before")
    rewrite(root, "accounting/sacct-raw.psv", lambda data: data.replace(b"|15:0|", b"|143:0|"))
    assert b"|15:0|" not in (root / "accounting/sacct-raw.psv").read_bytes()
    after = audit(root, tmp_path / "after")
    assert [(p["verdict"], p["reason"], p["rule_ids"]) for p in after["periods"]] == [
        (p["verdict"], p["reason"], p["rule_ids"]) for p in before["periods"]]
    assert sorted(findings(tmp_path / "after")["rule_id"]) == sorted(
        findings(tmp_path / "before")["rule_id"])


# ---------------------------------------------------------------- 2 and 3. a requeued period


def requeued_study(root: Path, with_d: bool) -> Path:
    """A period of two attempts of one job: job 7000002 ran (restart 0), was requeued and
    ran again (restart 1, ``attempt-7000002-r1``), as contract v1.1 lays it out. Built from
    the generated retried period (attempts 7000002 and 7000003): the second attempt becomes
    the rerun, and sacct's element 1 gets the two records (``with_d``) or the latest only."""
    outcome_study(root, ["completed", "retried"])
    old, new = root / DIR / "attempt-7000003", root / DIR / "attempt-7000002-r1"
    old.rename(new)
    for name in ("trial", "training"):
        suffix = "json" if name == "trial" else "log"
        (new / f"{name}-7000003.{suffix}").rename(new / f"{name}-7000002.{suffix}")
    record = next(p for p in period_records(root) if "s162" in str(p))

    def relink(doc: Any) -> None:
        first, second = doc["attempts"]
        first["restart_count"] = 0
        second.update(job_id="7000002", array_task_id=1, restart_count=1,
                      attempt_dir=f"{DIR}/attempt-7000002-r1")
        for entry in second["evidence"]:
            entry["path"] = entry["path"].replace("7000003", "7000002")

    edit_record(record, relink)
    for path in sorted(p for p in new.rglob("*") if p.is_file()):
        rewrite(root, path.relative_to(root).as_posix(),
                lambda data: data.replace(b"7000003", b"7000002"))
    for rel, restart in ((f"{DIR}/attempt-7000002/trial-7000002.json", 0),
                         (f"{DIR}/attempt-7000002-r1/trial-7000002.json", 1)):
        edit_json(root, rel, _restarted(restart))
    lines = (root / "accounting/sacct-raw.psv").read_text().splitlines()
    first = [line.replace("|COMPLETED|", "|REQUEUED|", 1) if line.startswith("7000000_1|")
             else line for line in lines if line.startswith("7000000_1")]
    rerun = [line.replace("7000000_2", "7000000_1").replace("7000003", "7000002")
             for line in lines if line.startswith("7000000_2")]
    kept = [line for line in lines if line.startswith("7000000_0")]
    (root / "accounting/sacct-raw.psv").write_text(
        "\n".join(kept + (first if with_d else []) + rerun) + "\n")
    return root


def _restarted(restart: int) -> Callable[[Any], None]:
    def change(doc: Any) -> None:
        doc.update(restart_count=restart, attempt=restart + 1)
    return change


def _no_restarts(doc: Any) -> None:
    for attempt in doc["attempts"]:
        attempt.pop("restart_count")


def test_a_requeued_period_with_d_is_one_job_each_attempt_in_its_own_record(
        tmp_path: Path) -> None:
    root = requeued_study(tmp_path / "study", with_d=True)
    summary = audit(root, tmp_path / "out")
    rules = rules_of(summary, RETRIED)
    assert not {"AUD111", "AUD117", "AUD119"} & rules, rules
    accounting = summary["accounting"]
    # every record held 4 GPUs: element 0 (430 s), element 1's requeued run (432 s), its rerun
    assert accounting["allocation_gpu_seconds"] == 4 * (430 + 432 + 439)
    assert accounting["requeued_gpu_seconds"] == 4 * 432
    assert (accounting["jobs_outside_array"], accounting["outside_array_gpu_seconds"]) == ([], 0)
    # evidence.md's rows add up to the scope the report gives: the requeued run's among them
    cited = (tmp_path / "out" / "evidence.md").read_text().split("## Scheduler elements")[1]
    rows = [line.split("|") for line in cited.splitlines() if line.startswith("| `")]
    assert sum(int(row[6].strip().replace(",", "")) for row in rows) == \
        accounting["allocation_gpu_seconds"]
    assert any("(run 1 of 2)" in row[1] and "REQUEUED" in row[3] for row in rows)


def test_without_d_the_earlier_attempt_is_not_compared_and_that_is_said(tmp_path: Path) -> None:
    root = requeued_study(tmp_path / "study", with_d=False)
    summary = audit(root, tmp_path / "out")
    rules = rules_of(summary, RETRIED)
    assert "AUD117" not in rules and "AUD111" not in rules, rules
    said = findings(tmp_path / "out")
    said = said[said["rule_id"] == "AUD119"]
    assert len(said) == 1
    message = said["message"].iloc[0]
    assert "restart 0" in message and "-D" in message and "not compared" in message
    assert summary["accounting"]["allocation_gpu_seconds"] == 4 * (430 + 439)
    assert summary["accounting"]["requeued_gpu_seconds"] == 0


def test_the_attempt_directory_suffix_is_no_part_of_the_job_id(tmp_path: Path) -> None:
    """``attempt-7000002-r1`` is job 7000002, restart 1: no job-id mismatch, and its
    restart (the trial's restart_count removed) still picks its own record."""
    root = requeued_study(tmp_path / "study", with_d=True)
    for rel in (f"{DIR}/attempt-7000002/trial-7000002.json",
                f"{DIR}/attempt-7000002-r1/trial-7000002.json"):
        edit_json(root, rel, lambda doc: doc.pop("restart_count"))
    edit_record(next(p for p in period_records(root) if "s162" in str(p)), _no_restarts)
    summary = audit(root, tmp_path / "out")
    assert not {"AUD111", "AUD117", "AUD119"} & rules_of(summary, RETRIED)


@pytest.mark.parametrize(("late_ns", "outside"), [(0, False), (1, True)])
def test_one_second_after_sacct_end_and_no_more(tmp_path: Path, late_ns: int,
                                                outside: bool) -> None:
    """sacct's End is the kill request's second, truncated: an invocation may finish up to
    a second after it (End + 1 s exactly is inside), not a nanosecond more."""
    root = requeued_study(tmp_path / "study", with_d=True)
    end = next(job for job in parse_sacct(
        HashingReader(open(root / "accounting/sacct-raw.psv", "rb")), "s").jobs
        if job.array_task_id == 1).end
    assert end is not None
    edit_json(root, f"{DIR}/attempt-7000002-r1/trial-7000002.json",
              lambda doc: doc["invocation"].update(finished_ns=(end + 1) * NS + late_ns))
    summary = audit(root, tmp_path / "out")
    assert ("AUD117" in rules_of(summary, RETRIED)) is outside


def test_a_preempted_record_is_lost_to_preemption(tmp_path: Path) -> None:
    root = outcome_study(tmp_path / "study", ["completed", "completed"])
    rewrite(root, "accounting/sacct-raw.psv", lambda data: b"\n".join(
        line.replace(b"|COMPLETED|", b"|PREEMPTED|", 1) if line.startswith(b"7000000_1|")
        else line for line in data.split(b"\n")))
    summary = audit(root, tmp_path / "out")
    assert summary["accounting"]["requeued_gpu_seconds"] == 4 * 432
    assert summary["accounting"]["allocation_gpu_seconds"] == 4 * (430 + 432)


def test_restarts_above_the_records_present_says_the_dump_lacked_d(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Slurm 24.11's ``Restarts``: the real dump without ``-D`` (tasks 6 and 7 were
    requeued once) with the count each task really had appended."""
    lines = (DUMPS / "contract.psv").read_text().splitlines()
    fmt = "JobID,JobIDRaw,JobName,State,ExitCode,Start,End,ElapsedRaw,AllocTRES,NodeList," \
          "Reason,Restarts"
    restarts = {"1_6": "1", "1_7": "1"}
    dump = tmp_path / "restarts.psv"
    dump.write_text("".join(
        f"{line}|{restarts.get(line.split('|')[0], '0') if '.' not in line.split('|')[0] else ''}\n"
        for line in lines))
    document = sacct_json(capsys, dump, "--format", fmt)
    said = [f for f in document["findings"] if f["rule_id"] == "AUD024"]
    assert len(said) == 1 and "-D" in said[0]["message"]
    assert "1_6 (Restarts 1, 1 record)" in said[0]["message"] and "1_7" in said[0]["message"]
    jobs = {job["array_task_id"]: job for job in document["jobs"]}
    assert (jobs[6]["restarts"], jobs[6]["attempts"]) == (1, [])
    # with -D the records are all there: nothing to say
    lines_d = (DUMPS / "contract-D.psv").read_text().splitlines()
    seen: dict[str, int] = {}
    rows = []
    for line in lines_d:
        job_id = line.split("|")[0]
        if "." in job_id:
            rows.append(f"{line}|\n")
            continue
        rows.append(f"{line}|{seen.get(job_id, 0)}\n")
        seen[job_id] = seen.get(job_id, 0) + 1
    (tmp_path / "restarts-D.psv").write_text("".join(rows))
    document = sacct_json(capsys, tmp_path / "restarts-D.psv", "--format", fmt)
    assert not [f for f in document["findings"] if f["rule_id"] == "AUD024"]
    assert [a["state"] for a in {j["array_task_id"]: j for j in document["jobs"]}[6][
        "attempts"]] == ["REQUEUED"]


def test_the_attempt_ledger_keeps_each_records_times_and_line() -> None:
    six = task(real("contract-D"), 6)
    (first,) = six.attempts
    assert (first.state, first.elapsed_s, first.gpus, first.line) == ("REQUEUED", 1, 2, 13)
    assert first.end is not None and six.start is not None and first.end <= six.start
    assert [s.state for s in first.steps] == ["FAILED"] and six.history == ("REQUEUED",)
    assert (six.total_gpu_seconds, six.requeued_gpu_seconds) == (22, 2)
    assert six.record_for_restart(0) is first and six.record_for_restart(1) is six
    # without -D the requeued run has no record of its own
    assert task(real("contract"), 6).record_for_restart(0, latest=1) is None


# ---------------------------------------------------------------- 4. pending ranges


def test_a_stale_range_holds_only_the_tasks_without_rows() -> None:
    dump = real("contract")
    stale = task(dump, None)
    assert stale.job_id == "1_[14-15%12]"
    assert (stale.covers(14), stale.covers(15), stale.pending_tasks) == (False, True, (15,))
    midrun = task(real("midrun"), None)
    assert midrun.pending_tasks == (12, 13, 14, 15) and midrun.covers(12)


def test_a_range_of_every_task_with_a_row_holds_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``4_[7-10%3]`` printed after all of 7 to 10 got rows: it holds nothing."""
    dump = tmp_path / "range.psv"
    dump.write_text("".join(f"4_{n}|{20 + n}|x|RUNNING|0:0|2026-12-01T20:00:00|Unknown|5|"
                            "gres/gpu=1|n|None\n" for n in range(7, 11))
                    + "4_[7-10%3]|4|x|PENDING|0:0|None|None|0||None assigned|JobArrayTaskLimit\n")
    jobs = {job["job_id"]: job for job in sacct_json(capsys, dump)["jobs"]}
    assert jobs["4_[7-10%3]"]["pending_tasks"] == []


# ---------------------------------------------------------------- 5. header against --format


def test_a_header_against_sacct_format_is_one_finding_in_the_audit(tmp_path: Path) -> None:
    root = outcome_study(tmp_path / "study", ["completed"])
    header = (b"JobID|JobIDRaw|JobName|State|ExitCode|Start|End|ElapsedRaw|AllocTRES|NodeList|"
              b"Reason\n")
    rewrite(root, "accounting/sacct-raw.psv", lambda data: header + data)
    audit(root, tmp_path / "out", "--sacct-format", "JobIDRaw,JobID,State")
    said = findings(tmp_path / "out")
    said = said[said["message"].str.contains("header")]
    assert len(said) == 1
    message = said["message"].iloc[0]
    assert "header was used" in message and "--format gave 3 (JobIDRaw,JobID,State)" in message
    # the same --format as the header: nothing to say
    audit(root, tmp_path / "same", "--sacct-format", header.decode().strip().replace("|", ","))
    assert not findings(tmp_path / "same")["message"].str.contains("header").any()


# ---------------------------------------------------------------- 6. what a new user saw


def test_gpu_seconds_unknown_without_elapsed_or_tres(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "states.psv"
    dump.write_text("900_1|1001|train|FAILED\n900_2|1002|train|COMPLETED\n")
    document = sacct_json(capsys, dump, "--format", "JobID,JobIDRaw,JobName,State")
    assert document["totals"]["gpu_seconds"] is None
    assert document["totals"]["requeued_gpu_seconds"] is None
    assert main(["sacct", str(dump), "--format", "JobID,JobIDRaw,JobName,State"]) == 0
    shown = capsys.readouterr().out
    assert "GPU-seconds unknown" in shown and "0 GPU-seconds" not in shown


def test_a_dump_of_the_wrong_field_count_is_refused_plainly(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "one.psv"
    dump.write_text("5055845_0\n5055845_1\n")
    capsys.readouterr()
    assert main(["sacct", str(dump), "--json"]) == 2
    err = capsys.readouterr().err
    assert "expected 11 fields" in err and "but the rows have 1 field;" in err
    assert "rows of 1 fields" not in err


def test_the_table_never_cuts_states_ids_or_codes(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    capsys.readouterr()
    assert main(["sacct", str(DUMPS / "contract-D.psv")]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    for word in ("CANCELLED", "REQUEUED", "TIMEOUT", "127:0", "1_[14-15%12]", "1_6 run 1",
                 "exit 15 or", "holds tasks"):
        assert word in out, word
    assert "6 of them held by runs lost to requeue" in " ".join(out.split())


def test_a_retry_job_outside_the_array_is_counted_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The retried period's second attempt ran as job 7000003, submitted on its own (sacct
    JobID ``7000003``, no array): not in the allocation scope, named and counted apart."""
    root = outcome_study(tmp_path / "study", ["completed", "retried"])
    rewrite(root, "accounting/sacct-raw.psv",
            lambda data: data.replace(b"7000000_2|", b"7000003|")
            .replace(b"7000000_2.", b"7000003."))
    summary = audit(root, tmp_path / "out")
    accounting = summary["accounting"]
    assert accounting["jobs_outside_array"] == ["7000003"]
    assert accounting["outside_array_gpu_seconds"] == 4 * 439
    assert accounting["allocation_gpu_seconds"] == 4 * (430 + 432)
    totals = sacct_json(capsys, root / "accounting/sacct-raw.psv")["totals"]
    assert (totals["jobs_outside_array"], totals["outside_array_gpu_seconds"]) == (
        ["7000003"], 4 * 439)
    assert totals["gpu_seconds"] == 4 * (430 + 432 + 439)


def test_the_example_study_accounting_is_unchanged(tmp_path: Path) -> None:
    """No requeue, no job outside the array: the seed's 20828 GPU-seconds, nothing lost."""
    example = Path(__file__).resolve().parent.parent / "fixtures" / "example_study"
    root = tmp_path / "example"
    shutil.copytree(example, root, symlinks=True)
    accounting = audit(root, tmp_path / "out")["accounting"]
    assert (accounting["allocation_gpu_seconds"], accounting["requeued_gpu_seconds"],
            accounting["jobs_outside_array"], accounting["outside_array_gpu_seconds"]) == (
        20828, 0, [], 0)


def test_auditor_sacct_says_on_stderr_that_the_header_was_used(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A header that disagrees with --format: one line on stderr saying which was used, for
    the reader of the table (the figures are the header's)."""
    from auditor._cli import main

    dump = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "header.psv"
    assert main(["sacct", str(dump), "--format",
                 "JobIDRaw,JobID,State,ExitCode,Elapsed,AllocTRES,Submit,Timelimit,JobName"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the header was used, --format ignored" in err


def test_a_stale_pending_range_whose_tasks_all_have_rows_is_not_the_array_partial(
        tmp_path: Path) -> None:
    """sacct may still print ``7000000_[0-1]`` after both tasks have rows of their own: the
    range holds no task, so the array is not partial (AUD210) on its account."""
    root = outcome_study(tmp_path / "study", ["completed", "completed"])
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b + b"7000000_[0-1]|7000000|host-capacity|PENDING|0:0|Unknown|Unknown|0||"
                          b"None|(Priority)\n", update_manifest=False)
    summary = audit(root, tmp_path / "out")
    assert "AUD210" not in set(findings(tmp_path / "out")["rule_id"])
    assert summary["gate"]["passed"] is True


def test_the_report_names_the_share_requeued_runs_held(tmp_path: Path) -> None:
    """The real kit study's -D dump: the allocation scope counts every record, and the
    report says how much of it runs lost to requeue held, and by which element."""
    study = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "kit" / "study"
    summary = audit(study, tmp_path / "out")
    assert summary["accounting"]["requeued_gpu_seconds"] == 6
    text = (tmp_path / "out" / "diagnostic.md").read_text()
    assert ("summed over every record of each array element, `sacct -D`'s earlier runs "
            "included)") in text
    assert "of which **6 GPU-seconds were held by runs lost to requeue or preemption** " \
           "(`1_8`)" in text


def test_the_report_says_when_the_dump_lacks_the_requeued_runs(tmp_path: Path) -> None:
    """Without -D, Restarts above the records present: the report says the earlier runs,
    and the GPU-seconds they held, are missing from the dump."""
    root = outcome_study(tmp_path / "study", ["completed"])
    text = (root / "accounting" / "sacct-raw.psv").read_text().splitlines()
    rows = [row + "|" + ("2" if i == 0 else "0") for i, row in enumerate(text)]
    (tmp_path / "with-restarts.psv").write_text("\n".join(rows) + "\n")
    fields = "JobID,JobIDRaw,JobName,State,ExitCode,Start,End,ElapsedRaw,AllocTRES,NodeList," \
             "Reason,Restarts"
    audit(root, tmp_path / "out", "--sacct", str(tmp_path / "with-restarts.psv"),
          "--sacct-format", fields)
    report = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "The dump was captured without `sacct -D`" in report


@pytest.mark.parametrize(("late_s", "outside"), [(10, False), (31, False), (32, True)])
def test_a_scheduler_ended_job_may_run_on_for_kill_wait(tmp_path: Path, late_s: int,
                                                        outside: bool) -> None:
    """A cancelled job's End is the kill request's second; its processes had KillWait (30 s
    by default) between SIGTERM and SIGKILL, and a launcher that traps the signal, forwards
    it and writes its record ends inside that window (seen on a real Slurm under load)."""
    root = outcome_study(tmp_path / "study", ["cancelled"])
    end = next(job for job in parse_sacct(
        HashingReader(open(root / "accounting/sacct-raw.psv", "rb")), "s").jobs
        if job.array_task_id == 0).end
    assert end is not None
    trial = next(root.glob("*-4gpu/attempt-*/trial-*.json")).relative_to(root).as_posix()
    edit_json(root, trial, lambda doc: doc["invocation"].update(
        finished_ns=(end + late_s) * NS))
    summary = audit(root, tmp_path / "out")
    subject = summary["periods"][0]["pair"] + "/period-1"
    assert ("AUD117" in rules_of(summary, subject)) is outside


def test_auditor_sacct_counts_unreadable_rows_past_the_first_few(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dump of a thousand rows it cannot read: the first few named on stderr, the rest
    counted in one line, and the reader's cap said (it was 200 lines, and no count)."""
    from auditor._cli import main
    from auditor._cli.inspect import NOTES_PER_RULE

    dump = tmp_path / "garbage.psv"
    head = "".join((DUMPS / "contract.psv").read_text().splitlines(keepends=True)[:3])
    dump.write_text(head + "".join(f"7000000_{n}|x|y\n" for n in range(1000)))
    assert main(["sacct", str(dump)]) == 0
    err = capsys.readouterr().err.splitlines()
    named = [line for line in err if "fields where the format has" in line]
    assert len(named) == NOTES_PER_RULE < len(err) <= NOTES_PER_RULE + 2, err
    assert any(f"and {200 - NOTES_PER_RULE:,} more AUD008" in line for line in err), err
    assert any("800 further findings not kept" in line for line in err), err


@pytest.mark.parametrize(("earlier", "expected"), [
    # (the first run completed; its own record says its step ran out of memory, and the
    # rerun failed: the period has no completion to rest on)
    ("OUT_OF_MEMORY|0:125", ("unresolved", "unclean_exit")),
    ("NODE_FAIL|0:0", ("unresolved", "unclean_exit")),
    ("COMPLETED|0:0", ("resolved", "completed")),  # (its record says nothing against it)
])
def test_an_earlier_runs_own_record_judges_that_run(tmp_path: Path, earlier: str,
                                                    expected: tuple[str, str]) -> None:
    """With sacct -D, each run of a requeued job has its own record: one whose step shows
    the node or the memory failed makes that run an infrastructure failure, as the latest
    record does the last run's, so a later failed rerun is what the period rests on."""
    root = requeued_study(tmp_path / "study", with_d=True)
    def first_step(data: bytes) -> bytes:
        lines = data.splitlines(keepends=True)
        at = next(i for i, line in enumerate(lines) if line.startswith(b"7000000_1.0|"))
        lines[at] = lines[at].replace(b"|COMPLETED|0:0|", f"|{earlier}|".encode(), 1)
        return b"".join(lines)  # (the first run's step: -D lists the earlier record first)
    rewrite(root, "accounting/sacct-raw.psv", first_step, update_manifest=False)
    edit_json(root, f"{DIR}/attempt-7000002-r1/trial-7000002.json",
              lambda doc: doc["invocation"].update(exit_code=1))
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)["host-qwen25-7b-gsm8k-c2-s162/period-1"] == expected


@pytest.mark.parametrize(("state", "expected"), [
    ("PREEMPTED", ("unresolved", "preempted")),
    ("TIMEOUT", ("unresolved", "time_limit")),
    ("CANCELLED", ("unresolved", "cancelled")),
    # (a batch script requeues its own job: seed 000's, after the coordinated shutdown it
    # read as a crash; that run finished, and the rerun is wasted)
    ("REQUEUED", ("completed", "completed")),
])
def test_an_earlier_run_the_scheduler_ended_is_never_a_coordinated_shutdown(
        tmp_path: Path, state: str, expected: tuple[str, str]) -> None:
    """The first run's controller exited 143 with the shutdown flag set, its terminal line
    printed, no signal received; its own sacct -D record says the scheduler ended it. That
    143 was the scheduler's SIGTERM, as it would be for the job's last run: the period rests
    on the failed rerun (it resolved on the first run, the rerun called wasted)."""
    root = requeued_study(tmp_path / "study", with_d=True)

    def coordinated(doc: Any) -> None:
        pid = doc["processes"][0]["pid"]
        doc["invocation"].update(exit_code=143, received_signal=None)
        doc["env"]["COSMOS_SHUTDOWN_ON_NO_POLICY_REPLICAS"] = "1"
        doc["processes"] = [{"role": "controller", "pid": pid, "exit_code": 143},
                            {"role": "policy", "pid": pid + 1, "exit_code": 0},
                            {"role": "rollout", "pid": pid + 2, "exit_code": 0}]
        doc["status"] = "failed"

    edit_json(root, f"{DIR}/attempt-7000002/trial-7000002.json", coordinated)
    edit_json(root, f"{DIR}/attempt-7000002-r1/trial-7000002.json",
              lambda doc: doc["invocation"].update(exit_code=1))

    def first_run(data: bytes) -> bytes:
        lines = data.splitlines(keepends=True)
        at = next(i for i, line in enumerate(lines) if line.startswith(b"7000000_1|"))
        lines[at] = lines[at].replace(b"|REQUEUED|0:0|", f"|{state}|0:0|".encode(), 1)
        return b"".join(lines)  # (-D lists the earlier record first)

    rewrite(root, "accounting/sacct-raw.psv", first_run, update_manifest=False)
    out = tmp_path / "out"
    summary = audit(root, out)
    first = pd.read_parquet(out / "attempts.parquet").set_index("attempt_dir").loc[
        f"{DIR}/attempt-7000002"]
    assert (first["outcome"], first["reason"]) == expected
    subject = "host-qwen25-7b-gsm8k-c2-s162/period-1"
    assert verdicts(summary)[subject] == (
        ("resolved", "completed") if state == "REQUEUED" else ("unresolved", "unclean_exit"))


@pytest.mark.parametrize("where", ["file", "entry"])
@pytest.mark.parametrize("passed", [False, True])
def test_an_earlier_run_whose_own_idle_check_failed_is_never_the_one_counted(
        tmp_path: Path, passed: bool, where: str) -> None:
    """The first run completed and its own idle check (its node's ``idle/<host>.json``,
    listed in its evidence, or its record entry's ``idle_check``, where a requeue's seal
    keeps it) says it did not leave the GPUs idle; the record's ``idle_check`` is the
    rerun's, which passed. The period rested on the first run, the rerun called wasted; now
    the rerun, itself complete, is counted."""
    import hashlib

    root = requeued_study(tmp_path / "study", with_d=True)
    trial = orjson.loads((root / DIR / "attempt-7000002/trial-7000002.json").read_bytes())
    check = {"host": "gpu-node-11", "passed": passed, "unavailable": None,
             "checked_ns": trial["invocation"]["finished_ns"] + 700_000_000}
    data = orjson.dumps(check)
    record = next(p for p in period_records(root) if "s162" in str(p))
    if where == "file":
        (root / DIR / "attempt-7000002/idle").mkdir()
        (root / DIR / "attempt-7000002/idle/gpu-node-11.json").write_bytes(data)
        edit_record(record, lambda doc: doc["attempts"][0]["evidence"].append({
            "path": "idle/gpu-node-11.json", "kind": "idle_check",
            "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}))
    else:
        edit_record(record, lambda doc: doc["attempts"][0].update(idle_check={
            "passed": passed, "checked_ns": check["checked_ns"],
            "gpu_memory_used_mib": [0 if passed else 30000], "gpu_processes": 0}))
    out = tmp_path / "out"
    summary = audit(root, out)
    assert verdicts(summary)["host-qwen25-7b-gsm8k-c2-s162/period-1"] == (
        "resolved", "completed")
    rows = pd.read_parquet(out / "attempts.parquet").set_index("attempt_dir")
    first, rerun = rows.loc[f"{DIR}/attempt-7000002"], rows.loc[f"{DIR}/attempt-7000002-r1"]
    if passed:
        assert first["counted"] and rerun["wasted"]
    else:
        assert (first["outcome"], first["reason"]) == ("unresolved", "idle_check_failed")
        assert rerun["counted"] and not rerun["wasted"]


@pytest.mark.parametrize("whose", ["the first run's", "its own"])
def test_a_worker_log_named_for_another_attempts_worker_is_never_this_ones_end(
        tmp_path: Path, whose: str) -> None:
    """The rerun exited 0 with its driver's log lacking the terminal line; its worker-logs/
    holds a file named for the first run's rank 0 (a session of that run left on the node)
    with the line. That output is the first run's, never the rerun's end (it resolved the
    period); one named for the rerun's own worker still is."""
    import hashlib

    root = requeued_study(tmp_path / "study", with_d=True)
    record_path = next(p for p in period_records(root) if "s162" in str(p))
    record = orjson.loads(record_path.read_bytes())
    first, rerun = record["attempts"]
    pid = (first if whose == "the first run's" else rerun)["workers"][0]["pid"]
    edit_json(root, f"{DIR}/attempt-7000002/trial-7000002.json",
              lambda doc: doc["invocation"].update(exit_code=1))

    def without_terminal(data: bytes) -> bytes:
        return b"\n".join(line for line in data.split(b"\n")
                          if b"training/global_step" not in line)

    for run in ("attempt-7000002", "attempt-7000002-r1"):
        rewrite(root, f"{DIR}/{run}/training-7000002.log", without_terminal)
    device = next((root / DIR / "attempt-7000002-r1").glob("device-evidence/*.json"))
    host = orjson.loads(device.read_bytes()).get("hostname") or "gpu-node-12"
    text = b"step:1 - training/global_step:1 - actor/pg_loss:-0.036\n"
    name = f"worker-logs/{host}-{pid}.out"
    (root / DIR / "attempt-7000002-r1" / "worker-logs").mkdir()
    (root / DIR / "attempt-7000002-r1" / name).write_bytes(text)
    edit_record(record_path, lambda doc: doc["attempts"][1]["evidence"].append(
        {"path": name, "kind": "worker_log", "sha256": hashlib.sha256(text).hexdigest(),
         "size": len(text)}))
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)["host-qwen25-7b-gsm8k-c2-s162/period-1"] == (
        ("unresolved", "terminal_event_missing") if whose == "the first run's"
        else ("resolved", "completed"))


@pytest.mark.parametrize("claim", ["the record's attempt element", "the trial's element",
                                   "the trial's array", None])
def test_an_attempts_own_element_or_array_is_held_to_its_jobs_row(
        tmp_path: Path, claim: str | None) -> None:
    """A retried period's attempt gives its own element (the record's attempts form has no
    period-wide one), and its trial its array and element (contract v1.1): each is held to
    sacct's row of the attempt's job, as a single attempt's record is (AUD111). They were
    never read, and the period resolved."""
    root = requeued_study(tmp_path / "study", with_d=True)
    record_path = next(p for p in period_records(root) if "s162" in str(p))
    rerun = f"{DIR}/attempt-7000002-r1/trial-7000002.json"
    if claim == "the record's attempt element":
        edit_record(record_path, lambda doc: doc["attempts"][1].update(array_task_id=5))
    elif claim == "the trial's element":
        edit_json(root, rerun, lambda doc: doc.update(array_task_id=5))
    elif claim == "the trial's array":
        edit_json(root, rerun, lambda doc: doc.update(array_job_id="6999999"))
    summary = audit(root, tmp_path / "out")
    subject = "host-qwen25-7b-gsm8k-c2-s162/period-1"
    assert verdicts(summary)[subject] == (("resolved", "completed") if claim is None
                                          else ("unresolved", "identity_mismatch"))
    if claim is not None:
        findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
        said = findings[(findings["rule_id"] == "AUD111") & (findings["subject"] == subject)]
        who = "period record" if claim.startswith("the record") else "trial"
        assert any(f"the {who} says" in message for message in said["message"]), said


def test_one_run_listed_under_two_directories_is_listed_twice(tmp_path: Path) -> None:
    """The rerun's directory a byte copy of the first run's (job 7000002, restart 0 in both
    trials and the record): one run, not a second and 'wasted' attempt whose GPU time was
    counted again; AUD127, as the same directory listed twice is."""
    import shutil

    root = requeued_study(tmp_path / "study", with_d=False)
    shutil.rmtree(root / DIR / "attempt-7000002-r1")
    shutil.copytree(root / DIR / "attempt-7000002", root / DIR / "attempt-7000002-r1")

    def copied(doc: Any) -> None:
        first, second = doc["attempts"]
        second.update(workers=first["workers"], evidence=first["evidence"], restart_count=0)

    edit_record(next(p for p in period_records(root) if "s162" in str(p)), copied)
    out = tmp_path / "out"
    summary = audit(root, out)
    subject = "host-qwen25-7b-gsm8k-c2-s162/period-1"
    assert verdicts(summary)[subject] == ("unresolved", "identity_mismatch")
    findings = pd.read_parquet(out / "findings.parquet")
    assert "AUD127" in set(findings[findings["subject"] == subject]["rule_id"])
    assert summary["accounting"]["wasted_gpu_seconds"] == 0


def test_an_earlier_runs_record_judges_only_the_attempt_its_end_hit(tmp_path: Path) -> None:
    """One element runs two periods in one job; its first run completed period 1, then its
    node failed in period 2, which the rerun (``-r1``) completed. The first run's own
    record (NODE_FAIL, and its period-2 step's) is not period 1's end: period 1 had
    finished before it. Both periods stay resolved."""
    first, second = period_spec(161, 1, 4), period_spec(161, 2, 2)
    pair = first.pair
    root = element_study(tmp_path / "study", [("7000001", [first, second])])
    rerun = f"{pair}-2gpu/attempt-7000001-r1"
    (root / f"{pair}-2gpu/attempt-7000001").rename(root / rerun)
    edit_record(root / f"pairs/{pair}/period-2.json",
                lambda doc: doc.update(attempt_dir=rerun, restart_count=1))
    edit_json(root, f"{rerun}/trial-7000001.json",
              lambda doc: doc.update(restart_count=1, attempt=2))
    edit_record(root / f"pairs/{pair}/period-1.json", lambda doc: doc.update(restart_count=0))
    edit_json(root, f"{pair}-4gpu/attempt-7000001/trial-7000001.json",
              lambda doc: doc.update(restart_count=0))
    lines = (root / "accounting/sacct-raw.psv").read_text().splitlines()
    earlier = [line.replace("|COMPLETED|", "|NODE_FAIL|", 1)
               if line.startswith(("7000000_0|", "7000000_0.1|")) else line for line in lines]
    (root / "accounting/sacct-raw.psv").write_text("\n".join(earlier + lines) + "\n")
    assert set(verdicts(audit(root, tmp_path / "out")).values()) == {("resolved", "completed")}


def test_gpu_counts_summing_past_64_bits_are_unknown_never_a_crash(tmp_path: Path) -> None:
    """AllocTRES naming ten GPU types of 18 digits each: each count is a number, their sum is
    past 64 bits, which no table holds: the allocation's GPUs are unknown (the audit crashed,
    exit 3)."""
    root = outcome_study(tmp_path / "study", ["completed"])
    many = ",".join(f"gres/gpu:t{i}=999999999999999999" for i in range(10))
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b.replace(b"gres/gpu:a100=4,gres/gpu=4", many.encode()),
            update_manifest=False)
    audit(root, tmp_path / "out")
    assert "AUD008" in set(findings(tmp_path / "out")["rule_id"])  # (unreadable AllocTRES)
    assert "| `7000000_0` | `7000001` | `COMPLETED` | 430 | — | — |" in \
        (tmp_path / "out" / "evidence.md").read_text()
