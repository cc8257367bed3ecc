"""The array's elements against the scheduler's dump, through whole audits: every element a
period's attempts ran in must show, and a pending range keeps the array partial whatever its
JobIDRaw."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tests.helpers import audit, element_study, outcome_study, period_spec, rewrite


def _without_element(data: bytes, element: bytes) -> bytes:
    return b"".join(line for line in data.splitlines(keepends=True)
                    if not line.startswith(element + b"|") and not line.startswith(element + b"."))


def test_an_element_a_retried_periods_attempt_ran_in_must_show(tmp_path: Path) -> None:
    """A retried period's attempts ran in elements 0 and 1: the dump lacking element 0 (the
    first attempt's) is AUD126 and fails the gate, as it is for a one-attempt period."""
    root = outcome_study(tmp_path / "study", ["retried"])
    rewrite(root, "accounting/sacct-raw.psv",
            lambda data: _without_element(data, b"7000000_0"), update_manifest=False)
    summary = audit(root, tmp_path / "out")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    assert "7000000_0" in set(findings[findings["rule_id"] == "AUD126"]["subject"])
    assert summary["gate"]["passed"] is False


def test_a_pending_range_under_the_arrays_own_job_id_keeps_the_array_partial(
        tmp_path: Path) -> None:
    """Element 1 ran as job 7000000 (the array's own id, as the task that starts last does);
    a range row ``7000000_[1-2]`` whose JobIDRaw is that id still holds task 2 pending."""
    root = element_study(
        tmp_path / "study", [("7000001", [period_spec(161)]), ("7000000", [period_spec(162)])],
        ("7000000_[1-2]|7000000|host-capacity|PENDING|0:0|Unknown|Unknown|0|"
         "|None assigned|(Priority)",))
    summary = audit(root, tmp_path / "out")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    assert "AUD210" in set(findings["rule_id"])
    assert summary["gate"]["passed"] is False


def test_a_steps_node_failure_is_the_infrastructures_under_a_completed_job(
        tmp_path: Path) -> None:
    """A step row's NODE_FAIL under a job sacct says COMPLETED: the node that ran the
    attempt failed, so the period is an infrastructure failure, as for the job's own state
    (a completed step beside it is nothing)."""
    root = outcome_study(tmp_path / "study", ["completed"])
    rewrite(root, "accounting/sacct-raw.psv",
            lambda data: data.replace(b"7000001.0|apptainer|COMPLETED|",
                                      b"7000001.0|apptainer|NODE_FAIL|"),
            update_manifest=False)
    summary = audit(root, tmp_path / "out")
    (period,) = summary["periods"]
    assert (period["verdict"], period["reason"]) == ("unresolved", "infrastructure_failure")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    (message,) = findings[findings["rule_id"] == "AUD208"]["message"]
    assert "NODE_FAIL (step 0)" in message, message
