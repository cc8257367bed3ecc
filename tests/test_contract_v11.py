"""The audit side of contract v1.1's producer-kit fields, on generated studies.

Unmeasured peaks (``null``: not measured, never 0) and a device file with ``"gpu": null``
are accepted and said in the report; an idle check that could not be made is unknown, not
passed: unresolved under the default protocol, accepted and said under ``"idle_check":
"optional"``; the trial's ``restart_count``, ``array_job_id`` and ``array_task_id`` are read;
a period sealed long after its attempt ended is said to be (``AUD125``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from auditor.collect.trial import read_trial
from tests.helpers import audit, edit_json, edit_record, find, outcome_study, verdicts

SUBJECT = "host-qwen25-7b-gsm8k-c2-s161/period-1"
RECORD = "pairs/host-qwen25-7b-gsm8k-c2-s161/period-1.json"


def _study(tmp_path: Path, idle_check: str | None = None) -> Path:
    root = outcome_study(tmp_path / "study", ["completed"])
    if idle_check is not None:
        protocol = root / "protocol.json"
        doc = json.loads(protocol.read_text())
        doc["idle_check"] = idle_check
        protocol.write_text(json.dumps(doc))
    return root


def _no_gpu(doc: dict[str, Any]) -> None:
    doc["gpu"] = None
    doc["gpu_unavailable"] = "NVML not available; torch with CUDA not available"
    doc["peak_allocated_mib"] = doc["peak_reserved_mib"] = None


def _rule_ids(out: Path) -> set[str]:
    return set(pd.read_parquet(out / "findings.parquet")["rule_id"])


def test_a_device_without_a_gpu_and_unmeasured_peaks_are_accepted_and_said(
        tmp_path: Path) -> None:
    root = _study(tmp_path)
    for rank in range(4):
        edit_json(root, find(root, f"*s161-4gpu/attempt-*/device-evidence/*-{rank}-*.json"),
                  _no_gpu)
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)[SUBJECT] == ("resolved", "completed")
    assert "AUD002" not in _rule_ids(tmp_path / "out")
    report = (tmp_path / "out" / "diagnostic.md").read_text()
    assert "Memory was not measured for ranks 0, 1, 2, 3" in report
    assert "not zero" in report


def test_an_idle_check_that_could_not_be_made_is_unknown_not_passed(tmp_path: Path) -> None:
    root = _study(tmp_path)
    edit_record(root / RECORD, lambda r: r.__setitem__(
        "idle_check", {"passed": None, "unavailable": "NVML not available"}))
    summary = audit(root, tmp_path / "required")
    assert verdicts(summary)[SUBJECT] == ("unresolved", "idle_check_failed")
    findings = pd.read_parquet(tmp_path / "required" / "findings.parquet")
    said = findings[findings["rule_id"] == "AUD118"]["message"].tolist()
    assert said and "could be made (NVML not available)" in said[0], said


def test_an_optional_idle_check_that_was_not_made_decides_nothing_and_is_said(
        tmp_path: Path) -> None:
    root = _study(tmp_path, idle_check="optional")
    edit_record(root / RECORD, lambda r: r.__setitem__(
        "idle_check", {"passed": None, "unavailable": "NVML not available"}))
    summary = audit(root, tmp_path / "optional")
    assert verdicts(summary)[SUBJECT] == ("resolved", "completed")
    assert "AUD118" not in _rule_ids(tmp_path / "optional")
    report = (tmp_path / "optional" / "diagnostic.md").read_text()
    assert "No post-period idle check was made" in report and "optional" in report
    # ...and one that ran and failed still decides, under either policy
    edit_record(root / RECORD, lambda r: r.__setitem__(
        "idle_check", {"passed": False, "checked_ns": 1, "gpu_memory_used_mib": [512],
                       "gpu_processes": 1}))
    summary = audit(root, tmp_path / "failed")
    assert verdicts(summary)[SUBJECT] == ("unresolved", "idle_check_failed")


def test_no_idle_check_under_an_optional_policy_is_accepted(tmp_path: Path) -> None:
    root = _study(tmp_path, idle_check="optional")
    edit_record(root / RECORD, lambda r: r.pop("idle_check"))
    summary = audit(root, tmp_path / "out")
    assert verdicts(summary)[SUBJECT] == ("resolved", "completed")
    root_required = _study(tmp_path / "again")
    edit_record(root_required / RECORD, lambda r: r.pop("idle_check"))
    summary = audit(root_required, tmp_path / "required")
    assert verdicts(summary)[SUBJECT] == ("unresolved", "idle_check_failed")


def test_a_protocol_idle_check_policy_of_another_word_is_an_error(tmp_path: Path) -> None:
    root = _study(tmp_path, idle_check="sometimes")
    audit(root, tmp_path / "out")
    findings = pd.read_parquet(tmp_path / "out" / "findings.parquet")
    said = findings[findings["rule_id"].isin(["AUD002", "AUD014"])]
    assert any("idle_check" in message for message in said["message"]), said["message"]


def test_a_period_sealed_long_after_its_attempt_is_said_to_be(tmp_path: Path) -> None:
    root = _study(tmp_path)
    trial = json.loads((root / find(root, "*s161-4gpu/attempt-*/trial-*.json")).read_text())
    finished = trial["invocation"]["finished_ns"]
    edit_record(root / RECORD, lambda r: r.update(
        sealed_ns=finished + 30 * 86400 * 10**9, sealed_by={"tool": "auditor",
                                                            "version": "0.1.0"}))
    summary = audit(root, tmp_path / "late")
    assert verdicts(summary)[SUBJECT] == ("resolved", "completed")  # (a warning only)
    findings = pd.read_parquet(tmp_path / "late" / "findings.parquet")
    late = findings[findings["rule_id"] == "AUD125"]["message"].tolist()
    assert late == [f"{SUBJECT}: sealed 30 days after its last attempt ended (auditor 0.1.0); "
                    "the manifest proves no change since then, not before"]
    report = (tmp_path / "late" / "diagnostic.md").read_text()
    assert "Sealing: 1 period record sealed by `auditor 0.1.0`" in report
    edit_record(root / RECORD, lambda r: r.update(sealed_ns=finished + 5 * 10**9))
    audit(root, tmp_path / "prompt")
    assert "AUD125" not in _rule_ids(tmp_path / "prompt")
    prompt = (tmp_path / "prompt" / "diagnostic.md").read_text()
    assert "sealed by `auditor 0.1.0`, 5 s after the attempt's end" in prompt
    # sealed before the end the trial records (another node's clock): said so, never "-60 s
    # after"
    edit_record(root / RECORD, lambda r: r.update(sealed_ns=finished - 60 * 10**9))
    audit(root, tmp_path / "early")
    assert "`auditor 0.1.0`, 60 s before the attempt's end" in (tmp_path / "early" /
                                                               "diagnostic.md").read_text()


def test_the_trial_records_restart_count_and_array_ids_are_read(tmp_path: Path) -> None:
    path = tmp_path / "trial-7.json"
    doc = {"schema": "run-evidence/trial/v1", "job_id": "7", "pair": "p", "period": 1,
           "gpus": 2, "attempt": 2, "restart_count": 1, "array_job_id": "5", "array_task_id": 3,
           "dispatch": {}, "env": {}, "processes": [], "status": "completed",
           "invocation": {"started_ns": 1, "finished_ns": 2, "exit_code": 0,
                          "received_signal": None}}
    path.write_text(json.dumps(doc))
    with path.open("rb") as handle:
        trial = read_trial(handle, "trial-7.json")
    assert (trial.restart_count, trial.array_job_id, trial.array_task_id) == (1, "5", 3)
    assert not trial.findings
