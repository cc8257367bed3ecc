"""Verdicts that rest on what the scheduler says (issue 19's findings on a real Slurm).

A batch script that traps the time limit's SIGTERM (as real launchers do) records it as a
received signal, like a scancel's: sacct's TIMEOUT for the element tells the two apart.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from tests.helpers import audit, outcome_study, rewrite, verdicts

SUBJECT = "host-qwen25-7b-gsm8k-c2-s161/period-1"


def test_a_trapped_time_limit_sigterm_is_a_time_limit_not_a_cancellation(
        tmp_path: Path) -> None:
    root = outcome_study(tmp_path / "study", ["cancelled"])
    assert verdicts(audit(root, tmp_path / "scancel"))[SUBJECT] == ("unresolved", "cancelled")
    timed = tmp_path / "timed"
    shutil.copytree(root, timed)
    rewrite(timed, "accounting/sacct-raw.psv",
            lambda b: b.replace(b"|CANCELLED by 1234|", b"|TIMEOUT|", 1), update_manifest=False)
    summary = audit(timed, tmp_path / "timeout")
    assert verdicts(summary)[SUBJECT] == ("unresolved", "time_limit")
    findings = pd.read_parquet(tmp_path / "timeout" / "findings.parquet")
    said = findings[findings["rule_id"] == "AUD207"]["message"].tolist()
    assert said and "sacct reports TIMEOUT" in said[0] and "time limit's" in said[0], said


def _without_element(root: Path, raw: bytes) -> None:
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b"".join(line for line in b.splitlines(keepends=True)
                               if f"|{raw.decode()}".encode() not in line), update_manifest=False)


def test_an_element_the_dump_does_not_show_fails_the_gate_naming_both_causes(
        tmp_path: Path) -> None:
    from auditor._cli import main

    root = outcome_study(tmp_path / "study", ["completed", "completed"])
    _without_element(root, b"7000001")
    out = tmp_path / "out"
    summary = audit(root, out)
    findings = pd.read_parquet(out / "findings.parquet")
    absent = findings[findings["rule_id"] == "AUD126"]
    assert list(absent["subject"]) == ["7000000_0"]
    message = absent["message"].iloc[0]
    assert "not yet accounted" in message and "cancelled while pending" in message, message
    assert not summary["gate"]["passed"]
    assert any("scheduler dump incomplete" in r for r in summary["gate"]["reasons"])
    assert main(["gate", str(out)]) == 1 and main(["gate", str(out), "--allow-partial"]) == 1
    waived = audit(root, tmp_path / "waived", "--waive", "AUD126:7000000_0",
                   "--reason", "cancelled while pending; rerun planned")
    assert not any("scheduler dump incomplete" in r for r in waived["gate"]["reasons"])


def test_an_element_inside_a_pending_range_is_pending_not_absent(tmp_path: Path) -> None:
    root = outcome_study(tmp_path / "study", ["completed", "completed"])
    rewrite(root, "accounting/sacct-raw.psv",
            lambda b: b"".join(
                (line if b"|7000002" not in line else b"") for line in b.splitlines(True)
            ) + b"7000000_[1-3]|7000000|host-capacity|PENDING|0:0|Unknown|Unknown|0||None|"
                b"(Priority)\n", update_manifest=False)
    audit(root, tmp_path / "out")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    assert "AUD126" not in set(findings["rule_id"])
    assert "AUD210" in set(findings["rule_id"])
