"""The fast suite's real sacct dumps: ``auditor sacct --json`` on what Slurm 22.05 printed.

The dumps in ``fixtures/slurm/`` were captured from the endings array
(``tests/slurm/endings.py``) on a real single-node cluster; ``fixtures/slurm/NOTES.md``
says what each task did and what sacct printed. No cluster is needed here: these run
everywhere. Where the auditor reads a real dump right, the test asserts it; where it reads
one wrong (issue 19's list), the test asserts the right behaviour and is marked
``xfail(strict=True)``, so the fix flips it to a pass (and strictness makes it fail then,
until the mark is removed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from auditor._cli import main
from tests.slurm.endings import OTHER_FORMAT

DUMPS = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
ARRAY = "1"

# task: (state, exit_code, signal, elapsed_s, batch step (state, exit_code, signal))
FINAL: dict[int, tuple[str, int, int, int, tuple[str, int, int]]] = {
    0: ("COMPLETED", 0, 0, 10, ("COMPLETED", 0, 0)),
    1: ("FAILED", 1, 0, 10, ("FAILED", 1, 0)),
    2: ("FAILED", 15, 0, 10, ("FAILED", 15, 0)),       # the script's exit 143
    3: ("CANCELLED", 0, 0, 1, ("FAILED", 15, 0)),      # scancel; the trap exits 143
    4: ("TIMEOUT", 0, 0, 87, ("FAILED", 15, 0)),       # a one-minute limit fired at 87 s
    5: ("COMPLETED", 0, 0, 27, ("COMPLETED", 0, 0)),   # the USR1 trap exits 0
    6: ("COMPLETED", 0, 0, 10, ("COMPLETED", 0, 0)),   # after an external requeue
    7: ("COMPLETED", 0, 0, 10, ("COMPLETED", 0, 0)),   # after a self requeue
    8: ("FAILED", 0, 9, 12, ("CANCELLED", 0, 9)),      # OverMemoryKill, not OUT_OF_MEMORY
    9: ("COMPLETED", 0, 0, 11, ("COMPLETED", 0, 0)),   # its srun steps failed
    10: ("FAILED", 9, 0, 10, ("FAILED", 9, 0)),        # the script's exit 137
    11: ("FAILED", 127, 0, 10, ("FAILED", 127, 0)),    # the script's exit 255
    12: ("COMPLETED", 0, 0, 10, ("COMPLETED", 0, 0)),
    13: ("COMPLETED", 0, 0, 10, ("COMPLETED", 0, 0)),
    14: ("COMPLETED", 0, 0, 10, ("COMPLETED", 0, 0)),
}
"""What sacct printed for each task's latest record. Task 15, cancelled while pending, has
no row of its own: the array's pending record ``1_[14-15%12]`` (JobIDRaw 1) was left
``CANCELLED by 0`` still naming task 14, which had started (JobIDRaw 16) and completed."""

STALE_RANGE = f"{ARRAY}_[14-15%12]"

FIRST_ATTEMPT_S = {6: 1, 7: 2}
"""ElapsedRaw of the REQUEUED record of each requeued task (``-D`` dumps)."""


def sacct_json(capsys: pytest.CaptureFixture[str], name: str, *extra: str) -> dict[str, Any]:
    """``auditor sacct fixtures/slurm/<name>.psv --json [extra]`` through the CLI."""
    capsys.readouterr()
    assert main(["sacct", str(DUMPS / f"{name}.psv"), "--json", *extra]) == 0
    document = orjson.loads(capsys.readouterr().out)
    assert isinstance(document, dict)
    return document


def by_task(document: dict[str, Any]) -> dict[int | None, dict[str, Any]]:
    return {job["array_task_id"]: job for job in document["jobs"]}


def test_final_records_as_sacct_printed_them(capsys: pytest.CaptureFixture[str]) -> None:
    jobs = by_task(sacct_json(capsys, "contract"))
    assert set(jobs) == {*FINAL, None}                 # task 15 never got a row of its own
    assert (jobs[None]["job_id"], jobs[None]["job_id_raw"], jobs[None]["state"]) == (
        STALE_RANGE, ARRAY, "CANCELLED")
    assert (jobs[None]["gpus"], jobs[None]["steps"]) == (0, [])
    for task, (state, code, sig, elapsed, batch) in FINAL.items():
        job = jobs[task]
        assert job["job_id"] == f"{ARRAY}_{task}"
        assert (job["state"], job["exit_code"], job["signal"], job["elapsed_s"]) == (
            state, code, sig, elapsed), task
        assert (job["steps"][0]["step"], job["steps"][0]["state"], job["steps"][0]["exit_code"],
                job["steps"][0]["signal"]) == ("batch", *batch), task
        assert job["array_job_id"] == ARRAY
        assert (job["gpus"], job["gpu_seconds"]) == (2, 2 * elapsed), task


def test_srun_steps_fail_under_a_completed_job(capsys: pytest.CaptureFixture[str]) -> None:
    steps = by_task(sacct_json(capsys, "contract"))[9]["steps"]
    assert [(s["step"], s["state"], s["exit_code"], s["signal"]) for s in steps] == [
        ("batch", "COMPLETED", 0, 0), ("0", "FAILED", 3, 0), ("1", "CANCELLED", 0, 9)]


def test_totals(capsys: pytest.CaptureFixture[str]) -> None:
    totals = sacct_json(capsys, "contract")["totals"]
    assert totals["jobs"] == 16 and totals["gpu_seconds"] == 476
    assert sum(2 * row[3] for row in FINAL.values()) == 476


@pytest.mark.parametrize(("name", "extra"), [
    ("header", ()),
    ("caret", ("--delimiter", "^")),
    ("other-format", ("--format", OTHER_FORMAT)),
    ("contract-D", ()),
    ("header-D", ()),
])
def test_every_capture_gives_the_same_final_states(
        capsys: pytest.CaptureFixture[str], name: str, extra: tuple[str, ...]) -> None:
    """A header, ``--delimiter=^``, another ``--format`` (Elapsed, not ElapsedRaw) and
    ``-D`` (whose latest record gives the state) all read as the contract's dump."""
    jobs = by_task(sacct_json(capsys, name, *extra))
    assert jobs.pop(None)["state"] == "CANCELLED"
    assert {task: (job["state"], job["exit_code"], job["signal"], job["elapsed_s"])
            for task, job in jobs.items()} == {
        task: row[:4] for task, row in FINAL.items()}


def test_caret_dump_without_its_delimiter_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["sacct", str(DUMPS / "caret.psv"), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "caret.psv" in captured.err and "--delimiter" in captured.err
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 1


def test_mid_run_dump_running_and_pending(capsys: pytest.CaptureFixture[str]) -> None:
    document = sacct_json(capsys, "midrun")
    jobs = by_task(document)
    assert all(jobs[task]["state"] == "RUNNING" for task in range(12))
    assert jobs[None]["job_id"] == f"{ARRAY}_[12-15%12]"
    assert jobs[None]["state"] == "PENDING"
    assert document["totals"]["states"] == {"PENDING": 1, "RUNNING": 12}


def test_second_mid_run_dump_requeued_and_not_yet_accounted(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Requeued tasks show REQUEUED without -D too; tasks 12 to 14 had started (squeue
    said so) but sacct did not have them yet (accounting lag), while the pending record,
    just cancelled with task 15, still names 14."""
    jobs = by_task(sacct_json(capsys, "midrun-2"))
    assert jobs[6]["state"] == jobs[7]["state"] == "REQUEUED"
    assert jobs[3]["state"] == "CANCELLED"
    assert not {12, 13, 14} & set(jobs)
    assert (jobs[None]["job_id"], jobs[None]["state"]) == (STALE_RANGE, "CANCELLED")


def test_table_shows_whole_states(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["sacct", str(DUMPS / "contract.psv")]) == 0
    out = capsys.readouterr().out
    for word in ("COMPLETED", "CANCELLED", "TIMEOUT", "FAILED", "127:0", f"{ARRAY}_14"):
        assert word in out, word


# ---------------------------------------------------------------- issue 19: read wrong today

def test_exit_code_may_have_lost_128(capsys: pytest.CaptureFixture[str]) -> None:
    jobs = by_task(sacct_json(capsys, "contract"))
    for task, printed, possible in ((2, 15, [15, 143]), (10, 9, [9, 137]),
                                    (11, 127, [127, 255])):
        assert jobs[task]["exit_code"] == printed        # kept as sacct printed it
        assert jobs[task]["exit_code_may_be"] == possible, task


def test_requeued_attempts_are_kept_and_counted(capsys: pytest.CaptureFixture[str]) -> None:
    document = sacct_json(capsys, "contract-D")
    jobs = by_task(document)
    for task, elapsed in FIRST_ATTEMPT_S.items():
        attempts = jobs[task]["attempts"]
        assert [(a["state"], a["elapsed_s"], a["gpus"]) for a in attempts] == [
            ("REQUEUED", elapsed, 2)], task
        assert jobs[task]["state"] == "COMPLETED"
    lost = sum(2 * elapsed for elapsed in FIRST_ATTEMPT_S.values())
    assert document["totals"]["requeued_gpu_seconds"] == lost
    assert document["totals"]["gpu_seconds"] == 476 + lost


def test_pending_range_lists_its_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    pending = by_task(sacct_json(capsys, "midrun"))[None]
    assert pending["pending_tasks"] == [12, 13, 14, 15]


def test_stale_range_counts_each_task_once(capsys: pytest.CaptureFixture[str]) -> None:
    document = sacct_json(capsys, "contract")
    jobs = by_task(document)
    assert jobs[None]["pending_tasks"] == [15]
    assert jobs[14]["state"] == "COMPLETED"
    assert document["totals"]["states"]["CANCELLED"] == 2  # task 3, and 15 in the range


def test_header_against_format_says_which_was_used(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["sacct", str(DUMPS / "header.psv"), "--json", "--format", OTHER_FORMAT]) == 0
    captured = capsys.readouterr()
    document = orjson.loads(captured.out)
    jobs = by_task(document)
    assert jobs[2]["state"] == "FAILED"                  # read by its header, rightly
    lines = [f["message"] for f in document["findings"] if "header" in f["message"].lower()]
    assert len(lines) == 1 and "--format" in lines[0] and "header was used" in lines[0], lines
    assert "\n" not in lines[0]


FINAL_2411: dict[int, tuple[str, int, int]] = {
    0: ("COMPLETED", 0, 0), 1: ("FAILED", 1, 0), 2: ("FAILED", 15, 0), 3: ("CANCELLED", 0, 0),
    4: ("TIMEOUT", 0, 0), 5: ("COMPLETED", 0, 0), 6: ("COMPLETED", 0, 0),
    7: ("COMPLETED", 0, 0), 8: ("FAILED", 0, 9), 9: ("COMPLETED", 0, 0), 10: ("FAILED", 9, 0),
    11: ("FAILED", 127, 0), 12: ("COMPLETED", 0, 0), 13: ("COMPLETED", 0, 0),
    14: ("COMPLETED", 0, 0), 15: ("CANCELLED", 0, 0),
}
"""What 24.11's sacct printed for each task's latest record (15, cancelled while pending,
took the array's own record, JobIDRaw 1)."""


@pytest.mark.parametrize(("name", "extra"), [
    ("contract", ()), ("contract-D", ()), ("header", ()), ("header-D", ()),
    ("caret", ("--delimiter", "^")),
    ("other-format", ("--format", "JobIDRaw,JobID,State,ExitCode,Elapsed,AllocTRES,Submit,"
                      "Timelimit,JobName")),
])
def test_every_24_11_capture_gives_the_final_states(
        capsys: pytest.CaptureFixture[str], name: str, extra: tuple[str, ...]) -> None:
    """The same array on Slurm 24.11 (``fixtures/slurm/24.11``, see its SOURCES.md): every
    capture reads with the states and exit codes sacct printed."""
    jobs = by_task(sacct_json(capsys, f"24.11/{name}", *extra))
    assert {task: (job["state"], job["exit_code"], job["signal"])
            for task, job in jobs.items()} == FINAL_2411
