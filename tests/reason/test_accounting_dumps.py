"""The GPU-time figures against a hand count, through whole audits of dumps as sites write
them: a site that does not track GPUs in AllocTRES, a record whose elapsed time is unknown,
a requeued run that held other GPUs than the run after it. Unknown is said, never 0."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from auditor._cli import main

KIT = Path(__file__).resolve().parents[2] / "fixtures" / "slurm" / "kit" / "study"


def _example(tmp_path: Path) -> Path:
    root = tmp_path / "study"
    assert main(["example", str(root)]) == 0
    return root


def _dump(root: Path, change: Any) -> None:
    path = root / "accounting" / "sacct-raw.psv"
    path.write_text(change(path.read_text()))


def _audit(root: Path, out: Path) -> dict[str, Any]:
    main(["audit", str(root), "--out", str(out), "--quiet", "--no-plots"])
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert isinstance(summary, dict)
    return summary


def test_allocations_that_name_no_gpu_leave_the_gpus_held_unknown(tmp_path: Path) -> None:
    """A site whose AccountingStorageTRES does not track gres/gpu: AllocTRES never names a
    GPU, so the GPUs each element held are unknown, not 0 (the allocation scope was 0
    GPU-seconds and the reservation scope took the periods' GPUs as the allocations')."""
    root = _example(tmp_path)
    _dump(root, lambda text: re.sub(r",gres/gpu[^,|]*", "", text))
    summary = _audit(root, tmp_path / "out")
    accounting = summary["accounting"]
    assert (accounting["allocation_gpu_seconds"], accounting["reservation_gpu_seconds"]) \
        == (None, None)
    assert accounting["task_gpu_seconds"] == 17605.783111
    findings = pq.read_table(tmp_path / "out" / "findings.parquet").to_pylist()
    assert any(f["rule_id"] == "AUD019" and "gres/gpu" in f["message"] for f in findings)
    attempts = pq.read_table(tmp_path / "out" / "attempts.parquet").to_pylist()
    assert {a["allocation_gpus"] for a in attempts} == {None}
    report = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "Allocation scope" in report and "**0 GPU-seconds" not in report


def test_a_record_of_unknown_length_is_counted_apart_not_as_0(tmp_path: Path) -> None:
    """``sacct -D``: element 3's first run (REQUEUED) has no ElapsedRaw and no Start; its
    second run's 2,232 GPU-seconds still count, and the figure says it is a lower bound."""
    root = _example(tmp_path)

    def requeued(text: str) -> str:
        (row,) = [line for line in text.splitlines() if line.startswith("5055845_3|")]
        first = row.split("|")
        first[3:8] = ["REQUEUED", "0:0", "Unknown", first[5], ""]
        return text.replace(row + "\n", "|".join(first) + "\n" + row + "\n")

    _dump(root, requeued)
    accounting = _audit(root, tmp_path / "out")["accounting"]
    assert (accounting["allocation_gpu_seconds"], accounting["allocation_records_unknown"]) \
        == (20828, 1)
    report = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "**at least 20,828 GPU-seconds" in report
    assert "the GPU-seconds of 1 record are unknown" in report


def test_a_requeued_run_is_reserved_at_its_own_records_gpus(tmp_path: Path) -> None:
    """The real kit study's requeued element: its first run's ``-D`` record held 4 GPUs, its
    last 2; each attempt's reservation takes its own run's record."""
    root = tmp_path / "kit"
    shutil.copytree(KIT, root)
    _dump(root, lambda text: text.replace(
        "1_8|10|kit|REQUEUED|0:0|2026-12-01T20:36:42|2026-12-01T20:36:45|3|billing=1,cpu=1,"
        "gres/gpu:a100=2,gres/gpu=2", "1_8|10|kit|REQUEUED|0:0|2026-12-01T20:36:42|"
        "2026-12-01T20:36:45|3|billing=1,cpu=1,gres/gpu:a100=4,gres/gpu=4"))
    _audit(root, tmp_path / "out")
    rows = {a["attempt_dir"].rsplit("/", 1)[1]: a for a in pq.read_table(
        tmp_path / "out" / "attempts.parquet").to_pylist() if a["job_id"] == "10"}
    assert (rows["attempt-10"]["allocation_gpus"], rows["attempt-10-r1"]["allocation_gpus"]) \
        == (4, 2)


def test_a_pending_range_is_each_task_it_still_holds(tmp_path: Path) -> None:
    """Contract v1.1: a pending range covers the tasks without a row of their own. The
    headline counted ``5055845_[8-10]`` (element 8 has its own row) as one element."""
    root = _example(tmp_path)
    _dump(root, lambda text: text + "5055845_[8-10]|5055871|host-capacity|PENDING|0:0|Unknown|"
          "Unknown|0||None assigned|Priority\n")
    _audit(root, tmp_path / "out")
    report = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "The eleven array elements of `5055845` are, as the dump shows them: nine " \
           "`FAILED 2:0`, two `PENDING 0:0`" in report


def test_a_requeue_the_evidence_shows_and_the_dump_lacks_is_said(tmp_path: Path) -> None:
    """The real kit study with its dump captured without ``-D`` and without ``Restarts``:
    the attempts show job 10 requeued (``AUD119``: restart 0 has no record of its own), so
    the allocation scope is said to lack the earlier run's GPU-seconds."""
    root = tmp_path / "kit"
    shutil.copytree(KIT, root)
    (root / "accounting" / "sacct-raw.psv").write_text(
        (KIT.parent / "contract.psv").read_text())
    _audit(root, tmp_path / "out")
    report = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "The dump was captured without `sacct -D`" in report


def test_the_dumps_other_jobs_are_said_and_counted_nowhere(tmp_path: Path) -> None:
    """Rows of jobs the study did not run (another array's element, a job of no attempt) are
    left out of every scope, and the Accounting section says so; a PREEMPTED latest record
    without earlier ones is no ``sacct -D`` run."""
    root = _example(tmp_path)
    tres = "billing=32,cpu=32,gres/gpu:a100=4,gres/gpu=4,mem=240G,node=1"
    _dump(root, lambda text: text.replace(
        "5055845_3|5055858|host-capacity|FAILED|2:0|",
        "5055845_3|5055858|host-capacity|PREEMPTED|0:0|")
        + f"6000000_0|6000001|other|COMPLETED|0:0|2026-09-15T18:00:00|2026-09-15T18:16:40|"
        f"1000|{tres}|gpu-node-30|None\n6100000|6100000|retry|COMPLETED|0:0|"
        f"2026-09-15T18:00:00|2026-09-15T18:16:40|1000|{tres}|gpu-node-31|None\n")
    accounting = _audit(root, tmp_path / "out")["accounting"]
    assert accounting["allocation_gpu_seconds"] == 20828
    report = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "The dump also holds 2 jobs the study did not run (`6000000_0`, `6100000`: no " \
           "array of its records, no attempt's job; 8,000 GPU-seconds known), counted in " \
           "no scope." in report
    assert "summed over every record of each array element)" in report
    assert "earlier runs included" not in report


def test_a_dump_in_local_time_is_said_to_be_one(tmp_path: Path) -> None:
    """Every invocation two hours before its allocation: the dump's times are local (the
    contract captures with TZ=UTC), and the finding says so; ten minutes off says nothing of
    time zones."""
    from datetime import datetime, timedelta

    def later(text: str, by: timedelta) -> str:
        return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", lambda m: (
            datetime.fromisoformat(m.group(0)) + by).isoformat(), text)

    for by, hinted in ((timedelta(hours=2), True), (timedelta(minutes=10), False)):
        root = _example(tmp_path / str(by.seconds))
        _dump(root, lambda text, by=by: later(text, by))
        _audit(root, tmp_path / f"out-{by.seconds}")
        messages = [f["message"] for f in pq.read_table(
            tmp_path / f"out-{by.seconds}" / "findings.parquet").to_pylist()
            if f["rule_id"] == "AUD117"]
        assert messages
        said = "2 h apart, as local times would be: a dump captured without TZ=UTC?"
        assert all((said in m) is hinted for m in messages), messages


def test_a_period_on_more_gpus_than_its_allocation_held_is_never_resolved(
        tmp_path: Path) -> None:
    """A 4-GPU period whose own allocation row held 2 GPUs resolved with no finding, and its
    reservation scope fell below its task scope (2,529 < 3,369 GPU-seconds): the record, the
    run or the row is not what it says (``AUD129``, ``identity_mismatch``). An allocation of
    more GPUs than its period used is no such thing, nor one whose AllocTRES shows no GPU
    at all (only ``gres/gpumem``: a site whose accounting does not track ``gres/gpu``), and
    a multi-node period of 8 GPUs on an 8-GPU allocation resolves."""
    from tests.helpers import audit, element_study, outcome_study, period_spec, verdicts

    held = "billing=32,cpu=32,gres/gpu:a100=4,gres/gpu=4,mem=240G,node=1|gpu-node-10|None"
    first, second = (f"host-qwen25-7b-gsm8k-c2-s{seed}/period-1" for seed in (161, 162))
    for name, tres, expected in [
            ("short", "gres/gpu:a100=2,gres/gpu=2", ("unresolved", "identity_mismatch")),
            ("gpumem", "gres/gpumem=160G", ("resolved", "completed")),
            ("more", "gres/gpu:a100=8,gres/gpu=8", ("resolved", "completed"))]:
        root = outcome_study(tmp_path / name, ["completed", "completed"])
        _dump(root, lambda text, tres=tres: text.replace(
            held, held.replace("gres/gpu:a100=4,gres/gpu=4", tres), 1))
        summary = audit(root, tmp_path / f"{name}-out")
        assert verdicts(summary) == {first: expected, second: ("resolved", "completed")}, name
        rules = next(p["rule_ids"] for p in summary["periods"] if p["seed"] == 161)
        assert ("AUD129" in rules) is (expected[0] == "unresolved"), (name, rules)
    findings = pq.read_table(tmp_path / "short-out" / "findings.parquet").to_pylist()
    (said,) = [f["message"] for f in findings if f["rule_id"] == "AUD129"]
    assert said == f"{first}: the period ran on 4 GPUs, but sacct's record of job 7000000_0 " \
                   "(line 1) held 2"
    root = element_study(tmp_path / "nodes", [("7000001", [period_spec(gpus=8)])])
    assert verdicts(audit(root, tmp_path / "nodes-out")) == {first: ("resolved", "completed")}


def test_one_runs_record_read_twice_is_counted_once(tmp_path: Path) -> None:
    """A dump saved twice into one file held every element's record twice with the same
    Start: each second copy was taken for a ``sacct -D`` rerun, the allocation scope doubled
    (6,896 GPU-seconds for 3,448) and 3,448 were "lost to requeue" by jobs never requeued.
    A capture made mid-run joined to the final one (``RUNNING``, then ``COMPLETED``, one
    Start) is one run too, completed. ``AUD027`` says so; a real rerun (a later Start)
    still counts apart."""
    from tests.helpers import audit, outcome_study, verdicts

    elapsed = 4 * (430 + 432)
    messages: dict[str, list[str]] = {}
    for name in ("twice", "mid-run", "requeued"):
        root = outcome_study(tmp_path / name, ["completed", "completed"])
        lines = (root / "accounting" / "sacct-raw.psv").read_text().splitlines(keepends=True)
        first = lines[0]  # (element 0's allocation row: Start 18:00:00, 430 s)
        earlier = {"twice": lines,
                   "mid-run": [first.replace("|COMPLETED|", "|RUNNING|").replace(
                       "|2026-09-15T18:07:10|430|", "|Unknown|200|")],
                   "requeued": [first.replace("|COMPLETED|", "|REQUEUED|").replace(
                       "T18:00:00|2026-09-15T18:07:10|430|", "T17:50:00|2026-09-15T17:55:00|300|")]
                   }[name]
        (root / "accounting" / "sacct-raw.psv").write_text("".join([*earlier, *lines]))
        summary = audit(root, tmp_path / f"{name}-out")
        assert set(verdicts(summary).values()) == {("resolved", "completed")}, name
        accounting = summary["accounting"]
        lost = 4 * 300 if name == "requeued" else 0
        assert (accounting["allocation_gpu_seconds"], accounting["requeued_gpu_seconds"]) \
            == (elapsed + lost, lost), name
        findings = pq.read_table(tmp_path / f"{name}-out" / "findings.parquet").to_pylist()
        messages[name] = [f["message"] for f in findings if f["rule_id"] == "AUD027"]
    assert messages["requeued"] == []
    assert messages["mid-run"] == ["accounting/sacct-raw.psv:2: job 7000000_0 is recorded "
                                   "again with the Start of line 1: one run, counted once"]
    assert [m.endswith("(and 1 more record(s) like it)") for m in messages["twice"]] == [True]


def test_a_requeued_runs_dump_saved_twice_counts_each_run_once(tmp_path: Path) -> None:
    """A ``sacct -D`` dump (element 0 requeued: a 300 s run, then its 430 s one) saved twice
    into one file: only a record repeating the job's latest was known as one, so element 0's
    first run was counted twice and its completed run once more as lost to requeue (7,568
    GPU-seconds held, 4,120 lost, for 4,648 and 1,200). A capture made mid-run, joined before
    that -D dump, is its last run again, never a run before the requeued one."""
    from tests.helpers import audit, outcome_study, verdicts

    elapsed, lost = 4 * (430 + 432), 4 * 300
    for name in ("twice", "mid-run first"):
        root = outcome_study(tmp_path / name, ["completed", "completed"])
        path = root / "accounting" / "sacct-raw.psv"
        lines = path.read_text().splitlines(keepends=True)
        first = lines[0]  # (element 0's allocation row: Start 18:00:00, 430 s)
        requeued = first.replace("|COMPLETED|", "|REQUEUED|").replace(
            "T18:00:00|2026-09-15T18:07:10|430|", "T17:50:00|2026-09-15T17:55:00|300|")
        mid_run = first.replace("|COMPLETED|", "|RUNNING|").replace(
            "|2026-09-15T18:07:10|430|", "|Unknown|200|")
        dump = [requeued, *lines]
        path.write_text("".join(dump * 2 if name == "twice" else [mid_run, *dump]))
        summary = audit(root, tmp_path / f"{name}-out")
        assert set(verdicts(summary).values()) == {("resolved", "completed")}, name
        accounting = summary["accounting"]
        assert (accounting["allocation_gpu_seconds"], accounting["requeued_gpu_seconds"]) \
            == (elapsed + lost, lost), name
        findings = pq.read_table(tmp_path / f"{name}-out" / "findings.parquet").to_pylist()
        assert [f["rule_id"] for f in findings if f["rule_id"] == "AUD027"] == ["AUD027"], name
